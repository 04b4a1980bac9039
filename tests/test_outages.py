"""Outages against the real daemon: the relay down for a long stretch or misbehaving, and the
database refusing writes (disk full, file made read-only, file-size limit) while it runs.

Relays are real aiohttp servers on loopback; the gate is ``python -m gate serve``; faults are
real: a small tmpfs filled up, ``chattr +i`` on the database files, ``RLIMIT_FSIZE`` lowered on
the daemon with prlimit. A fault that this machine cannot produce (no root, no tmpfs mount,
no chattr) skips its test with the reason.
"""

from __future__ import annotations

import contextlib
import re
import resource
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gate.config import load
from gate.daemon.app import build_gate
from gate.daemon.dispatch import BACKOFF_BASE_S, BACKOFF_CAP_S, backoff_s
from gate.daemon.relay_http import post_signed, relay_session
from tests.badrelays import PermissiveServer
from tests.outbox_harness import Fault, ScriptedRelay
from tests.support import (
    DEADLINE_S,
    ENV,
    ROOT,
    Api,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    wait_until,
    write_config,
)

UNAVAILABLE = {"status": "unavailable", "reason": "storage_unavailable"}
APPROVED = {"status": "recorded", "resolved": True, "outcome": "approved"}
FAILED = re.compile(
    r"event=dispatch_failed approval_id=(\S+) revision=(\d+) attempt=(\d+) "
    r"error=.* retry_in_s=([\d.]+)"
)


def create(api: Api, step: str = "q1", run_id: str | None = None, body: str = "Draft\n") -> str:
    extra = {"run_id": run_id} if run_id else {}
    return api.create(step, body, **extra)["approval_id"]


def assert_log_clean(gate: GateProcess) -> None:
    log = gate.log()
    for needle in ("Traceback", "internal_error", "event=dispatch_loop_failed"):
        assert needle not in log, f"daemon log contains {needle!r}:\n{log}"


# ---------------------------------------------------------------------------------------------
# Relay outages
# ---------------------------------------------------------------------------------------------


def test_backoff_doubles_from_half_a_second_to_a_one_minute_cap_with_equal_jitter():
    import random

    rng = random.Random(7)
    for attempt in range(1, 20):
        ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1))
        for _ in range(50):
            assert ceiling / 2 <= backoff_s(attempt, rng) <= ceiling
    assert backoff_s(30, rng) <= 60.0


def test_backoff_base_and_cap_are_the_dispatchers_own_when_given(tmp_path):
    """``build_gate(dispatch_backoff_s=...)`` (in-process tests) reaches the dispatcher's
    delays; the default is the daemon's 0.5 s doubling to 60 s; a cap below the base is
    refused."""
    config, secrets = load(write_config(tmp_path, "http://127.0.0.1:9/relay"), ENV)
    default = build_gate(config, secrets, writer_process=False).dispatcher
    fast = build_gate(config, secrets, writer_process=False, dispatch_backoff_s=(0.01, 0.04))

    assert (default.backoff_base_s, default.backoff_cap_s) == (BACKOFF_BASE_S, BACKOFF_CAP_S)
    assert [fast.dispatcher.backoff_ms(1) <= 10 for _ in range(50)] == [True] * 50
    assert 20 <= fast.dispatcher.backoff_ms(30) <= 40
    with pytest.raises(ValueError, match="backoff needs 0 < base <= cap"):
        build_gate(config, secrets, writer_process=False, dispatch_backoff_s=(1.0, 0.5))


