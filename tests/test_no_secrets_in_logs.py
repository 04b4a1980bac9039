"""No secret, API token, receipt key, relay-URL signature or draft body ever reaches a log line.

One daemon runs at ``--log-level DEBUG`` (the most it can say) with secrets known to this test,
and goes through the suite's scenarios: create, approve, adjust (quorum 1 and 2), skip,
secret rotation, every kind of refused decision, refused API calls, expiry, cancel, a relay
answering 500, a slow relay, an unreachable relay, the CLI client, and a clean stop. Every
draft body and every adjust text carries a unique marker; so do wrong secrets and tokens that
callers present. Then no line of the daemon's stderr (nor of the CLI's stderr) may contain
any of them, nor a nonce.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gate.protocol.canonical import wire_json
from tests.support import (
    DEADLINE_S,
    ROOT,
    Api,
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    http_request,
    post_decision,
    sign_headers,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e


def marker(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex}"


RELAY_SECRET = marker("relay-secret")
OLD_RELAY_SECRET = marker("old-relay-secret")
API_TOKEN = marker("api-token")
RECEIPT_KEY = marker("receipt-key")
WRONG_SECRET = marker("wrong-secret")
WRONG_TOKEN = marker("wrong-token")
URL_SIGNATURE = marker("url-sig")
ENV = {
    "HITL_RELAY_SECRET": RELAY_SECRET,
    "HITL_RELAY_SECRET_OLD": OLD_RELAY_SECRET,
    "HITL_API_TOKEN": API_TOKEN,
    "HITL_RECEIPT_KEY": RECEIPT_KEY,
}


def DebugGate(config: Path, env: dict[str, str]) -> GateProcess:  # noqa: N802
    """``python -m gate serve --log-level DEBUG``."""
    return GateProcess(config, env, args=("--log-level", "DEBUG"))


class ScriptedRelay(CaptureRelay):
    """Answers per ``run_id``: ``script[run_id] = (status, delay_s)``; others 202 at once."""

    def __init__(self) -> None:
        super().__init__()
        self.script: dict[str, tuple[int, float]] = {}

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        status, delay = self.script.get(json.loads(raw).get("run_id"), (202, 0.0))
        if delay:
            await asyncio.sleep(delay)
        with self._cond:
            self.received.append(
                {"headers": dict(request.headers), "raw": raw, "status": status, "at": time.time()}
            )
            self._cond.notify_all()
        return web.json_response({"status": "ok"}, status=status)


@pytest.fixture
def relay() -> Iterator[ScriptedRelay]:
    r = ScriptedRelay().start()
    yield r
    r.stop()


class Scenario:
    """The daemon, its relay, and every sensitive string the scenarios used."""

    def __init__(self, gate: GateProcess, relay: ScriptedRelay) -> None:
        self.gate = gate
        self.relay = relay
        self.api = Api(gate.api_url, API_TOKEN)
        self.sensitive: set[str] = {
            RELAY_SECRET,
            OLD_RELAY_SECRET,
            API_TOKEN,
            RECEIPT_KEY,
            WRONG_SECRET,
            WRONG_TOKEN,
            URL_SIGNATURE,
        }

    def draft(self, kind: str = "draft") -> str:
        text = f"Dear customer,\n{marker(kind)}\nregards\n"
        self.sensitive.add(text.splitlines()[1])
        return text

    def open(self, step: str = "q1", run_id: str | None = None) -> tuple[str, dict[str, Any]]:
        extra = {"run_id": run_id} if run_id else {}
        approval_id = self.api.create(step, self.draft(), **extra)["approval_id"]
        dispatch = self.relay.wait_dispatch(approval_id)
        self.sensitive.add(dispatch["callback"]["nonce"])
        return approval_id, dispatch

    def decide(
        self,
        dispatch: dict[str, Any],
        identity: str = "alice@example.com",
        verb: str = "approve",
        secret: str = RELAY_SECRET,
        **overrides: Any,
    ) -> tuple[int, Any]:
        status, answer, _ = post_decision(
            self.gate.callback_url,
            decision_body(dispatch, identity, verb, **overrides),
            secret=secret,
        )
        return status, answer


def run_scenarios(s: Scenario) -> None:
    api, relay = s.api, s.relay
    # approve, with the current secret
    _, dispatch = s.open()
    assert s.decide(dispatch)[0] == 200
    # adjust with quorum 1
    _, dispatch = s.open()
    edit = s.draft("adjust")
    assert s.decide(dispatch, verb="adjust", adjust_text=edit[:50])[0] == 200
    # adjust with quorum 2, then approve revision 2 with the previous (rotated) secret
    approval_id, dispatch = s.open("q2")
    assert s.decide(dispatch, verb="adjust", adjust_text=s.draft("adjust2")[:50])[0] == 200
    second = relay.wait_dispatch(approval_id, revision=2)
    s.sensitive.add(second["callback"]["nonce"])
    assert s.decide(second, "bob@example.com", secret=OLD_RELAY_SECRET)[0] == 200
    # skip
    _, dispatch = s.open()
    assert s.decide(dispatch, verb="skip")[0] == 200

    # every kind of refused decision, on one pending approval
    approval_id, dispatch = s.open("q2")
    refused = [
        s.decide(dispatch, secret=WRONG_SECRET),
        s.decide(dispatch, payload_hash="sha256:" + "0" * 64),
        s.decide(dispatch, "mallory@example.com"),
        s.decide(dispatch, "dave@example.com"),
        s.decide(dispatch, nonce=uuid.uuid4().hex),
        s.decide(dispatch, verb="adjust", adjust_text=s.draft("too-long") * 10),
        s.decide(dispatch, verb="adjust", adjust_text="   "),
        s.decide(dispatch, decision="timeout"),
        s.decide(dispatch, approval_id="01" + "0" * 24),
    ]
    assert all(status >= 400 for status, _ in refused), refused
    stale = wire_json(decision_body(dispatch))
    assert (
        http_request(
            s.gate.callback_url,
            "POST",
            stale,
            sign_headers(stale, RELAY_SECRET, int(time.time()) - 3600),
        )[0]
        == 401
    )
    junk = f'{{"protocol": "hitl/v0", "note": "{s.draft("junk").splitlines()[1]}"'.encode()
    assert (
        http_request(s.gate.callback_url, "POST", junk, sign_headers(junk, RELAY_SECRET))[0] == 400
    )
    huge = (s.draft("huge") * 4000).encode()
    assert (
        http_request(s.gate.callback_url, "POST", huge, sign_headers(huge, RELAY_SECRET))[0] == 413
    )
    assert s.decide(dispatch)[0] == 200
    assert s.decide(dispatch)[0] == 409  # duplicate
    assert s.decide(dispatch, "bob@example.com", verb="skip")[0] == 200

    # refused API calls
    body = {
        "pipeline": "p",
        "step": "q1",
        "draft": {"content_type": "text/plain", "body": s.draft()},
    }
    assert Api(s.gate.api_url, WRONG_TOKEN).call("POST", "/v1/approvals", body)[0] == 401
    assert Api(s.gate.api_url, None).call("GET", "/v1/approvals")[0] == 401
    assert Api(s.gate.api_url, f"{API_TOKEN}x").call("GET", "/v1/approvals")[0] == 401
    assert api.call("POST", "/v1/approvals", dict(body, step="nope"))[0] == 404
    assert api.call("POST", "/v1/approvals", {"draft": s.draft()})[0] == 400
    key = {"Idempotency-Key": "k-1"}
    assert api.call("POST", "/v1/approvals", body, key)[0] == 201
    changed = dict(body, draft={"content_type": "text/plain", "body": s.draft()})
    assert api.call("POST", "/v1/approvals", changed, key)[0] == 409
    assert (
        api.call(
            "POST",
            "/v1/approvals",
            dict(body, draft={"content_type": "text/plain", "body": s.draft("big") * 100_000}),
        )[0]
        == 413
    )

    # expiry, cancel
    short, _ = s.open("short")
    approval_id, _ = s.open()
    assert api.call("POST", f"/v1/approvals/{approval_id}/cancel")[0] == 200
    assert api.wait_resolved(short)["outcome"] == "timeout"

    # a relay answering 500, then a slow one (dispatch_timeout is 2 s)
    relay.script = {"r500": (500, 0.0), "slow": (202, 3.0)}
    for run_id in relay.script:
        approval_id = api.create("q1", s.draft(), run_id=run_id)["approval_id"]
        wait_until(
            lambda a=approval_id: api.get(a)["dispatch"]["last_error"],
            DEADLINE_S,
            f"a failed dispatch ({run_id})",
        )
    relay.script = {}


def assert_nothing_sensitive(log: str, sensitive: set[str], what: str) -> None:
    for line in log.splitlines():
        for value in sensitive:
            assert value not in line, f"{what} logs a sensitive value ({value[:12]}…): {line}"
    assert "Traceback" not in log, f"{what} logged a traceback:\n{log}"


def test_no_secret_token_key_or_draft_in_any_log_line(tmp_path: Path, relay: ScriptedRelay):
    relay_url = f"{relay.url}?api-version=1&sig={URL_SIGNATURE}"
    config = write_config(tmp_path, relay_url)
    gate = DebugGate(config, gate_env(**ENV)).start()
    try:
        scenario = Scenario(gate, relay)
        run_scenarios(scenario)

        # the CLI client, waiting for a decision
        draft = scenario.draft("cli")
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gate",
                "request",
                "-c",
                str(config),
                "--api-url",
                gate.api_url,
                "--pipeline",
                "p",
                "--step",
                "q1",
                "--draft",
                draft,
                "--wait",
                "--timeout",
                "20",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=gate_env(**ENV),
            cwd=ROOT,
        )
        dispatch = wait_until(
            lambda: next((d for d in relay.dispatches() if d["draft"]["body"] == draft), None),
            DEADLINE_S,
            "the CLI's dispatch",
        )
        scenario.sensitive.add(dispatch["callback"]["nonce"])
        assert scenario.decide(dispatch)[0] == 200
        out, err = cli.communicate(timeout=DEADLINE_S)
        assert cli.returncode == 0, err.decode()
        assert out.decode() == draft  # the final body goes to stdout, by design; never stderr
        assert_nothing_sensitive(err.decode(), scenario.sensitive, "hitl-gate request")

        assert gate.stop() == 0
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.kill9()
    log = gate.log()
    assert "event=stopped" in log
    assert re.search(r" DEBUG ", log), "the daemon did not log at DEBUG level"
    assert_nothing_sensitive(log, scenario.sensitive, "the daemon")


def test_unreachable_relay_with_a_signed_url_does_not_log_the_url_signature(tmp_path: Path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = write_config(tmp_path, f"http://127.0.0.1:{port}/hook?sig={URL_SIGNATURE}")
    gate = DebugGate(config, gate_env(**ENV)).start()
    try:
        api = Api(gate.api_url, API_TOKEN)
        draft = f"body {marker('unreachable')}\n"
        approval_id = api.create("q1", draft)["approval_id"]
        wait_until(
            lambda: api.get(approval_id)["dispatch"]["attempts"] >= 2,
            DEADLINE_S,
            "two failed attempts",
        )
        assert gate.stop() == 0
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.kill9()
    assert_nothing_sensitive(
        gate.log(), {*ENV.values(), URL_SIGNATURE, draft.strip()}, "the daemon"
    )


@pytest.fixture
def garbage_relay() -> Iterator[int]:
    """A TCP server on loopback that answers every connection with bytes that are no HTTP
    (aiohttp's error text then carries the request URL); yields its port."""
    import socketserver
    import threading

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.recv(65536)
            self.request.sendall(b"NOT HTTP AT ALL\r\n\r\n")

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("shape", ["percent-encoded-query", "userinfo-and-query"])
def test_relay_url_secrets_stay_out_of_last_error_logs_and_doctor(
    tmp_path: Path, garbage_relay: int, shape: str
) -> None:
    """Security review: with a Power Automate-style URL (``sp=%2Ftriggers...&sig=...``) or one
    with userinfo, aiohttp's error text carried the URL in a form the redaction did not match
    (yarl decodes %2F; it drops the userinfo), so the signature reached ``dispatch.last_error``
    (readable with the API token), the log and ``doctor``'s output."""
    password = marker("url-password")
    if shape == "percent-encoded-query":
        url = (
            f"http://127.0.0.1:{garbage_relay}/hook?api-version=1&sp=%2Ftriggers%2Fmanual"
            f"%2Frun&sig={URL_SIGNATURE}"
        )
        sensitive = {URL_SIGNATURE}
    else:
        url = f"http://user:{password}@127.0.0.1:{garbage_relay}/hook?sig={URL_SIGNATURE}"
        sensitive = {URL_SIGNATURE, password}
    config = write_config(tmp_path, url)
    gate = DebugGate(config, gate_env(**ENV)).start()
    try:
        api = Api(gate.api_url, API_TOKEN)
        approval_id = api.create("q1", "body\n")["approval_id"]
        error = wait_until(
            lambda: api.get(approval_id)["dispatch"]["last_error"], DEADLINE_S, "a failed attempt"
        )
        for value in sensitive:
            assert value not in error, error
        assert "<redacted>" in error, error
        assert gate.stop() == 0
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.kill9()
    assert_nothing_sensitive(gate.log(), sensitive, "the daemon")
    doctor = subprocess.run(
        [sys.executable, "-m", "gate", "doctor", "-c", str(config)],
        capture_output=True,
        env=gate_env(**ENV),
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    text = doctor.stdout.decode() + doctor.stderr.decode()
    assert "relay" in text
    for value in sensitive:
        assert value not in text, text
