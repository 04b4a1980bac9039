"""SQLite statements on PostgreSQL, written once: ``PgConnection`` offers the statement
classes of the gate's store (``gate.store.tx.WriteTx`` and what it composes, the requests,
the outbox, the reads) and the inbox's queries (``gate.inbox.db``) exactly what they use of
a ``sqlite3.Connection``, over a psycopg 3 (sync) connection in autocommit mode, and
translates each SQLite statement once.

What it offers, as sqlite3 does:

- ``execute(sql, params)`` returns a cursor with ``fetchone``, ``fetchall``, ``fetchmany``,
  iteration and ``rowcount``; rows (``Row``) answer by index and by column name
  (case-insensitive, as ``sqlite3.Row``), unpack, ``keys()``;
- ``total_changes`` (rows changed by INSERT/UPDATE/DELETE since the connection opened: the
  sum of their row counts) and ``in_transaction`` (the server's transaction status);
- transactions are explicit SQL (``BEGIN``, ``SAVEPOINT job``, ``ROLLBACK TO job``,
  ``RELEASE job``, ``COMMIT``), as on the store's autocommit sqlite3 connections;
- errors are raised as the sqlite3 exception classes the callers catch (``PgError`` and its
  subclasses, with the server's ``sqlstate`` and the driver's exception as ``__cause__``):
  class 23 (integrity) as ``sqlite3.IntegrityError``, so a constraint fails one job alone;
  08 (connection), 40 (serialization, deadlock), 53 (resources), 57 (operator intervention:
  shutdown, cancelled, statement timeout), 58 (system) and 55P03 (``lock_timeout``: a lock
  waited for too long) as ``sqlite3.OperationalError``, which
  ``gate.store.batch.is_fault`` counts as a storage fault (503 ``storage_unavailable``);
  22 (data) as ``sqlite3.DataError``; anything else as ``sqlite3.DatabaseError``.
- parameters: a sequence for ``?`` placeholders, or a mapping for ``:name`` ones (as
  sqlite3's named style); a Python ``bool`` is sent as the integer SQLite stores (the
  schema's flags are ``BIGINT`` on both backends); everything else as given. A new row's id
  is read as on SQLite >= 3.35: ``INSERT ... RETURNING id`` (no ``lastrowid``).

The translator (``translate``), applied once per distinct statement text (cached), outside
string literals, quoted identifiers and comments unless said otherwise:

1. ``?`` becomes ``%s``, ``:name`` ``%(name)s``; every ``%`` (literals too: psycopg reads
   the whole text) ``%%``;
2. ``INDEXED BY index`` is dropped (PostgreSQL's planner picks the partial index itself);
3. ``INSERT OR IGNORE INTO t ...`` becomes ``INSERT INTO t ... ON CONFLICT DO NOTHING`` (the
   store ignores only key conflicts: ``OutboxStatements.queue(once=True)``);
4. ``x IS ?`` becomes ``x IS NOT DISTINCT FROM %s``, ``x IS NOT ?`` ``x IS DISTINCT FROM %s``
   (SQLite's ``IS`` with a parameter is null-safe equality);
5. ``json_extract(column, '$.a.b')`` (a plain dotted path) becomes ``(column)::jsonb #>>
   '{a,b}'``, text: what the store compares and selects are strings; used as a sort key
   (followed by ``ASC``/``DESC``) it becomes the jsonb value ``(column)::jsonb #> '{a,b}'``
   (JSON null as NULL), which orders numbers as numbers and strings as strings, with
   SQLite's placement of NULL (smallest: ``NULLS FIRST`` ascending, ``NULLS LAST``
   descending). Values of different JSON types in one sort key order differently (SQLite:
   numbers before strings; jsonb: strings before numbers, booleans after both): the store's
   one sort key (a receipt's ``seq``) is always a number;
6. ``BEGIN IMMEDIATE`` (the writer's) becomes ``BEGIN`` (READ COMMITTED). The cluster's write
   exclusion is not this statement: the batch's head-row lock (``SELECT ... FROM audit_head
   ... FOR UPDATE``) belongs to the PostgreSQL batch runner. A plain (deferred) ``BEGIN``,
   which the store issues only to read several statements from one snapshot (as SQLite's
   WAL gives it), becomes ``BEGIN ISOLATION LEVEL REPEATABLE READ``: one snapshot too.

Not translated (``Untranslatable``): ``PRAGMA`` (each caller has its PostgreSQL equivalent:
docs/design.md "Storage backends") and SQLite's catalog (``sqlite_master``,
``sqlite_schema``). A statement the rules cannot carry goes into ``OVERRIDES``, its exact
SQLite text mapped to its PostgreSQL text; the overrides are checked first.

No driver import here: the connection is typed against ``DriverConnection``, which psycopg's
``Connection`` satisfies, so the base install (no psycopg) imports this module.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any, Protocol


class DriverCursor(Protocol):
    """What ``PgConnection`` uses of a psycopg cursor."""

    @property
    def description(self) -> Sequence[Any] | None: ...
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def fetchmany(self, size: int = ...) -> list[Any]: ...


class DriverInfo(Protocol):
    """What ``PgConnection`` uses of psycopg's ``ConnectionInfo``."""

    @property
    def transaction_status(self) -> int: ...


