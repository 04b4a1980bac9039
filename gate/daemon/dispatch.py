"""The dispatcher: the loop that drains every outbox (each a
``gate.daemon.delivery.OutboxSender``) and the settings their sends share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

import aiohttp

from gate.core.approvals.approver_signature_check import step_mode
from gate.core.approvals.delegation import delegates_for
from gate.core.approvals.rules import skip_reason_required as step_requires_reason
from gate.core.service import GateService
from gate.daemon.approval_dispatch import dispatch_envelope
from gate.daemon.delivery import OutboxSender
from gate.errors import GateError
from gate.metrics import Metrics
from gate.model import Approval

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 60.0
IDLE_S = 3600.0


def backoff_s(
    attempts: int,
    rng: random.Random,
    base_s: float = BACKOFF_BASE_S,
    cap_s: float = BACKOFF_CAP_S,
) -> float:
    """Return the delay before retry number ``attempts`` (1-based), in seconds.

    Capped exponential (``base_s`` doubling, capped at ``cap_s``: by default 0.5 s and 60 s)
    with equal jitter: half fixed, half uniform random, so retries of many approvals spread
    out (SPEC §2: "retry with capped exponential backoff and jitter until expiry").
    """
    ceiling = min(cap_s, base_s * float(2 ** max(0, attempts - 1)))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


class Dispatcher:
    """The loop that drains every outbox (``outboxes``: approvals' dispatches, follow-ups,
    questions' dispatches and notices, each a ``gate.daemon.delivery.OutboxSender``), and
    the settings their sends share.

    ``secret`` signs dispatches (the current relay secret); ``timeout_s`` bounds one
    attempt (an ack is any 2xx within it); redirects are never followed. Attempts are
    retried with capped exponential backoff and jitter until the approval resolves; none
    starts at or after the approval's ``expires_at``. Nothing is sent before ``start``
    gives the public callback URL (once the callback listener is bound); ``run`` takes the
    HTTP session (``relay_session``) the POSTs go through.

    The delivery guarantees (in-flight cap, an unrecorded result recorded again without a
    second POST, storage retry, a fault while building one send recorded with backoff) are
    ``gate.daemon.delivery``'s. POSTs are counted in ``metrics`` (the gate's,
    ``gate.daemon.app.build_gate``): attempts, failures by reason, ack latency, last ack.

    ``backoff_base_s`` and ``backoff_cap_s`` shape the retry delays (``backoff_s``); the
    defaults are the daemon's (0.5 s doubling to 60 s), which no config key changes: only
    in-process tests pass smaller ones, not to wait out real backoff. Raises ValueError
    unless ``0 < backoff_base_s <= backoff_cap_s``.
    """

    def __init__(
        self,
        service: GateService,
        metrics: Metrics,
        relay_url: str,
        secret: str,
        timeout_s: float,
        *,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_cap_s: float = BACKOFF_CAP_S,
    ) -> None:
        if not 0 < backoff_base_s <= backoff_cap_s:
            raise ValueError(
                f"backoff needs 0 < base <= cap, got base {backoff_base_s} s, cap {backoff_cap_s} s"
            )
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.service = service
        self.metrics = metrics
        self.reconfigure(relay_url, secret, timeout_s, callback_url="")
        self.ready = asyncio.Event()
        self._rng = random.Random()
        # the outboxes this loop drains, in order (``gate.daemon.delivery.OutboxSender``s,
        # one per channel; set by build_gate)
        self.outboxes: tuple[OutboxSender[Any], ...] = ()

    def backoff_ms(self, attempts: int) -> int:
        """The delay before retry number ``attempts`` (1-based), in whole milliseconds: the
        one retry schedule of dispatches and follow-up sends (reminders, notices)."""
        return int(backoff_s(attempts, self._rng, self.backoff_base_s, self.backoff_cap_s) * 1000)

    def start(self, callback_url: str) -> None:
        """Let ``run`` send: dispatches carry ``callback_url`` (the public URL of the
        callback listener, ``gate.daemon.app.callback_url``)."""
        self.callback_url = callback_url
        self.ready.set()

    def reconfigure(self, relay_url: str, secret: str, timeout_s: float, callback_url: str) -> None:
        """Use these for every attempt not yet sent (from ``__init__``, then on a SIGHUP
        reload): the relay's URL, the signing secret (the current relay secret), the
        per-attempt timeout in seconds and the public callback URL ("" until ``start``). No
        await: an attempt sees all old or all new values."""
        self.relay_url = relay_url
        self.secret = secret
        self.timeout_s = timeout_s
        self.callback_url = callback_url

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Loop until cancelled: launch what is due in every outbox (``outboxes``, in order)
        through ``session``, then sleep until the next due attempt or a wake-up. Sends
        nothing before ``start``."""
        await self.ready.wait()
        wakeup = self.service.dispatch_wakeup
        try:
            while True:
                wakeup.clear()
                delay = IDLE_S
                try:
                    now = self.service.clock.now_ms()
                    for outbox in self.outboxes:
                        at = await outbox.launch_due(session, now)
                        if at is not None:
                            at_s = max(0.0, (at - self.service.clock.now_ms()) / 1000)
                            delay = min(delay, at_s + 0.002)
                except GateError as exc:
                    log.error(
                        "event=dispatch_loop_failed reason=%s message=%s", exc.code, exc.message
                    )
                    delay = 1.0
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
                # lands as the wake-up fires, and the stopping daemon would wait here forever
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(delay, IDLE_S)):
                        await wakeup.wait()
        finally:
            for outbox in self.outboxes:
                await outbox.stop()

    def envelope_for(self, full: Approval, revision: int) -> dict[str, Any]:
        """The dispatch envelope of ``revision`` as the config in force makes it now: the
        step's required skip reason and the delegations in force, for the
        revision's first dispatch and for its reminders and escalations alike."""
        config, now = self.service.config, self.service.clock.now_ms()
        return dispatch_envelope(
            full,
            revision,
            self.callback_url,
            skip_reason_required=step_requires_reason(config, full.pipeline, full.step),
            delegates=delegates_for(full, config, now),
            approver_signature=step_mode(config, full),
        )
