"""Read the questions' rows for ``audit verify -c`` and ``doctor``, read-only: the
records the audit check compares with the log, the newest receipt stored with a question, and
the pending questions whose dispatch the question relay never acked."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gate.audit import chain as audit
from gate.audit.question_entries import QUESTION_KINDS
from gate.audit.question_records import QuestionRecord
from gate.errors import Unavailable
from gate.store import readonly
from gate.store.auditlog import _audit_query, _grouped

_QUESTIONS = (
    "SELECT question_id, pipeline, step, version, state, outcome, expires_at, scope,"
    " requested_by_id, answer, answered_by, answer_version, receipt, answer_identity,"
    " answer_salt FROM questions"
    " ORDER BY question_id"
)
_QUESTION_COLUMNS = (
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
)
_VERSIONS = (
    "SELECT question_id, version, question, request_hash, nonce FROM question_versions"
    " ORDER BY question_id, version"
)
_OUTBOX = (
    "SELECT question_id, version, attempts, delivered_at FROM question_outbox"
    " ORDER BY question_id, version"
)
# the audit_log.kind filter of the questions' entries (and, negated, of the approvals')
KINDS_SQL = "(" + ", ".join(f"'{kind}'" for kind in QUESTION_KINDS) + ")"


def _has_questions(conn: sqlite3.Connection) -> bool:
    return (
        conn.execute(
            "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'questions'"
        ).fetchone()
        is not None
    )


def question_records(path: Path) -> Iterator[QuestionRecord]:
    """Yield every question named by the questions tables or by a question entry of the
    audit log of the database at ``path``, in question_id order, with its versions, outbox
    rows and audit rows, all in one snapshot (a running gate may keep writing). Streams
    (memory grows with one question). Yields nothing for a database without the questions
    tables (schema < 5) or without an audit log. Raises Unavailable when it cannot be read."""
    sql = _audit_query(readonly.connect(path))
    if sql is None:
        return
    conn = readonly.connect(path)
    try:
        conn.execute("BEGIN")  # one snapshot for the four cursors
        if not _has_questions(conn):
            conn.execute("COMMIT")
            return
        questions, versions, outbox = (
            _grouped(conn.execute(q)) for q in (_QUESTIONS, _VERSIONS, _OUTBOX)
        )
        entries = _grouped(
            conn.execute(
                sql.replace(
                    "FROM audit_log ORDER BY seq",
                    f"FROM audit_log WHERE approval_id IS NOT NULL AND kind IN {KINDS_SQL}"
                    " ORDER BY approval_id, seq",
                )
            ),
            1,
        )
        streams = (questions, versions, entries, outbox)
        heads: list[Any] = [next(s, None) for s in streams]
        while any(head is not None for head in heads):
            question_id = min(head[0] for head in heads if head is not None)
            parts: list[list[Any]] = []
            for index, head in enumerate(heads):
                if head is not None and head[0] == question_id:
                    parts.append(head[1])
                    heads[index] = next(streams[index], None)
                else:
                    parts.append([])
            rows, vers, logged, sent = parts
            yield QuestionRecord(
                question_id,
                dict(zip(_QUESTION_COLUMNS, rows[0], strict=True)) if rows else None,
                [(v[1], v[2], v[3], v[4]) for v in vers],  # as stored
                [audit.AuditRow(*row) for row in logged],
                [(o[1], o[2], o[3]) for o in sent],
            )
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc
    finally:
        conn.close()


def latest_stored_receipt(path: Path) -> tuple[str, dict[str, Any]] | None:
    """``(question_id, receipt)`` of the resolved question whose stored resolution receipt
    has the highest audit seq, or None (no such question, or no questions table), read-only:
    ``audit verify -c`` expects the log to hold it, as for approvals
    (``gate.store.inspection.latest_stored_receipt``). Raises Unavailable on a read error."""
    conn = readonly.connect(path)
    try:
        if not _has_questions(conn):
            return None
        row = conn.execute(
            "SELECT question_id, receipt FROM questions WHERE receipt IS NOT NULL"
            " ORDER BY json_extract(receipt, '$.seq') DESC LIMIT 1"
        ).fetchone()
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"cannot read database {path}: {exc}") from exc
    finally:
        conn.close()
    if row is None:
        return None
    try:
        receipt = json.loads(row[1])
    except ValueError:
        receipt = {}
    return str(row[0]), receipt if isinstance(receipt, dict) else {}


def undelivered_dispatches(path: Path) -> tuple[int, str | None]:
    """``(pending questions whose current version's dispatch was attempted and never acked,
    the last error of the most recently attempted one)``, read-only; ``(0, None)`` when
    there are none or no questions tables. Raises Unavailable on a read error."""
    where = (
        " FROM question_outbox o JOIN questions q ON q.question_id = o.question_id"
        " WHERE q.state = 'pending' AND o.version = q.version AND o.delivered_at IS NULL"
        " AND o.attempts > 0"
    )
    conn = readonly.connect(path)
    try:
        if not _has_questions(conn):
            return 0, None
        (count,) = conn.execute("SELECT count(*)" + where).fetchone()
        row = conn.execute(
            "SELECT o.last_error" + where + " ORDER BY o.next_attempt_at DESC LIMIT 1"
        ).fetchone()
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"cannot read database {path}: {exc}") from exc
    finally:
        conn.close()
    return int(count), None if row is None else row[0]
