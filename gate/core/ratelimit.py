"""Per-approver sliding-window rate limit (SPEC §2 check 13), in memory."""

from __future__ import annotations

import math
from collections import deque

from gate.core.approvals.rules import refuse

WINDOW_MS = 60_000


class RateLimiter:
    """Allow at most ``per_minute`` decisions per operator in any 60 s window.

    State is in memory only: a restart forgets it, which errs towards letting a
    human decide rather than locking them out.
    """

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._seen: dict[int, deque[int]] = {}

    def check(self, operator_id: int, now_ms: int) -> None:
        """Count one attempt for ``operator_id`` at ``now_ms``.

        Raises 429 ``rate_limited`` with ``retry_after`` (whole seconds) when over the limit.
        """
        seen = self._seen.setdefault(operator_id, deque())
        while seen and seen[0] <= now_ms - WINDOW_MS:
            seen.popleft()
        if len(seen) >= self.per_minute:
            retry_after = max(1, math.ceil((seen[0] + WINDOW_MS - now_ms) / 1000))
            raise refuse(
                429,
                "rate_limited",
                "rate_limited",
                f"more than {self.per_minute} decisions a minute from this approver",
                retry_after=retry_after,
            )
        seen.append(now_ms)
