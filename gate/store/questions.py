"""The SQL of questions (migration 5): the ``questions``, ``question_versions`` and
``question_outbox`` tables. The only place that speaks SQL about questions.

Plain functions over a connection, used by the writer through ``QuestionStatements`` (mixed
into ``gate.store.tx.WriteTx``) and by the reads (``gate.store.reads.Reads``). Values go in
and come out as plain Python (JSON text is made by the caller); loads return
``gate.model.Question``.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from gate.audit import chain as audit
from gate.audit.receipts import receipt_object
from gate.model import Dispatch, DueQuestion, Question, QuestionAnswer, QuestionVersion

_QUESTION_SQL = (
    "SELECT question_id, run_id, pipeline, step, risk, scope, version, state, outcome,"
    " created_at, expires_at, resolved_at, idempotency_key, request_body_hash, requested_by,"
    " requested_by_id, answer, answered_by, answer_identity, answer_display, answer_channel,"
    " answer_version, answered_at, answer_recorded_at, receipt, answer_salt FROM questions"
    " WHERE question_id = ?"
)
_VERSIONS_SQL = (
    "SELECT version, question, request_hash, nonce, created_at FROM question_versions"
    " WHERE question_id = ? ORDER BY version"
)
_OUTBOX_SQL = (
    "SELECT version, attempts, next_attempt_at, delivered_at, last_error FROM question_outbox"
    " WHERE question_id = ? ORDER BY version"
)
_CREATED_SQL = (
    "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id, signature"
    " FROM audit_log INDEXED BY audit_log_question_created"
    " WHERE approval_id = ? AND kind = 'question_created' ORDER BY seq LIMIT 1"
)
_DUE_DISPATCHES = """
    SELECT o.question_id, o.version, o.attempts, o.next_attempt_at
    FROM question_outbox o INDEXED BY question_outbox_due
    JOIN questions q ON q.question_id = o.question_id
    WHERE o.delivered_at IS NULL AND o.next_attempt_at <= ?
      AND q.state = 'pending' AND q.version = o.version
    ORDER BY o.next_attempt_at LIMIT ?"""
_NEXT_DISPATCH = """
    SELECT o.next_attempt_at FROM question_outbox o INDEXED BY question_outbox_due
    JOIN questions q ON q.question_id = o.question_id
    WHERE o.delivered_at IS NULL AND q.state = 'pending' AND q.version = o.version
    ORDER BY o.next_attempt_at LIMIT 1"""


def load(conn: sqlite3.Connection, question_id: str, outbox: bool = True) -> Question | None:
    """The question with its versions, (unless ``outbox`` is False) its outbox rows and the
    receipt of its ``question_created`` entry; None when there is no such question."""
    row = conn.execute(_QUESTION_SQL, (question_id,)).fetchone()
    if row is None:
        return None
    entry = conn.execute(_CREATED_SQL, (question_id,)).fetchone()
    answer = None
    if row[16] is not None:
        answer = QuestionAnswer(
            value=json.loads(row[16]),
            operator_id=int(row[17]),
            identity=row[18],
            display=row[19],
            channel=row[20],
            version=int(row[21]),
            decided_at=row[22],
            recorded_at=int(row[23]),
        )
    versions = tuple(
        QuestionVersion(int(v), json.loads(text), digest, nonce, int(at))
        for v, text, digest, nonce, at in conn.execute(_VERSIONS_SQL, (question_id,))
    )
    return Question(
        question_id=row[0],
        run_id=row[1],
        pipeline=row[2],
        step=row[3],
        risk=row[4],
        scope=tuple((int(op_id), str(identity)) for op_id, identity in json.loads(row[5])),
        version=int(row[6]),
        state=row[7],
        outcome=row[8],
        created_at=int(row[9]),
        expires_at=int(row[10]),
        resolved_at=None if row[11] is None else int(row[11]),
        idempotency_key=row[12],
        request_body_hash=row[13],
        requested_by=row[14],
        requested_by_id=row[15],
        answer=answer,
        receipt=json.loads(row[24]) if row[24] else None,
        versions=versions,
        outbox=tuple(Dispatch(*r) for r in conn.execute(_OUTBOX_SQL, (question_id,)))
        if outbox
        else (),
        created_receipt=receipt_object(audit.AuditRow(*entry)) if entry else None,
        answer_salt=row[25],
    )


def page(
    conn: sqlite3.Connection, state: str, pipeline: str | None, limit: int, after: str | None
) -> list[Question]:
    """Up to ``limit`` questions ordered by question_id (ULID: creation order); ``state`` is
    pending|resolved|all, ``after`` the cursor (the last question_id seen)."""
    where: list[str] = []
    args: list[Any] = []
    if state != "all":
        where.append("state = ?")
        args.append(state)
    if pipeline:
        where.append("pipeline = ?")
        args.append(pipeline)
    if after:
        where.append("question_id > ?")
        args.append(after)
    sql = "SELECT question_id FROM questions"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY question_id LIMIT ?"
    args.append(limit)
    ids = [row[0] for row in conn.execute(sql, args).fetchall()]
    return [q for q in (load(conn, i) for i in ids) if q is not None]


def next_expiry(conn: sqlite3.Connection) -> int | None:
    """The earliest ``expires_at`` (unix ms) of a pending question, or None."""
    row = conn.execute(
        "SELECT MIN(expires_at) FROM questions INDEXED BY questions_pending_expiry"
        " WHERE state = 'pending'"
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def pending_count(conn: sqlite3.Connection) -> int:
    """How many questions are pending."""
    row = conn.execute(
        "SELECT COUNT(*) FROM questions INDEXED BY questions_pending_expiry WHERE state = 'pending'"
    ).fetchone()
    return int(row[0])


def dispatch_plan(
    conn: sqlite3.Connection, now_ms: int, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` un-acked question dispatches due at ``now_ms`` of pending questions'
    current version (``question_id, version, attempts, next_attempt_at``; earliest first)
    and the earliest ``next_attempt_at`` (unix ms) of any such row, due or not (or None)."""
    due = [dict(row) for row in conn.execute(_DUE_DISPATCHES, (now_ms, limit))]
    first = conn.execute(_NEXT_DISPATCH).fetchone()
    return due, None if first is None else int(first[0])


