"""Per-approver sliding-window rate limit (SPEC §2 check 13): the rule, and its attempts in
the writer's memory (one gate on SQLite) unless the backend keeps them (PostgreSQL: every
gate's, ``WriteTx.rate_events``)."""

from __future__ import annotations

import math
from collections import deque

from gate.core.approvals.rules import refuse
from gate.store.tx import RateEvents

WINDOW_MS = 60_000


class MemoryEvents:
    """Attempts in this process's memory: a restart forgets them, which errs towards letting
    a human decide rather than locking them out."""

    def __init__(self) -> None:
        self._seen: dict[int, deque[int]] = {}

    def window(self, operator_id: int, since_ms: int) -> tuple[int, int | None]:
        seen = self._seen.setdefault(operator_id, deque())
        while seen and seen[0] <= since_ms:
            seen.popleft()
        return len(seen), seen[0] if seen else None

    def add(self, operator_id: int, at_ms: int, since_ms: int) -> None:
        self._seen.setdefault(operator_id, deque()).append(at_ms)

    def expect(self, operator_id: int, since_ms: int) -> None:
        """Nothing to read ahead: the attempts are in memory."""


class RateLimiter:
    """Allow at most ``per_minute`` decisions per operator in any 60 s window: attempts
    that pass this check count, also when a later check refuses them (check 14)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._memory = MemoryEvents()

    def expect(self, operator_id: int, now_ms: int, events: RateEvents | None = None) -> None:
        """``check`` of ``operator_id`` at ``now_ms`` is likely next: ``events`` may read its
        window ahead, with a statement sent before (``RateEvents.expect``)."""
        if events is not None:
            events.expect(operator_id, now_ms - WINDOW_MS)

    def check(self, operator_id: int, now_ms: int, events: RateEvents | None = None) -> None:
        """Count one attempt for ``operator_id`` at ``now_ms`` in ``events`` (None: this
        limiter's memory).

        Raises 429 ``rate_limited`` with ``retry_after`` (whole seconds) when over the limit
        (that attempt is not counted).
        """
        store: RateEvents = self._memory if events is None else events
        since = now_ms - WINDOW_MS
        count, oldest = store.window(operator_id, since)
        if count >= self.per_minute and oldest is not None:
            retry_after = max(1, math.ceil((oldest + WINDOW_MS - now_ms) / 1000))
            raise refuse(
                429,
                "rate_limited",
                "rate_limited",
                f"more than {self.per_minute} decisions a minute from this approver",
                retry_after=retry_after,
            )
        store.add(operator_id, now_ms, since)
