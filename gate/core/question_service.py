"""The questions' half of ``GateService``: create, get, wait, list, cancel, revise,
record an answer, expire. Mixed into ``gate.core.service.GateService``; no HTTP, no SQL."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gate.core.longpoll import long_poll, wake
from gate.core.question_requests import parse_question_create, parse_spec
from gate.core.question_tx import EXPIRE_BATCH, QuestionPolicy
from gate.core.question_views import question_view
from gate.core.requests import not_an_operator
from gate.errors import Conflict, GateError, NotFound, refused
from gate.model import Question
from gate.protocol.question import Answer
from gate.store import Command, Store
from gate.store.questions import QUESTIONS

if TYPE_CHECKING:
    from gate.clock import Clock
    from gate.config import Config

log = logging.getLogger(__name__)

MAX_OPTIONS_LIMIT = 1000  # the config's ceiling of a step's max_options


@dataclass(frozen=True, slots=True)
class AnswerResult:
    """``record_answer``: the 200 body and the question's ``pipeline`` (metrics)."""

    answer: dict[str, Any]
    pipeline: str


def step_is(kind: str, found: Any) -> GateError:
    """400 ``step_is_question``/``step_is_approval`` (field ``step``): a request for the other
    kind of step, with a ``message`` naming the command and endpoint to use (A4).
    """
    command = "ask" if kind == "question" else "request"
    message = f"step {found!r} is {'a' if kind == 'question' else 'an'} {kind} step: use"
    message += f" hitl-gate {command} (POST /v1/{kind}s)"
    return refused(f"step_is_{kind}", "step", message)