class QuestionStatements:
    """The question statements of ``WriteTx``."""

    _conn: sqlite3.Connection

    def load_question(self, question_id: str, outbox: bool = True) -> Question | None:
        """The question as seen inside this transaction (``load``), or None."""
        return load(self._conn, question_id, outbox)

    def question_by_idempotency_key(self, key: str) -> tuple[str, str] | None:
        """``(question_id, request_body_hash)`` of the question created with ``key``, or None."""
        row = self._conn.execute(
            "SELECT question_id, request_body_hash FROM questions WHERE idempotency_key = ?",
            (key,),
        ).fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def insert_question(self, row: dict[str, Any]) -> None:
        """Insert a questions row (``scope`` as a Python list, stored as JSON)."""
        values = dict(row)
        values["scope"] = json.dumps(values["scope"], ensure_ascii=False)
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        self._conn.execute(
            f"INSERT INTO questions ({cols}) VALUES ({marks})", tuple(values.values())
        )

    def insert_question_version(
        self,
        question_id: str,
        version: int,
        question_json: str,
        request_hash: str,
        nonce: str,
        created_at: int,
    ) -> None:
        """Insert version ``version`` (its JSON in the order given, hash and nonce), make it
        current and queue its dispatch due at ``created_at`` (unix ms)."""
        self._conn.execute(
            "INSERT INTO question_versions (question_id, version, question, request_hash, nonce,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (question_id, version, question_json, request_hash, nonce, created_at),
        )
        self._conn.execute(
            "UPDATE questions SET version = ? WHERE question_id = ?", (version, question_id)
        )
        self._conn.execute(
            "INSERT INTO question_outbox (question_id, version, next_attempt_at) VALUES (?, ?, ?)",
            (question_id, version, created_at),
        )

    def record_question_answer(
        self, question_id: str, answer_json: str, answer: QuestionAnswer
    ) -> bool:
        """Store the winning answer (``answer_json`` the canonical JSON of its value) on a
        pending question; False (nothing changed) when it is no longer pending or answered."""
        cur = self._conn.execute(
            "UPDATE questions SET answer = ?, answered_by = ?, answer_identity = ?,"
            " answer_display = ?, answer_channel = ?, answer_version = ?, answered_at = ?,"
            " answer_recorded_at = ? WHERE question_id = ? AND state = 'pending'"
            " AND answer IS NULL",
            (
                answer_json,
                answer.operator_id,
                answer.identity,
                answer.display,
                answer.channel,
                answer.version,
                answer.decided_at,
                answer.recorded_at,
                question_id,
            ),
        )
        return cur.rowcount == 1

    def resolve_question(
        self, question_id: str, outcome: str, at_ms: int, receipt: dict[str, Any]
    ) -> bool:
        """Mark a pending question resolved with ``outcome`` at ``at_ms`` (unix ms) and the
        ``question_resolved`` entry's ``receipt``; False (nothing changed) if not pending."""
        cur = self._conn.execute(
            "UPDATE questions SET state = 'resolved', outcome = ?, resolved_at = ?, receipt = ?"
            " WHERE question_id = ? AND state = 'pending'",
            (outcome, at_ms, json.dumps(receipt), question_id),
        )
        return cur.rowcount == 1

    def due_questions(self, now_ms: int, limit: int) -> list[DueQuestion]:
        """Pending questions with ``expires_at <= now_ms`` (unix ms), oldest deadline first,
        at most ``limit``, with their current version's request hash."""
        rows = self._conn.execute(
            "SELECT q.question_id, q.version, v.request_hash"
            " FROM questions q INDEXED BY questions_pending_expiry JOIN question_versions v"
            " ON v.question_id = q.question_id AND v.version = q.version"
            " WHERE q.state = 'pending' AND q.expires_at <= ?"
            " ORDER BY q.expires_at LIMIT ?",
            (now_ms, limit),
        ).fetchall()
        return [DueQuestion(str(i), int(v), str(h)) for i, v, h in rows]

    def question_dispatch_attempted(
        self,
        question_id: str,
        version: int,
        *,
        delivered_at: int | None,
        next_attempt_at: int,
        error: str | None,
    ) -> int:
        """Count one dispatch attempt of ``version``: its ack time or next attempt and last
        error. Returns the attempts so far; -1 when the row is acked already (unchanged)."""
        cur = self._conn.execute(
            "UPDATE question_outbox SET attempts = attempts + 1, delivered_at = ?,"
            " next_attempt_at = ?, last_error = ? WHERE question_id = ? AND version = ?"
            " AND delivered_at IS NULL",
            (delivered_at, next_attempt_at, error, question_id, version),
        )
        if cur.rowcount != 1:
            return -1
        row = self._conn.execute(
            "SELECT attempts FROM question_outbox WHERE question_id = ? AND version = ?",
            (question_id, version),
        ).fetchone()
        return int(row[0])
