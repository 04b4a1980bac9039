"""The one long-poll (``gate.core.longpoll``, SPEC §3 ``?wait=``) in one event loop:
``wake`` returns every waiting poll at once and the next poll waits again (no spin)."""

from __future__ import annotations

import asyncio
from typing import Any

from gate.core.longpoll import Waiters, long_poll, wake

KEY = "01KDWZ8B00J3Q9V5X7Z2M4N6PR"


class Question:
    """A question's state as ``read`` sees it: pending at ``version``."""

    def __init__(self) -> None:
        self.version = 1
        self.hold = asyncio.Event()  # a slow read (e.g. a busy database) ends when set

    async def read(self, key: str) -> dict[str, Any]:
        return {"question_id": key, "state": "pending", "version": self.version}

    async def slow_read(self, key: str) -> dict[str, Any]:
        if self.version > 1:
            await self.hold.wait()
        return await self.read(key)


async def _settle() -> None:
    """Let every ready task run until it blocks again (no clock involved)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_wake_returns_every_waiting_poll_with_the_new_view() -> None:
    waiters: Waiters = {}
    q = Question()
    polls = [asyncio.create_task(long_poll(waiters, KEY, q.read, 300)) for _ in range(2)]
    await _settle()
    assert waiters[KEY][1] == 2 and not any(p.done() for p in polls)

    q.version = 2
    wake(waiters, KEY)
    views = await asyncio.wait_for(asyncio.gather(*polls), 5)

    assert [v["version"] for v in views] == [2, 2]
    assert KEY not in waiters


async def test_a_poll_started_after_a_wake_waits_for_the_next_one() -> None:
    waiters: Waiters = {}
    q = Question()
    first = asyncio.create_task(long_poll(waiters, KEY, q.read, 300))
    slow = asyncio.create_task(long_poll(waiters, KEY, q.slow_read, 300))
    await _settle()
    q.version = 2
    wake(waiters, KEY)
    assert (await asyncio.wait_for(first, 5))["version"] == 2

    # the woken client polls again while the slow poll on the same id still counts
    again = asyncio.create_task(long_poll(waiters, KEY, q.read, 300))
    await _settle()

    assert not slow.done() and waiters[KEY][1] == 2
    assert not again.done(), "a poll after the wake returned at once (the set event was kept)"
    q.hold.set()
    assert (await asyncio.wait_for(slow, 5))["version"] == 2
    q.version = 3
    wake(waiters, KEY)
    assert (await asyncio.wait_for(again, 5))["version"] == 3
    assert KEY not in waiters


def test_wake_without_waiters_keeps_nothing() -> None:
    waiters: Waiters = {}
    wake(waiters, KEY)
    assert waiters == {}
