"""The SDK rides out an unreachable gate (as ``hitl-gate request --wait`` does):
a wait goes on across a gate restart, and a create is retried with its Idempotency-Key until
the gate takes it (one approval, not two). Real daemon, capturing relay, loopback."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from gate.sdk import AsyncGate
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