class DriverConnection(Protocol):
    """What ``PgConnection`` uses of a psycopg 3 sync ``Connection`` (autocommit, tuple rows)."""

    @property
    def autocommit(self) -> bool: ...
    @property
    def info(self) -> DriverInfo: ...
    @property
    def closed(self) -> bool: ...
    @property
    def broken(self) -> bool: ...
    def execute(self, query: Any, params: Any = ..., /) -> Any: ...
    def close(self) -> None: ...


class Untranslatable(ValueError):
    """A SQLite statement with no mechanical PostgreSQL form and no override."""


# Statements the rules cannot carry, by their exact SQLite text: their PostgreSQL text
# (already with %s placeholders). Empty today: every statement of the store that runs on
# PostgreSQL goes through the rules; a statement added here is tested in
# tests/test_store_pg_connection.py like the rest.
OVERRIDES: dict[str, str] = {}

_TOKENS = re.compile(
    r"""'(?:[^']|'')*'      # a string literal
      | "(?:[^"]|"")*"      # a quoted identifier
      | --[^\n]*            # a line comment
      | /\*.*?\*/           # a block comment
    """,
    re.VERBOSE | re.DOTALL,
)
_MASK = "\x00{}\x00"
_MASKED = re.compile(r"\x00(\d+)\x00")
_INDEXED_BY = re.compile(r"\s+INDEXED\s+BY\s+\w+", re.IGNORECASE)
_OR_IGNORE = re.compile(r"^(\s*)INSERT\s+OR\s+IGNORE\s+INTO\b", re.IGNORECASE)
_IS_NOT_PARAM = re.compile(r"\bIS\s+NOT\s+\?", re.IGNORECASE)
_IS_PARAM = re.compile(r"\bIS\s+\?", re.IGNORECASE)
_JSON_EXTRACT = re.compile(
    r"\bjson_extract\(\s*([\w.]+)\s*,\s*\x00(\d+)\x00\s*\)(\s+(?:ASC|DESC)\b)?", re.IGNORECASE
)
_JSON_PATH = re.compile(r"\$((?:\.[A-Za-z_]\w*)+)")
_BEGIN_IMMEDIATE = re.compile(r"^\s*BEGIN\s+IMMEDIATE\s*$", re.IGNORECASE)
_BEGIN_DEFERRED = re.compile(r"^\s*BEGIN(?:\s+DEFERRED)?\s*$", re.IGNORECASE)
_REFUSED = re.compile(r"^\s*PRAGMA\b|\bsqlite_(?:master|schema)\b", re.IGNORECASE)
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
_CHANGES = re.compile(
    r"^\s*(?:INSERT|UPDATE|DELETE)\b|^\s*WITH\b[\s\S]*\b(?:INSERT|UPDATE|DELETE)\b", re.IGNORECASE
)
_READ_ONLY = re.compile(r"^\s*SELECT\b(?![\s\S]*\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b)", re.IGNORECASE)


def _json_extract(match: re.Match[str], literals: list[str]) -> str:
    column, literal, order = match.group(1), literals[int(match.group(2))], match.group(3)
    path = _JSON_PATH.fullmatch(literal[1:-1])
    if path is None:
        raise Untranslatable(f"json_extract path {literal} is not a plain dotted path")
    keys = ",".join(path.group(1)[1:].split("."))
    if order is None:
        return f"(({column})::jsonb #>> '{{{keys}}}')"
    nulls = "NULLS LAST" if order.strip().upper() == "DESC" else "NULLS FIRST"
    return f"NULLIF(({column})::jsonb #> '{{{keys}}}', 'null'::jsonb){order} {nulls}"


@lru_cache(maxsize=4096)
def translate(sql: str) -> str:
    """The PostgreSQL text of the SQLite statement ``sql`` (the module's rules, or its
    ``OVERRIDES`` entry); raises Untranslatable for a PRAGMA, SQLite's catalog or a
    ``json_extract`` path the rules do not know. Cached: each distinct text once."""
    if sql in OVERRIDES:
        return OVERRIDES[sql]
    literals: list[str] = []

    def mask(match: re.Match[str]) -> str:
        literals.append(match.group(0))
        return _MASK.format(len(literals) - 1)

    code = _TOKENS.sub(mask, sql)
    if _REFUSED.search(code):
        raise Untranslatable(f"no PostgreSQL form (see docs/design.md): {sql.strip()[:80]}")
    if _BEGIN_IMMEDIATE.match(code):
        return "BEGIN"
    if _BEGIN_DEFERRED.match(code):
        return "BEGIN ISOLATION LEVEL REPEATABLE READ"
    code = _INDEXED_BY.sub("", code)
    ignore = _OR_IGNORE.match(code)
    if ignore:
        code = _OR_IGNORE.sub(r"\1INSERT INTO", code, count=1).rstrip() + " ON CONFLICT DO NOTHING"
    code = _JSON_EXTRACT.sub(lambda m: _json_extract(m, literals), code)
    code = code.replace("%", "%%")
    code = _NAMED.sub(r"%(\1)s", code)
    code = _IS_NOT_PARAM.sub("IS DISTINCT FROM ?", code)
    code = _IS_PARAM.sub("IS NOT DISTINCT FROM ?", code)
    code = code.replace("?", "%s")
    return _MASKED.sub(lambda m: literals[int(m.group(1))].replace("%", "%%"), code)


