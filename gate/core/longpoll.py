"""One long-poll for approvals and questions (SPEC §3 ``?wait=``): wait on the
request's event until it is resolved or the wait elapses. Waiters are counted per id so the
event lives exactly as long as someone waits on it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

# id -> (event set when the request resolves or changes, how many long-polls wait on it)
Waiters = dict[str, tuple[asyncio.Event, int]]


async def long_poll(
    waiters: Waiters,
    key: str,
    read: Callable[[str], Awaitable[dict[str, Any]]],
    seconds: float,
) -> dict[str, Any]:
    """Return ``read(key)`` (an approval or question object) once its ``state`` is
    ``resolved``, when ``wake`` is called for ``key`` (a question's revise: the view is then
    pending, at its new version), or after ``seconds``, whichever comes first; ``read``
    raises what it raises (e.g. NotFound for an unknown id)."""
    event, count = waiters.get(key, (asyncio.Event(), 0))
    waiters[key] = (event, count + 1)
    try:
        view = await read(key)
        if view["state"] == "resolved" or seconds <= 0:
            return view
        try:
            await asyncio.wait_for(event.wait(), timeout=seconds)
        except TimeoutError:
            pass
        return await read(key)
    finally:
        event, count = waiters.get(key, (event, 1))
        if count <= 1:
            waiters.pop(key, None)
        else:
            waiters[key] = (event, count - 1)


def wake(waiters: Waiters, key: str) -> None:
    """Wake every long-poll waiting on ``key`` now (a resolution, or a question's revise).
    The set event is replaced by a fresh one, so a long-poll that starts after
    this (the woken client polling again) waits for the next change instead of returning at
    once."""
    found = waiters.get(key)
    if found is None:
        return
    event, count = found
    event.set()
    waiters[key] = (asyncio.Event(), count)
