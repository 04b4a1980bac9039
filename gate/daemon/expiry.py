"""One expiry scheduler driven by the earliest pending ``expires_at`` (no task per approval)."""

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
    """Resolve approvals as ``timeout`` when the gate's clock passes their ``expires_at``.

    Sleeps until the earliest deadline from the partial index, or until
    ``service.expiry_wakeup`` is set (a new approval may expire sooner). Runs until
    cancelled. Storage errors are logged and retried after a second. Each timeout counts in
    ``metrics`` (the gate's) as resolved ``timeout``.
    """
    resolved = metrics.approvals_resolved
    while True:
        service.expiry_wakeup.clear()
        try:
            expired = await service.expire_due()
            if expired:
                resolved.labels("timeout").inc(expired)
                log.info("event=expired count=%d", expired)
            next_at = await service.store.next_expiry()
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
