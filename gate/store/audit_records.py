"""Read each kind of request's rows for ``audit verify -c`` and ``doctor``, read-only: the
records the audit check compares with the log, the newest receipt stored with a request, and
the pending requests whose dispatch the relay never acked. One set of reads serves every
kind through its ``KindTables`` (``APPROVAL_TABLES``, ``QUESTION_TABLES``): a closed set of
table and column names, never input."""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby, repeat
from typing import TYPE_CHECKING, Any, NamedTuple

from gate.audit import chain as audit
from gate.audit.approval_kind import ApprovalRecord
from gate.audit.question_entries import QUESTION_KINDS
from gate.audit.question_kind import QuestionRecord
from gate.audit.records import Record
from gate.store import readonly
from gate.store.approvals import APPROVALS
from gate.store.auditlog import audit_query, grouped
from gate.store.inspection import read_only
from gate.store.questions import QUESTIONS
from gate.store.readonly import ReadConnection, has_table, reading, table_columns
from gate.store.requests import RequestTables

if TYPE_CHECKING:
    from gate.store.readonly import Database


class Read(NamedTuple):
    """What was read of one request: its id (``key``), its ``row`` as a dict (None when
    only another table or the log names it), the rows of each ``side`` table, its audit rows
    (``entries``) and its outbox rows (``sent``), all as stored."""

    key: str
    row: dict[str, Any] | None
    side: list[list[Any]]
    entries: list[audit.AuditRow]
    sent: list[Any]


@dataclass(frozen=True, slots=True)
class KindTables:
    """Where one kind of request (a ``noun``) is stored: its ``tables`` (the store's
    ``RequestTables``: its table, id and current version columns, its dispatch table), its
    row read as ``columns``; ``side`` the queries of its other tables (key first, ordered by
    key); ``entries`` the ``audit_log.kind`` filter of its entries. ``record`` builds its
    audit record from what was ``Read``. ``optional``: a database from before its migration
    has no such tables (it then has no such records)."""

    noun: str
    tables: RequestTables[Any, Any]
    columns: tuple[str, ...]
    side: tuple[str, ...]
    entries: str
    record: Callable[[Read], Record]
    optional: bool = False


def _approval(read: Read) -> ApprovalRecord:
    revs, decs = read.side
    return ApprovalRecord(
        read.key,
        read.row,
        [(r[1], r[2], r[3]) for r in revs],  # as stored: a wrong type disagrees
        [
            (d[1], d[2], d[3], d[4])
            + (() if d[6] is None else (d[6],))
            + (() if d[7] is None else (("credential_id", d[7]),))
            for d in decs
        ],
        read.entries,
        [(o[1], o[2], o[3]) for o in read.sent],
        [(d[1], d[2], d[5]) for d in decs],
    )


def _question(read: Read) -> QuestionRecord:
    (vers,) = read.side
    return QuestionRecord(
        read.key,
        read.row,
        [(v[1], v[2], v[3], v[4]) for v in vers],  # as stored
        read.entries,
        [(o[1], o[2], o[3]) for o in read.sent],
    )


# the audit_log.kind filter of the questions' entries (and, negated, of the approvals'): a
# question's entries carry its question_id in audit_log.approval_id
_QUESTION_KINDS = "(" + ", ".join(f"'{kind}'" for kind in QUESTION_KINDS) + ")"

APPROVAL_TABLES = KindTables(
    noun="approval",
    tables=APPROVALS,
    columns=(
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
    ),
    side=(
        "SELECT approval_id, revision, body, payload_hash FROM revisions"
        " ORDER BY approval_id, revision",
        "SELECT approval_id, revision, operator_id, decision, payload_hash, reason, on_behalf_of,"
        " credential_id FROM decisions ORDER BY approval_id, revision, operator_id",
    ),
    entries=f"kind NOT IN {_QUESTION_KINDS}",
    record=_approval,
)
QUESTION_TABLES = KindTables(
    noun="question",
    tables=QUESTIONS,
    columns=(
        "question_id",
        "pipeline",
        "step",
        "version",
        "state",
        "outcome",
        "expires_at",
        "scope",
        "requested_by_id",
        "answer",
        "answered_by",
        "answer_version",
        "receipt",
        "answer_identity",
        "answer_salt",
    ),
    side=(
        "SELECT question_id, version, question, request_hash, nonce FROM question_versions"
        " ORDER BY question_id, version",
    ),
    entries=f"kind IN {_QUESTION_KINDS}",
    record=_question,
    optional=True,
)


