"""Test support: the real daemon as a subprocess, a capturing relay on loopback, HTTP helpers.

Nothing here mocks a gate component: the gate runs as ``python -m gate serve``; the relay
is a real aiohttp server on 127.0.0.1 port 0; requests are real HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml
from aiohttp import web

from gate.protocol import signing
from gate.protocol.answer import build_answer
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import build_decision
from gate.store import Command

ROOT = Path(__file__).resolve().parent.parent
# at least 32 bytes each: shorter ones are refused (< 16) or warned about (check-config)
SECRET = "test-secret-new-6a1f0c9e2d7b4853"
OLD_SECRET = "test-secret-old-0e4b7d2c9a1f6385"
API_TOKEN = "test-api-token-7f3a5c0e9b2d4a61e8"
RECEIPT_KEY = "test-receipt-key-91c2d8e04f7a3b65"
# How long a wait for something that should happen (a line, a state, a process's exit) may
# last before the test fails: a bound that catches a hang, never a speed check. 60 s, not 20:
# under a second suite on the same two cores a CLI call that ends in 0.3 s took over 20 s.
DEADLINE_S = 60.0

ENV = {
    "HITL_RELAY_SECRET": SECRET,
    "HITL_RELAY_SECRET_OLD": OLD_SECRET,
    "HITL_API_TOKEN": API_TOKEN,
    "HITL_RECEIPT_KEY": RECEIPT_KEY,
}

# 20 operators: alice, bob, carol, then op04..op20; plus dave (defined, not allowed).
IDENTITIES = ["alice@example.com", "bob@example.com", "carol@example.com"] + [
    f"op{n:02d}@example.com" for n in range(4, 21)
]


@dataclass(frozen=True, slots=True)
class Named(Command[Any]):
    """A test's write transaction by ``name``, with picklable ``args``: the handler the test
    binds to a bare Store (``Store.bind``) runs it by name."""

    name: str
    args: tuple[Any, ...] = ()


def wait_until(
    predicate: Callable[[], Any], timeout: float = DEADLINE_S, what: str = "condition"
) -> Any:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class HasLog(Protocol):
    """A process of the tests whose stderr is read as it comes (``GateProcess``,
    ``CliProcess``, ``InboxProcess``)."""

    def log(self) -> str: ...


def logged(process: HasLog, text: str, times: int = 1) -> int:
    """Wait until ``process`` has logged ``text`` at least ``times`` times; return how often
    it has. A line a running process writes reaches the test through a reader thread:
    asserting on ``log()`` the moment an answer arrives raced with it (a flaky CI run: the
    answer had come, its log line not yet)."""
    wait_until(lambda: process.log().count(text) >= times, what=f"{times} x {text!r} logged")
    return process.log().count(text)


def gate_env(**extra: str) -> dict[str, str]:
    """Return the environment for a gate process: this one plus the test secrets."""
    env = dict(os.environ)
    env.update(ENV)
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


# the steps of pipeline ``p`` most tests take: an approval (quorum 1) and a question
Q1_STEP = {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"}
ASK_STEP = {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"}


def write_config(
    directory: Path,
    relay_url: str,
    *,
    steps: list[dict[str, Any]] | None = None,
    security: dict[str, Any] | None = None,
    relay: dict[str, Any] | None = None,
    api: dict[str, Any] | None = None,
    db: str = "gate.db",
) -> Path:
    """Write a test config into ``directory`` and return its path.

    Listeners bind port 0; the default steps of pipeline ``p`` are ``q1`` (quorum 1),
    ``q2`` (quorum 2), ``q3`` (quorum 3, all 20 operators) and ``short`` (timeout 3 s).
    """
    operators = [{"id": 100 + i, "identity": ident} for i, ident in enumerate(IDENTITIES, 1)]
    operators.append({"id": 999, "identity": "dave@example.com"})
    allowed = [100 + i for i in range(1, len(IDENTITIES) + 1)]
    default_steps = [
        Q1_STEP,
        {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h"},
        {"name": "q3", "quorum": 3, "approvers": allowed, "timeout": "1h"},
        {"name": "short", "quorum": 1, "approvers": [101, 102], "timeout": "3s"},
    ]
    sec = {"allowed_users": allowed, "max_input_length": 50, "rate_limit": 1000, "max_skew": "300s"}
    sec.update(security or {})
    relay_cfg: dict[str, Any] = {
        "url": relay_url,
        "secret_env": "HITL_RELAY_SECRET",
        "previous_secret_env": "HITL_RELAY_SECRET_OLD",
        "callback_addr": "127.0.0.1:0",
        "dispatch_timeout": "2s",
        "operators": operators,
        "security": sec,
    }
    relay_cfg.update(relay or {})
    api_cfg = {"listen": "127.0.0.1:0", "token_env": "HITL_API_TOKEN", "max_draft_bytes": 1048576}
    api_cfg.update(api or {})
    config = {
        "relay": relay_cfg,
        "api": api_cfg,
        "storage": {"path": db},
        "receipts": {"key_env": "HITL_RECEIPT_KEY"},
        "pipelines": [{"name": "p", "steps": steps or default_steps}],
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


class GateProcess:
    """``python -m gate serve -c CONFIG`` as a subprocess; stderr collected line by line."""

    LISTENING = re.compile(r"event=listening callback=(\S+) api=(\S+)")

    def __init__(
        self, config: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> None:
        self.config = config
        self.env = env or gate_env()
        self.args = args  # extra ``serve`` options, e.g. ("--log-level", "DEBUG")
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._eof = False  # the reader has every line (the daemon and its writer closed stderr)
        self.callback_url = ""
        self.api_url = ""

    def start(self) -> GateProcess:
        """Start and wait until both listeners are bound; returns self. A daemon that does not
        get there is killed (a failed start leaves nothing running)."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gate", "serve", "-c", str(self.config), *self.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=self.env,
            cwd=ROOT,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            match = self.wait_for_line(self.LISTENING)
        except BaseException:
            if self.proc.poll() is None:
                self.kill9()
            raise
        self.callback_url = match.group(1) + "/hitl/v0/decisions"
        self.api_url = match.group(2)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()
        self.proc.stderr.close()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for_line(
        self, pattern: re.Pattern[str] | str, timeout: float = DEADLINE_S
    ) -> re.Match[str]:
        """Wait until a stderr line matches ``pattern``; fail with the log if the process dies."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                assert self.proc is not None
                if self._eof and self.proc.poll() is not None:  # every line was read
                    raise AssertionError(
                        f"gate exited {self.proc.returncode}:\n" + "\n".join(self.lines)
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"no line matching {regex.pattern!r}:\n" + "\n".join(self.lines)
                    )
                self._cond.wait(min(remaining, 0.2))

    def log(self) -> str:
        """Return everything the daemon wrote on stderr so far (all of it once it exited:
        the reader is given up to 5 s to take the last lines)."""
        if self.proc is not None and self.proc.poll() is not None and self._reader is not None:
            self._reader.join(5)
        with self._cond:
            return "\n".join(self.lines)

    def api(self) -> Api:
        """Return a client for this gate's pipeline API."""
        return Api(self.api_url, API_TOKEN)

    def stop(self, timeout: float = DEADLINE_S) -> int:
        """SIGTERM and wait; return the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill9(self) -> None:
        """SIGKILL and reap (no clean stop); then wait until its writer process, which
        sees its input end, has exited too (as systemd waits for the unit's processes
        before a restart)."""
        assert self.proc is not None
        writers = children(self.proc.pid) if self.proc.poll() is None else []
        self.proc.kill()
        self.proc.wait(DEADLINE_S)
        wait_until(
            lambda: not any(running(pid) for pid in writers),
            what="the killed gate's writer process to exit",
        )


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (Linux /proc; none once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    except OSError:
        return []
    return [int(word) for word in text.split()]


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def writer_pid(gate: GateProcess) -> int:
    """The pid of the daemon's writer process (``gate.store.writer_process``: its one child)."""
    assert gate.proc is not None
    found = children(gate.proc.pid)
    assert len(found) == 1, f"expected one child of the gate, found {found}"
    return found[0]


