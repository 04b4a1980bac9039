"""The channel of ``outbox``: each pending approval's current revision POSTed to the relay's
URL as its dispatch envelope (``gate.daemon.dispatch.dispatch_envelope``), retried until the
approval resolves; drained by ``gate.daemon.delivery.OutboxSender``."""

from __future__ import annotations

import logging

from gate.daemon.delivery import ChannelBase, Outcome, Send
from gate.daemon.dispatch import SendResult
from gate.protocol.canonical import wire_json
from gate.store.approvals import APPROVALS
from gate.store.outbox import DISPATCHES, DueDispatch

# its lines keep the logger they always had
log = logging.getLogger("gate.daemon.dispatch")


class ApprovalDispatch(ChannelBase):
    """Approvals' dispatches for ``dispatcher`` (its relay URL, callback URL and metrics).
    None is sent for an approval resolved, revised, acked or expired since the plan was read:
    the expiry scheduler resolves it as timeout, and nothing is dispatched after."""

    failed_event = "dispatch_failed"
    log = log
    table = DISPATCHES

    def log_id(self, row: DueDispatch) -> str:
        return f"approval_id={row.request_id}"

    async def build(self, row: DueDispatch) -> Send | None:
        service = self.dispatcher.service
        full = await service.store.reads.fetch(APPROVALS, row.request_id)
        if full is None or full.state != "pending" or full.revision != row.version:
            return None
        if any(o.revision == row.version and o.delivered_at is not None for o in full.outbox):
            return None  # acked meanwhile: the due rows were read before that ack was recorded
        if service.clock.now_ms() >= full.expires_at:
            return None  # the expiry scheduler resolves it as timeout; never dispatch after
        body = wire_json(self.dispatcher.envelope_for(full, row.version))
        return Send(self.dispatcher.relay_url, body)

    def sent(
        self, row: DueDispatch, send: Send, result: SendResult, attempt: int, retry_at_ms: int
    ) -> None:
        service = self.dispatcher.service
        acked = result.error is None
        self.dispatcher.metrics.dispatch_result(
            acked, result.elapsed_s, result.failure, service.clock.now_ms()
        )
        if acked:
            log.info(
                "event=dispatched approval_id=%s revision=%d attempt=%d status=%s",
                row.request_id,
                row.version,
                attempt,
                result.status,
            )
        else:
            log.warning(
                "event=dispatch_failed approval_id=%s revision=%d attempt=%d error=%r "
                "retry_in_s=%.1f",
                row.request_id,
                row.version,
                attempt,
                result.error,
                (retry_at_ms - service.clock.now_ms()) / 1000,
            )

    async def record(self, row: DueDispatch, outcome: Outcome) -> str | None:
        await self.dispatcher.service.dispatch_result(
            row.request_id,
            row.version,
            acked=outcome.acked,
            error=outcome.error,
            retry_at_ms=outcome.retry_at(),
        )
        return None

    def what(self, row: DueDispatch) -> str:
        return "dispatch"