class QuestionMethods:
    """The question methods of ``GateService``. Uses the service's ``config``,
    ``store``, ``clock``, wake-up events and long-poll waiters."""

    config: Config
    store: Store
    clock: Clock
    dispatch_wakeup: asyncio.Event
    expiry_wakeup: asyncio.Event
    _waiters: dict[str, tuple[asyncio.Event, int]]

    def _question_step(self, pipeline: str, step: str) -> Any:
        if not any(p.name == pipeline for p in self.config.pipelines):
            raise NotFound("unknown_pipeline", f"pipeline {pipeline!r} is not configured")
        found = self.config.find_step(pipeline, step)
        if found is None:
            raise NotFound("unknown_step", f"step {step!r} is not configured in {pipeline!r}")
        if not found[1].is_question:
            raise step_is("approval", step)
        return found[1]

    def check_approval_step(self, pipeline: str, step: str) -> None:
        """Refuse ``POST /v1/approvals`` for a question step: 400 ``step_is_question``."""
        found = self.config.find_step(pipeline, step)
        if found is not None and found[1].is_question:
            raise step_is("question", step)

    def _requester(self, identity: str | None) -> tuple[int, str] | None:
        """``(operator id, configured identity)`` of ``requested_by``, None when not given;
        raises 400 ``invalid_requested_by`` (``not_an_operator``) when it names nobody."""
        if identity is None:
            return None
        op = self.config.operator_by_identity(identity)
        if op is None:
            raise not_an_operator(
                identity, [(o.id, o.identity) for o in self.config.relay.operators]
            )
        return op.id, op.identity

    async def create_question(
        self, body: Any, idempotency_key: str | None
    ) -> tuple[dict[str, Any], bool]:
        """POST /v1/questions: validate ``body`` (decoded JSON) against its step and record
        the question with its dispatch in one transaction. Returns ``(question object,
        created)``; created is False for a repeated Idempotency-Key with the same body.
        Raises GateError 400 ``invalid_<field>``/``step_is_approval``, 413
        ``question_too_large``, NotFound 404, Conflict 409 ``idempotency_key_reused``."""
        limit = self.config.api.max_draft_bytes
        req = parse_question_create(body, max_bytes=limit, max_options=MAX_OPTIONS_LIMIT)
        step = self._question_step(req.pipeline, req.step)
        # again with the step's limits: its max_options bounds options and form enums, its
        # max_answer_chars refuses form fields no answer could fill (review findings 3, 9)
        req = replace(
            req,
            spec=parse_spec(
                body,
                max_bytes=limit,
                max_options=step.max_options,
                max_answer_chars=step.max_answer_chars,
            ),
        )
        requester = self._requester(req.requested_by)
        scope = tuple((op.id, op.identity) for op in self.config.scope(step))
        policy = QuestionPolicy(scope, step.timeout, step.risk, step.max_answer_chars)
        full: Question
        full, created = await self.store.transact(
            Command("create_question", (req, idempotency_key, requester, policy))
        )
        if created:
            log.info(
                "event=question_created question_id=%s pipeline=%s step=%s request_hash=%s",
                full.question_id,
                req.pipeline,
                req.step,
                full.current.request_hash,
            )
            self.dispatch_wakeup.set()
            self.expiry_wakeup.set()
        return question_view(full), created

    async def get_question(self, question_id: str) -> dict[str, Any]:
        """The question object; raises NotFound 404 ``unknown_question``."""
        full = await self.store.reads.fetch(QUESTIONS, question_id)
        if full is None:
            raise NotFound("unknown_question", "no question with this question_id")
        return question_view(full)

    async def wait_question(self, question_id: str, seconds: float) -> dict[str, Any]:
        """The question object once resolved or after ``seconds``, whichever comes first."""
        return await long_poll(self._waiters, question_id, self.get_question, seconds)

    async def list_questions(
        self, state: str, pipeline: str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """``{items, next_cursor}`` of questions; ``next_cursor`` None on the last page."""
        rows = await self.store.reads.page(QUESTIONS, state, pipeline, limit + 1, cursor)
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "items": [question_view(r) for r in rows],
            "next_cursor": rows[-1].question_id if more and rows else None,
        }

    async def cancel_question(self, question_id: str) -> dict[str, Any]:
        """Resolve a pending question ``cancelled``; one past its ``expires_at`` resolves
        ``timeout`` and the answer is 409 ``already_resolved`` with that outcome. Raises
        NotFound 404 ``unknown_question``, Conflict 409 ``already_resolved``."""
        outcome, full = await self.store.transact(Command("cancel_question", (question_id,)))
        log.info("event=question_resolved question_id=%s outcome=%s", question_id, outcome)
        self.wake_question(question_id)
        if outcome == "timeout":
            raise Conflict(
                "already_resolved",
                "the question expired before it was cancelled",
                extra={"outcome": "timeout"},
            )
        return question_view(full)

    async def revise_question(self, question_id: str, body: Any) -> dict[str, Any]:
        """POST /v1/questions/{id}/revise: the question with the given fields replaced,
        validated as at creation, becomes version n+1 (new request hash, new nonce) and is
        dispatched again; the long-polls on it are woken with the new version. Raises as
        ``create_question`` and 404 ``unknown_question``, 409 ``already_resolved`` (outcome
        ``timeout`` when past ``expires_at``: then resolved so), 409 ``too_many_versions``."""
        # the merge onto the current version happens in the write transaction: two revises
        # racing each build on the other's result (review finding 1)
        outcome, revised = await self.store.transact(
            Command("revise_question", (question_id, body))
        )
        if outcome == "timeout":
            log.info("event=question_resolved question_id=%s outcome=timeout", question_id)
            self.wake_question(question_id)
            raise Conflict(
                "already_resolved",
                "the question expired before it was revised",
                extra={"outcome": "timeout"},
            )
        log.info(
            "event=question_revised question_id=%s version=%d request_hash=%s",
            question_id,
            revised.version,
            revised.current.request_hash,
        )
        self.dispatch_wakeup.set()
        self.wake_question(question_id)  # long-polls return the new version (finding 6)
        return question_view(revised)

    async def record_answer(self, answer: Answer) -> AnswerResult:
        """Checks 6-13 of the answer table and the recording of the first valid answer,
        in one transaction. Returns the 200 body ``{"status": "recorded", "resolved": true,
        "outcome": "answered"}``. Raises GateError with the table's status and reason."""
        operator_id, version, pipeline = await self.store.transact(
            Command("answer_question", (answer,))
        )
        log.info(
            "event=question_answered question_id=%s operator_id=%d version=%d",
            answer.question_id,
            operator_id,
            version,
        )
        self.wake_question(answer.question_id)
        return AnswerResult(
            {"status": "recorded", "resolved": True, "outcome": "answered"}, pipeline
        )

    async def expire_questions(self) -> int:
        """Resolve every pending question past ``expires_at`` as ``timeout`` (batches of
        500 per transaction); returns how many."""
        total = 0
        while True:
            ids = await self.store.transact(Command("expire_questions", ()))
            for question_id in ids:
                log.info("event=question_resolved question_id=%s outcome=timeout", question_id)
                self.wake_question(question_id)
            total += len(ids)
            if len(ids) < EXPIRE_BATCH:
                return total

    async def question_dispatch_result(
        self, question_id: str, version: int, *, acked: bool, error: str | None, retry_at_ms: int
    ) -> None:
        """Record one question dispatch attempt; an ack writes ``question_dispatch_ack``."""
        await self.store.transact(
            Command("question_dispatch_result", (question_id, version, acked, error, retry_at_ms))
        )

    async def question_notice_result(
        self, question_id: str, *, acked: bool, error: str | None, retry_at_ms: int | None
    ) -> str | None:
        """Record one attempt of a question's resolution notice (``retry_at_ms`` None drops
        it as failed). Returns ``"delivered"``, ``"retry"``, ``"failed"`` or None."""
        result: str | None = await self.store.transact(
            Command("question_notice_result", (question_id, acked, error, retry_at_ms))
        )
        return result

    async def next_question_expiry(self) -> int | None:
        """The earliest ``expires_at`` (unix ms) of a pending question, or None."""
        return await self.store.reads.next_expiry(QUESTIONS)

    async def pending_questions(self) -> int:
        """How many questions are pending (the metrics gauge)."""
        return (await self.store.reads.pending_summary(QUESTIONS))[0]

    def wake_question(self, question_id: str) -> None:
        """Wake the long-polls waiting on ``question_id`` (``longpoll.wake``) and, notices
        on, the dispatcher: its resolution notice was queued with the resolution."""
        if self.config.relay.question_notice_target is not None:
            self.dispatch_wakeup.set()
        wake(self._waiters, question_id)
