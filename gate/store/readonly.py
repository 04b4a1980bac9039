"""The one read-only opener of a gate database (``audit verify``/``export``, ``doctor``),
reads run through it (``reading``), and the audit_log column list of any schema version.

A database is a SQLite file (a ``Path``) or a PostgreSQL database (``PgDatabase``,
``gate.store.pg_read``): the readers write their statements once, in SQLite's words, and
the PostgreSQL connection translates them (``gate.store.pg_connection``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, Protocol

from gate.errors import Unavailable
from gate.store import pg_read
from gate.store.connection import BUSY_TIMEOUT_MS
from gate.store.pg_connection import PgConnection
from gate.store.pg_read import PgDatabase

AUDIT_COLUMNS = "seq, approval_id, kind, entry, prev_hash, entry_hash, receipt"

# where a gate's state is: a SQLite file, or a PostgreSQL database
Database = Path | PgDatabase


class ReadCursor(Protocol):
    """What the offline readers use of a cursor (sqlite3's, or ``PgConnection``'s)."""

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def fetchmany(self, size: int = ..., /) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class ReadConnection(Protocol):
    """What the offline readers use of a connection (sqlite3's, or ``PgConnection``)."""

    def execute(self, sql: str, params: Any = ..., /) -> ReadCursor: ...
    def close(self) -> None: ...


def connect(path: Database) -> ReadConnection:
    """A read-only connection to the database ``path``: ``pg_read.read_only`` for a
    PostgreSQL one (one snapshot, server-side cursors), else ``connect_file``'s."""
    if isinstance(path, PgDatabase):
        return pg_read.read_only(path)
    return connect_file(path)


def connect_file(path: Path) -> sqlite3.Connection:
    """A connection (autocommit, ``query_only``, the Store's busy timeout: 10 s) that only
    reads the existing database at ``path``; it takes no lock, so a running gate may keep
    writing. Raises Unavailable (``storage_unavailable``) when it cannot be opened.

    Opened ``mode=rw`` (never creates the file) with ``query_only``, not ``mode=ro``: on a
    WAL-mode file SQLite creates ``-wal``/``-shm`` beside it, and only a connection that may
    write removes them again on close (a read-only one left them behind next to a backup).
    Only a file (or medium) it may not write is opened ``mode=ro``.
    """
    base = Path(path).absolute().as_uri()
    try:
        try:
            conn = sqlite3.connect(base + "?mode=rw", uri=True, isolation_level=None)
            conn.execute("PRAGMA schema_version").fetchone()  # opened for real
        except sqlite3.Error:  # a file (or medium) we may not write: read-only after all
            conn = sqlite3.connect(base + "?mode=ro", uri=True, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA query_only = ON")
        return conn
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"cannot open database {path}: {exc}") from exc


@contextmanager
def reading(path: Database, failed: str = "database read failed") -> Iterator[ReadConnection]:
    """A read-only connection to the existing database at ``path`` (``connect``: no lock),
    closed on exit; a read error raises Unavailable ``storage_unavailable``, ``FAILED:
    error``."""
    with closing(connect(path)) as conn:
        try:
            yield conn
        except sqlite3.Error as exc:
            raise Unavailable("storage_unavailable", f"{failed}: {exc}") from exc


def has_table(conn: ReadConnection, name: str) -> bool:
    """Whether the database holds the table ``name`` (one added by a later migration)."""
    if isinstance(conn, PgConnection):
        return pg_read.has_table(conn, name)
    found = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
    ).fetchone()
    return found is not None


def audit_columns(conn: ReadConnection) -> str:
    """The columns that make an ``AuditRow``, for a ``SELECT`` from audit_log: a log from
    before signed entries (schema 1) has no key_id/signature yet, read as NULL (PostgreSQL's
    schema starts with them). Raises sqlite3.Error as the connection does."""
    if isinstance(conn, PgConnection):
        return f"{AUDIT_COLUMNS}, key_id, signature"
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(audit_log)")}
    signed = "key_id, signature" if {"key_id", "signature"} <= columns else "NULL, NULL"
    return f"{AUDIT_COLUMNS}, {signed}"
