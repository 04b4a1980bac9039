"""The one injectable clock: unix milliseconds, UTC."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now_ms() -> int`` (unix epoch milliseconds, UTC)."""

    def now_ms(self) -> int:
        """Return the current time in unix milliseconds."""
        ...


class PinnedClock:
    """``clock``, or while a write batch on PostgreSQL holds the cluster's write lock, the
    database's time read when the lock was taken, advancing by this process's monotonic
    clock (``pin``): every gate's transactions then read one clock, non-decreasing in the
    audit log's order whatever each host's clock says. ``unpin`` ends the batch's time.
    Outside a batch it is ``clock`` less ``offset_ms``, that clock minus the database's as
    the gate last measured it (``gate.daemon.cluster``; 0 until then), so what runs outside
    the batches (the senders choosing what is due) reads the database's time too."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._pinned: tuple[int, float] | None = None
        self.offset_ms = 0

    def local_ms(self) -> int:
        """The wrapped clock's time, as this host has it (to measure ``offset_ms`` with)."""
        return self._clock.now_ms()

    def pin(self, now_ms: int) -> None:
        """From now until ``unpin``, the time is ``now_ms`` plus the monotonic time since."""
        self._pinned = (now_ms, time.monotonic())

    def unpin(self) -> None:
        """Back to the wrapped clock."""
        self._pinned = None

    def now_ms(self) -> int:
        """The pinned time advanced by the monotonic clock, else the wrapped clock's less
        ``offset_ms``."""
        pinned = self._pinned
        if pinned is None:
            return self._clock.now_ms() - self.offset_ms
        return pinned[0] + int((time.monotonic() - pinned[1]) * 1000)


class SystemClock:
    """The wall clock (``time.time()``)."""

    def now_ms(self) -> int:
        """Return ``time.time()`` in whole milliseconds."""
        return int(time.time() * 1000)
