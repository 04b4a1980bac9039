"""The question kind of request (``gate.core.requests.kind.Kind``): its rows and audit
entries in the writer's transaction (``questions``, ``question_versions``,
``question_outbox``, ``question_notices``), its resolution and the question object of the
pipeline API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gate.audit.question_entries import (
    QuestionCreatedData,
    QuestionDispatchAckData,
    QuestionResolvedData,
)
from gate.audit.receipts import receipt_object
from gate.core.questions.create import QuestionRequest
from gate.core.requests.kind import Kind
from gate.core.requests.lifecycle_tx import NOTICE_GIVE_UP_MS, new_nonce
from gate.core.views import api_time, named, opening
from gate.errors import Conflict
from gate.model import DueQuestion, Question
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, request_hash
from gate.store import WriteTx
from gate.store.outbox import QUESTION_DISPATCHES, QUESTION_NOTICES
from gate.store.questions import QUESTIONS as TABLES

if TYPE_CHECKING:
    from gate.config import Config
    from gate.core.transactions import Transactions


@dataclass(frozen=True, slots=True)
class QuestionPolicy:
    """What a question needs of its step, resolved at create time: the frozen ``scope``
    (operator id, identity), ``timeout_s`` seconds and ``risk`` (its answer limits are read
    from the config in force: ``step_limits``)."""

    scope: tuple[tuple[int, str], ...]
    timeout_s: float
    risk: str


def step_limits(config: Config, question: Question) -> tuple[int, int]:
    """``(max_options, max_answer_chars)`` of the question's step in ``config`` (the one in
    force; the defaults when a reload removed the step)."""
    found = config.find_step(question.pipeline, question.step)
    if found is None:
        return 50, 2000
    return found[1].max_options, found[1].max_answer_chars


def add_version(tx: WriteTx, question_id: str, version: int, spec: QuestionSpec, now: int) -> str:
    """Insert ``spec`` as version ``version`` with a new nonce, make it current and queue its
    dispatch; return its request hash."""
    digest = request_hash(question_id, version, spec)
    # stored in the order given (a form's fields are shown in it); the hash is canonical
    text = wire_json(spec.to_json()).decode("utf-8")
    tx.questions.insert_version(question_id, version, text, digest, new_nonce(), now)
    tx.outbox.queue(QUESTION_DISPATCHES, (question_id, version), now)
    return digest


def resolve_question(
    t: Transactions,
    tx: WriteTx,
    target: DueQuestion,
    outcome: str,
    now: int,
    value_digest: str | None = None,
) -> None:
    """Resolve ``target`` (a question at its current version) with ``outcome`` at ``now``
    (unix ms): its ``question_resolved`` entry, whose receipt becomes the question's, and
    (notices on) its resolution notice queued in this transaction. Raises Conflict 409
    ``already_resolved`` when another transaction resolved it first."""
    data = QuestionResolvedData(outcome, target.version, target.request_hash, value_digest)
    row = t.audit(tx, data.kind, target.question_id, now, data.to_data())
    if not tx.questions.resolve(target.question_id, outcome, now, receipt_object(row)):
        raise Conflict("already_resolved", "question was resolved concurrently")
    if t.config.relay.question_notice_target is not None:  # the question relay is told
        notice = (target.question_id, target.version)
        tx.outbox.queue(QUESTION_NOTICES, notice, now, now + NOTICE_GIVE_UP_MS, once=True)


def insert_question(
    t: Transactions,
    tx: WriteTx,
    row: dict[str, Any],
    req: QuestionRequest,
    policy: QuestionPolicy,
    now: int,
    body_hash: str,
    digest: str | None,
) -> None:
    """The questions row, version 1 with its dispatch, the ``question_created`` entry."""
    question_id = row["question_id"]
    tx.questions.insert(
        {
            **row,
            "version": 1,
            "request_body_hash": body_hash,
            "answer_salt": new_nonce(),  # 16 random bytes, hex (value_hash's salt)
        }
    )
    created = QuestionCreatedData(
        pipeline=req.pipeline,
        step=req.step,
        version=1,
        request_hash=add_version(tx, question_id, 1, req.spec, now),
        response_type=req.spec.response_type,
        approvers=[op_id for op_id, _ in policy.scope],
        expires_at=row["expires_at"],
        requested_by=row["requested_by_id"],
    )
    t.audit(tx, created.kind, question_id, now, created.to_data())


def question_view(full: Question) -> dict[str, Any]:
    """The question object (JSON-ready; docs/openapi.yaml): the current version's
    ``question`` and ``request_hash``, the winning ``answer`` (None unless answered; its
    ``request_hash`` is that of the version answered), times as RFC 3339 UTC,
    ``dispatch`` of the current version, the ``receipt`` of the resolution and
    ``created_receipt`` of the ``question_created`` entry."""
    current = full.current
    rows = [o for o in full.outbox if o.revision == full.version]
    latest = rows[-1] if rows else None
    answer = None
    if full.answer is not None:
        won = full.answer
        answered = next((v for v in full.versions if v.version == won.version), None)
        answer = {
            **named(won, "value", "operator_id", "identity", "display", "channel", "version"),
            "request_hash": answered.request_hash if answered is not None else None,
            "decided_at": won.decided_at,
            "recorded_at": api_time(won.recorded_at),
        }
    return {
        "question_id": full.question_id,
        **opening(full),
        "approvers": [identity for _, identity in full.scope],
        "version": full.version,
        "request_hash": current.request_hash,
        "question": current.question,
        "answer": answer,
        "created_at": api_time(full.created_at),
        "expires_at": api_time(full.expires_at),
        "resolved_at": api_time(full.resolved_at),
        "requested_by": full.requested_by,
        "dispatch": {
            "attempts": int(latest.attempts) if latest else 0,
            "delivered_at": api_time(latest.delivered_at) if latest else None,
            "last_error": latest.last_error if latest else None,
        },
        "receipt": full.receipt,
        "created_receipt": full.created_receipt,
    }


QUESTIONS: Kind[Question, DueQuestion] = Kind(
    name="question",
    tables=TABLES,
    event="question_",
    already_resolved="the question is already resolved (it cannot be cancelled)",
    logger="gate.core.question_service",
    insert=insert_question,
    target=lambda full: DueQuestion(full.question_id, full.version, full.current.request_hash),
    resolve=resolve_question,
    dispatches=QUESTION_DISPATCHES,
    dispatch_ack=lambda version, attempts: QuestionDispatchAckData(version),
    notices_on=lambda config: config.relay.question_notice_target is not None,
    view=question_view,
)
"""Questions: a typed answer, first valid answer wins (``gate.core.questions.answer_tx``)."""
