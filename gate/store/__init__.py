"""SQLite persistence: the only package that speaks SQL."""

from gate.store.batch import Command, Writer
from gate.store.facade import Store
from gate.store.tx import WriteTx

__all__ = ["Command", "Store", "WriteTx", "Writer"]
