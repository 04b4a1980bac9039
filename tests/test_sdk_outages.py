"""The SDK rides out an unreachable gate (as ``hitl-gate request --wait`` does):
a wait goes on across a gate restart, and a create is retried with its Idempotency-Key until
the gate takes it (one approval, not two). Real daemon, capturing relay, loopback."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.sdk import AsyncGate
from tests.pg_server import PgServer, running_server
from tests.support import (
    API_TOKEN,
    CaptureRelay,
    GateProcess,
    decision_body,
    free_port,
    post_decision,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


async def logged(caplog: pytest.LogCaptureFixture, text: str, timeout: float = 20.0) -> None:
    """Wait (with a deadline) until the SDK has logged a line holding ``text``."""
    deadline = time.monotonic() + timeout
    while not any(text in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, f"the SDK never logged {text!r}"
        await asyncio.sleep(0.05)


def first_dispatch(relay: CaptureRelay) -> dict[str, Any]:
    """The first dispatch the relay acked (waits for it)."""
    return dict(wait_until(relay.dispatches, what="a dispatch")[0])


def fixed_port_config(tmp_path: Path, relay: CaptureRelay) -> tuple[Path, str]:
    """A config whose API listens on a fixed free port (a restarted gate is found again)."""
    listen = f"127.0.0.1:{free_port()}"
    return write_config(tmp_path, relay.url, api={"listen": listen}), f"http://{listen}"


async def test_sdk_wait_rides_out_a_gate_restart(
    tmp_path: Path, relay: CaptureRelay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gate.sdk")
    config, url = fixed_port_config(tmp_path, relay)
    gate = await asyncio.to_thread(GateProcess(config).start)
    try:
        async with AsyncGate(url, API_TOKEN) as client:
            waiting = asyncio.create_task(client.request_approval("p", "q1", "Survive it\n"))
            dispatch = await asyncio.to_thread(first_dispatch, relay)
            assert await asyncio.to_thread(gate.stop) == 0
            await logged(caplog, f"retrying=wait approval_id={dispatch['approval_id']}")
            assert not waiting.done()
            gate = await asyncio.to_thread(GateProcess(config).start)
            body = decision_body(dispatch)
            status, _, _ = await asyncio.to_thread(post_decision, gate.callback_url, body)
            final = await asyncio.wait_for(waiting, 30)
    finally:
        if gate.proc and gate.proc.poll() is None:
            await asyncio.to_thread(gate.stop)

    assert status == 200
    assert (final.id, final.outcome) == (dispatch["approval_id"], "approved")
    assert final.body == "Survive it\n"


async def test_sdk_create_is_retried_with_its_key_until_the_gate_takes_it(
    tmp_path: Path, relay: CaptureRelay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gate.sdk")
    config, url = fixed_port_config(tmp_path, relay)
    gate = GateProcess(config)
    async with AsyncGate(url, API_TOKEN) as client:
        waiting = asyncio.create_task(
            client.request_approval("p", "q1", "Later\n", idempotency_key="sdk-retry-1")
        )
        await logged(caplog, "retrying=create idempotency_key=sdk-retry-1")
        assert not waiting.done()
        await asyncio.to_thread(gate.start)
        try:
            dispatch = await asyncio.to_thread(first_dispatch, relay)
            body = decision_body(dispatch, verb="skip", reason="not today")
            await asyncio.to_thread(post_decision, gate.callback_url, body)
            final = await asyncio.wait_for(waiting, 30)
        finally:
            await asyncio.to_thread(gate.stop)

    assert (final.outcome, final.reason) == ("skipped", "not today")
    conn = sqlite3.connect(config.parent / "gate.db")
    try:
        assert conn.execute("SELECT COUNT(*) FROM approvals").fetchone() == (1,)
    finally:
        conn.close()


def test_sdk_waits_are_bounded_against_a_gate_that_hangs(tmp_path: Path) -> None:
    """Review 18c finding 6: a SIGSTOPped gate accepts connections but never answers; a call
    with ``wait=2`` still ends within the wait + the transport's margin, raising
    GateUnavailable ("did not answer within"): never a hang, never a yes."""
    import os
    import signal
    import threading

    from gate.sdk import Gate, GateUnavailable
    from gate.sdk.transport import MARGIN_S

    relay = CaptureRelay().start()
    gate = GateProcess(write_config(tmp_path, relay.url)).start()
    client = Gate(gate.api_url, API_TOKEN)
    made = client.request_approval("p", "q1", "hang on", wait=0)
    outcomes: dict[str, Any] = {}

    def call(name: str, fn: Any) -> threading.Thread:
        def run() -> None:
            try:
                outcomes[name] = fn()
            except Exception as exc:  # the test reads what the call raised
                outcomes[name] = exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    os.kill(gate.proc.pid, signal.SIGSTOP)
    try:
        threads = [
            call("create", lambda: client.request_approval("p", "q1", "hung", wait=2)),
            call("wait", lambda: client.get_approval(made.id, wait=2)),
        ]
        for thread in threads:
            thread.join(timeout=2 + MARGIN_S + 10)  # a bound, not a measurement
        assert not any(t.is_alive() for t in threads), outcomes
    finally:
        os.kill(gate.proc.pid, signal.SIGCONT)
        gate.stop()
        relay.stop()

    for name in ("create", "wait"):
        assert isinstance(outcomes[name], GateUnavailable), outcomes
        assert "did not answer within" in str(outcomes[name])


def retries_logged(caplog: pytest.LogCaptureFixture, text: str) -> int:
    """How many lines the SDK logged holding ``text``."""
    return sum(text in r.getMessage() for r in caplog.records)


async def test_sdk_get_rides_out_a_gate_down_at_its_first_request(
    tmp_path: Path, relay: CaptureRelay, caplog: pytest.LogCaptureFixture
) -> None:
    """The first GET of ``get_approval``/``get_question`` is retried like every later poll:
    ``wait=None`` and ``wait=30`` wait through a gate that is down when they start; a short
    wait raises GateUnavailable only once it has passed, not at once."""
    from gate.sdk import GateUnavailable

    caplog.set_level(logging.WARNING, logger="gate.sdk")
    config, url = fixed_port_config(tmp_path, relay)
    gate = await asyncio.to_thread(GateProcess(config).start)
    try:
        async with AsyncGate(url, API_TOKEN) as client:
            made = await client.request_approval("p", "q1", "Down at first\n", wait=0)
            dispatch = await asyncio.to_thread(first_dispatch, relay)
            assert await asyncio.to_thread(gate.stop) == 0
            started = time.monotonic()
            with pytest.raises(GateUnavailable):
                await client.get_question("01JZZZZZZZZZZZZZZZZZZZZZZZ", wait=1.5)
            assert time.monotonic() - started >= 1.5
            unbounded = asyncio.create_task(client.get_approval(made.id))
            bounded = asyncio.create_task(client.get_approval(made.id, wait=30))
            line = f"retrying=wait approval_id={made.id}"
            deadline = time.monotonic() + 20
            while retries_logged(caplog, line) < 2:
                assert time.monotonic() < deadline, "the SDK never retried both first requests"
                await asyncio.sleep(0.05)
            assert not unbounded.done() and not bounded.done()
            gate = await asyncio.to_thread(GateProcess(config).start)
            body = decision_body(dispatch)
            status, _, _ = await asyncio.to_thread(post_decision, gate.callback_url, body)
            finals = await asyncio.wait_for(asyncio.gather(unbounded, bounded), 30)
    finally:
        if gate.proc and gate.proc.poll() is None:
            await asyncio.to_thread(gate.stop)

    assert status == 200
    assert [(f.id, f.outcome) for f in finals] == [(made.id, "approved")] * 2


@pytest.fixture
def pg() -> Iterator[PgServer]:
    """A throwaway PostgreSQL server for one test (skipped where there is none)."""
    pytest.importorskip("psycopg")
    yield from running_server()


@pytest.mark.postgres
async def test_sdk_get_retries_a_503_while_postgresql_is_down(
    tmp_path: Path, relay: CaptureRelay, pg: PgServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 503 ``storage_unavailable`` (PostgreSQL stopped under the gate) passes by itself: the
    first GET of ``get_approval(wait=20)`` retries it within the wait instead of raising it
    as a refusal, and the wait ends with the outcome once the server is back."""
    from tests.test_gate_on_postgres import start_gate

    caplog.set_level(logging.WARNING, logger="gate.sdk")
    gate = await asyncio.to_thread(start_gate, tmp_path, relay, pg.database("sdk_503"))
    try:
        async with AsyncGate(gate.api_url, API_TOKEN) as client:
            made = await client.request_approval("p", "q1", "Through a 503\n", wait=0)
            dispatch = await asyncio.to_thread(first_dispatch, relay)
            await asyncio.to_thread(pg.stop, "fast")
            try:
                waiting = asyncio.create_task(client.get_approval(made.id, wait=20))
                await logged(caplog, f"retrying=wait approval_id={made.id}")
                assert not waiting.done()
            finally:
                await asyncio.to_thread(pg.start)

            def decided() -> bool:
                status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
                assert status in (200, 503), answer
                return status == 200

            await asyncio.to_thread(wait_until, decided, what="the decision to be taken")
            final = await asyncio.wait_for(waiting, 30)
    finally:
        await asyncio.to_thread(gate.stop)

    assert (final.id, final.outcome) == (made.id, "approved")