def records_of(path: Database, kind: KindTables) -> Iterator[Record]:
    """Yield every request of ``kind`` named by its tables or by one of its entries in the
    audit log of the database at ``path``, in id order, with its other tables' rows, outbox
    rows and audit rows, all read in one snapshot (one read transaction: a running gate may
    keep writing). Streams: memory grows with one request, not the database (SQLite sorts
    the log by request). Yields nothing for a database without an audit log or (an
    ``optional`` kind) without the kind's tables. Raises Unavailable when it cannot be read."""
    sql = audit_query(readonly.connect(path))
    if sql is None:
        return
    tables = kind.tables
    with reading(path) as conn:
        conn.execute("BEGIN")  # one snapshot for every cursor
        if kind.optional and not has_table(conn, tables.table):
            conn.execute("COMMIT")
            return
        queries = (
            f"SELECT {', '.join(kind.columns)} FROM {tables.table} ORDER BY {tables.id}",
            *kind.side,
            f"SELECT {tables.id}, {tables.version}, attempts, delivered_at FROM {tables.outbox}"
            f" ORDER BY {tables.id}, {tables.version}",
        )
        streams = [grouped(conn.execute(_for_schema(conn, q))) for q in queries]
        mine = f"approval_id IS NOT NULL AND {kind.entries} ORDER BY approval_id, seq"
        by_request = sql.replace("FROM audit_log ORDER BY seq", f"FROM audit_log WHERE {mine}")
        streams.append(grouped(conn.execute(by_request), 1))
        for subject_id, (rows, *side, sent, entries) in _merged(streams):
            row = dict(zip(kind.columns, rows[0], strict=True)) if rows else None
            logged = [audit.AuditRow(*r) for r in entries]
            yield kind.record(Read(subject_id, row, side, logged, sent))
        conn.execute("COMMIT")


def _merged(
    streams: list[Iterator[tuple[str, list[Any]]]],
) -> Iterator[tuple[str, list[list[Any]]]]:
    """``(id, runs)`` for every id of the ``grouped`` ``streams`` (each ordered by id), in id
    order: ``runs`` holds each stream's rows of that id (``[]`` where it has none)."""
    tagged = heapq.merge(*(zip(s, repeat(i)) for i, s in enumerate(streams)), key=_subject)
    for subject_id, group in groupby(tagged, key=_subject):
        runs: list[list[Any]] = [[] for _ in streams]
        for (_, rows), index in group:
            runs[index] = rows
        yield subject_id, runs


def _subject(tagged: tuple[tuple[str, list[Any]], int]) -> str:
    return tagged[0][0]


def latest_stored_receipt(path: Database, kind: KindTables) -> tuple[str, dict[str, Any]] | None:
    """``(id, receipt)`` of the resolved request of ``kind`` whose stored resolution receipt
    has the highest audit seq, or None when none holds one (or there is no such table),
    read-only. ``audit verify -c`` and ``doctor`` expect the log to hold it, so a deleted
    tail is caught without a receipt kept elsewhere. Raises Unavailable on a read error."""
    tables = kind.tables
    with read_only(path) as conn:
        if not has_table(conn, tables.table):
            return None
        row = conn.execute(
            f"SELECT {tables.id}, receipt FROM {tables.table} WHERE receipt IS NOT NULL"
            " ORDER BY json_extract(receipt, '$.seq') DESC LIMIT 1"
        ).fetchone()
    if row is None:
        return None
    try:
        receipt = json.loads(row[1])
    except ValueError:
        receipt = {}
    return str(row[0]), receipt if isinstance(receipt, dict) else {}


def undelivered_dispatches(path: Database, kind: KindTables) -> tuple[int, str | None]:
    """``(pending requests of kind whose current version's dispatch was attempted and never
    acked, the last error of the most recently attempted one)`` of the database at
    ``path``, read-only; ``(0, None)`` when there are none (or no tables yet). Raises
    Unavailable on a read error."""
    tables = kind.tables
    where = (
        f" FROM {tables.outbox} o JOIN {tables.table} r ON r.{tables.id} = o.{tables.id}"
        f" WHERE r.state = 'pending' AND o.{tables.version} = r.{tables.version}"
        " AND o.delivered_at IS NULL AND o.attempts > 0"
    )
    with read_only(path) as conn:
        if not (has_table(conn, tables.outbox) and has_table(conn, tables.table)):
            return 0, None
        (count,) = conn.execute("SELECT count(*)" + where).fetchone()
        row = conn.execute(
            "SELECT o.last_error" + where + " ORDER BY o.next_attempt_at DESC LIMIT 1"
        ).fetchone()
    return int(count), None if row is None else row[0]


def _for_schema(conn: ReadConnection, sql: str) -> str:
    """``sql`` for this database: before migration 4 the decisions table has no
    ``reason`` and ``on_behalf_of`` columns, before migration 6 no
    ``credential_id``, before migration 7 the approvals table no ``approver_signature``:
    each read as NULL (an older schema is read as it is, not migrated). Raises sqlite3.Error
    as the connection does."""
    if " approver_signature " in sql:  # migration 7: frozen at creation
        approvals = table_columns(conn, "approvals")
        if "approver_signature" not in approvals:
            sql = sql.replace(" approver_signature ", " NULL ")
    if " on_behalf_of" not in sql:
        return sql
    columns = table_columns(conn, "decisions")
    for column in ("reason", "on_behalf_of", "credential_id"):
        if column not in columns:
            sql = sql.replace(f" {column}", " NULL")
    return sql
