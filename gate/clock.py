"""The one injectable clock: unix milliseconds, UTC."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now_ms() -> int`` (unix epoch milliseconds, UTC)."""

    def now_ms(self) -> int:
        """Return the current time in unix milliseconds."""
        ...


class SystemClock:
    """The wall clock (``time.time()``)."""

    def now_ms(self) -> int:
        """Return ``time.time()`` in whole milliseconds."""
        return int(time.time() * 1000)


class ManualClock:
    """A clock that moves only when told to; for tests of expiry without sleeping."""

    def __init__(self, start_ms: int) -> None:
        self._now = int(start_ms)

    def now_ms(self) -> int:
        """Return the set time in unix milliseconds."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (may be fractional)."""
        self._now += int(seconds * 1000)
