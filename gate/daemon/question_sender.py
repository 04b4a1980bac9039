"""The channel of ``question_outbox``: each pending question's current version is
POSTed to ``relay.question_target`` with the dispatch's signing, timeout, backoff and ack rules;
drained by ``gate.daemon.delivery.OutboxSender``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gate.daemon.delivery import ChannelBase, Outcome, Send, typed
from gate.daemon.dispatch import SendResult
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, build_question_dispatch

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (question_id, version)


def still_due(full: Question, version: int, now_ms: int) -> bool:
    """Whether ``version`` of ``full`` is still to be sent, as the approvals' dispatcher
    decides (``ApprovalDispatch.build``): the question is pending (not answered, cancelled or
    expired since the plan was read), ``version`` is current, not acked meanwhile, and
    ``expires_at`` has not passed (the expiry scheduler resolves it; never sent after). A row
    not sent stays as it is: the plan reads only pending questions' current version."""
    if full.state != "pending" or full.version != version or now_ms >= full.expires_at:
        return False
    return not any(o.revision == version and o.delivered_at is not None for o in full.outbox)


@dataclass(frozen=True, slots=True)
class QuestionDispatchRow:
    """A due ``question_outbox`` row: ``version`` of ``question_id``, ``attempts`` so far."""

    question_id: str
    version: int
    attempts: int

    @property
    def key(self) -> Key:
        return (self.question_id, self.version)

    @property
    def log_id(self) -> str:
        return f"question_id={self.question_id} version={self.version}"


class QuestionDispatch(ChannelBase):
    """The channel of ``question_outbox`` for ``dispatcher`` (its callback URL and metrics).
    Not acked: retried until the question resolves or expires (the plan reads only pending
    questions' current version). With no question target configured (a reload removed it)
    nothing is read or sent."""

    failed_event = "question_dispatch_failed"
    log = log

    async def due(self, now_ms: int, limit: int) -> tuple[list[QuestionDispatchRow], int | None]:
        service = self.dispatcher.service
        if service.config.relay.question_target is None:
            return [], None
        rows, next_at = await service.store.reads.question_dispatch_plan(now_ms, limit)
        return typed(QuestionDispatchRow, rows), next_at

    async def build(self, row: QuestionDispatchRow) -> Send | None:
        service = self.dispatcher.service
        full = await service.store.reads.fetch_question(row.question_id)
        url = service.config.relay.question_target
        if full is None or url is None or not still_due(full, row.version, service.clock.now_ms()):
            return None
        return Send(url, self.envelope(full))

    def envelope(self, full: Question) -> bytes:
        """The body of the dispatch of ``full``'s current version (``build_question_dispatch``;
        the caller signs it)."""
        current = full.current
        return wire_json(
            build_question_dispatch(
                question_id=full.question_id,
                run_id=full.run_id,
                pipeline=full.pipeline,
                step=full.step,
                issued_at_ms=self.dispatcher.service.clock.now_ms(),
                expires_at_ms=full.expires_at,
                risk=full.risk,
                version=current.version,
                spec=QuestionSpec.from_json(current.question),
                request_hash=current.request_hash,
                approvers=[identity for _, identity in full.scope],
                callback_url=self.dispatcher.callback_url,
                nonce=current.nonce,
                requested_by=full.requested_by,
            )
        )

    def sent(
        self,
        row: QuestionDispatchRow,
        send: Send,
        result: SendResult,
        attempt: int,
        retry_at_ms: int,
    ) -> None:
        d = self.dispatcher
        acked = result.error is None
        now = d.service.clock.now_ms()
        d.metrics.dispatch_result(acked, result.elapsed_s, result.failure, now, question=True)
        if acked:
            log.info(
                "event=question_dispatched question_id=%s version=%d attempt=%d status=%s",
                row.question_id,
                row.version,
                attempt,
                result.status,
            )
        else:
            log.warning(
                "event=question_dispatch_failed question_id=%s version=%d attempt=%d error=%r",
                row.question_id,
                row.version,
                attempt,
                result.error,
            )

    async def record(self, row: QuestionDispatchRow, outcome: Outcome) -> str | None:
        await self.dispatcher.service.questions.dispatch_result(
            row.question_id,
            row.version,
            acked=outcome.acked,
            error=outcome.error,
            retry_at_ms=outcome.retry_at(),
        )
        return None

    def what(self, row: QuestionDispatchRow) -> str:
        return "dispatch"
