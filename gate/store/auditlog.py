"""Stream a database's audit log for ``audit verify``/``export``: no lock, constant memory
(``gate.store.readonly`` connections)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gate.audit import chain as audit
from gate.audit.question_entries import QUESTION_KINDS
from gate.audit.records import ApprovalRecord
from gate.errors import Unavailable
from gate.store import readonly
from gate.store.schema import SCHEMA_VERSION

CHUNK = 1000


class DatabaseRows:
    """The audit rows of a database, read lazily in ascending seq (constant memory).

    Each iteration opens its own connection (no lock: a running gate may keep writing)
    and streams one query. Iterate as often as needed (``verify``, then
    ``gate.audit.receipts.check_receipt``).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._sql = _audit_query(self._connect())

    def _connect(self) -> sqlite3.Connection:
        return _connect(self.path)

    def __iter__(self) -> Iterator[audit.AuditRow]:
        if self._sql is None:
            return
        conn = self._connect()
        try:
            cursor = conn.execute(self._sql)
            while True:
                chunk = cursor.fetchmany(CHUNK)
                if not chunk:
                    return
                for row in chunk:
                    yield audit.AuditRow(*row)
        except sqlite3.Error as exc:
            raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc
        finally:
            conn.close()


def seq_bounds(path: Path) -> tuple[int, int] | None:
    """Return ``(lowest, highest)`` audit seq of the database at ``path``, or None when it
    has no audit entry. Raises Unavailable when it cannot be read."""
    if _audit_query(_connect(path)) is None:
        return None
    conn = _connect(path)
    try:
        low, high = conn.execute("SELECT min(seq), max(seq) FROM audit_log").fetchone()
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc
    finally:
        conn.close()
    return None if high is None else (int(low), int(high))


def read_range(path: Path, low: int, high: int) -> Iterator[tuple[Any, ...]]:
    """Yield the audit rows with ``low <= seq <= high``, ascending, as tuples ``(seq,
    approval_id, kind, entry, prev_hash, entry_hash, receipt)`` (constant memory, own
    connection: one ``audit verify`` worker each). Raises Unavailable on a read error."""
    conn = _connect(path)
    try:
        cursor = conn.execute(
            "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt FROM audit_log"
            " WHERE seq BETWEEN ? AND ? ORDER BY seq",
            (low, high),
        )
        while True:
            chunk = cursor.fetchmany(CHUNK)
            if not chunk:
                return
            yield from chunk
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc
    finally:
        conn.close()


def _connect(path: Path) -> sqlite3.Connection:
    return readonly.connect(path)


def _audit_query(conn: sqlite3.Connection) -> str | None:
    """Return the query listing the audit rows (unsigned columns as NULL in a database from
    before signing), or None when the database has no audit log yet. Closes ``conn``."""
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise Unavailable(
                "storage_unavailable",
                f"database schema {version} is newer than this gate ({SCHEMA_VERSION})",
            )
        if not conn.execute("PRAGMA table_info(audit_log)").fetchone():
            return None
        return f"SELECT {readonly.audit_columns(conn)} FROM audit_log ORDER BY seq"
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"cannot read database: {exc}") from exc
    finally:
        conn.close()


_RECORD_QUERIES = (
    "SELECT approval_id, pipeline, step, quorum_required, revision, state, outcome, expires_at,"
    " receipt, scope, approver_signature FROM approvals ORDER BY approval_id",
    "SELECT approval_id, revision, body, payload_hash FROM revisions"
    " ORDER BY approval_id, revision",
    "SELECT approval_id, revision, operator_id, decision, payload_hash, reason, on_behalf_of,"
    " credential_id FROM decisions ORDER BY approval_id, revision, operator_id",
    "SELECT approval_id, revision, attempts, delivered_at FROM outbox"
    " ORDER BY approval_id, revision",
)
_APPROVAL_COLUMNS = (
    "approval_id",
    "pipeline",
    "step",
    "quorum_required",
    "revision",
    "state",
    "outcome",
    "expires_at",
    "receipt",
    "scope",
    "approver_signature",
)
# a question's entries carry its question_id in audit_log.approval_id: they are
# checked with the questions' rows (gate.store.question_audit), not as an approval's
_NOT_QUESTIONS = "kind NOT IN (" + ", ".join(f"'{kind}'" for kind in QUESTION_KINDS) + ")"


