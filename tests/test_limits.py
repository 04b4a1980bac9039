"""Limits and abuse against the real daemon: body sizes, the per-approver rate limit, slow
clients (slowloris headers, trickled bodies, idle connections), header sizes, and dispatch
redirects that must never be followed.

Clients are raw sockets or http.client; the gate is ``python -m gate serve``. Timing bounds are
generous (CI machines are slow) but every wait has a deadline.
"""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aiohttp import web

from gate.protocol.canonical import wire_json
from tests.support import (
    API_TOKEN,
    DEADLINE_S,
    IDENTITIES,
    ROOT,
    Api,
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    post_decision,
    sign_headers,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ALICE, BOB, CAROL = IDENTITIES[:3]
APPROVED = {"status": "recorded", "resolved": True, "outcome": "approved"}
DRAFT_TOO_LARGE = {"status": "invalid", "reason": "draft_too_large"}
BODY_TOO_LARGE = {"status": "invalid", "reason": "body_too_large"}
REQUEST_TIMEOUT = {"status": "invalid", "reason": "request_timeout"}
MAX_DRAFT = 1000
HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(relay: CaptureRelay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    """One daemon with small limits: 1000-byte drafts, rate limit 3/min, 3 s for headers and
    2 s for a body."""
    config = write_config(
        tmp_path_factory.mktemp("limits"),
        relay.url,
        api={"max_draft_bytes": MAX_DRAFT},
        security={"rate_limit": 3},
    )
    text = config.read_text(encoding="utf-8")
    config.write_text(
        text + f"http:\n  header_timeout: {HEADER_TIMEOUT_S:g}s\n"
        f"  body_timeout: {BODY_TIMEOUT_S:g}s\n",
        encoding="utf-8",
    )
    proc = GateProcess(config).start()
    yield proc
    assert proc.stop() == 0
    log = proc.log()
    for needle in ("Traceback", "internal_error"):
        assert needle not in log, f"daemon log contains {needle!r}:\n{log}"


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


def connect(url: str) -> socket.socket:
    return socket.create_connection(host_port(url), timeout=DEADLINE_S)


def read_response(
    sock: socket.socket, timeout: float = DEADLINE_S, data: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response (Content-Length framed) from a raw socket; ``data`` is what
    was already received of it."""
    sock.settimeout(timeout)
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body[:length]


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True when the peer closes (EOF or reset) within ``timeout`` seconds; data is drained."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


# ---------------------------------------------------------------------------------------------
# Body sizes
# ---------------------------------------------------------------------------------------------


def create_raw(gate: GateProcess, body: str) -> tuple[int, Any]:
    return gate.api().call(
        "POST",
        "/v1/approvals",
        {"pipeline": "p", "step": "q1", "draft": {"content_type": "text/plain", "body": body}},
    )


@pytest.mark.parametrize("unit", ["x", "é", "€", "👍"])
def test_draft_of_exactly_max_draft_bytes_is_accepted_one_byte_more_is_413(gate, unit):
    size = len(unit.encode("utf-8"))
    fits = unit * (MAX_DRAFT // size) + "x" * (MAX_DRAFT % size)
    assert len(fits.encode("utf-8")) == MAX_DRAFT
    status, answer = create_raw(gate, fits)
    assert status == 201, answer
    assert create_raw(gate, fits + "x") == (413, DRAFT_TOO_LARGE)


def test_announced_oversized_bodies_are_refused_at_once_without_reading_them(gate):
    """A Content-Length over the limit is answered 413 before a single body byte is sent."""
    cases = [
        (gate.api_url, "/v1/approvals", {"Authorization": f"Bearer {API_TOKEN}"}, DRAFT_TOO_LARGE),
        (gate.callback_url, "/hitl/v0/decisions", {}, BODY_TOO_LARGE),
    ]
    for url, path, extra, expected in cases:
        sock = connect(url)
        try:
            head = [
                f"POST {path} HTTP/1.1",
                "Host: gate",
                "Content-Type: application/json",
                "Content-Length: 50000000",
                *(f"{k}: {v}" for k, v in extra.items()),
            ]
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("ascii"))
            status, _, body = read_response(sock, timeout=5)
            # 413 at once: waiting for the body would have answered 408 after body_timeout
            assert (status, json.loads(body)) == (413, expected)
        finally:
            sock.close()


def test_chunked_draft_request_over_the_read_cap_is_413(gate):
    payload = json.dumps(
        {
            "pipeline": "p",
            "step": "q1",
            "draft": {"content_type": "text/plain", "body": "x" * 300_000},
        }
    )

    def chunks() -> Iterator[bytes]:
        data = payload.encode()
        for i in range(0, len(data), 8192):
            yield data[i : i + 8192]

    host, port = host_port(gate.api_url)
    conn = http.client.HTTPConnection(host, port, timeout=DEADLINE_S)
    try:
        conn.request(
            "POST",
            "/v1/approvals",
            body=chunks(),
            encode_chunked=True,
            headers={
                "Authorization": f"Bearer {API_TOKEN}",
                "Content-Type": "application/json",
                "Transfer-Encoding": "chunked",
            },
        )
        resp = conn.getresponse()
        assert (resp.status, json.loads(resp.read())) == (413, DRAFT_TOO_LARGE)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the gate answered and closed while we were still sending: also a refusal
    finally:
        conn.close()


def test_oversized_header_is_refused_and_the_daemon_keeps_serving(gate):
    sock = connect(gate.api_url)
    try:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: gate\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
        )
        status, _, _ = read_response(sock, timeout=5)
        assert status in (400, 431)
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    assert Api(gate.api_url, None).call("GET", "/healthz")[0] == 200


# ---------------------------------------------------------------------------------------------
# Rate limit (SPEC §2 check 13)
# ---------------------------------------------------------------------------------------------


def test_burst_from_one_approver_is_cut_at_the_rate_limit_with_retry_after(gate, relay):
    """Eight decisions from alice at once, limit 3/min: exactly three are recorded, five are
    429 with a Retry-After header equal to the body's retry_after; those approvals are
    unchanged and bob, who has his own budget, decides them."""
    api = gate.api()
    ids = [api.create("q1", f"burst {i}\n")["approval_id"] for i in range(8)]
    dispatches = [relay.wait_dispatch(approval_id) for approval_id in ids]
    with ThreadPoolExecutor(8) as pool:
        results = list(
            pool.map(lambda d: post_decision(gate.callback_url, decision_body(d)), dispatches)
        )
    recorded = [i for i, (status, _, _) in enumerate(results) if status == 200]
    limited = [i for i, (status, _, _) in enumerate(results) if status == 429]
    assert len(recorded) == 3 and len(limited) == 5, [r[:2] for r in results]
    for i in limited:
        status, answer, headers = results[i]
        retry_after = int(headers["retry-after"])
        assert 1 <= retry_after <= 60
        assert answer == {
            "status": "rate_limited",
            "reason": "rate_limited",
            "retry_after": retry_after,
        }
        approval = api.get(ids[i])
        assert approval["state"] == "pending" and approval["decisions"] == []
    for i in limited[:3]:
        assert post_decision(gate.callback_url, decision_body(dispatches[i], BOB))[:2] == (
            200,
            APPROVED,
        )


# ---------------------------------------------------------------------------------------------
# Slow clients
# ---------------------------------------------------------------------------------------------


class Trickler:
    """Many raw connections, each sent one more byte of a never-ending request every
    ``every_s`` seconds; records when the server closes each one."""

    def __init__(self, urls: list[str], count: int, prefix: bytes, every_s: float = 0.5) -> None:
        self.prefix = prefix
        self.every_s = every_s
        self.socks: list[socket.socket] = []
        self.opened: dict[socket.socket, float] = {}
        self.closed: dict[socket.socket, float] = {}
        self.responses: dict[socket.socket, bytes] = {}
        for i in range(count):
            sock = connect(urls[i % len(urls)])
            sock.setblocking(False)
            self.socks.append(sock)
            self.opened[sock] = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Trickler:
        self._thread.start()
        return self

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        for sock in self.socks:
            sel.register(sock, selectors.EVENT_READ)
        sent = 0
        next_send = time.monotonic()
        while not self._stop.is_set() and len(self.closed) < len(self.socks):
            now = time.monotonic()
            if now >= next_send:
                for sock in self.socks:
                    if sock in self.closed:
                        continue
                    byte = self.prefix[sent : sent + 1] or b"a"
                    try:
                        sock.send(byte)
                    except (BlockingIOError, BrokenPipeError, ConnectionResetError, OSError):
                        pass
                sent += 1
                next_send = now + self.every_s
            for key, _ in sel.select(timeout=0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except (ConnectionResetError, OSError):
                    data = b""
                if data:
                    self.responses[sock] = self.responses.get(sock, b"") + data
                else:
                    self.closed[sock] = time.monotonic()
                    sel.unregister(sock)
        sel.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE_S)
        for sock in self.socks:
            sock.close()


def test_slowloris_headers_are_cut_after_header_timeout_and_do_not_block_others(gate, relay):
    """60 clients on both listeners send one header byte every 0.5 s and never finish: normal
    requests are served meanwhile, and every slow client is disconnected ~3 s after it
    connected (``http.header_timeout``), no matter that bytes keep arriving."""
    prefix = b"GET /healthz HTTP/1.1\r\nHost: gate\r\nX-Slow: "
    slow = Trickler([gate.api_url, gate.callback_url], 60, prefix).start()
    try:
        # the daemon keeps serving everyone else, promptly
        api = gate.api()
        for _ in range(5):
            started = time.monotonic()
            assert Api(gate.api_url, None).call("GET", "/healthz")[0] == 200
            # not held until the slow clients are cut (HEADER_TIMEOUT_S); margin for load
            assert time.monotonic() - started < HEADER_TIMEOUT_S - 0.5
        started = time.monotonic()
        approval_id = api.create("q1", "served while slow clients hang on\n")["approval_id"]
        dispatch = relay.wait_dispatch(approval_id)
        assert post_decision(gate.callback_url, decision_body(dispatch, CAROL))[:2] == (
            200,
            APPROVED,
        )
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 2

        wait_until(
            lambda: len(slow.closed) == len(slow.socks),
            HEADER_TIMEOUT_S + 8,
            "every slow client to be disconnected",
        )
        for sock in slow.socks:
            held = slow.closed[sock] - slow.opened[sock]
            assert HEADER_TIMEOUT_S - 0.5 <= held <= HEADER_TIMEOUT_S + 6, held
            assert sock not in slow.responses  # no request was ever handled
    finally:
        slow.stop()


def test_idle_connection_is_closed_after_header_timeout(gate):
    socks = [connect(url) for url in (gate.api_url, gate.callback_url)]
    started = time.monotonic()
    try:
        for sock in socks:
            assert closed_by_peer(sock, HEADER_TIMEOUT_S + 5)
            assert HEADER_TIMEOUT_S - 0.5 <= time.monotonic() - started <= HEADER_TIMEOUT_S + 6
    finally:
        for sock in socks:
            sock.close()


def test_keep_alive_connection_gets_a_fresh_header_timeout_after_each_answer(gate):
    host, port = host_port(gate.api_url)
    conn = http.client.HTTPConnection(host, port, timeout=DEADLINE_S)
    try:
        for _ in range(3):
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 200
            resp.read()
            time.sleep(HEADER_TIMEOUT_S / 2)  # idle on purpose, for less than the timeout
    finally:
        conn.close()


def slow_body(
    url: str, path: str, body: bytes, extra: dict[str, str]
) -> tuple[float, int, dict[str, str], bytes]:
    """Send complete headers, then the body one byte every 0.3 s until an answer comes."""
    sock = connect(url)
    try:
        head = [
            f"POST {path} HTTP/1.1",
            "Host: gate",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in extra.items()),
        ]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        started = time.monotonic()
        sock.setblocking(False)
        got = b""
        for i in range(len(body)):
            try:
                sock.send(body[i : i + 1])
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                pass
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    time.sleep(0.02)
                    continue
                got += chunk
                if b"\r\n\r\n" in got or not chunk:
                    break
            if b"\r\n\r\n" in got:
                break
        elapsed = time.monotonic() - started
        sock.setblocking(True)
        status, headers, answer = read_response(sock, timeout=5, data=got)
        return elapsed, status, headers, answer
    finally:
        sock.close()


def test_trickled_body_is_408_request_timeout_after_body_timeout(gate, relay):
    api = gate.api()
    approval_id = api.create("q1", "slow body\n")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    decision = wire_json(decision_body(dispatch))
    cases = [
        (gate.callback_url, "/hitl/v0/decisions", decision, sign_headers(decision)),
        (
            gate.api_url,
            "/v1/approvals",
            json.dumps(
                {
                    "pipeline": "p",
                    "step": "q1",
                    "draft": {"content_type": "text/plain", "body": "x" * 200},
                }
            ).encode(),
            {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"},
        ),
    ]
    for url, path, body, headers in cases:
        elapsed, status, resp_headers, answer = slow_body(url, path, body, headers)
        assert (status, json.loads(answer)) == (408, REQUEST_TIMEOUT)
        assert resp_headers.get("connection", "").lower() == "close"
        assert BODY_TIMEOUT_S - 0.5 <= elapsed <= BODY_TIMEOUT_S + 6, elapsed
    # nothing was recorded from the slow decision; the approval is still decidable
    assert api.get(approval_id)["decisions"] == []
    assert post_decision(gate.callback_url, decision_body(dispatch, CAROL))[:2] == (200, APPROVED)


def test_long_poll_outlives_the_header_and_body_timeouts(gate):
    api = gate.api()
    approval_id = api.create("q1", "long poll\n")["approval_id"]
    wait = HEADER_TIMEOUT_S + BODY_TIMEOUT_S + 0.5
    started = time.monotonic()
    approval = api.get(approval_id, wait=wait)
    assert approval["state"] == "pending"
    assert time.monotonic() - started >= wait - 0.1


# ---------------------------------------------------------------------------------------------
# Redirects on dispatch
# ---------------------------------------------------------------------------------------------


class RedirectingRelay(CaptureRelay):
    """Answers a dispatch whose ``run_id`` is ``r<status>`` with that status and
    ``Location: <location>``."""

    def __init__(self, location: str) -> None:
        super().__init__()
        self.location = location

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        status = int(json.loads(raw)["run_id"][1:])
        with self._cond:
            self.received.append(
                {"headers": dict(request.headers), "raw": raw, "status": status, "at": time.time()}
            )
            self._cond.notify_all()
        return web.json_response(
            {"status": "moved"}, status=status, headers={"Location": self.location}
        )


REDIRECTS = (301, 302, 303, 307, 308)


def test_dispatch_redirect_is_never_followed(tmp_path):
    """Every redirect status, pointing at a second relay that would ack: the dispatch is not
    acked, is retried at the original URL, and the second relay never sees a request."""
    target = CaptureRelay().start()
    redirecting = RedirectingRelay(target.url).start()
    proc = GateProcess(write_config(tmp_path, redirecting.url)).start()
    try:
        api = proc.api()
        ids = {status: api.create("q1", run_id=f"r{status}")["approval_id"] for status in REDIRECTS}
        for status, approval_id in ids.items():
            wait_until(
                lambda a=approval_id: len(redirecting.raw_for(a)) >= 2,
                DEADLINE_S,
                f"two attempts answered {status}",
            )
            dispatch = api.get(approval_id)["dispatch"]
            assert dispatch["delivered_at"] is None
            assert dispatch["last_error"] == f"relay answered HTTP {status}"
        assert target.received == []
        assert proc.stop() == 0
    finally:
        if proc.proc and proc.proc.poll() is None:
            proc.stop()
        redirecting.stop()
        target.stop()


def test_dispatch_never_sends_back_a_cookie_the_relay_set(tmp_path, relay):
    """A relay (or whoever answers at its URL) cannot plant state in later dispatches: the
    gate keeps no cookie jar, so a Set-Cookie on one ack is not sent with the next POST."""
    relay.set_cookie = "session=planted; Path=/; Max-Age=3600"
    # a host name: aiohttp's default jar ignores cookies from IP addresses anyway
    proc = GateProcess(write_config(tmp_path, relay.url.replace("127.0.0.1", "localhost")))
    proc.start()
    try:
        api = proc.api()
        first = api.create("q1", run_id="cookie-1")["approval_id"]
        relay.wait_dispatch(first)
        second = api.create("q1", run_id="cookie-2")["approval_id"]
        relay.wait_dispatch(second)
        with relay._cond:
            answered = list(relay.received)
        assert len(answered) >= 2
        assert all("Cookie" not in r["headers"] for r in answered), answered[-1]["headers"]
        assert proc.stop() == 0
    finally:
        if proc.proc and proc.proc.poll() is None:
            proc.stop()


def test_http_section_values_must_be_positive_durations(tmp_path, relay):
    config = write_config(tmp_path, relay.url)
    config.write_text(
        config.read_text(encoding="utf-8") + "http:\n  header_timeout: 0s\n  body_timeout: soon\n",
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, "-m", "gate", "check-config", "-c", str(config)],
        capture_output=True,
        text=True,
        env=gate_env(),
        cwd=ROOT,
        timeout=DEADLINE_S,
        check=False,
    )
    assert done.returncode == 2
    assert "http.header_timeout" in done.stderr and "http.body_timeout" in done.stderr
