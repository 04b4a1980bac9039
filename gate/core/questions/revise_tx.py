"""The questions' own write transactions beside the shared lifecycle and the answer: revise
(version n+1 of a pending question) and the bookkeeping of a resolution notice. Run on the
store's writer with the state ``Transactions`` owns (``t``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gate.audit.question_entries import QuestionRevisedData
from gate.core.commands import Transaction
from gate.core.questions.create import parse_spec, revised_fields
from gate.core.questions.kind import QUESTIONS, add_version, step_limits
from gate.core.requests.lifecycle_tx import check_pending, load, send_result
from gate.errors import Conflict
from gate.model import Question
from gate.protocol.question import QuestionSpec
from gate.store import WriteTx
from gate.store.outbox import QUESTION_NOTICES

if TYPE_CHECKING:
    from gate.core.transactions import Transactions

MAX_VERSIONS = 20
"""A question has at most this many versions: a revise past it is 409 ``too_many_versions``
(every load reads every version)."""


@dataclass(frozen=True, slots=True)
class ReviseQuestion(Transaction[tuple[str, Question]]):
    """Make the current version with ``body``'s fields replaced (a decoded revise body,
    ``revised_fields``) version n+1 of a pending question, validated as at creation (new
    request hash and nonce), queue its dispatch, write ``question_revised``. The merge reads
    the current version inside this transaction, so racing revises build on each other.
    Returns ``("revised", loaded question)``, or ``("timeout", ...)`` when ``expires_at`` has
    passed (resolved ``timeout`` here, as a cancel does). Raises NotFound 404
    ``unknown_question``, Conflict 409 ``already_resolved`` (+ outcome) or
    ``too_many_versions`` (at ``MAX_VERSIONS``), GateError 400/413 as at creation."""

    question_id: str
    body: Any

    def run(self, t: Transactions, tx: WriteTx) -> tuple[str, Question]:
        now = t.clock.now_ms()
        question = load(QUESTIONS, tx, self.question_id)
        check_pending(question, "the question is already resolved (it cannot be revised)")
        if now >= question.expires_at:
            QUESTIONS.resolve(t, tx, QUESTIONS.target(question), "timeout", now)
            return "timeout", load(QUESTIONS, tx, self.question_id)
        if question.version >= MAX_VERSIONS:
            message = f"the question has {MAX_VERSIONS} versions, the most it may have"
            raise Conflict("too_many_versions", message, extra={"message": message})
        max_options, max_answer_chars = step_limits(t.config, question)
        spec = parse_spec(
            revised_fields(QuestionSpec.from_json(question.current.question), self.body),
            max_bytes=t.config.api.max_draft_bytes,
            max_options=max_options,
            max_answer_chars=max_answer_chars,
        )
        version = question.version + 1
        digest = add_version(tx, self.question_id, version, spec, now)
        revised = QuestionRevisedData(version, digest)
        t.audit(tx, revised.kind, self.question_id, now, revised.to_data())
        return "revised", load(QUESTIONS, tx, self.question_id)


@dataclass(frozen=True, slots=True)
class QuestionNoticeResult(Transaction[str | None]):
    """Record one attempt of a question's resolution notice (``send_result``; ``retry_at_ms``
    None: dropped unsent, as failed). Returns ``"delivered"``, ``"retry"``, ``"failed"`` or
    None."""

    question_id: str
    acked: bool
    error: str | None
    retry_at_ms: int | None

    def run(self, t: Transactions, tx: WriteTx) -> str | None:
        key = (self.question_id,)
        return send_result(t, tx, QUESTION_NOTICES, key, self.acked, self.error, self.retry_at_ms)
