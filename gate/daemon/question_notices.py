"""The channel of ``question_notices``: a question's resolution notice POSTed to
``relay.question_notice_target`` with the dispatch's signing, timeout, backoff and redirect
rules; drained by ``gate.daemon.delivery.OutboxSender``."""

from __future__ import annotations

import logging
from typing import Any

from gate.daemon.delivery import Channel, Outcome, Send, resolution
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.protocol.followup import build_question_notice
from gate.store.outbox import QUESTION_NOTICES, DueNotice
from gate.store.questions import QUESTIONS

log = logging.getLogger(__name__)


def question_notice_envelope(full: Question) -> dict[str, Any]:
    """The resolution notice of a resolved question (``build_question_notice``): the final
    version's ``request_hash``, ``answered_by`` the winning answer's identity. Raises
    ValueError when the question is not resolved."""
    return build_question_notice(
        **resolution(full),
        version=full.version,
        request_hash=full.current.request_hash,
        answered_by=full.answer.identity if full.answer is not None else None,
    )


class QuestionNotices(Channel[DueNotice]):
    """The channel of ``question_notices`` for ``dispatcher``. Dropped as failed when notices
    or the question relay were turned off by a reload; retried until the row's
    ``give_up_at``; delivered and failed ones are counted in ``hitl_gate_notices_total`` like
    approvals' notices."""

    table = QUESTION_NOTICES
    event = "question_notice"
    log = log

    async def build(self, row: DueNotice) -> Send | Outcome:
        """The POST of ``row``, or a drop (an ``Outcome`` without a retry time)."""
        service = self.dispatcher.service
        url = service.config.relay.question_notice_target
        if url is None:
            return Outcome(False, "notices are turned off", None)
        if service.clock.now_ms() >= row.give_up_at:
            return Outcome(False, "not delivered before it was given up", None)
        full = await service.store.reads.fetch(QUESTIONS, row.question_id)
        if full is None or full.state != "resolved":
            return Outcome(False, "unknown question", None)
        body = wire_json(question_notice_envelope(full))
        return Send(url, body, detail=f"outcome={full.outcome}")

    async def record(self, row: DueNotice, outcome: Outcome) -> str | None:
        return await self.dispatcher.service.questions.notice_result(
            row.question_id,
            acked=outcome.acked,
            error=outcome.error,
            retry_at_ms=outcome.retry_at_ms,
        )

    def ended(self, row: DueNotice, state: str | None, outcome: Outcome) -> None:
        if state == "failed":
            log.warning(
                "event=question_notice_given_up %s error=%r", self.log_id(row), outcome.error
            )
        if state in ("delivered", "failed"):
            self.dispatcher.metrics.notice(state)

    def what(self, row: DueNotice) -> str:
        return "notice"