@pytest.mark.slow
@pytest.mark.e2e
def test_relay_down_for_a_long_stretch_retries_with_backoff_and_delivers_all_when_back(
    tmp_path, scripted
):
    """Relay unreachable (connection refused) for ~8 s: every pending approval is retried with
    growing delays, none is lost; after the relay returns each is delivered exactly once;
    one that expired meanwhile is resolved ``timeout`` and never dispatched."""
    scripted.down()
    gate = GateProcess(write_config(tmp_path, scripted.url)).start()
    try:
        api = gate.api()
        pending = [create(api, run_id=f"pending-{i}") for i in range(5)]
        expiring = create(api, "short", run_id="expiring")  # timeout 3 s
        went_down = time.monotonic()

        resolved = api.wait_resolved(expiring, timeout=DEADLINE_S)
        assert resolved["outcome"] == "timeout"
        assert resolved["dispatch"]["delivered_at"] is None
        attempts_at_expiry = resolved["dispatch"]["attempts"]
        assert attempts_at_expiry >= 2

        wait_until(lambda: time.monotonic() - went_down >= 8.0, 10, "8 s of outage")
        for approval_id in pending:
            approval = api.get(approval_id)
            assert approval["state"] == "pending"
            dispatch = approval["dispatch"]
            assert dispatch["delivered_at"] is None
            assert "Cannot connect" in dispatch["last_error"] or "refused" in dispatch["last_error"]
            # 0.5 s doubling with equal jitter: at least 4, at most 6 attempts in ~8 s
            assert 4 <= dispatch["attempts"] <= 7, dispatch
        for match in FAILED.finditer(gate.log()):
            attempt, retry_in = int(match.group(3)), float(match.group(4))
            ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (attempt - 1))
            assert ceiling / 2 - 0.11 <= retry_in <= ceiling + 0.01, match.group(0)

        scripted.up()
        for approval_id in pending:
            wait_until(
                lambda a=approval_id: api.get(a)["dispatch"]["delivered_at"],
                30,
                f"delivery of {approval_id}",
            )
        for i, approval_id in enumerate(pending):
            assert scripted.count(f"pending-{i}") == 1
            env = scripted.wait_dispatch(approval_id)
            assert env["approval_id"] == approval_id
        # the expired approval: never sent after its expiry, not even once the relay is back
        assert scripted.count("expiring") == 0
        assert api.get(expiring)["dispatch"]["attempts"] == attempts_at_expiry

        # and the delivered ones are decidable as usual
        env = scripted.wait_dispatch(pending[0])
        status, answer, _ = post_decision(gate.callback_url, decision_body(env))
        assert (status, answer) == (200, APPROVED)
        assert gate.stop() == 0
        assert_log_clean(gate)
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()


NOT_ACKS = (301, 302, 303, 307, 308, 400, 401, 404, 409, 429, 500, 502, 503)


@pytest.mark.slow
@pytest.mark.e2e
def test_relay_status_other_than_2xx_is_not_an_ack_and_is_retried(tmp_path, scripted):
    """One approval per status, all at once: 3xx (redirects are not followed), 4xx and 5xx
    are retried; once the relay answers 2xx, each is acked on its next retry."""
    scripted.script = {f"s{status}": (status, 0.0) for status in NOT_ACKS}
    scripted.location = "http://127.0.0.1:9/elsewhere"
    gate = GateProcess(write_config(tmp_path, scripted.url)).start()
    try:
        api = gate.api()
        ids = {status: create(api, run_id=f"s{status}") for status in NOT_ACKS}
        for status, approval_id in ids.items():
            wait_until(
                lambda s=status: scripted.count(f"s{s}") >= 3,
                DEADLINE_S,
                f"three attempts answered {status}",
            )
            dispatch = api.get(approval_id)["dispatch"]
            assert dispatch["delivered_at"] is None
            assert dispatch["last_error"] == f"relay answered HTTP {status}"
        # the relay recovers: the next retry is the ack
        scripted.script = {}
        for status, approval_id in ids.items():
            wait_until(
                lambda a=approval_id: api.get(a)["dispatch"]["delivered_at"],
                DEADLINE_S,
                f"the ack after {status}",
            )
        assert gate.stop() == 0
        assert_log_clean(gate)
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()


