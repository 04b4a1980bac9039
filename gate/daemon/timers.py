"""The one scheduler of everything timed: expiry of approvals and questions, reminders and
escalation levels, driven by the earliest pending ``expires_at`` and ``next_followup_at``,
with no task per request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gate.core.service import GateService
from gate.errors import GateError
from gate.metrics import Metrics
from gate.store.approvals import APPROVALS
from gate.store.questions import QUESTIONS

log = logging.getLogger("gate.daemon.expiry")  # its lines keep the logger they always had

MAX_SLEEP_S = 3600.0
RETRY_AFTER_ERROR_S = 1.0


@dataclass(frozen=True, slots=True)
class Timers:
    """The scheduler of ``service`` (the gate's), counting in ``metrics`` (the gate's).

    ``run`` resolves approvals, then questions, as ``timeout`` when the gate's clock passes
    their ``expires_at``, then applies the due reminders and escalation levels
    (``Approvals.followups_due``): each only when its earliest time has passed, so a
    wake-up with nothing due costs reads, never a write transaction. It sleeps until the
    earliest deadline or follow-up (one lookup in each partial index), or until
    ``service.expiry_wakeup`` is set (a new request may be due sooner), and runs until
    cancelled. Storage errors are logged and retried after a second. Each timeout counts
    as resolved ``timeout``.
    """

    service: GateService
    metrics: Metrics

    async def run(self) -> None:
        """Loop until cancelled (this class's docstring)."""
        service = self.service
        while True:
            service.expiry_wakeup.clear()
            try:
                next_at = await self._handle_due(service.clock.now_ms())
            except GateError as exc:
                log.error("event=expiry_failed reason=%s message=%s", exc.code, exc.message)
                next_at = service.clock.now_ms() + int(RETRY_AFTER_ERROR_S * 1000)
            delay = MAX_SLEEP_S
            if next_at is not None:
                delay = min(delay, max(0.0, (next_at - service.clock.now_ms()) / 1000) + 0.002)
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancel
                async with asyncio.timeout(delay):
                    await service.expiry_wakeup.wait()

    async def _handle_due(self, now: int) -> int | None:
        """Handle what is due at ``now`` (unix ms); return the earliest time still ahead."""
        reads = self.service.store.reads
        times = (
            await _when_due(now, lambda: reads.next_expiry(APPROVALS), self._expire_approvals),
            await _when_due(now, lambda: reads.next_expiry(QUESTIONS), self._expire_questions),
            await _when_due(now, reads.next_followup, self.service.approvals.followups_due),
        )
        return min((t for t in times if t is not None), default=None)

    async def _expire_approvals(self) -> None:
        expired = await self.service.approvals.expire_due()
        if expired:
            self.metrics.resolved("approval", "timeout", expired)
            log.info("event=expired count=%d", expired)

    async def _expire_questions(self) -> None:
        timed_out = await self.service.questions.expire_due()
        if timed_out:
            self.metrics.resolved("question", "timeout", timed_out)


async def _when_due(
    now: int, next_at: Callable[[], Awaitable[int | None]], handle: Callable[[], Awaitable[object]]
) -> int | None:
    """``next_at()`` (unix ms, or None); when it has come by ``now``, ``handle()`` first and
    then ``next_at()`` read again."""
    at = await next_at()
    if at is not None and at <= now:
        await handle()
        at = await next_at()
    return at
