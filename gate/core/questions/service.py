"""The questions of a gate (``GateService.questions``): the shared lifecycle
(``RequestService``) with create, revise and the answer. No HTTP, no SQL."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from gate.core.questions.answer_tx import AnswerQuestion
from gate.core.questions.create import parse_question_create, parse_spec
from gate.core.questions.kind import QUESTIONS, QuestionPolicy
from gate.core.questions.revise_tx import QuestionNoticeResult, ReviseQuestion
from gate.core.requests.lifecycle_tx import Create
from gate.core.requests.service import RequestService, Shared
from gate.errors import Conflict
from gate.model import Question
from gate.protocol.answer import Answer
from gate.store.questions import QUESTIONS as TABLES

MAX_OPTIONS_LIMIT = 1000  # the config's ceiling of a step's max_options


@dataclass(frozen=True, slots=True)
class AnswerResult:
    """``Questions.record_answer``: the 200 body and the question's ``pipeline`` (metrics)."""

    answer: dict[str, Any]
    pipeline: str


class Questions(RequestService[Question]):
    """Questions over the gate's ``Shared`` state: a typed answer, first valid answer wins."""

    def __init__(self, shared: Shared) -> None:
        super().__init__(QUESTIONS, shared)

    async def create(self, body: Any, idempotency_key: str | None) -> tuple[dict[str, Any], bool]:
        """POST /v1/questions: validate ``body`` (decoded JSON) against its step and record
        the question with its dispatch in one transaction. Returns ``(question object,
        created)``; created is False for a repeated Idempotency-Key with the same body.
        Raises GateError 400 ``invalid_<field>``/``step_is_approval``, 413
        ``question_too_large``, NotFound 404, Conflict 409 ``idempotency_key_reused``."""
        limit = self.config.api.max_draft_bytes
        req = parse_question_create(body, max_bytes=limit, max_options=MAX_OPTIONS_LIMIT)
        step = self.step(req.pipeline, req.step)
        # again with the step's limits: its max_options bounds options and form enums, its
        # max_answer_chars refuses form fields no answer could fill
        req = replace(
            req,
            spec=parse_spec(
                body,
                max_bytes=limit,
                max_options=step.max_options,
                max_answer_chars=step.max_answer_chars,
            ),
        )
        requester = self.requester(req.requested_by)
        scope = tuple((op.id, op.identity) for op in self.config.scope(step))
        policy = QuestionPolicy(scope, step.timeout, step.risk)
        full, created = await self.store.transact(
            Create(QUESTIONS, req, idempotency_key, requester, policy, req.body_hash())
        )
        if not created:
            return self.kind.view(full), False
        return self.opened(full, "request_hash=%s", full.current.request_hash), True

    async def revise(self, question_id: str, body: Any) -> dict[str, Any]:
        """POST /v1/questions/{id}/revise: the question with the given fields replaced,
        validated as at creation, becomes version n+1 (new request hash, new nonce) and is
        dispatched again; the long-polls on it are woken with the new version. Raises as
        ``create`` and 404 ``unknown_question``, 409 ``already_resolved`` (outcome
        ``timeout`` when past ``expires_at``: then resolved so), 409 ``too_many_versions``."""
        # the merge onto the current version happens in the write transaction: two revises
        # racing each build on the other's result
        outcome, revised = await self.store.transact(ReviseQuestion(question_id, body))
        if outcome == "timeout":
            self.resolved(question_id, "timeout")
            raise Conflict(
                "already_resolved",
                "the question expired before it was revised",
                extra={"outcome": "timeout"},
            )
        self.log.info(
            "event=question_revised question_id=%s version=%d request_hash=%s",
            question_id,
            revised.version,
            revised.current.request_hash,
        )
        self.shared.dispatch_wakeup.set()
        self.wake(question_id)  # long-polls return the new version
        return self.kind.view(revised)

    async def record_answer(self, answer: Answer) -> AnswerResult:
        """Checks 6-13 of the answer table and the recording of the first valid answer,
        in one transaction. Returns the 200 body ``{"status": "recorded", "resolved": true,
        "outcome": "answered"}``. Raises GateError with the table's status and reason."""
        operator_id, version, pipeline = await self.store.transact(AnswerQuestion(answer))
        self.log.info(
            "event=question_answered question_id=%s operator_id=%d version=%d",
            answer.question_id,
            operator_id,
            version,
        )
        self.wake(answer.question_id)
        return AnswerResult(
            {"status": "recorded", "resolved": True, "outcome": "answered"}, pipeline
        )

    async def notice_result(
        self, question_id: str, *, acked: bool, error: str | None, retry_at_ms: int | None
    ) -> str | None:
        """Record one attempt of a question's resolution notice (``retry_at_ms`` None drops
        it as failed). Returns ``"delivered"``, ``"retry"``, ``"failed"`` or None."""
        return await self.store.transact(
            QuestionNoticeResult(question_id, acked, error, retry_at_ms)
        )

    async def pending(self) -> int:
        """How many questions are pending (the metrics gauge)."""
        count, _ = await self.store.reads.pending_summary(TABLES)
        return count
