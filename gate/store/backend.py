"""What the storage backends do differently around one write batch, behind one small
object: how a batch begins (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: the ``audit_head``
row lock, which also gives the chain's tail and the batch's clock), what it does before
its COMMIT and after it, and the probe. The batch runner (``gate.store.batch``) is one;
SQLite's side is here, PostgreSQL's in ``gate.store.pg_backend``."""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Protocol

from gate.store.tx import WriteTx


class BatchBackend(Protocol):
    """The backend's part of one write batch, in the order the batch runner calls it, and
    ``savepoints``: whether each job runs in its own SAVEPOINT (SQLite), or without one
    (PostgreSQL, where each is a round trip and a subtransaction: a job refused after it
    wrote, as ``writes`` tells, has the batch's transaction rolled back and the jobs before
    it run again without it, ``gate.store.batch.run_batch``)."""

    savepoints: bool

    def writes(self, conn: sqlite3.Connection) -> int:
        """How many statements that may change rows ran on ``conn`` so far (0 where jobs
        have SAVEPOINTs: not asked)."""

    def begin(self, conn: sqlite3.Connection, tx: WriteTx) -> None:
        """Open the batch's transaction holding the database's write exclusion; raises
        sqlite3.Error (the batch's jobs then fail 503, nothing ran)."""

    def before_commit(self, conn: sqlite3.Connection, tx: WriteTx) -> None:
        """The last statements of the batch's transaction, after its jobs."""

    def finished(self) -> None:
        """The batch's transaction is over (committed or rolled back)."""

    def probe(self, conn: sqlite3.Connection) -> None:
        """A write that changes nothing, proving the database takes writes
        (``Store.check_writable``)."""


class SqliteBatch:
    """SQLite: ``BEGIN IMMEDIATE`` takes the file's write lock; the chain's tail is read from
    the log (``WriteTx.append_audit``), the clock is the gate's; the probe rewrites the
    header (``PRAGMA user_version`` set to its own value)."""

    savepoints = True

    def writes(self, conn: sqlite3.Connection) -> int:
        return 0

    def begin(self, conn: sqlite3.Connection, tx: WriteTx) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def before_commit(self, conn: sqlite3.Connection, tx: WriteTx) -> None:
        return None

    def finished(self) -> None:
        return None

    def probe(self, conn: sqlite3.Connection) -> None:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        conn.execute(f"PRAGMA user_version = {version}")


SQLITE = SqliteBatch()


class WriteSide(Protocol):
    """A writer's database: its connection for the next batch and its ``BatchBackend``."""

    @property
    def backend(self) -> BatchBackend:
        """What the batch runner calls around each batch."""

    def connection(self) -> sqlite3.Connection:
        """The write connection for the next batch (PostgreSQL: a new one when the last
        was lost); raises sqlite3.Error when there is none."""

    def close(self) -> None:
        """Close the connection (idempotent)."""


class SqliteSide:
    """The SQLite write connection ``conn`` (owned: ``close`` closes it)."""

    backend: BatchBackend = SQLITE

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def connection(self) -> sqlite3.Connection:
        return self._conn

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()
