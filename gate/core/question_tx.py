"""The questions' write transactions (issue 15): create (idempotent), revise, cancel, expire,
answer (checks 6-13, first valid answer wins) and dispatch bookkeeping. Run on the store's
writer with the state ``Transactions`` owns (``t``); registered in ``transactions.TABLE``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ulid import ULID

from gate.audit.chain import receipt_object
from gate.audit.question_entries import (
    QuestionAnsweredData,
    QuestionCreatedData,
    QuestionDispatchAckData,
    QuestionResolvedData,
    QuestionRevisedData,
)
from gate.core.decide_tx import new_nonce
from gate.core.model import Question, QuestionAnswer
from gate.core.question_requests import QuestionRequest
from gate.core.rules import refuse
from gate.errors import Conflict, GateError, NotFound
from gate.protocol.canonical import canonical_json
from gate.protocol.question import Answer, QuestionSpec, check_value, request_hash, value_hash
from gate.protocol.whitespace import identity_key
from gate.store import WriteTx

if TYPE_CHECKING:
    from gate.core.transactions import Transactions

EXPIRE_BATCH = 500  # questions resolved ``timeout`` per transaction


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


def _load(tx: WriteTx, question_id: str) -> Question:
    found = tx.load_question(question_id)
    if found is None:
        raise _unknown()
    return found


def _add_version(tx: WriteTx, question_id: str, version: int, spec: QuestionSpec, now: int) -> str:
    digest = request_hash(question_id, version, spec)
    text = canonical_json(spec.to_json()).decode("utf-8")
    tx.insert_question_version(question_id, version, text, digest, new_nonce(), now)
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
        seen = tx.question_by_idempotency_key(idempotency_key)
        if seen is not None:
            if seen[1] != body_hash:
                raise Conflict(
                    "idempotency_key_reused",
                    "Idempotency-Key was used before with a different body",
                )
            return _load(tx, seen[0]), False
    now = t.clock.now_ms()
    question_id = str(ULID())
    expires_at = now + int(policy.timeout_s * 1000)
    tx.insert_question(
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
    return _load(tx, question_id), True


def _check_pending(question: Question, now: int, what: str) -> None:
    if question.state == "resolved":
        raise Conflict(
            "already_resolved",
            f"the question is already resolved ({what})",
            extra={"outcome": question.outcome},
        )


def revise_question(t: Transactions, tx: WriteTx, question_id: str, spec: QuestionSpec) -> Question:
    """Make ``spec`` version n+1 of a pending question (new request hash and nonce), queue
    its dispatch, write ``question_revised``. Raises NotFound 404 ``unknown_question``,
    Conflict 409 ``already_resolved`` (+ outcome)."""
    now = t.clock.now_ms()
    question = _load(tx, question_id)
    _check_pending(question, now, "it cannot be revised")
    version = question.version + 1
    digest = _add_version(tx, question_id, version, spec, now)
    revised = QuestionRevisedData(version, digest)
    t.audit(tx, revised.kind, question_id, now, revised.to_data())
    return _load(tx, question_id)


def _resolve(
    t: Transactions,
    tx: WriteTx,
    question_id: str,
    version: int,
    digest: str,
    outcome: str,
    now: int,
    value_digest: str | None = None,
) -> None:
    data = QuestionResolvedData(outcome, version, digest, value_digest)
    row = t.audit(tx, data.kind, question_id, now, data.to_data())
    if not tx.resolve_question(question_id, outcome, now, receipt_object(row)):
        raise Conflict("already_resolved", "question was resolved concurrently")


def cancel_question(t: Transactions, tx: WriteTx, question_id: str) -> tuple[str, Question]:
    """Resolve a pending question ``cancelled`` (``timeout`` when past ``expires_at``);
    returns ``(outcome, loaded question)``. Raises NotFound 404 ``unknown_question``,
    Conflict 409 ``already_resolved`` (+ outcome)."""
    now = t.clock.now_ms()
    question = _load(tx, question_id)
    _check_pending(question, now, "it cannot be cancelled")
    outcome = "timeout" if now >= question.expires_at else "cancelled"
    current = question.current
    _resolve(t, tx, question_id, current.version, current.request_hash, outcome, now)
    return outcome, _load(tx, question_id)


def expire_questions(t: Transactions, tx: WriteTx) -> list[str]:
    """Resolve up to ``EXPIRE_BATCH`` pending questions past ``expires_at`` as ``timeout``,
    oldest deadline first; return their ids."""
    now = t.clock.now_ms()
    due = tx.due_questions(now, EXPIRE_BATCH)
    for item in due:
        _resolve(t, tx, item.question_id, item.version, item.request_hash, "timeout", now)
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
    attempts = tx.question_dispatch_attempted(
        question_id,
        version,
        delivered_at=now if acked else None,
        next_attempt_at=now if acked else retry_at_ms,
        error=error,
    )
    if acked and attempts > 0:
        ack = QuestionDispatchAckData(version)
        t.audit(tx, ack.kind, question_id, now, ack.to_data())


def _check_resolved(question: Question, answer: Answer, now: int) -> None:
    """Check 8: not resolved (the winner's own answer again is 409 ``duplicate``)."""
    won = question.answer
    if (
        won is not None
        and identity_key(won.identity) == identity_key(answer.approver_id)
        and value_hash(won.value) == value_hash(answer.value)
    ):
        raise refuse(409, "duplicate", "duplicate", "this answer was already recorded")
    if question.outcome == "timeout" or (
        question.state == "pending" and now >= question.expires_at
    ):
        raise refuse(410, "expired", "expired", "the question expired before this answer")
    if question.state == "resolved":
        raise refuse(
            409,
            "already_resolved",
            "already_resolved",
            "the question is resolved",
            outcome=question.outcome,
        )


def _operator(question: Question, identity: str) -> int:
    """Check 11: the answerer's operator id in the question's frozen scope."""
    key = identity_key(identity)
    for operator_id, scoped in question.scope:
        if identity_key(scoped) == key:
            return int(operator_id)
    raise refuse(
        403,
        "forbidden",
        "approver_not_allowed",
        "approver is not an operator in scope for this step",
    )


def _max_answer_chars(t: Transactions, question: Question) -> int:
    found = t.config.find_step(question.pipeline, question.step)
    return found[1].max_answer_chars if found is not None else 2000


def answer_question(t: Transactions, tx: WriteTx, answer: Answer) -> tuple[int, int, str]:
    """Checks 6-13 of issue 15's answer table, in order, and the recording of the first valid
    answer with its ``question_answered`` and ``question_resolved`` entries. Returns
    ``(operator id, version answered, pipeline)``. Raises GateError with the table's status
    and reason (nothing changes); an answer naming an approval is 409 ``wrong_kind``."""
    now = t.clock.now_ms()
    question = tx.load_question(answer.question_id, outbox=False)
    if question is None:
        if tx.load_approval(answer.question_id, outbox=False, created_receipt=False) is not None:
            raise wrong_kind("an answer names a question_id; this id is an approval's")
        # check 6 on the callback listener: SPEC §2's status word is the reason, as
        # ``unknown_approval`` (the pipeline API's 404 stays ``not_found``)
        raise refuse(404, "unknown_question", "unknown_question", "no question with this id")
    nonce_version = next((v.version for v in question.versions if v.nonce == answer.nonce), None)
    if nonce_version is None:
        raise refuse(403, "forbidden", "nonce_mismatch", "nonce does not belong to this question")
    _check_resolved(question, answer, now)
    current = question.current
    if nonce_version != current.version:
        raise refuse(
            409,
            "superseded",
            "superseded",
            f"nonce is for version {nonce_version}; the current version is {current.version}",
        )
    if answer.request_hash != current.request_hash:
        raise refuse(
            403,
            "forbidden",
            "request_hash_mismatch",
            "request_hash does not match the current version's hash",
        )
    operator_id = _operator(question, answer.approver_id)
    value = check_value(
        QuestionSpec.from_json(current.question),
        answer.value,
        max_answer_chars=_max_answer_chars(t, question),
    )
    t.rate.check(operator_id, now)
    row = QuestionAnswer(
        value=value,
        operator_id=operator_id,
        identity=answer.approver_id,
        display=answer.approver_display,
        channel=answer.approver_channel,
        version=current.version,
        decided_at=answer.decided_at,
        recorded_at=now,
    )
    if not tx.record_question_answer(
        question.question_id, canonical_json(value).decode("utf-8"), row
    ):
        raise refuse(409, "already_resolved", "already_resolved", "the question is resolved")
    digest = value_hash(value)
    answered = QuestionAnsweredData(
        operator_id, current.version, current.request_hash, answer.nonce, digest
    )
    t.audit(tx, answered.kind, question.question_id, now, answered.to_data())
    _resolve(
        t, tx, question.question_id, current.version, current.request_hash, "answered", now, digest
    )
    return operator_id, current.version, question.pipeline


def wrong_kind(message: str) -> GateError:
    """409 ``wrong_kind``: an answer for an approval, or a decision for a question (issue 15):
    refused after check 5, nothing recorded."""
    return Conflict("wrong_kind", message)
