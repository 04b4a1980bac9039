"""Copy a SQLite gate's whole state into an empty PostgreSQL database (``hitl-gate storage
migrate``): every table row by row, values as stored (the audit log's ``entry`` text byte for
byte: its bytes are hashed), in one transaction, with the identity sequences set past the
copied ids and ``audit_head`` set from the copied log. The source is held with the gate's own
lock while it is read, so no gate writes it meanwhile.

What it refuses (``MoveError``, nothing written): a source that is missing, in use, not a
gate database or newer than this gate; a target that is not empty (a row in any of the gate's
tables, or its audit head past 0: gates run or have run there), not UTF8, not sorted by
code point (the ``C`` collation) or newer than this gate; a value PostgreSQL cannot hold as
it is (a BLOB, a text with U+0000, a value of another type than its column's).
The copy's audit check (the chain, its head equal to the source's) is ``gate.audit.verify``'s.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gate.errors import GateError, Unavailable
from gate.postgres.connection import as_sqlite_error
from gate.postgres.migrate import SchemaTooNew
from gate.postgres.target import PgTarget
from gate.store import connection, pg_read, readonly
from gate.store.pg_backend import text_rules_problem
from gate.store.pg_schema import CLUSTER_TABLES, PG_MIGRATIONS, migrate, sync_audit_head
from gate.store.schema import SCHEMA_VERSION

CHUNK = 1000
# which Python values a PostgreSQL column type takes unchanged (what SQLite returns for it)
_TAKES: dict[str, tuple[type, ...]] = {
    "bigint": (int,),
    "double precision": (float, int),
    "text": (str,),
}


class MoveError(GateError):
    """The move cannot be done; ``option`` is the command's option to name (``--from``,
    ``--to``), None when the data itself is at fault. Nothing was written."""

    def __init__(self, option: str | None, message: str) -> None:
        super().__init__("move_refused", message)
        self.option = option


@dataclass(frozen=True, slots=True)
class Moved:
    """What was copied: ``(table, rows)`` in copy order, and the log's head ``(seq,
    entry_hash)`` (None for an empty log)."""

    tables: tuple[tuple[str, int], ...]
    head: tuple[int, str] | None


def move(source: Path, target: PgTarget) -> Moved:
    """Copy the gate database at ``source`` into the empty database ``target`` (its schema
    applied first, ``pg_schema.migrate``), in one transaction, holding the source's lock.
    Raises MoveError (nothing written), GateError ``no_driver`` without psycopg."""
    with _held(source) as lite:
        tables = _source_tables(lite)
        names = [name for name, _ in tables]
        conn = pg_read.session(target, "move")
        try:
            with conn.transaction():
                _refuse_text_rules(conn)
                _refuse_rows(conn, _gate_tables(names))  # before anything is applied
                _migrate(conn)
                # the gates' write lock: one running on this database waits for the COMMIT,
                # then appends after the copied head
                conn.execute("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE")
                # and again under it: nothing written meanwhile, no gate's trace
                _refuse_rows(conn, _gate_tables(names))
                _refuse_head(conn)
                copied = tuple((name, _copy(lite, conn, name, cols)) for name, cols in tables)
                _set_identities(conn, names)
                seq, entry_hash, _ = sync_audit_head(conn)
        except pg_read.driver().Error as exc:
            raise MoveError(None, f"the copy failed: {_primary(exc)}") from None
        except (ValueError, KeyError, TypeError):  # sync_audit_head: the newest entry's time
            raise MoveError(
                None, "the copy failed: the newest audit entry has no valid time (at)"
            ) from None
        finally:
            conn.close()
    return Moved(copied, (seq, entry_hash) if seq else None)


def _primary(exc: Any) -> str:
    """The server's one-line message for ``exc`` without its DETAIL and CONTEXT, which may
    quote a row (a draft); the client's first line when the server sent none."""
    primary = getattr(getattr(exc, "diag", None), "message_primary", None)
    return str(primary) if primary else str(as_sqlite_error(exc)).split("; ")[0]


