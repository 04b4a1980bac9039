"""The SQL of questions (migration 5): the ``questions`` and ``question_versions`` tables.
``QUESTIONS`` names them for the reads and statements every kind shares
(``gate.store.requests``); what only questions have is here: the loader, versions and the
winning answer. Values go in and come out as plain Python (JSON text is made by the caller);
loads return ``gate.model.Question``.
"""

from __future__ import annotations

import json
import sqlite3

from gate.model import DueQuestion, Question, QuestionAnswer, QuestionVersion, field_values
from gate.store.requests import RequestStatements, RequestTables, request_row

# the columns of the model's fields (``gate.model.Question``), named alike, and its answer's
_COLUMNS = (
    *("question_id", "run_id", "pipeline", "step", "risk", "scope", "version", "state"),
    *("outcome", "created_at", "expires_at", "resolved_at", "idempotency_key"),
    *("request_body_hash", "requested_by", "requested_by_id", "receipt", "answer_salt"),
)
_ANSWER = (
    *("answer", "answered_by", "answer_identity", "answer_display", "answer_channel"),
    *("answer_version", "answered_at", "answer_recorded_at"),
)
_VERSIONS_SQL = (
    "SELECT version, question, request_hash, nonce, created_at FROM question_versions"
    " WHERE question_id = ? ORDER BY version"
)
_ANSWER_VALUES = field_values(QuestionAnswer)


def load(
    conn: sqlite3.Connection, question_id: str, outbox: bool = True, created: bool = True
) -> Question | None:
    """The question with its versions, (unless ``outbox`` is False) its outbox rows and
    (unless ``created`` is False) the receipt of its ``question_created`` entry; None when
    there is no such question."""
    values = request_row(conn, QUESTIONS, _COLUMNS + _ANSWER, question_id, outbox, created)
    if values is None:
        return None
    value, by, identity, display, channel, version, decided, recorded = map(values.pop, _ANSWER)
    answer = None
    if value is not None:
        answer = QuestionAnswer(
            json.loads(value),
            int(by),
            identity,
            display,
            channel,
            int(version),
            decided,
            int(recorded),
        )
    resolved_at = values["resolved_at"]
    values.update(
        version=int(values["version"]),
        created_at=int(values["created_at"]),
        expires_at=int(values["expires_at"]),
        resolved_at=None if resolved_at is None else int(resolved_at),
        answer=answer,
        versions=tuple(
            QuestionVersion(int(v), json.loads(text), digest, nonce, int(at))
            for v, text, digest, nonce, at in conn.execute(_VERSIONS_SQL, (question_id,))
        ),
    )
    return Question(**values)


QUESTIONS: RequestTables[Question, DueQuestion] = RequestTables(
    table="questions",
    id="question_id",
    version="version",
    versions="question_versions",
    version_hash="request_hash",
    request_hash="request_body_hash",
    outbox="question_outbox",
    created="question_created",
    json_columns=("scope",),
    permit=False,
    due_extra=(),
    due_row=DueQuestion,
    load=load,
)


class QuestionStatements(RequestStatements[Question, DueQuestion]):
    """The statements of a write transaction about questions (``WriteTx.questions``): the
    ones every kind shares, and these."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn, QUESTIONS)

    def insert_version(
        self,
        question_id: str,
        version: int,
        question_json: str,
        request_hash: str,
        nonce: str,
        created_at: int,
    ) -> None:
        """Insert version ``version`` (its JSON in the order given, hash and nonce) and make
        it current; its dispatch is queued apart (``gate.store.outbox``)."""
        self._conn.execute(
            "INSERT INTO question_versions (question_id, version, question, request_hash, nonce,"
            " created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (question_id, version, question_json, request_hash, nonce, created_at),
        )
        self.set_version(question_id, version)

    def record_answer(self, question_id: str, answer_json: str, answer: QuestionAnswer) -> bool:
        """Store the winning answer (``answer_json`` the canonical JSON of its value) on a
        pending question; False (nothing changed) when it is no longer pending or answered."""
        cur = self._conn.execute(
            "UPDATE questions SET answer = ?, answered_by = ?, answer_identity = ?,"
            " answer_display = ?, answer_channel = ?, answer_version = ?, answered_at = ?,"
            " answer_recorded_at = ? WHERE question_id = ? AND state = 'pending'"
            " AND answer IS NULL",
            # the model's fields in their order, its value as ``answer_json``
            (answer_json, *_ANSWER_VALUES(answer)[1:], question_id),
        )
        return cur.rowcount == 1