class Row:
    """One result row, as ``sqlite3.Row`` offers it: by index (and slice), by column name
    (case-insensitive), iterated, unpacked, ``keys()``, ``len``; equal to a row of the same
    columns and values."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: tuple[str, ...], values: Sequence[Any]) -> None:
        self._names = names
        self._values = tuple(values)

    def __getitem__(self, key: int | str | slice) -> Any:
        if isinstance(key, str):
            folded = key.lower()
            for index, name in enumerate(self._names):
                if name.lower() == folded:
                    return self._values[index]
            raise IndexError(f"No item with that key: {key!r}")
        return self._values[key]

    def keys(self) -> list[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Row):
            return NotImplemented
        return self._names == other._names and self._values == other._values

    def __hash__(self) -> int:
        return hash((self._names, self._values))

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._names, self._values, strict=True))!r})"


class Cursor:
    """The result of ``PgConnection.execute``: rows as ``Row``, and ``rowcount`` (rows an
    INSERT/UPDATE/DELETE changed; -1 for a statement without a count, as sqlite3)."""

    __slots__ = ("_cursor", "_names", "rowcount")

    def __init__(self, cursor: DriverCursor, changes: bool) -> None:
        self._cursor = cursor
        description = cursor.description
        self._names = tuple(str(column.name) for column in description or ())
        self.rowcount = cursor.rowcount if changes else -1

    def _row(self, values: Sequence[Any] | None) -> Row | None:
        return None if values is None else Row(self._names, values)

    def fetchone(self) -> Row | None:
        if not self._names:
            return None
        with _errors():
            return self._row(self._cursor.fetchone())

    def fetchall(self) -> list[Row]:
        if not self._names:
            return []
        with _errors():
            return [Row(self._names, values) for values in self._cursor.fetchall()]

    def fetchmany(self, size: int = 1) -> list[Row]:
        if not self._names:
            return []
        with _errors():
            return [Row(self._names, values) for values in self._cursor.fetchmany(size)]

    def __iter__(self) -> Iterator[Row]:
        while chunk := self.fetchmany(1000):
            yield from chunk


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


class _errors:
    """Raise a driver error (``psycopg.Error``, recognised by its module) as
    ``as_sqlite_error``'s; anything else as it is."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is not None and type(exc).__module__.startswith("psycopg"):
            raise as_sqlite_error(exc) from exc


def _param(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


class PgConnection:
    """A psycopg 3 sync connection (``autocommit=True``: transactions are the statements'
    own ``BEGIN``/``COMMIT``, as on the store's sqlite3 connections) offering what the
    store's statement classes use of a ``sqlite3.Connection``; each statement translated once
    (``translate``). Raises ValueError for a connection not in autocommit mode."""

    def __init__(self, conn: DriverConnection) -> None:
        if not conn.autocommit:
            raise ValueError("PgConnection needs an autocommit connection (explicit BEGIN/COMMIT)")
        self._conn = conn
        self.total_changes = 0
        # statements run that may change rows: every one but a plain SELECT (the batch
        # runner's test of whether a job refused without a SAVEPOINT wrote anything)
        self.writes = 0

    @property
    def driver(self) -> DriverConnection:
        """The psycopg connection underneath."""
        return self._conn

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Cursor:
        """Run the SQLite statement ``sql`` (translated) with ``params`` (``?`` in order, or
        a mapping for ``:name``)."""
        text = translate(sql)
        sent: tuple[Any, ...] | dict[str, Any]
        if isinstance(params, Mapping):
            sent = {name: _param(value) for name, value in params.items()}
        else:
            sent = tuple(_param(p) for p in params)
        with _errors():
            cursor = self._conn.execute(text, sent)
        changes = _counts_changes(sql)
        if _may_write(sql):
            self.writes += 1
        result = Cursor(cursor, changes)
        if changes and result.rowcount > 0:
            self.total_changes += result.rowcount
        return result

    @property
    def in_transaction(self) -> bool:
        """A transaction is open (or failed and not yet rolled back): the server's
        transaction status is not idle."""
        return int(self._conn.info.transaction_status) != 0

    @property
    def closed(self) -> bool:
        """The connection is closed, or was lost (the driver saw it broken)."""
        return bool(self._conn.closed or self._conn.broken)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


@lru_cache(maxsize=4096)
def _counts_changes(sql: str) -> bool:
    return _CHANGES.match(sql) is not None


@lru_cache(maxsize=4096)
def _may_write(sql: str) -> bool:
    return _READ_ONLY.match(sql) is None