def _refuse_text_rules(conn: Any) -> None:
    """MoveError unless the target database stores UTF-8 and sorts text by code point
    (``pg_backend.text_rules_problem``: the gate's own rule)."""
    problem = text_rules_problem(conn)
    if problem is not None:
        raise MoveError("--to", problem)


@contextmanager
def _held(source: Path) -> Iterator[sqlite3.Connection]:
    """A read connection to the gate database at ``source`` in one snapshot, while this
    process holds its lock (as a gate does: none can start on it meanwhile)."""
    if not source.is_file():
        raise MoveError("--from", f"no database file at {source}")
    try:
        fd = connection.lock(source)
    except Unavailable as exc:
        raise MoveError("--from", exc.message) from None
    except OSError as exc:
        raise MoveError("--from", f"cannot lock {source}: {exc.strerror or exc}") from None
    try:
        try:
            lite = readonly.connect_file(source)
            version = int(lite.execute("PRAGMA user_version").fetchone()[0])
        except (Unavailable, sqlite3.Error) as exc:
            text = exc.message if isinstance(exc, Unavailable) else str(exc)
            raise MoveError("--from", f"cannot read {source}: {text}") from None
        try:
            if version < 1 or not readonly.has_table(lite, "audit_log"):
                raise MoveError("--from", f"{source} is not a hitl-gate database")
            if version > SCHEMA_VERSION:
                raise MoveError(
                    "--from",
                    f"{source} has schema {version}, newer than this gate ({SCHEMA_VERSION})",
                )
            lite.execute("BEGIN")
            yield lite
        finally:
            lite.close()
    finally:
        connection.release(fd)


def _source_tables(lite: sqlite3.Connection) -> list[tuple[str, list[str]]]:
    """The source's tables in creation order (a table before the ones that refer to it),
    each with its columns; SQLite's own tables left out."""
    names = [
        str(row[0])
        for row in lite.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'"
            " AND name NOT LIKE 'sqlite%' ORDER BY rowid"
        )
    ]
    return [
        (name, [str(c[1]) for c in lite.execute(f"PRAGMA table_info({name})")]) for name in names
    ]


def _gate_tables(source: list[str]) -> list[str]:
    """The source's tables, then every other table of the gate's PostgreSQL schema (those
    of PostgreSQL alone, those a schema newer than the source's has): a row in any of them
    is refused. ``audit_head`` always has its row (``_refuse_head`` checks its seq)."""
    created = [
        name
        for step in PG_MIGRATIONS.values()
        for sql in step
        for name in re.findall(r"CREATE TABLE (\w+)", sql)
    ]
    return [name for name in dict.fromkeys([*source, *created]) if name != "audit_head"]


def _refuse_rows(conn: Any, tables: list[str]) -> None:
    """MoveError naming the first of ``tables`` that holds a row in the target (before its
    schema is applied: any table of that name counts); a row in a table of PostgreSQL alone
    (``CLUSTER_TABLES``) says gates run or have run there."""
    for table in tables:
        (there,) = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{table}"',)).fetchone()
        if not there or not conn.execute(f'SELECT EXISTS (SELECT 1 FROM "{table}")').fetchone()[0]:
            continue
        if table in CLUSTER_TABLES:
            raise _gates_ran(f"table {table} has rows")
        raise MoveError(
            "--to",
            f"the database is not empty: table {table} has rows (the move copies into"
            " an empty database only; nothing was written)",
        )


def _refuse_head(conn: Any) -> None:
    """MoveError when the target's audit head is past 0 (a gate appended there, even if
    its rows are gone); call under the head's lock, after ``_migrate``."""
    (seq,) = conn.execute("SELECT seq FROM audit_head WHERE id = 1").fetchone() or (0,)
    if seq:
        raise _gates_ran(f"its audit head is at entry {seq}")


