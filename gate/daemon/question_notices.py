"""The channel of ``question_notices``: a question's resolution notice POSTed to
``relay.question_notice_target`` with the dispatch's signing, timeout, backoff and redirect
rules; drained by ``gate.daemon.delivery.OutboxSender``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from gate.daemon.delivery import ChannelBase, Outcome, Send, typed
from gate.daemon.dispatch import SendResult
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.protocol.question_notice import build_question_notice

log = logging.getLogger(__name__)


def question_notice_envelope(full: Question) -> dict[str, Any]:
    """The resolution notice of a resolved question (``build_question_notice``): the final
    version's ``request_hash``, ``answered_by`` the winning answer's identity. Raises
    ValueError when the question is not resolved."""
    if full.outcome is None or full.resolved_at is None:
        raise ValueError(f"question {full.question_id} is not resolved")
    return build_question_notice(
        question_id=full.question_id,
        run_id=full.run_id,
        pipeline=full.pipeline,
        step=full.step,
        outcome=full.outcome,
        resolved_at_ms=full.resolved_at,
        version=full.version,
        request_hash=full.current.request_hash,
        answered_by=full.answer.identity if full.answer is not None else None,
    )


@dataclass(frozen=True, slots=True)
class QuestionNoticeRow:
    """A due ``question_notices`` row: ``question_id``'s notice, ``attempts`` so far,
    ``give_up_at`` (unix ms: not delivered by then, failed)."""

    question_id: str
    attempts: int
    give_up_at: int

    @property
    def key(self) -> str:
        return self.question_id

    @property
    def log_id(self) -> str:
        return f"question_id={self.question_id}"


class QuestionNotices(ChannelBase):
    """The channel of ``question_notices`` for ``dispatcher``. Dropped as failed when notices
    or the question relay were turned off by a reload; retried until the row's
    ``give_up_at``; delivered and failed ones are counted in ``hitl_gate_notices_total`` like
    approvals' notices."""

    failed_event = "question_notice_failed"
    log = log

    async def due(self, now_ms: int, limit: int) -> tuple[list[QuestionNoticeRow], int | None]:
        reads = self.dispatcher.service.store.reads
        rows, next_at = await reads.question_notice_plan(now_ms, limit)
        return typed(QuestionNoticeRow, rows), next_at

    async def build(self, row: QuestionNoticeRow) -> Send | Outcome:
        """The POST of ``row``, or a drop (an ``Outcome`` without a retry time)."""
        service = self.dispatcher.service
        url = service.config.relay.question_notice_target
        if url is None:
            return Outcome(False, "notices are turned off", None)
        if service.clock.now_ms() >= row.give_up_at:
            return Outcome(False, "not delivered before it was given up", None)
        full = await service.store.reads.fetch_question(row.question_id)
        if full is None or full.state != "resolved":
            return Outcome(False, "unknown question", None)
        body = wire_json(question_notice_envelope(full))
        return Send(url, body, detail=f"outcome={full.outcome}")

    def sent(
        self, row: QuestionNoticeRow, send: Send, result: SendResult, attempt: int, retry_at_ms: int
    ) -> None:
        if result.error is None:
            log.info(
                "event=question_notice_sent question_id=%s %s attempt=%d status=%s",
                row.question_id,
                send.detail,
                attempt,
                result.status,
            )
        else:
            log.warning(
                "event=question_notice_attempt_failed question_id=%s attempt=%d error=%r",
                row.question_id,
                attempt,
                result.error,
            )

    async def record(self, row: QuestionNoticeRow, outcome: Outcome) -> str | None:
        return await self.dispatcher.service.questions.notice_result(
            row.question_id,
            acked=outcome.acked,
            error=outcome.error,
            retry_at_ms=outcome.retry_at_ms,
        )

    def ended(self, row: QuestionNoticeRow, state: str | None, outcome: Outcome) -> None:
        metrics = self.dispatcher.metrics.followups
        if state == "delivered":
            metrics.notice("delivered")
        elif state == "failed":
            log.warning(
                "event=question_notice_given_up question_id=%s error=%r",
                row.question_id,
                outcome.error,
            )
            metrics.notice("failed")

    def what(self, row: QuestionNoticeRow) -> str:
        return "notice"
