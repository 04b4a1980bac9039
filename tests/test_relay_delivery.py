"""The one signed delivery every relay uses (gate/relay/delivery.py): what it sends, and its
retry policy: a connection error or a 5xx is retried with backoff until the deadline, a 4xx
never, and every attempt carries the same bytes re-signed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.relay import delivery
from gate.relay.delivery import Courier, GateUnreachable
from tests.support import free_port

SECRET = "delivery-test-secret-0123456789"
BODY = b'{"protocol":"hitl/v0","decision":"approve"}'


@dataclass
class Gate:
    """A stand-in gate answering each POST with the next of ``answers`` (the last one
    again when they run out), keeping what it received."""

    answers: list[int]
    received: list[tuple[bytes, dict[str, str]]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((await request.read(), dict(request.headers)))
        status = self.answers[min(len(self.received), len(self.answers)) - 1]
        return web.json_response({"status": "x", "reason": f"r{status}"}, status=status)


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(delivery, "FIRST_DELAY_S", 0.01)
    monkeypatch.setattr(delivery, "MAX_DELAY_S", 0.02)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def serve(gate: Gate) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/hitl/v0/decisions", gate.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}/hitl/v0/decisions"


@pytest.mark.parametrize("status", [200, 400, 401, 409, 422, 429])
async def test_delivery_ends_at_the_first_answer_below_500(
    session: aiohttp.ClientSession, status: int
) -> None:
    gate = Gate([status])
    runner, url = await serve(gate)
    try:
        answer = await Courier(session, SECRET).deliver(url, BODY, time.time() + 5)
    finally:
        await runner.cleanup()

    assert answer.status == status and answer.fields()["reason"] == f"r{status}"
    assert len(gate.received) == 1


async def test_delivery_retries_a_5xx_with_the_same_bytes_signed_afresh(
    session: aiohttp.ClientSession,
) -> None:
    gate = Gate([503, 500, 200])
    told: list[tuple[int, str]] = []
    runner, url = await serve(gate)
    try:
        answer = await Courier(session, SECRET).deliver(
            url, BODY, time.time() + 5, lambda attempt, problem, _: told.append((attempt, problem))
        )
    finally:
        await runner.cleanup()

    assert answer.status == 200
    assert told == [(1, "HTTP 503"), (2, "HTTP 500")]
    assert [raw for raw, _ in gate.received] == [BODY] * 3
    for _, headers in gate.received:
        assert headers[PROTOCOL_HEADER] == PROTOCOL
        assert headers["Content-Type"] == "application/json; charset=utf-8"
        signing.verify(headers[SIGNATURE_HEADER], BODY, [SECRET], time.time(), 300)


async def test_delivery_returns_the_last_5xx_at_the_deadline(
    session: aiohttp.ClientSession,
) -> None:
    gate = Gate([503])
    runner, url = await serve(gate)
    try:
        answer = await Courier(session, SECRET).deliver(url, BODY, time.time() + 0.2)
    finally:
        await runner.cleanup()

    assert answer.status == 503 and len(gate.received) >= 2


async def test_delivery_to_an_unreachable_gate_raises_at_the_deadline(
    session: aiohttp.ClientSession,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/hitl/v0/decisions"  # nothing listens there
    told: list[int] = []

    with pytest.raises(GateUnreachable, match="cannot reach the gate") as raised:
        await Courier(session, SECRET, 1.0).deliver(
            url, BODY, time.time() + 0.2, lambda attempt, *_: told.append(attempt)
        )

    assert told and told == list(range(1, len(told) + 1))
    assert SECRET not in str(raised.value)
