"""A PostgreSQL database read offline (``audit verify``/``export``/``signatures``, ``storage
migrate``'s check): the read-only connection the offline readers use, one ``REPEATABLE READ
READ ONLY`` snapshot for the connection's life, every ``SELECT`` through a server-side
(named) cursor, so a log of any size streams in constant memory. The database is a
``gate.postgres.target.PgTarget``, its connection ``gate.postgres.target.connect``'s (role
``offline``), without the daemon's statement and idle timeouts: an export piped into a slow
reader waits, it is not cut off.
"""

from __future__ import annotations

import importlib
import re
from contextlib import suppress
from itertools import count
from typing import Any
from urllib.parse import urlsplit

from gate.errors import GateError, Unavailable
from gate.postgres.connection import DriverInfo, PgConnection, PgError, as_sqlite_error
from gate.postgres.target import PgTarget, connect
from gate.store.pg_backend import text_rules_problem

SCHEMES = ("postgresql", "postgres")
EXTRA = "needs the postgres extra: pip install 'hitl-gate[postgres]'"
_SELECT = re.compile(r"^\s*(?:SELECT|WITH|VALUES)\b", re.IGNORECASE)
_SNAPSHOT = re.compile(r"^\s*(?:BEGIN|COMMIT|ROLLBACK)\b", re.IGNORECASE)


def is_url(text: str) -> bool:
    """Whether ``text`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return urlsplit(text.strip()).scheme.lower() in SCHEMES


def driver() -> Any:
    """The ``psycopg`` module; GateError ``no_driver`` (``PostgreSQL needs the postgres
    extra: ...``) when it is not installed."""
    try:
        return importlib.import_module("psycopg")
    except ImportError:
        raise GateError("no_driver", f"PostgreSQL {EXTRA}") from None


def session(target: PgTarget, role: str, *, read_only: bool = False) -> Any:
    """An autocommit psycopg connection to ``target`` (``gate.postgres.target.connect``'s, role
    ``role``) with no statement or idle-in-transaction timeout: an offline tool's reads and
    a move's copy take as long as they take. Raises GateError ``no_driver``, Unavailable
    ``storage_unavailable`` (``cannot connect to URL: reason``) when it cannot connect."""
    psycopg = driver()
    conn = None
    try:
        conn = connect(target, role, read_only=read_only).driver
        conn.execute("SET statement_timeout = 0")
        conn.execute("SET idle_in_transaction_session_timeout = 0")
    except (PgError, psycopg.Error) as exc:
        if conn is not None:
            conn.close()
        reason = exc if isinstance(exc, PgError) else as_sqlite_error(exc)
        raise Unavailable("storage_unavailable", f"cannot connect to {target}: {reason}") from None
    return conn


class _NoRows:
    """The cursor of a statement the snapshot takes as done (``BEGIN``, ``COMMIT``)."""

    description = None
    rowcount = -1

    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def fetchmany(self, size: int = 1) -> list[Any]:
        return []


class Snapshot:
    """A psycopg connection inside one ``REPEATABLE READ READ ONLY`` transaction, for
    ``PgConnection``: each ``SELECT`` runs as a server-side cursor (rows fetched as they are
    read: constant memory; several may be read in turn), and the readers' own ``BEGIN``/
    ``COMMIT`` are no-ops (the whole connection is one snapshot already)."""

    autocommit = True  # transactions are explicit: the one opened here

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._names = count(1)
        self._cursors: list[Any] = []  # closed with the connection
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    @property
    def info(self) -> DriverInfo:
        info: DriverInfo = self._conn.info
        return info

    @property
    def closed(self) -> bool:
        return bool(self._conn.closed)

    @property
    def broken(self) -> bool:
        return bool(self._conn.broken)

    def execute(self, query: Any, params: Any = (), /) -> Any:
        if _SNAPSHOT.match(query):
            return _NoRows()
        if not _SELECT.match(query):
            return self._conn.execute(query, params)
        cursor = self._conn.cursor(name=f"hitl_read_{next(self._names)}")
        self._cursors.append(cursor)
        cursor.execute(query, params)
        return cursor

    def close(self) -> None:
        """Close the cursors, then the connection (which ends the read-only transaction:
        nothing to keep); a connection already lost is closed all the same."""
        errors = driver().Error
        for cursor in self._cursors:
            with suppress(errors):
                cursor.close()
        self._cursors.clear()
        self._conn.close()


def read_only(target: PgTarget) -> PgConnection:
    """A read-only ``PgConnection`` to ``target``: one snapshot, server-side cursors
    (``Snapshot``). Raises as ``session``, and Unavailable ``storage_unavailable`` for a
    database not UTF8 sorted by code point (``text_rules_problem``: its texts would read as
    bytes)."""
    conn = session(target, "offline", read_only=True)
    try:
        problem = text_rules_problem(conn)
        if problem is not None:
            raise Unavailable("storage_unavailable", f"database {target}: {problem}")
        return PgConnection(Snapshot(conn))
    except BaseException:
        conn.close()
        raise
