"""Stream a database's audit log for ``audit verify``/``export``: no lock, constant memory
(``gate.store.readonly`` connections: a SQLite file, or PostgreSQL through server-side
cursors); ``gate.store.audit_records`` reads each request's entries with its rows through
``audit_query`` and ``grouped``."""

from __future__ import annotations

import itertools
import operator
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gate.audit import chain as audit
from gate.errors import Unavailable
from gate.store import readonly
from gate.store.readonly import ReadConnection, ReadCursor, reading
from gate.store.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from gate.store.readonly import Database

CHUNK = 1000


class DatabaseRows:
    """The audit rows of a database, read lazily in ascending seq (constant memory).

    Each iteration opens its own connection (no lock: a running gate may keep writing)
    and streams one query. Iterate as often as needed (``verify``, then
    ``gate.audit.receipts.check_receipt``).
    """

    def __init__(self, path: Database) -> None:
        self.path = path
        self._sql = audit_query(readonly.connect(self.path))

    def __iter__(self) -> Iterator[audit.AuditRow]:
        if self._sql is None:
            return
        with reading(self.path) as conn:
            for row in fetched(conn.execute(self._sql)):
                yield audit.AuditRow(*row)


def seq_bounds(path: Database) -> tuple[int, int] | None:
    """Return ``(lowest, highest)`` audit seq of the database at ``path``, or None when it
    has no audit entry. Raises Unavailable when it cannot be read."""
    if audit_query(readonly.connect(path)) is None:
        return None
    with reading(path) as conn:
        low, high = conn.execute("SELECT min(seq), max(seq) FROM audit_log").fetchone()
    return None if high is None else (int(low), int(high))


def read_range(path: Database, low: int, high: int) -> Iterator[tuple[Any, ...]]:
    """Yield the audit rows with ``low <= seq <= high``, ascending, as tuples ``(seq,
    approval_id, kind, entry, prev_hash, entry_hash, receipt)`` (constant memory, own
    connection: one ``audit verify`` worker each). Raises Unavailable on a read error."""
    with reading(path) as conn:
        yield from fetched(
            conn.execute(
                "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt"
                " FROM audit_log WHERE seq BETWEEN ? AND ? ORDER BY seq",
                (low, high),
            )
        )


def fetched(cursor: ReadCursor) -> Iterator[Any]:
    """The rows of ``cursor``, fetched CHUNK at a time (constant memory)."""
    while chunk := cursor.fetchmany(CHUNK):
        yield from chunk


def audit_query(conn: ReadConnection) -> str | None:
    """Return the query listing the audit rows (unsigned columns as NULL in a database from
    before signing), or None when the database has no audit log yet. Closes ``conn``."""
    try:
        version = readonly.schema_version(conn)
        if version > SCHEMA_VERSION:
            raise Unavailable(
                "storage_unavailable",
                f"database schema {version} is newer than this gate ({SCHEMA_VERSION})",
            )
        if not readonly.has_table(conn, "audit_log"):
            return None
        return f"SELECT {readonly.audit_columns(conn)} FROM audit_log ORDER BY seq"
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"cannot read database: {exc}") from exc
    finally:
        conn.close()


def grouped(cursor: ReadCursor, key: int = 0) -> Iterator[tuple[str, list[Any]]]:
    """``(id, rows)`` runs of a cursor ordered by the request id (an approval_id or a
    question_id) in column ``key``, read CHUNK rows at a time."""
    for request_id, run in itertools.groupby(fetched(cursor), key=operator.itemgetter(key)):
        yield str(request_id), list(run)
