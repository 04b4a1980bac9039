"""The answer transaction: checks 6-13 of the answer table in order, then the
first valid answer recorded with its ``question_answered`` and ``question_resolved`` entries.
Runs on the store's writer with the state ``Transactions`` owns (``t``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gate.audit.question_entries import QuestionAnsweredData
from gate.core.approvals.rules import (
    forbidden,
    operator_in_scope,
    refuse,
    resolved_refusal,
    superseded,
)
from gate.core.commands import Transaction
from gate.core.questions.kind import QUESTIONS, resolve_question, step_limits
from gate.core.requests.lifecycle_tx import said_by
from gate.errors import Conflict
from gate.model import Question, QuestionAnswer
from gate.protocol.answer import Answer
from gate.protocol.canonical import canonical_json
from gate.protocol.question import QuestionSpec, check_value, value_hash
from gate.protocol.whitespace import identity_key
from gate.store import WriteTx

if TYPE_CHECKING:
    from gate.core.transactions import Transactions


def _check_resolved(question: Question, answer: Answer, now: int) -> None:
    """Check 8: not resolved (the winner's own answer again is 409 ``duplicate``)."""
    won = question.answer
    if (
        won is not None
        and identity_key(won.identity) == identity_key(answer.approver_id)
        and _same_value(won.value, answer.value)
    ):
        raise refuse(409, "duplicate", "duplicate", "this answer was already recorded")
    if question.outcome == "timeout" or (
        question.state == "pending" and now >= question.expires_at
    ):
        raise refuse(410, "expired", "expired", "the question expired before this answer")
    if question.state == "resolved":
        raise resolved_refusal("question", question.outcome)


def _same_value(won: Any, sent: Any) -> bool:
    """The winner's value and a value as sent (not yet through check 12) have the same
    canonical JSON; a value canonical JSON cannot hold (a lone surrogate) is simply not the
    same, never an error (review finding 2)."""
    try:
        return canonical_json(won) == canonical_json(sent)
    except (ValueError, TypeError):  # UnicodeEncodeError is a ValueError
        return False


def answer_question(t: Transactions, tx: WriteTx, answer: Answer) -> tuple[int, int, str]:
    """Checks 6-13 of the answer table, in order, and the recording of the first valid
    answer with its ``question_answered`` and ``question_resolved`` entries. Returns
    ``(operator id, version answered, pipeline)``. Raises GateError with the table's status
    and reason (nothing changes); an answer naming an approval is 409 ``wrong_kind``."""
    now = t.clock.now_ms()
    question = tx.questions.load(answer.question_id, outbox=False)
    if question is None:
        if tx.approvals.load(answer.question_id, outbox=False, created_receipt=False) is not None:
            raise Conflict("wrong_kind", "an answer names a question_id; this id is an approval's")
        # check 6 on the callback listener: SPEC §2's status word is the reason, as
        # ``unknown_approval`` (the pipeline API's 404 stays ``not_found``)
        raise refuse(404, "unknown_question", "unknown_question", "no question with this id")
    nonce_version = next((v.version for v in question.versions if v.nonce == answer.nonce), None)
    if nonce_version is None:
        raise forbidden("nonce_mismatch", "nonce does not belong to this question")
    _check_resolved(question, answer, now)
    current = question.current
    if nonce_version != current.version:
        raise superseded("version", nonce_version, current.version)
    if answer.request_hash != current.request_hash:
        message = "request_hash does not match the current version's hash"
        raise forbidden("request_hash_mismatch", message)
    operator_id = operator_in_scope(question.scope, answer.approver_id)  # check 11
    value = check_value(
        QuestionSpec.from_json(current.question),
        answer.value,
        max_answer_chars=step_limits(t.config, question)[1],
    )
    stored = canonical_json(value).decode("utf-8")
    digest = value_hash(value, salt=bytes.fromhex(question.answer_salt))
    # check 13, the last: nothing after it can refuse
    t.rate.check(operator_id, now, tx.rate_events)
    row = QuestionAnswer(
        value=value,
        operator_id=operator_id,
        version=current.version,
        recorded_at=now,
        **said_by(answer),
    )
    if not tx.questions.record_answer(question.question_id, stored, row):
        raise refuse(409, "already_resolved", "already_resolved", "the question is resolved")
    answered = QuestionAnsweredData(
        operator_id, current.version, current.request_hash, answer.nonce, digest
    )
    t.audit(tx, answered.kind, question.question_id, now, answered.to_data())
    resolve_question(t, tx, QUESTIONS.target(question), "answered", now, digest)
    return operator_id, current.version, question.pipeline


@dataclass(frozen=True, slots=True)
class AnswerQuestion(Transaction[tuple[int, int, str]]):
    """Check and record an answer (``answer_question``): ``(operator id, version, pipeline)``."""

    answer: Answer

    def run(self, t: Transactions, tx: WriteTx) -> tuple[int, int, str]:
        return answer_question(t, tx, self.answer)
