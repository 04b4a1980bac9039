"""PostgreSQL's errors as the sqlite3 exception classes the store's callers catch: by the
server's SQLSTATE class (``as_sqlite_error``), so a constraint fails one job alone and a lost
connection, a lock timeout or a server shutting down is a storage fault (``gate.store.batch``
answers it 503 ``storage_unavailable``). No driver import here: a driver error is recognised
by its module."""

from __future__ import annotations

import sqlite3
from typing import Any


class PgError(sqlite3.DatabaseError):
    """A PostgreSQL error raised as sqlite3's class for it (the module's docstring);
    ``sqlstate`` is the server's code (None when the connection itself failed)."""

    sqlstate: str | None = None


class PgIntegrityError(PgError, sqlite3.IntegrityError):
    """SQLSTATE class 23: a constraint (unique, foreign key, check, not null)."""


class PgOperationalError(PgError, sqlite3.OperationalError):
    """SQLSTATE classes 08, 40, 53, 57, 58, 55P03 (a lock timeout), or a lost connection:
    a storage fault."""


class PgDataError(PgError, sqlite3.DataError):
    """SQLSTATE class 22: a value the column cannot hold."""


_BY_CLASS: dict[str, type[PgError]] = {
    "23": PgIntegrityError,
    "08": PgOperationalError,
    "40": PgOperationalError,
    "53": PgOperationalError,
    "57": PgOperationalError,
    "58": PgOperationalError,
    "22": PgDataError,
}


# single SQLSTATEs outside those classes: lock_not_available (lock_timeout expired)
_BY_STATE: dict[str, type[PgError]] = {"55P03": PgOperationalError}

# a driver error without a SQLSTATE (raised by the client: a lost connection, a value it
# cannot send) by the name of its DB-API class
_BY_DBAPI: dict[str, type[PgError]] = {
    "OperationalError": PgOperationalError,
    "InterfaceError": PgOperationalError,
    "IntegrityError": PgIntegrityError,
    "DataError": PgDataError,
}


def as_sqlite_error(exc: BaseException) -> PgError:
    """The sqlite3-class error for a driver error ``exc`` (its message on one line): by its
    SQLSTATE's class; without one (the client raised it) by its DB-API class, a lost
    connection (``OperationalError``) as ``PgOperationalError``, a value the client cannot
    send (``DataError``: a text with U+0000) as ``PgDataError``."""
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate is not None:
        kind = _BY_STATE.get(sqlstate) or _BY_CLASS.get(sqlstate[:2], PgError)
    else:
        names = [cls.__name__ for cls in type(exc).__mro__]
        kind = next((_BY_DBAPI[n] for n in names if n in _BY_DBAPI), PgError)
    # libpq's messages span lines (a HINT, "Is the server running ..."): one line here, for
    # the one-line errors and log fields the store's callers make of them
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    error = kind(text or type(exc).__name__)
    error.sqlstate = sqlstate
    return error


class driver_errors:
    """Raise a driver error (``psycopg.Error``, recognised by its module) as
    ``as_sqlite_error``'s; anything else as it is."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is not None and type(exc).__module__.startswith("psycopg"):
            raise as_sqlite_error(exc) from exc
