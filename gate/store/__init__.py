"""SQLite persistence: the only package that speaks SQL."""

from gate.store.batch import Command
from gate.store.facade import Store, Writer
from gate.store.tx import WriteTx

__all__ = ["Command", "Store", "WriteTx", "Writer"]