# what a relay answers a dispatch with -> what the gate keeps of it
RELAY_REFUSAL_ANSWERS = {
    "spec-reason": (
        401,
        {"status": "unauthorized", "reason": "timestamp_out_of_window"},
        "relay answered HTTP 401: timestamp_out_of_window",
    ),
    "busy-5xx": (
        503,
        {"status": "unavailable", "reason": "flow paused for maintenance"},
        "relay answered HTTP 503: flow paused for maintenance",
    ),
    # controls, escapes, quotes, backslash and non-ASCII never reach a log line or a terminal
    "hostile-characters": (
        401,
        {"reason": "bad\x1b[2J\r\nevent=forged approval_id=X 'q' \"d\" \\ caf\u00e9\u202e"},
        "relay answered HTTP 401: bad?[2J event=forged approval_id=X ?q? ?d? ? caf?",
    ),
    "long": (401, {"reason": "x" * 1000}, "relay answered HTTP 401: " + "x" * 100),
    "no-letter-or-digit": (401, {"reason": "\u0000\u0007 ..."}, "relay answered HTTP 401"),
    "reason-not-a-string": (401, {"reason": {"code": 7}}, "relay answered HTTP 401"),
    "json-array": (401, ["signature_mismatch"], "relay answered HTTP 401"),
    "plain-text": (401, "Unauthorized\n", "relay answered HTTP 401"),
    # the body beyond 4 KiB is never read: a big answer keeps no reason
    "big-body": (
        401,
        {"reason": "signature_mismatch", "pad": "p" * 10_000},
        "relay answered HTTP 401",
    ),
    "deeply-nested": (401, "[" * 4000, "relay answered HTTP 401"),
    # a relay echoing its URL's secret query value gets it redacted, as connection errors are
    "echoes-url-secret": (
        401,
        {"reason": "sig=url-secret-77aa is not ours"},
        "relay answered HTTP 401: sig=<redacted> is not ours",
    ),
}


@pytest.mark.parametrize("case", list(RELAY_REFUSAL_ANSWERS))
async def test_relay_refusal_reason_is_kept_bounded_and_sanitised(case: str) -> None:
    """The relay's JSON ``reason`` is kept with its HTTP status; it is
    at most 100 printable ASCII characters without quotes or backslashes, read from at most
    4 KiB of the answer, never the relay's whole body, and a secret of the relay URL is
    redacted from it."""
    status, answer, expected = RELAY_REFUSAL_ANSWERS[case]
    server = PermissiveServer(status, answer).start()
    try:
        async with relay_session() as session:
            # "via=relay": a query value that is also a word of the error's own text
            result = await post_signed(
                session,
                server.url + "hook?sig=url-secret-77aa&via=relay",
                b"{}",
                "secret",
                int(time.time()),
                5.0,
            )
    finally:
        server.stop()
    assert (result.status, result.error, result.failure) == (status, expected, "http_status")
    assert len(server.requests()) == 1


@pytest.mark.slow
@pytest.mark.e2e
def test_relay_2xx_variants_are_acks(tmp_path, scripted):
    scripted.script = {
        "s200": (200, 0.0),
        "s201": (201, 0.0),
        "s204": (204, 0.0),
        "s299": (299, 0.0),
    }
    gate = GateProcess(write_config(tmp_path, scripted.url)).start()
    try:
        api = gate.api()
        ids = {run_id: create(api, run_id=run_id) for run_id in scripted.script}
        for run_id, approval_id in ids.items():
            wait_until(
                lambda a=approval_id: api.get(a)["dispatch"]["delivered_at"],
                DEADLINE_S,
                f"ack of {run_id}",
            )
            assert api.get(approval_id)["dispatch"]["attempts"] == 1
            assert scripted.count(run_id) == 1
        assert gate.stop() == 0
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()


@pytest.mark.slow
@pytest.mark.e2e
def test_slow_relay_times_out_is_retried_and_does_not_hold_other_dispatches(tmp_path, scripted):
    """``relay.dispatch_timeout`` is 5 s here; the relay holds one run for 8 s. The five
    other dispatches are acked while that attempt is still in flight (no attempt recorded
    yet: it ends only at its timeout), so it held none of them. (Was a wall-clock bound of
    1.5 s with a 2 s timeout: at risk on a loaded host, flaky-test audit.)"""
    scripted.script = {"slow": (202, 8.0)}
    gate = GateProcess(
        write_config(tmp_path, scripted.url, relay={"dispatch_timeout": "5s"})
    ).start()
    try:
        api = gate.api()
        slow = create(api, run_id="slow")
        wait_until(lambda: scripted.count("slow") == 1, DEADLINE_S, "the slow dispatch")
        fast = [create(api, run_id=f"fast-{i}") for i in range(5)]
        for approval_id in fast:
            wait_until(
                lambda a=approval_id: api.get(a)["dispatch"]["delivered_at"],
                DEADLINE_S,
                "a fast ack",
            )
        held = api.get(slow)["dispatch"]
        assert (held["attempts"], held["delivered_at"]) == (0, None), (
            "the fast dispatches waited for the slow relay answer"
        )
        wait_until(
            lambda: api.get(slow)["dispatch"]["attempts"] >= 1,
            DEADLINE_S,
            "the slow attempt's timeout",
        )
        dispatch = api.get(slow)["dispatch"]
        assert dispatch["delivered_at"] is None
        assert dispatch["last_error"] == "no answer within 5 s"
        scripted.script = {}
        wait_until(
            lambda: api.get(slow)["dispatch"]["delivered_at"],
            DEADLINE_S,
            "the ack once the relay is fast",
        )
        assert gate.stop() == 0
        assert_log_clean(gate)
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()


