"""SQLite persistence: the only package that speaks SQL."""

from gate.store.db import Store
from gate.store.tx import WriteTx

__all__ = ["Store", "WriteTx"]
