"""SQLite persistence: the only package that speaks SQL."""

from gate.store.db import Store, WriteTx

__all__ = ["Store", "WriteTx"]