def _gates_ran(reason: str) -> MoveError:
    return MoveError(
        "--to",
        f"gates run or have run on this database: {reason} (the move copies into a database"
        " no gate has used; nothing was written)",
    )


def _migrate(conn: Any) -> None:
    """Apply the gate's schema (``pg_schema.migrate``); MoveError for a database newer than
    this gate, or one whose tables clash with it."""
    psycopg = pg_read.driver()
    try:
        with conn.transaction():  # a savepoint: the error is reported, not the aborted block
            migrate(conn)
    except SchemaTooNew as exc:
        raise MoveError("--to", str(exc)) from None
    except psycopg.Error as exc:
        raise MoveError("--to", f"cannot apply the gate's schema: {_primary(exc)}") from None


def _column_types(conn: Any, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s",
        (table,),
    ).fetchall()
    return {str(name): str(kind) for name, kind in rows}


def _copy(lite: sqlite3.Connection, conn: Any, table: str, columns: list[str]) -> int:
    """COPY every row of ``table`` (``columns``, all of which the target has) from the
    source into the target; returns the rows copied, checked against the target's count."""
    types = _column_types(conn, table)
    missing = [c for c in columns if c not in types]
    if not types or missing:
        what = f"column {table}.{missing[0]}" if types else f"table {table}"
        raise MoveError("--to", f"the database's schema has no {what}")
    kinds = [_TAKES.get(types[c], (str,)) for c in columns]
    names = ", ".join(f'"{c}"' for c in columns)
    rows = 0
    with conn.cursor().copy(f'COPY "{table}" ({names}) FROM STDIN') as copy:
        cursor = lite.execute(f"SELECT {names} FROM {table} ORDER BY rowid")
        while chunk := _fetched(cursor, table, rows):
            for row in chunk:
                rows += 1
                _check_row(table, columns, kinds, rows, row)
                copy.write_row(row)
    (count,) = conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
    if count != rows:
        raise MoveError(None, f"table {table}: {rows} rows read, {count} written")
    return rows


def _fetched(cursor: sqlite3.Cursor, table: str, done: int) -> list[Any]:
    """The next CHUNK rows of ``cursor``; MoveError naming ``table`` and the column when
    the source cannot give one (a text that is not UTF-8: its value is not shown, it may
    be a draft)."""
    try:
        return cursor.fetchmany(CHUNK)
    except sqlite3.Error as exc:
        column = re.search(r"column '(\w+)'", str(exc))
        what = f"{table}.{column.group(1)}" if column else f"table {table}"
        why = "holds text that is not UTF-8" if column else f"cannot be read ({type(exc).__name__})"
        raise MoveError(None, f"{what} {why} (in rows {done + 1} to {done + CHUNK})") from None


def _check_row(
    table: str, columns: list[str], kinds: list[tuple[type, ...]], number: int, row: Any
) -> None:
    """MoveError unless every value of ``row`` goes into its column unchanged."""
    for column, takes, value in zip(columns, kinds, row, strict=True):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, takes):
            held = "a BLOB" if isinstance(value, bytes) else f"a {type(value).__name__} value"
            raise MoveError(
                None,
                f"{table}.{column} of row {number} holds {held}, which its PostgreSQL column"
                " cannot hold unchanged",
            )
        if isinstance(value, str) and "\x00" in value:
            raise MoveError(
                None,
                f"{table}.{column} of row {number} holds U+0000, which PostgreSQL text cannot hold",
            )


def _set_identities(conn: Any, tables: list[str]) -> None:
    """Set each identity column's sequence of ``tables`` past its highest copied id (the
    next row the gate inserts gets the next id)."""
    rows = conn.execute(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND is_identity = 'YES'"
    ).fetchall()
    for table, column in rows:
        if table not in tables:
            continue
        conn.execute(
            f'SELECT setval(pg_get_serial_sequence(%s, %s), coalesce(max("{column}"), 1),'
            f' max("{column}") IS NOT NULL) FROM "{table}"',
            (f'"{table}"', column),
        )
