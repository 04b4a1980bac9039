"""The questions' write transactions but the answer: create (idempotent), revise,
cancel, expire and dispatch bookkeeping. Run on the store's writer with the state
``Transactions`` owns (``t``); registered in ``transactions.TABLE``. The answer's checks:
``question_answer_tx``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ulid import ULID

from gate.audit.question_entries import (
    QuestionCreatedData,
    QuestionDispatchAckData,
    QuestionResolvedData,
    QuestionRevisedData,
)
from gate.audit.receipts import receipt_object
from gate.core.decide_tx import new_nonce
from gate.core.question_requests import QuestionRequest, parse_spec, revised_fields
from gate.core.resolve_tx import NOTICE_GIVE_UP_MS
from gate.errors import Conflict, NotFound
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, request_hash
from gate.store import WriteTx
from gate.store.outbox import QUESTION_DISPATCHES, QUESTION_NOTICES

if TYPE_CHECKING:
    from gate.core.transactions import Transactions

EXPIRE_BATCH = 500  # questions resolved ``timeout`` per transaction
MAX_VERSIONS = 20
"""A question has at most this many versions: a revise past it is 409 ``too_many_versions``
(every load reads every version; review finding 4)."""


@dataclass(frozen=True, slots=True)
class QuestionPolicy:
    """What a question needs of its step, resolved at create time: the frozen ``scope``
    (operator id, identity), ``timeout_s`` seconds, ``risk``, ``max_answer_chars``."""

    scope: tuple[tuple[int, str], ...]
    timeout_s: float
    risk: str
    max_answer_chars: int


def _unknown() -> NotFound:
    return NotFound("unknown_question", "no question with this question_id")


def load_question(tx: WriteTx, question_id: str) -> Question:
    """The question ``question_id`` with its versions; raises NotFound 404
    ``unknown_question``."""
    found = tx.questions.load(question_id)
    if found is None:
        raise _unknown()
    return found


def _add_version(tx: WriteTx, question_id: str, version: int, spec: QuestionSpec, now: int) -> str:
    digest = request_hash(question_id, version, spec)
    # stored in the order given (a form's fields are shown in it); the hash is canonical
    text = wire_json(spec.to_json()).decode("utf-8")
    tx.questions.insert_version(question_id, version, text, digest, new_nonce(), now)
    tx.outbox.queue(QUESTION_DISPATCHES, (question_id, version), now)
    return digest


def create_question(
    t: Transactions,
    tx: WriteTx,
    req: QuestionRequest,
    idempotency_key: str | None,
    requester: tuple[int, str] | None,
    policy: QuestionPolicy,
) -> tuple[Question, bool]:
    """Insert the question, its version 1, its dispatch and its ``question_created`` entry.
    Returns ``(loaded question, created)``; ``created`` is False for an Idempotency-Key seen
    with the same body. Raises Conflict 409 ``idempotency_key_reused`` for another body."""
    body_hash = req.body_hash()
    if idempotency_key is not None:
        seen = tx.questions.by_idempotency_key(idempotency_key)
        if seen is not None:
            if seen[1] != body_hash:
                raise Conflict(
                    "idempotency_key_reused",
                    "Idempotency-Key was used before with a different body",
                )
            return load_question(tx, seen[0]), False
    now = t.clock.now_ms()
    question_id = str(ULID())
    expires_at = now + int(policy.timeout_s * 1000)
    tx.questions.insert(
        {
            "question_id": question_id,
            "run_id": req.run_id or str(ULID()),
            "pipeline": req.pipeline,
            "step": req.step,
            "risk": policy.risk,
            "scope": [list(pair) for pair in policy.scope],
            "version": 1,
            "state": "pending",
            "created_at": now,
            "expires_at": expires_at,
            "idempotency_key": idempotency_key,
            "request_body_hash": body_hash,
            "requested_by": requester[1] if requester else None,
            "requested_by_id": requester[0] if requester else None,
            "answer_salt": new_nonce(),  # 16 random bytes, hex (value_hash's salt)
        }
    )
    digest = _add_version(tx, question_id, 1, req.spec, now)
    created = QuestionCreatedData(
        pipeline=req.pipeline,
        step=req.step,
        version=1,
        request_hash=digest,
        response_type=req.spec.response_type,
        approvers=[op_id for op_id, _ in policy.scope],
        expires_at=expires_at,
        requested_by=requester[0] if requester else None,
    )
    t.audit(tx, created.kind, question_id, now, created.to_data())
    return load_question(tx, question_id), True


def _check_pending(question: Question, what: str) -> None:
    """Conflict 409 ``already_resolved`` (+ outcome) for a resolved question; ``what`` says
    what cannot be done."""
    if question.state == "resolved":
        raise Conflict(
            "already_resolved",
            f"the question is already resolved ({what})",
            extra={"outcome": question.outcome},
        )


def _step_limits(t: Transactions, question: Question) -> tuple[int, int]:
    """``(max_options, max_answer_chars)`` of the question's step in the config in force (the
    defaults when a reload removed the step)."""
    found = t.config.find_step(question.pipeline, question.step)
    if found is None:
        return 50, 2000
    return found[1].max_options, found[1].max_answer_chars


def revise_question(
    t: Transactions, tx: WriteTx, question_id: str, body: Any
) -> tuple[str, Question]:
    """Make the current version with ``body``'s fields replaced (a decoded revise body,
    ``revised_fields``) version n+1 of a pending question, validated as at creation (new
    request hash and nonce), queue its dispatch, write ``question_revised``. The merge reads
    the current version inside this transaction, so racing revises build on each other.
    Returns ``("revised", loaded question)``, or ``("timeout", ...)`` when ``expires_at`` has
    passed (resolved ``timeout`` here, as ``cancel_question`` does). Raises NotFound 404
    ``unknown_question``, Conflict 409 ``already_resolved`` (+ outcome) or
    ``too_many_versions`` (at ``MAX_VERSIONS``), GateError 400/413 as at creation."""
    now = t.clock.now_ms()
    question = load_question(tx, question_id)
    _check_pending(question, "it cannot be revised")
    current = question.current
    if now >= question.expires_at:
        resolve_question(t, tx, question_id, current.version, current.request_hash, "timeout", now)
        return "timeout", load_question(tx, question_id)
    if question.version >= MAX_VERSIONS:
        message = f"the question has {MAX_VERSIONS} versions, the most it may have"
        raise Conflict("too_many_versions", message, extra={"message": message})
    max_options, max_answer_chars = _step_limits(t, question)
    spec = parse_spec(
        revised_fields(QuestionSpec.from_json(current.question), body),
        max_bytes=t.config.api.max_draft_bytes,
        max_options=max_options,
        max_answer_chars=max_answer_chars,
    )
    version = question.version + 1
    digest = _add_version(tx, question_id, version, spec, now)
    revised = QuestionRevisedData(version, digest)
    t.audit(tx, revised.kind, question_id, now, revised.to_data())
    return "revised", load_question(tx, question_id)


def resolve_question(
    t: Transactions,
    tx: WriteTx,
    question_id: str,
    version: int,
    digest: str,
    outcome: str,
    now: int,
    value_digest: str | None = None,
) -> None:
    """Resolve ``question_id`` with ``outcome`` at ``now`` (unix ms): its
    ``question_resolved`` entry, whose receipt becomes the question's, and (notices on) its
    resolution notice queued in this transaction. Raises Conflict 409 ``already_resolved``
    when another transaction resolved it first."""
    data = QuestionResolvedData(outcome, version, digest, value_digest)
    row = t.audit(tx, data.kind, question_id, now, data.to_data())
    if not tx.questions.resolve(question_id, outcome, now, receipt_object(row)):
        raise Conflict("already_resolved", "question was resolved concurrently")
    if t.config.relay.question_notice_target is not None:  # A2: the question relay is told
        notice = (question_id, version)
        tx.outbox.queue(QUESTION_NOTICES, notice, now, now + NOTICE_GIVE_UP_MS, once=True)


def cancel_question(t: Transactions, tx: WriteTx, question_id: str) -> tuple[str, Question]:
    """Resolve a pending question ``cancelled`` (``timeout`` when past ``expires_at``);
    returns ``(outcome, loaded question)``. Raises NotFound 404 ``unknown_question``,
    Conflict 409 ``already_resolved`` (+ outcome)."""
    now = t.clock.now_ms()
    question = load_question(tx, question_id)
    _check_pending(question, "it cannot be cancelled")
    outcome = "timeout" if now >= question.expires_at else "cancelled"
    current = question.current
    resolve_question(t, tx, question_id, current.version, current.request_hash, outcome, now)
    return outcome, load_question(tx, question_id)


def expire_questions(t: Transactions, tx: WriteTx) -> list[str]:
    """Resolve up to ``EXPIRE_BATCH`` pending questions past ``expires_at`` as ``timeout``,
    oldest deadline first; return their ids."""
    now = t.clock.now_ms()
    due = tx.questions.due(now, EXPIRE_BATCH)
    for item in due:
        resolve_question(t, tx, item.question_id, item.version, item.request_hash, "timeout", now)
    return [item.question_id for item in due]


def question_dispatch_result(
    t: Transactions,
    tx: WriteTx,
    question_id: str,
    version: int,
    acked: bool,
    error: str | None,
    retry_at_ms: int,
) -> None:
    """Count one dispatch attempt of ``version``; the first ack writes a
    ``question_dispatch_ack`` entry, a failure sets the next attempt at ``retry_at_ms``."""
    now = t.clock.now_ms()
    key = (question_id, version)
    attempt = tx.outbox.attempted(
        QUESTION_DISPATCHES, key, now, acked=acked, error=error, retry_at_ms=retry_at_ms
    )
    if acked and attempt is not None:
        ack = QuestionDispatchAckData(version)
        t.audit(tx, ack.kind, question_id, now, ack.to_data())


def question_notice_result(
    t: Transactions,
    tx: WriteTx,
    question_id: str,
    acked: bool,
    error: str | None,
    retry_at_ms: int | None,
) -> str | None:
    """Record one attempt of a question's resolution notice (``retry_at_ms`` None: dropped
    unsent, as failed). Returns ``"delivered"``, ``"retry"``, ``"failed"`` or None."""
    attempt = tx.outbox.attempted(
        QUESTION_NOTICES,
        (question_id,),
        t.clock.now_ms(),
        acked=acked,
        error=error,
        retry_at_ms=retry_at_ms,
    )
    return None if attempt is None else attempt.state
