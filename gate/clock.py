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
