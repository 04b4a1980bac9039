"""A PostgreSQL database read offline (``audit verify``/``export``, ``storage migrate``):
where it is (``PgDatabase``: a libpq URL, the password apart and never shown), the driver
imported only here and when asked for, and the read-only connection the offline readers use:
one ``REPEATABLE READ READ ONLY`` snapshot for the connection's life, every ``SELECT`` through
a server-side (named) cursor, so a log of any size streams in constant memory."""

from __future__ import annotations

import importlib
import re
from contextlib import suppress
from dataclasses import dataclass, field
from itertools import count
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from gate.errors import GateError, Unavailable
from gate.store.pg_connection import DriverInfo, PgConnection

SCHEMES = ("postgresql", "postgres")
CONNECT_TIMEOUT_S = 10  # an unreachable host is reported, not waited for
EXTRA = "needs the postgres extra: pip install 'hitl-gate[postgres]'"
_SELECT = re.compile(r"^\s*(?:SELECT|WITH|VALUES)\b", re.IGNORECASE)
_SNAPSHOT = re.compile(r"^\s*(?:BEGIN|COMMIT|ROLLBACK)\b", re.IGNORECASE)


def is_url(text: str) -> bool:
    """Whether ``text`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return urlsplit(text.strip()).scheme.lower() in SCHEMES


def redacted(url: str) -> str:
    """``url`` as it may be shown or logged: a password in it replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


@dataclass(frozen=True, slots=True)
class PgDatabase:
    """A PostgreSQL database: its libpq ``url`` and the ``password`` to connect with (None:
    libpq's own ``PGPASSWORD``/``.pgpass``, or a password in the URL). Shown (``str``) with
    any password redacted; ``repr`` never holds the password."""

    url: str
    password: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not is_url(self.url):
            raise ValueError(f"{redacted(self.url)!r} is not a postgresql:// URL")

    def __str__(self) -> str:
        return redacted(self.url)


def driver() -> Any:
    """The ``psycopg`` module; GateError ``no_driver`` (``PostgreSQL needs the postgres
    extra: ...``) when it is not installed."""
    try:
        return importlib.import_module("psycopg")
    except ImportError:
        raise GateError("no_driver", f"PostgreSQL {EXTRA}") from None


def one_line(exc: BaseException) -> str:
    """A driver error as one line (libpq's messages run over several)."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    return text or type(exc).__name__


def connect(db: PgDatabase, *, autocommit: bool, role: str) -> Any:
    """A psycopg connection to ``db`` (``application_name`` ``hitl-gate/ROLE``; libpq's
    ``connect_timeout`` CONNECT_TIMEOUT_S unless the URL sets one). Raises
    GateError ``no_driver``, Unavailable ``storage_unavailable`` (``cannot connect to URL:
    reason``, the URL redacted) when it cannot connect."""
    psycopg = driver()
    extra = {} if db.password is None else {"password": db.password}
    try:
        if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(db.url):
            extra["connect_timeout"] = str(CONNECT_TIMEOUT_S)
        return psycopg.connect(
            db.url, autocommit=autocommit, application_name=f"hitl-gate/{role}", **extra
        )
    except psycopg.Error as exc:
        reason = f"cannot connect to {db}: {one_line(exc)}"
        raise Unavailable("storage_unavailable", reason) from None


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


def read_only(db: PgDatabase) -> PgConnection:
    """A read-only ``PgConnection`` to ``db``: one snapshot, server-side cursors
    (``Snapshot``). Raises as ``connect``."""
    conn = connect(db, autocommit=True, role="offline")
    try:
        return PgConnection(Snapshot(conn))
    except BaseException:
        conn.close()
        raise


def has_table(conn: PgConnection, name: str) -> bool:
    """Whether the database's current schema holds the table ``name``."""
    row = conn.execute(
        "SELECT count(*) FROM information_schema.tables"
        " WHERE table_schema = current_schema() AND table_name = ?",
        (name,),
    ).fetchone()
    return row is not None and int(row[0]) > 0


def schema_version(conn: PgConnection) -> int:
    """The newest schema version applied (``schema_migrations``), 0 when none was."""
    if not has_table(conn, "schema_migrations"):
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return 0 if row is None else int(row[0])
