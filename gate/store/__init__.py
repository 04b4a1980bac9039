"""SQLite persistence: the only package that speaks SQL."""

from gate.store.db import Command, Store
from gate.store.tx import WriteTx

__all__ = ["Command", "Store", "WriteTx"]
