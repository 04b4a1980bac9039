"""The one read-only opener of a gate database (``audit verify``/``export``, ``doctor``),
reads run through it (``reading``), and the audit_log column list of any schema version;
the catalog questions (``has_table``, ``table_columns``, ``schema_version``) on either backend.

A database is a SQLite file (a ``Path``) or a PostgreSQL database (a
``gate.postgres.target.PgTarget``, read through ``gate.store.pg_read``): the readers write
their statements once, in SQLite's words, and the PostgreSQL connection translates them
(``gate.postgres.connection``)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from gate.errors import Unavailable
from gate.postgres.connection import PgConnection
from gate.store.connection import BUSY_TIMEOUT_MS

if TYPE_CHECKING:  # pg_backend imports the writer's modules, which import this one
    from gate.postgres.target import PgTarget

AUDIT_COLUMNS = "seq, approval_id, kind, entry, prev_hash, entry_hash, receipt"

# where a gate's state is: a SQLite file, or a PostgreSQL database (an annotation only:
# import it under TYPE_CHECKING; a path is a ``PurePath``)
if TYPE_CHECKING:
    Database: TypeAlias = Path | PgTarget


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
    if isinstance(path, str | PurePath):  # a file's path (str: as before)
        return connect_file(Path(path))
    from gate.store import pg_read  # imports pg_backend: not at this module's import

    return pg_read.read_only(path)


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
    """Whether the database holds the table ``name`` (one added by a later migration):
    SQLite's ``sqlite_master``, PostgreSQL's ``information_schema`` (the current schema)."""
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    if isinstance(conn, PgConnection):
        sql = (
            "SELECT 1 FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_name = ?"
        )
    return conn.execute(sql, (name,)).fetchone() is not None


def table_columns(conn: ReadConnection, table: str) -> set[str]:
    """The column names of ``table`` (a known table name, never input): SQLite's ``PRAGMA
    table_info``, PostgreSQL's ``information_schema.columns``."""
    if isinstance(conn, PgConnection):
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        )
        return {str(row[0]) for row in rows}
    return {str(row[1]) for row in conn.execute(f"PRAGMA table_info({table})")}


def schema_version(conn: ReadConnection) -> int:
    """The database's schema version: SQLite's ``PRAGMA user_version``, PostgreSQL's newest
    ``schema_migrations`` row (0 when none)."""
    if not isinstance(conn, PgConnection):
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    if not has_table(conn, "schema_migrations"):
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return 0 if row is None else int(row[0])


def audit_columns(conn: ReadConnection) -> str:
    """The columns that make an ``AuditRow``, for a ``SELECT`` from audit_log: a log from
    before signed entries (schema 1) has no key_id/signature yet, read as NULL. Raises
    sqlite3.Error as the connection does."""
    columns = table_columns(conn, "audit_log")
    signed = "key_id, signature" if {"key_id", "signature"} <= columns else "NULL, NULL"
    return f"{AUDIT_COLUMNS}, {signed}"