def healthz(gate: GateProcess) -> tuple[int, Any]:
    return Api(gate.api_url, None).call("GET", "/healthz")


def integrity(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def audit_verify(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gate", "audit", "verify", "-c", str(config)],
        capture_output=True,
        text=True,
        env=gate_env(),
        cwd=ROOT,
        timeout=DEADLINE_S,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_database_refusing_writes_answers_503_changes_nothing_and_recovers_without_restart(
    fault: Fault, scripted: ScriptedRelay
):
    """Writes answer 503 storage_unavailable, /healthz reports it, reads keep working, the
    failed transactions leave nothing behind, a relay ack that cannot be recorded is not
    re-sent, and once the fault is fixed the same daemon writes again; the file is intact."""
    scripted.script = {"held": (202, 3.0)}  # answered 3 s after arrival (timeout: 6 s)
    config = write_config(fault.dir, scripted.url, relay={"dispatch_timeout": "6s"})
    gate = GateProcess(config).start()
    try:
        api = gate.api()
        decided = create(api, run_id="decided")
        env = scripted.wait_dispatch(decided)
        wait_until(lambda: api.get(decided)["dispatch"]["delivered_at"], what="first ack")
        assert healthz(gate)[0] == 200
        before = api.get(decided)

        held = create(api, run_id="held")
        wait_until(lambda: scripted.count("held") == 1, what="the held dispatch")
        fault.apply(gate)  # while the relay holds its answer

        status, answer = api.call(
            "POST",
            "/v1/approvals",
            {
                "pipeline": "p",
                "step": "q1",
                "draft": {"content_type": "text/plain", "body": "refused\n"},
            },
        )
        assert (status, answer) == (503, UNAVAILABLE)
        status, answer, _ = post_decision(gate.callback_url, decision_body(env))
        assert (status, answer) == (503, UNAVAILABLE)
        assert api.call("POST", f"/v1/approvals/{decided}/cancel") == (503, UNAVAILABLE)
        assert healthz(gate) == (503, UNAVAILABLE)
        gate.wait_for_line("event=storage_unavailable")
        # reads still answer, and show that nothing changed
        assert api.get(decided) == before
        status, listed = api.call("GET", "/v1/approvals?state=all")
        assert status == 200 and len(listed["items"]) == 2

        # the relay acked "held" during the fault: recording is retried, the POST is not
        wait_until(
            lambda: (
                len(
                    re.findall(
                        rf"event=dispatch_failed approval_id={held} reason=storage_unavailable",
                        gate.log(),
                    )
                )
                >= 2
            ),
            what="two failed attempts to record the held ack",
        )
        assert scripted.count("held") == 1

        fault.clear(gate)
        wait_until(lambda: healthz(gate)[0] == 200, what="/healthz to recover")
        status, answer, _ = post_decision(gate.callback_url, decision_body(env))
        assert (status, answer) == (200, APPROVED)
        later = create(api, run_id="later")
        scripted.wait_dispatch(later)
        wait_until(lambda: api.get(held)["dispatch"]["delivered_at"], what="held ack recorded")
        assert scripted.count("held") == 1
        assert api.get(held)["dispatch"]["attempts"] == 1
        assert api.get(decided)["decisions"][0]["decision"] == "approve"

        assert gate.stop() == 0
        gate.wait_for_line("event=storage_recovered")
        assert_log_clean(gate)
    finally:
        if gate.proc and gate.proc.poll() is None:
            with contextlib.suppress(Exception):
                fault.clear(gate)
            gate.stop()
    assert integrity(fault.db) == "ok"
    verified = audit_verify(config)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_a_dispatch_that_cannot_be_built_is_retried_with_backoff_not_in_a_hot_loop(
    tmp_path, scripted
):
    """A fault while building one dispatch (here: a stored budget that no longer encodes as
    JSON, as two ``spend`` values of 1.7e308 once summed to infinity) is recorded as that
    attempt's failure and retried with backoff; before, the dispatcher's task died, was started
    again at once, and the daemon spun a core and wrote ~15k log lines a second while no other
    dispatch left (security review). Other approvals are dispatched as usual."""
    scripted.script = {"poison": (503, 0.0)}  # its first attempt fails: the row waits 0.25-0.5 s
    config = write_config(tmp_path, scripted.url)
    gate = GateProcess(config).start()
    try:
        api = gate.api()
        poison = create(api, run_id="poison")
        wait_until(
            lambda: api.get(poison)["dispatch"]["attempts"] >= 1,
            DEADLINE_S,
            "the first (refused) attempt",
        )
        with contextlib.closing(sqlite3.connect(tmp_path / "gate.db", timeout=30)) as conn:
            conn.execute(
                "UPDATE approvals SET budget = ? WHERE approval_id = ?",
                (
                    '{"unit": "EUR", "spent_today": 1e999, "cap_today": 20.0,'
                    ' "spent_pipeline": 0.0, "cap_pipeline": null, "this_request": 1.0}',
                    poison,
                ),
            )
            conn.commit()
        wait_until(
            lambda: "could not be built" in (api.get(poison)["dispatch"]["last_error"] or ""),
            DEADLINE_S,
            "the failure recorded",
        )
        dispatch = api.get(poison)["dispatch"]
        assert dispatch["last_error"] == "the dispatch could not be built (ValueError)"
        assert dispatch["delivered_at"] is None

        other = create(api, run_id="other")
        wait_until(
            lambda: api.get(other)["dispatch"]["delivered_at"],
            DEADLINE_S,
            "the other approval's ack",
        )
        # backoff, not a loop: 0.5 s doubling means a handful of attempts by now, not thousands
        attempts = api.get(poison)["dispatch"]["attempts"]
        assert 2 <= attempts <= 6, attempts
        failures = gate.log().count(f"event=dispatch_failed approval_id={poison}")
        assert failures <= 6, failures
        assert scripted.count("poison") == 1  # nothing was sent after the fault
        assert gate.stop() == 0
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()


@pytest.mark.slow
@pytest.mark.e2e
def test_out_of_file_descriptors_is_logged_once_a_minute_and_the_gate_recovers(tmp_path, scripted):
    """Security review: with its file descriptors exhausted by idle connections, asyncio
    logged "socket.accept() out of system resource" with a traceback ~700 times a second
    (115,000 lines in 25 s), which would also push real events out of journald's rate
    limit. It is now one line per minute (with how many were left out); once the
    connections close, the gate answers again."""
    import socket

    gate = GateProcess(write_config(tmp_path, scripted.url)).start()
    socks: list[socket.socket] = []
    try:
        soft, hard = resource.prlimit(gate.proc.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(gate.proc.pid, resource.RLIMIT_NOFILE, (64, hard))
        host, port = gate.callback_url.split("/")[2].split(":")
        for _ in range(120):
            socks.append(socket.create_connection((host, int(port)), timeout=5))
        gate.wait_for_line(r"event=accept_failed")
        started = time.monotonic()
        wait_until(lambda: time.monotonic() - started >= 3, 5, "three seconds of exhaustion")
        log = gate.log()
        assert log.count("event=accept_failed") == 1, log[-3000:]
        assert "out of system resource" not in log, log[-3000:]
        assert "Traceback" not in log
        for sock in socks:
            sock.close()
        socks.clear()
        resource.prlimit(gate.proc.pid, resource.RLIMIT_NOFILE, (soft, hard))
        api = gate.api()
        wait_until(lambda: api.call("GET", "/healthz")[0] == 200, DEADLINE_S, "answers again")
        assert gate.stop() == 0
    finally:
        for sock in socks:
            sock.close()
        if gate.proc and gate.proc.poll() is None:
            gate.stop()