def http_request(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:
    """One real HTTP request with http.client; returns ``(status, headers, raw body)``."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path or "/", body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def shown_time(wire: str) -> str:
    """How the CLI and the reference relay print the API/wire time ``wire``: RFC 3339 UTC with
    exactly three millisecond digits (computed here apart from the code under test)."""
    from datetime import UTC, datetime

    when = datetime.fromisoformat(wire.replace("Z", "+00:00")).astimezone(UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def as_json(raw: bytes) -> Any:
    """Decode a JSON answer body (empty -> None)."""
    return json.loads(raw) if raw else None


class Api:
    """Synchronous client of the pipeline API for tests."""

    def __init__(self, base: str, token: str | None) -> None:
        self.base = base.rstrip("/")
        self.token = token

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float = 330.0,
    ) -> tuple[int, Any]:
        """Send a request; ``body`` dict -> JSON, bytes as is. Returns ``(status, json)``."""
        hdrs = dict(headers or {})
        if self.token is not None:
            hdrs.setdefault("Authorization", f"Bearer {self.token}")
        data = None
        if isinstance(body, bytes):
            data = body
        elif body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            hdrs.setdefault("Content-Type", "application/json")
        status, _, raw = http_request(self.base + path, method, data, hdrs, timeout)
        return status, as_json(raw)

    def create(
        self, step: str = "q1", body: str = "Hello, world\n", pipeline: str = "p", **extra: Any
    ) -> dict[str, Any]:
        """Create an approval and return it (asserts 201)."""
        payload = {
            "pipeline": pipeline,
            "step": step,
            "draft": {"content_type": "text/plain", "body": body},
            **extra,
        }
        status, answer = self.call("POST", "/v1/approvals", payload)
        assert status == 201, (status, answer)
        return answer

    def get(self, approval_id: str, wait: float | None = None) -> dict[str, Any]:
        """GET one approval (optionally long-polling)."""
        path = f"/v1/approvals/{approval_id}" + (f"?wait={wait}" if wait is not None else "")
        status, answer = self.call("GET", path)
        assert status == 200, (status, answer)
        return answer

    def wait_resolved(self, approval_id: str, timeout: float = DEADLINE_S) -> dict[str, Any]:
        """Long-poll until resolved (fails after ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"approval {approval_id} not resolved in {timeout} s")
            approval = self.get(approval_id, wait=round(min(remaining, 10), 2))
            if approval["state"] == "resolved":
                return approval


def sign_headers(
    body: bytes, secret: str = SECRET, t: int | None = None, header: str | None = None
) -> dict[str, str]:
    """Return decision headers: a valid signature at ``t`` (default now), or ``header`` as given."""
    ts = int(time.time()) if t is None else t
    return {
        "Content-Type": "application/json",
        "X-Hitl-Protocol": "hitl/v0",
        "X-Draftcat-Signature": header if header is not None else signing.sign(secret, ts, body),
    }


def decision_body(
    dispatch: dict[str, Any],
    identity: str = "alice@example.com",
    verb: str = "approve",
    **overrides: Any,
) -> dict[str, Any]:
    """Return a decision envelope answering a captured dispatch; ``overrides`` replace fields."""
    body = build_decision(
        approval_id=dispatch["approval_id"],
        nonce=dispatch["callback"]["nonce"],
        decision=verb,
        payload_hash=dispatch["payload_hash"],
        approver_id=identity,
        decided_at_ms=int(time.time() * 1000),
        channel="test",
        adjust_text=overrides.pop("adjust_text", None),
    )
    body.update(overrides)
    return body


def post_decision(
    callback_url: str,
    body: dict[str, Any] | bytes,
    *,
    secret: str = SECRET,
    t: int | None = None,
    header: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """Sign (unless ``header`` is given) and POST a decision; returns ``(status, json,
    headers)``."""
    raw = body if isinstance(body, bytes) else wire_json(body)
    hdrs = sign_headers(raw, secret, t, header)
    hdrs.update(headers or {})
    status, resp_headers, answer = http_request(callback_url, "POST", raw, hdrs)
    return status, as_json(answer), resp_headers


class CaptureRelay:
    """A relay that records every dispatch (headers + raw bytes) and answers ``status``.

    Runs an aiohttp server on 127.0.0.1 port 0 in its own thread and event loop.
    ``status`` may be changed at any time (e.g. 503 while "down"); ``delay_s`` holds the
    connection before answering.
    """

    def __init__(self) -> None:
        self.status = 202
        self.delay_s = 0.0
        self.set_cookie: str | None = None  # a Set-Cookie header on every answer
        self.received: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CaptureRelay:
        """Start the server thread; returns self once bound."""
        self._thread.start()
        assert self._started.wait(DEADLINE_S), "capture relay did not start"
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.run_forever()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/relay"
        self._started.set()

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        status = self.status
        record = {"headers": dict(request.headers), "raw": raw, "status": status, "at": time.time()}
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        with self._cond:
            self.received.append(record)
            self._cond.notify_all()
        headers = {"Set-Cookie": self.set_cookie} if self.set_cookie else None
        return web.json_response({"status": "ok"}, status=status, headers=headers)

    def dispatches(self, acked_only: bool = True) -> list[dict[str, Any]]:
        """Return the decoded envelopes received so far (only 2xx-answered by default)."""
        with self._cond:
            return [
                json.loads(r["raw"])
                for r in self.received
                if not acked_only or 200 <= r["status"] < 300
            ]

    def wait_dispatch(
        self, approval_id: str, revision: int = 1, timeout: float = DEADLINE_S
    ) -> dict[str, Any]:
        """Wait for an acked dispatch of ``approval_id`` at ``revision``; return the envelope."""

        def find() -> dict[str, Any] | None:
            for env in self.dispatches():
                # .get: a question's dispatch names a question_id instead
                if env.get("approval_id") == approval_id and env.get("revision", 1) == revision:
                    return env
            return None

        return wait_until(find, timeout, f"dispatch of {approval_id} rev {revision}")

    def raw_for(self, approval_id: str) -> list[dict[str, Any]]:
        """Return the raw records (headers, bytes, status) received for ``approval_id``."""
        with self._cond:
            return [
                r for r in self.received if json.loads(r["raw"]).get("approval_id") == approval_id
            ]

    def stop(self) -> None:
        """Stop the server and its loop."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def module_gate(name: str, env: dict[str, str] | None = None, **config: Any) -> tuple[Any, Any]:
    """Two module-scoped fixtures, ``relay`` (a CaptureRelay on loopback) and ``gate`` (a real
    ``hitl-gate serve`` on ``write_config(<tmp>/<name>N, relay.url, **config)``, dispatching
    to it, with ``env``, default ``gate_env()``), both stopped after the module's last test.
    A module takes them as ``relay, gate = module_gate("sdk", steps=STEPS)``; they stand in
    for conftest's per-test ``relay`` and ``gate`` there."""

    @pytest.fixture(scope="module", name="relay")
    def relay() -> Iterator[CaptureRelay]:
        r = CaptureRelay().start()
        yield r
        r.stop()

    @pytest.fixture(scope="module", name="gate")
    def gate(
        tmp_path_factory: pytest.TempPathFactory, relay: CaptureRelay
    ) -> Iterator[GateProcess]:
        config_path = write_config(tmp_path_factory.mktemp(name), relay.url, **config)
        proc = GateProcess(config_path, env=env)
        proc.start()
        yield proc
        proc.stop()

    return relay, gate


# ---- questions, and the gate's SQLite file read back ----------------------------------------


def ask(
    gate: GateProcess, step: str = "ask", *, text: str = "Which supplier?", **fields: Any
) -> dict[str, Any]:
    """POST /v1/questions on pipeline ``p`` at ``step`` asking ``text``; ``fields`` add to
    the body (``response_type``, ``options``, ``schema``, ...). Asserts 201; returns the
    question's view."""
    body = {"pipeline": "p", "step": step, "text": text, **fields}
    status, out = gate.api().call("POST", "/v1/questions", body)
    assert status == 201, (status, out)
    return dict(out)


def dispatch_of(relay: CaptureRelay, question_id: str, version: int = 1) -> dict[str, Any]:
    """Wait for ``relay``'s acked dispatch of question ``question_id`` at ``version`` (never a
    resolution notice of it) and return the envelope: the question twin of
    ``CaptureRelay.wait_dispatch``."""

    def seen() -> dict[str, Any] | None:
        for d in relay.dispatches():
            if (d.get("question_id"), d.get("version")) == (question_id, version):
                if d.get("type") != "notice":
                    return d
        return None

    found: dict[str, Any] = wait_until(seen, what=f"dispatch of {question_id} v{version}")
    return found


def answer_body(
    dispatch: dict[str, Any], value: Any, who: str = "", channel: str | None = None, **over: Any
) -> dict[str, Any]:
    """An answer envelope to a captured question dispatch, by ``who`` (default its first
    approver), decided now; ``over`` replaces fields: the question twin of
    ``decision_body``."""
    body = build_answer(
        question_id=dispatch["question_id"],
        nonce=dispatch["callback"]["nonce"],
        request_hash=dispatch["request_hash"],
        value=value,
        approver_id=who or dispatch["approvers"][0],
        decided_at_ms=int(time.time() * 1000),
        channel=channel,
    )
    body.update(over)
    return body


def answer(
    gate: GateProcess, dispatch: dict[str, Any], value: Any, who: str = ""
) -> tuple[int, Any]:
    """Sign and POST ``answer_body(dispatch, value, who)`` to the gate; ``(status, json)``."""
    status, out, _ = post_decision(gate.callback_url, answer_body(dispatch, value, who))
    return status, out


def db(gate: GateProcess, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` (with ``args``) read from the gate's SQLite file on a connection of
    their own, beside the running daemon."""
    conn = sqlite3.connect(gate.config.parent / "gate.db")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


# audit entries a refused request, decision or answer could add (dispatch acks arrive on their own)
COUNT_CHANGES = (
    "SELECT COUNT(*) FROM audit_log WHERE kind NOT IN ('dispatch_ack', 'question_dispatch_ack')"
)


def snapshot(gate: GateProcess) -> tuple[Any, ...]:
    """What a refused question, revise or answer must leave as it was: every question row,
    every version, the count of audit entries that are not dispatch acks."""
    return (
        db(gate, "SELECT * FROM questions ORDER BY question_id"),
        db(gate, "SELECT * FROM question_versions ORDER BY question_id, version"),
        db(gate, COUNT_CHANGES),
    )


def kinds_of(gate: GateProcess, request_id: str) -> list[str]:
    """The kinds of the audit entries about ``request_id`` (an approval's or a question's: one
    id space), oldest first."""
    rows = db(gate, "SELECT kind FROM audit_log WHERE approval_id = ? ORDER BY seq", request_id)
    return [r[0] for r in rows]


# ---- CLI subprocess helpers (used by test_e2e_lifecycle.py and test_cli.py) ----------------


def run_cli(
    *args: str,
    stdin: bytes | None = None,
    env: dict[str, str] | None = None,
    timeout: float = DEADLINE_S,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m gate ARGS`` to completion; stdout/stderr are captured as raw bytes."""
    return subprocess.run(
        [sys.executable, "-m", "gate", *args],
        input=stdin,
        capture_output=True,
        env=env or gate_env(),
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def _interruptible() -> None:
    """In a CLI child before it runs: SIGINT handled by default and not blocked, as in a
    shell's foreground job, whatever the test process or its spawning thread inherited or
    left behind (an ignored or blocked SIGINT is kept across exec, and a command then never
    sees a Ctrl-C sent to it)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class CliProcess:
    """``python -m gate ARGS`` running in the background: stdout kept as bytes, stderr as lines.

    ``wait_for_line`` waits (with a deadline) for a stderr line; ``finish`` waits for the exit
    and returns ``(returncode, stdout bytes, stderr text)``; ``stop`` sends SIGTERM first.
    With ``keep_stdin``, stdin stays open after ``stdin`` is written: ``send`` writes more.
    """

    def __init__(
        self,
        *args: str,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        keep_stdin: bool = False,
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gate", *args],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env or gate_env(),
            cwd=ROOT,
            preexec_fn=_interruptible,
        )
        self.lines: list[str] = []
        self.stdout = b""
        self._cond = threading.Condition()
        self._eof = False
        self._threads = [
            threading.Thread(target=self._read_err, daemon=True),
            threading.Thread(target=self._read_out, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        if stdin is not None:
            self.send(stdin, close=not keep_stdin)

    def send(self, data: bytes, close: bool = False) -> None:
        """Write ``data`` to the process's stdin (``stdin=`` given), closing it if ``close``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        if close:
            self.proc.stdin.close()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._cond:
                self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
                self._cond.notify_all()
        self.proc.stderr.close()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        self.stdout = self.proc.stdout.read()
        self.proc.stdout.close()

    def log(self) -> str:
        """Return everything written on stderr so far."""
        with self._cond:
            return "\n".join(self.lines)

    def wait_for_line(
        self, pattern: re.Pattern[str] | str, timeout: float = DEADLINE_S
    ) -> re.Match[str]:
        """Wait until a stderr line matches ``pattern``; fail if stderr ends or time runs out."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines:
                    match = regex.search(line)
                    if match:
                        return match
                if self._eof:
                    raise AssertionError(
                        f"process ended without {regex.pattern!r}:\n" + "\n".join(self.lines)
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"no line matching {regex.pattern!r}:\n" + "\n".join(self.lines)
                    )
                self._cond.wait(min(remaining, 0.2))

    def finish(self, timeout: float = DEADLINE_S) -> tuple[int, bytes, str]:
        """Wait for the exit (killing it after ``timeout``); return (code, stdout, stderr)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):  # kept open (``keep_stdin``): EOF now
                self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(DEADLINE_S)
            for thread in self._threads:
                thread.join(DEADLINE_S)
            raise AssertionError(
                f"process did not exit within {timeout} s:\n{self.log()}"
            ) from None
        for thread in self._threads:
            thread.join(DEADLINE_S)
        return code, self.stdout, self.log()

    def stop(self) -> int:
        """SIGTERM (if still running) and wait; return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.finish()[0]


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago, below the kernel's
    ephemeral range: the other runs of the fleet bind port 0 all the while, and one of
    them took a port picked from that range before its owner bound it (a flaky CI run)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, max(20001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # nothing free down there: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def refused_dispatch(config: Path, env: dict[str, str] | None = None) -> str:
    """Run ``hitl-gate serve`` on ``config`` (its relay refusing every dispatch) until one
    new approval's dispatch was attempted once, then stop it; return the approval's id."""
    gate = GateProcess(config, env).start()
    try:
        api = gate.api()
        approval_id = str(api.create("q1", "never acked")["approval_id"])
        wait_until(
            lambda: api.get(approval_id)["dispatch"]["attempts"] >= 1, what="a refused attempt"
        )
    finally:
        gate.stop()
    return approval_id