def approval_records(path: Path) -> Iterator[ApprovalRecord]:
    """Yield every approval named by the approvals table or the audit log (a question's
    entries aside) of the database at ``path``, in approval_id order, with its
    revisions, decisions, outbox rows and audit rows, all read in one snapshot (one read
    transaction: a running gate may keep writing). Streams: memory grows with one
    approval, not the database (SQLite sorts the log by approval).
    Raises Unavailable when it cannot be read; yields nothing for a database without
    tables yet."""
    sql = _audit_query(_connect(path))
    if sql is None:
        return
    conn = _connect(path)
    try:
        conn.execute("BEGIN")  # one snapshot for the five cursors
        approvals, revisions, decisions, outbox = (
            _grouped(conn.execute(_for_schema(conn, q))) for q in _RECORD_QUERIES
        )
        entries = _grouped(
            conn.execute(
                sql.replace(
                    "FROM audit_log ORDER BY seq",
                    f"FROM audit_log WHERE approval_id IS NOT NULL AND {_NOT_QUESTIONS}"
                    " ORDER BY approval_id, seq",
                )
            ),
            1,
        )
        streams = (approvals, revisions, decisions, entries, outbox)
        heads: list[Any] = [next(s, None) for s in streams]
        while any(head is not None for head in heads):
            approval_id = min(head[0] for head in heads if head is not None)
            parts: list[list[Any]] = []
            for index, head in enumerate(heads):
                if head is not None and head[0] == approval_id:
                    parts.append(head[1])
                    heads[index] = next(streams[index], None)
                else:
                    parts.append([])
            rows, revs, decs, logged, sent = parts
            yield ApprovalRecord(
                approval_id,
                dict(zip(_APPROVAL_COLUMNS, rows[0], strict=True)) if rows else None,
                [(r[1], r[2], r[3]) for r in revs],  # as stored: a wrong type disagrees
                [
                    (d[1], d[2], d[3], d[4])
                    + (() if d[6] is None else (d[6],))
                    + (() if d[7] is None else (("credential_id", d[7]),))
                    for d in decs
                ],
                [audit.AuditRow(*row) for row in logged],
                [(o[1], o[2], o[3]) for o in sent],
                [(d[1], d[2], d[5]) for d in decs],
            )
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc
    finally:
        conn.close()


def _for_schema(conn: sqlite3.Connection, sql: str) -> str:
    """``sql`` for this database: before migration 4 the decisions table has no
    ``reason`` and ``on_behalf_of`` columns, before migration 6 no
    ``credential_id``, before migration 7 the approvals table no ``approver_signature``:
    each read as NULL (an older schema is read as it is, not migrated).
    Raises sqlite3.Error as the connection does."""
    if " approver_signature " in sql:  # migration 7: frozen at creation
        approvals = {str(row[1]) for row in conn.execute("PRAGMA table_info(approvals)")}
        if "approver_signature" not in approvals:
            sql = sql.replace(" approver_signature ", " NULL ")
    if " on_behalf_of" not in sql:
        return sql
    columns = {str(row[1]) for row in conn.execute("PRAGMA table_info(decisions)")}
    for column in ("reason", "on_behalf_of", "credential_id"):
        if column not in columns:
            sql = sql.replace(f" {column}", " NULL")
    return sql


_NOTHING = object()  # no approval_id seen yet (a NULL one is an id here too)


def _grouped(cursor: sqlite3.Cursor, key: int = 0) -> Iterator[tuple[str, list[Any]]]:
    """``(approval_id, rows)`` runs of a cursor ordered by the approval_id in column
    ``key``."""
    current: Any = _NOTHING
    run: list[Any] = []
    while True:
        chunk = cursor.fetchmany(CHUNK)
        if not chunk:
            break
        for row in chunk:
            if row[key] != current:
                if run:
                    yield str(current), run
                current, run = row[key], []
            run.append(row)
    if run:
        yield str(current), run
