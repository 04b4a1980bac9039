"""One scheduler driven by the earliest pending ``expires_at`` and ``next_followup_at``: expiry,
reminders and escalation levels, with no task per approval."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gate.core.service import GateService
from gate.errors import GateError
from gate.metrics import Metrics

log = logging.getLogger(__name__)

MAX_SLEEP_S = 3600.0
RETRY_AFTER_ERROR_S = 1.0


async def run_expiry(service: GateService, metrics: Metrics) -> None:
    """Resolve approvals, then questions, as ``timeout`` when the gate's clock
    passes their ``expires_at``; each only when its earliest deadline has passed, so a
    wake-up with nothing due writes nothing.

    Then apply the due reminders and escalation levels (``Approvals.followups_due``).
    Sleeps until the earliest deadline or follow-up (one lookup in each partial
    index), or until ``service.expiry_wakeup`` is set (a new approval may be due sooner).
    Runs until cancelled. Storage errors are logged and retried after a second. Each
    timeout counts in ``metrics`` (the gate's) as resolved ``timeout``.
    """
    resolved = metrics.approvals_resolved
    while True:
        service.expiry_wakeup.clear()
        try:
            reads = service.store.reads
            now = service.clock.now_ms()
            # a wake-up with nothing due (each create wakes it) costs reads, never a write
            # transaction: each kind is expired only when its earliest deadline has passed
            next_expiry = await reads.next_expiry()
            if next_expiry is not None and next_expiry <= now:
                expired = await service.approvals.expire_due()
                if expired:
                    resolved.labels("timeout").inc(expired)
                    log.info("event=expired count=%d", expired)
                next_expiry = await reads.next_expiry()
            next_question = await service.questions.next_expiry()
            if next_question is not None and next_question <= now:
                timed_out = await service.questions.expire_due()  # the same scheduler
                if timed_out:
                    metrics.question_resolved_many("timeout", timed_out)
                next_question = await service.questions.next_expiry()
            next_followup = await reads.next_followup()
            if next_followup is not None and next_followup <= now:
                await service.approvals.followups_due()  # a write only when one is due
                next_followup = await reads.next_followup()
            next_at = _earliest(next_expiry, next_followup, next_question)
        except GateError as exc:
            log.error("event=expiry_failed reason=%s message=%s", exc.code, exc.message)
            next_at = service.clock.now_ms() + int(RETRY_AFTER_ERROR_S * 1000)
        if next_at is None:
            delay = MAX_SLEEP_S
        else:
            delay = min(MAX_SLEEP_S, max(0.0, (next_at - service.clock.now_ms()) / 1000) + 0.002)
        with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancel (3.11)
            async with asyncio.timeout(delay):
                await service.expiry_wakeup.wait()


def _earliest(*times: int | None) -> int | None:
    """The earliest of ``times`` (unix ms) that is not None, or None."""
    return min((t for t in times if t is not None), default=None)
