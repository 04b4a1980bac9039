"""The channel of ``outbox``: each pending approval's current revision POSTed to the relay's
URL as its dispatch envelope (``gate.daemon.dispatch.dispatch_envelope``), retried until the
approval resolves; drained by ``gate.daemon.delivery.OutboxSender``."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gate.daemon.delivery import ChannelBase, Outcome, Send, typed
from gate.daemon.dispatch import SendResult
from gate.protocol.canonical import wire_json

# its lines keep the logger they always had
log = logging.getLogger("gate.daemon.dispatch")


@dataclass(frozen=True, slots=True)
class DispatchRow:
    """A due ``outbox`` row: ``revision`` of ``approval_id``, ``attempts`` so far."""

    approval_id: str
    revision: int
    attempts: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.approval_id, self.revision)

    @property
    def log_id(self) -> str:
        return f"approval_id={self.approval_id}"


class ApprovalDispatch(ChannelBase):
    """Approvals' dispatches for ``dispatcher`` (its relay URL, callback URL and metrics).
    None is sent for an approval resolved, revised, acked or expired since the plan was read:
    the expiry scheduler resolves it as timeout, and nothing is dispatched after."""

    failed_event = "dispatch_failed"
    log = log

    async def due(self, now_ms: int, limit: int) -> tuple[list[DispatchRow], int | None]:
        rows, next_at = await self.dispatcher.service.store.reads.dispatch_plan(now_ms, limit)
        return typed(DispatchRow, rows), next_at

    async def build(self, row: DispatchRow) -> Send | None:
        service = self.dispatcher.service
        full = await service.store.reads.fetch_approval(row.approval_id)
        if full is None or full.state != "pending" or full.revision != row.revision:
            return None
        if any(o.revision == row.revision and o.delivered_at is not None for o in full.outbox):
            return None  # acked meanwhile: the due rows were read before that ack was recorded
        if service.clock.now_ms() >= full.expires_at:
            return None  # the expiry scheduler resolves it as timeout; never dispatch after
        body = wire_json(self.dispatcher.envelope_for(full, row.revision))
        return Send(self.dispatcher.relay_url, body)

    def sent(
        self, row: DispatchRow, send: Send, result: SendResult, attempt: int, retry_at_ms: int
    ) -> None:
        service = self.dispatcher.service
        acked = result.error is None
        self.dispatcher.metrics.dispatch_result(
            acked, result.elapsed_s, result.failure, service.clock.now_ms()
        )
        if acked:
            log.info(
                "event=dispatched approval_id=%s revision=%d attempt=%d status=%s",
                row.approval_id,
                row.revision,
                attempt,
                result.status,
            )
        else:
            log.warning(
                "event=dispatch_failed approval_id=%s revision=%d attempt=%d error=%r "
                "retry_in_s=%.1f",
                row.approval_id,
                row.revision,
                attempt,
                result.error,
                (retry_at_ms - service.clock.now_ms()) / 1000,
            )

    async def record(self, row: DispatchRow, outcome: Outcome) -> str | None:
        await self.dispatcher.service.approvals.dispatch_result(
            row.approval_id,
            row.revision,
            acked=outcome.acked,
            error=outcome.error,
            retry_at_ms=outcome.retry_at(),
        )
        return None

    def what(self, row: DispatchRow) -> str:
        return "dispatch"
