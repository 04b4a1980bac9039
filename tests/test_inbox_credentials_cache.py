"""The inbox's credentials cache: when it asks the gate again for an
unknown credential id, and how a gate outage is logged. The real ``CredentialsCache`` with
an explicit monotonic clock and a fetch function standing in for the gate's channel."""

from __future__ import annotations

import logging

import pytest

from gate.inbox.credentials_cache import CredentialsCache
from gate.inbox.gate_client import GateUnreachable
from gate.protocol.credentials import CredentialsAnswer


class Gate:
    """Answers the credentials channel with no credentials, or is down."""

    def __init__(self) -> None:
        self.down = False
        self.asked = 0

    async def fetch(self) -> CredentialsAnswer:
        self.asked += 1
        if self.down:
            raise GateUnreachable(ConnectionRefusedError("gate down"), None)
        return CredentialsAnswer("2026-12-01T00:00:00Z", None, ())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_refresh_for_unknown_asks_again_for_another_id_but_not_the_same_one() -> None:
    gate, clock = Gate(), Clock()
    cache = CredentialsCache(gate.fetch, None, now_s=clock)

    assert await cache.refresh_for_unknown("A") is True
    clock.now += 1.0
    assert await cache.refresh_for_unknown("B") is True  # enrolled a moment after A
    assert await cache.refresh_for_unknown("B") is False  # B again within 5 s: cached
    clock.now += 5.0
    assert await cache.refresh_for_unknown("B") is True
    assert gate.asked == 3


async def test_refresh_for_unknown_asks_at_most_twice_a_second() -> None:
    gate, clock = Gate(), Clock()
    cache = CredentialsCache(gate.fetch, None, now_s=clock)

    answers = [await cache.refresh_for_unknown(f"id{n}") for n in range(5)]

    assert answers == [True, True, False, False, False]
    clock.now += 1.0
    assert await cache.refresh_for_unknown("id9") is True
    assert gate.asked == 3


async def test_fetched_within_says_how_fresh_the_gates_last_answer_is() -> None:
    """What a session with an unknown credential relies on before it is ended as revoked:
    a failed ask keeps the time of the last answer."""
    gate, clock = Gate(), Clock()
    cache = CredentialsCache(gate.fetch, None, now_s=clock)
    assert cache.fetched_within(5.0) is False  # never answered

    await cache.refresh()
    clock.now += 4.9
    assert cache.fetched_within(5.0) is True
    gate.down = True
    assert await cache.refresh() is False
    clock.now += 0.1
    assert cache.fetched_within(5.0) is False


async def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate, clock = Gate(), Clock()
    cache = CredentialsCache(gate.fetch, None, now_s=clock)
    caplog.set_level(logging.INFO, logger="gate.inbox.credentials_cache")
    gate.down = True

    for _ in range(4):
        assert await cache.refresh() is False
    gate.down = False
    assert await cache.refresh() is True
    assert await cache.refresh() is True

    events = [
        (r.levelno, r.getMessage().split()[0])
        for r in caplog.records
        if "event=credentials_" in r.getMessage()
    ]
    assert events == [
        (logging.WARNING, "event=credentials_unavailable"),
        (logging.INFO, "event=credentials_available"),
    ]
