"""``hitl-gate mcp --http``: streamable HTTP behind a bearer token. A real gate, a
capturing relay, the MCP server as a process and the real MCP client of the ``mcp`` package
over loopback; requests without the token or with a wrong one are refused before MCP sees
them."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
from collections.abc import Callable, Iterator

import pytest
from mcp import MCPError

from tests.mcp_support import MCP_TOKEN, dispatch_for, http_mcp, result_json, rows
from tests.support import (
    DEADLINE_S,
    CliProcess,
    GateProcess,
    decision_body,
    gate_env,
    http_request,
    logged,
    module_gate,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

LISTENING = r"event=mcp_listening url=(http://127\.0\.0\.1:\d+/mcp)"
INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "probe", "version": "0"},
        },
    }
).encode()


relay, gate = module_gate("mcp-http")


@pytest.fixture(scope="module")
def server(gate: GateProcess) -> Iterator[tuple[CliProcess, str]]:
    env = gate_env(HITL_MCP_TOKEN=MCP_TOKEN)
    args = ["mcp", "-c", str(gate.config), "--api-url", gate.api_url]
    proc = CliProcess(*args, "--http", "127.0.0.1:0", "--token-env", "HITL_MCP_TOKEN", env=env)
    url = proc.wait_for_line(LISTENING).group(1)
    yield proc, url
    assert proc.stop() == 0, proc.log()  # SIGTERM: a clean stop


async def test_mcp_http_request_approval_approved(gate, relay, server):
    proc, url = server
    draft = f"Pay invoice 2026-114 ({time.monotonic_ns()})"
    async with http_mcp(url) as client:
        call = asyncio.create_task(
            client.call_tool(
                "request_approval",
                {"pipeline": "p", "step": "q1", "draft": draft, "wait_seconds": 20},
            )
        )
        dispatch = await dispatch_for(relay, draft)
        status, _, _ = await asyncio.to_thread(
            post_decision, gate.callback_url, decision_body(dispatch, "bob@example.com")
        )
        got = result_json(await call)

    assert status == 200
    assert (got["outcome"], got["allowed"], got["body"]) == ("approved", True, draft)
    assert got["decided_by"] == ["bob@example.com"]
    assert rows(
        gate, "SELECT outcome FROM approvals WHERE approval_id = ?", got["approval_id"]
    ) == [("approved",)]
    assert MCP_TOKEN not in proc.log() and draft not in proc.log()


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        pytest.param({}, "missing_token", id="no-token"),
        pytest.param({"Authorization": "Bearer wrong-token-0000000000"}, "wrong_token", id="wrong"),
        pytest.param({"Authorization": f"Basic {MCP_TOKEN}"}, "wrong_token", id="not-bearer"),
        pytest.param({"Authorization": f"Bearer {MCP_TOKEN}x"}, "wrong_token", id="longer"),
    ],
)
def test_mcp_http_refuses_a_request_without_the_right_token(gate, server, headers, reason):
    proc, url = server
    before = rows(gate, "SELECT COUNT(*) FROM approvals")
    hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

    status, got_headers, body = http_request(url, "POST", INITIALIZE, {**hdrs, **headers})

    assert status == 401
    assert json.loads(body) == {"error": "unauthorized", "reason": reason}
    assert got_headers["www-authenticate"].startswith("Bearer")
    proc.wait_for_line(f"event=mcp_refused reason={reason}")
    assert rows(gate, "SELECT COUNT(*) FROM approvals") == before


async def test_mcp_http_client_with_a_wrong_token_cannot_call_a_tool(server):
    proc, url = server
    refused = len(re.findall("reason=wrong_token", proc.log()))

    with pytest.raises(ExceptionGroup) as caught:
        async with http_mcp(url, token="wrong-token-0000000000") as client:
            await client.list_tools()

    assert caught.group_contains(MCPError)  # the client's error: the server answered 401
    wait_until(lambda: len(re.findall("reason=wrong_token", proc.log())) > refused)


def test_mcp_http_the_right_token_is_accepted(server):
    _, url = server
    hdrs = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {MCP_TOKEN}",
    }

    status, _, body = http_request(url, "POST", INITIALIZE, hdrs)

    assert status == 200, body
    assert b"hitl-gate" in body  # the server's name in the initialize result


RELAY_LISTENING = r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)"
EDITED = "Hallo Anna, bitte PO 7 angeben."


async def test_mcp_http_with_the_reference_relay_adjusts_and_answers(
    tmp_path, clis, spawn, monkeypatch
):
    """The shipped pieces end to end: ``hitl-gate relay --auto adjust:…`` decides, the gate
    resolves, ``hitl-gate mcp --http`` hands the agent the edited body to act on; a question
    gets the relay's ``--auto-answer``."""
    monkeypatch.setenv("HITL_MCP_TOKEN", MCP_TOKEN)
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--auto",
        f"adjust:{EDITED}",
        "--auto-answer",
        "globex",
    )
    steps = [
        {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
        {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
    ]
    config = write_config(
        tmp_path,
        relay.wait_for_line(RELAY_LISTENING).group(1),
        steps=steps,
        relay={"questions": True},
    )
    gate = spawn(config)
    server = clis(
        *["mcp", "-c", str(config), "--api-url", gate.api_url],
        *["--http", "127.0.0.1:0", "--token-env", "HITL_MCP_TOKEN"],
    )
    url = server.wait_for_line(LISTENING).group(1)

    async with http_mcp(url) as client:
        approval = result_json(
            await client.call_tool(
                "request_approval",
                {"pipeline": "p", "step": "q1", "draft": "Hallo Anna", "wait_seconds": 20},
            )
        )
        question = result_json(
            await client.call_tool(
                "ask_human",
                {
                    "pipeline": "p",
                    "step": "ask",
                    "text": "Which supplier?",
                    "response_type": "single_choice",
                    "options": ["acme", "globex"],
                    "wait_seconds": 20,
                },
            )
        )

    assert (approval["outcome"], approval["allowed"], approval["body"]) == (
        "adjusted",
        True,
        EDITED,
    )
    assert (question["outcome"], question["answer"]) == ("answered", "globex")
    assert EDITED not in server.log() and "globex" not in server.log()


# ---- slow and idle clients (1100 idle connections exhausted the fds) -------


@pytest.fixture
def mcp_http(gate: GateProcess) -> Iterator[Callable[..., tuple[CliProcess, str]]]:
    """Start ``mcp --http`` with extra arguments (the limits); stopped cleanly at the end."""
    started: list[CliProcess] = []

    def start(*limits: str) -> tuple[CliProcess, str]:
        env = gate_env(HITL_MCP_TOKEN=MCP_TOKEN)
        args = ["mcp", "-c", str(gate.config), "--api-url", gate.api_url, "--http", "127.0.0.1:0"]
        proc = CliProcess(*args, "--token-env", "HITL_MCP_TOKEN", *limits, env=env)
        started.append(proc)
        return proc, proc.wait_for_line(LISTENING).group(1)

    yield start
    for proc in started:
        assert proc.stop() == 0, proc.log()


def _connect(url: str) -> socket.socket:
    host, port = re.match(r"http://([\d.]+):(\d+)/", url).groups()  # type: ignore[union-attr]
    return socket.create_connection((host, int(port)), timeout=DEADLINE_S)


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed ``sock`` without an answer (recv gives b"" or a reset);
    blocks up to the socket's timeout for that."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_mcp_http_closes_a_client_that_never_finishes_its_request(mcp_http):
    """A request line and half the headers, then nothing: closed after the read timeout,
    not held open forever (a slow client holds a file descriptor)."""
    proc, url = mcp_http("--read-timeout", "1")
    with _connect(url) as slow:
        slow.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert _closed_by_server(slow)
    with _connect(url) as dribble:  # the token and a body promised, never sent: the same
        head = f"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {MCP_TOKEN}\r\n"
        dribble.sendall(
            f"{head}Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{".encode()
        )
        assert _closed_by_server(dribble)
    with _connect(url) as mute:  # connected, never a byte
        assert _closed_by_server(mute)
    assert proc.proc is not None and proc.proc.poll() is None


def test_mcp_http_a_request_in_time_is_served_with_the_read_timeout(mcp_http):
    """The timeout bounds reading a request, not answering it: a whole request is served."""
    _, url = mcp_http("--read-timeout", "1")
    status, _, _ = http_request(url, "POST", body=INITIALIZE)
    assert status == 401  # the bearer check answered: the request was read and served


async def test_mcp_http_a_tool_call_waiting_longer_than_the_read_timeout_is_answered(
    gate, relay, mcp_http
):
    """The read timeout bounds reading, never answering: with ``--read-timeout 1`` a tool
    call the gate holds 3 s (nobody decides) is answered, the same client waits again
    (keep-alive) and then gets the decision made meanwhile."""
    _, url = mcp_http("--read-timeout", "1")
    draft = f"Refund order 88 ({time.monotonic_ns()})"
    async with http_mcp(url) as client:
        first = result_json(
            await client.call_tool(
                "request_approval",
                {"pipeline": "p", "step": "q1", "draft": draft, "wait_seconds": 3},
            )
        )
        assert (first["state"], first["outcome"]) == ("pending", None), first
        dispatch = await dispatch_for(relay, draft)
        waiting = asyncio.create_task(
            client.call_tool(
                "get_approval", {"approval_id": first["approval_id"], "wait_seconds": 20}
            )
        )
        status, _, _ = await asyncio.to_thread(
            post_decision, gate.callback_url, decision_body(dispatch, "bob@example.com")
        )
        second = result_json(await waiting)
    assert status == 200
    assert (second["outcome"], second["body"]) == ("approved", draft)


def test_mcp_http_refuses_connections_over_its_cap_and_serves_again_after(mcp_http):
    """Three idle connections fill ``--max-connections 3``: a fourth is closed at once
    without an answer; once the idle ones are gone a request is served again."""
    proc, url = mcp_http("--max-connections", "3")
    idle = [_connect(url) for _ in range(3)]
    try:
        with _connect(url) as extra:
            extra.sendall(b"GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _closed_by_server(extra)
    finally:
        for sock in idle:
            sock.close()
    logged(proc, "event=mcp_connections_full limit=3")
    status = wait_until(lambda: _status(url), what="a request served after the idle ones left")
    assert status == 401


def _status(url: str) -> int | None:
    """The status of one unauthenticated POST, or None when the connection was refused."""
    try:
        return http_request(url, "POST", body=INITIALIZE)[0]
    except OSError:
        return None


HTTP = ["--http", "127.0.0.1:0", "--token-env", "HITL_MCP_TOKEN"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([*HTTP, "--read-timeout", "0"], "--read-timeout: 0 is not from 1 to 3600 seconds"),
        ([*HTTP, "--max-connections", "0"], "--max-connections: 0 is not from 1 to 10000"),
        (["--read-timeout", "5"], "--read-timeout: only with --http"),
        (["--max-connections", "5"], "--max-connections: only with --http"),
    ],
)
def test_mcp_limits_are_checked(gate, args, said):
    """Bad limits: one line naming the option, exit 2, nothing served."""
    env = gate_env(HITL_MCP_TOKEN=MCP_TOKEN)
    result = run_cli("mcp", "-c", str(gate.config), *args, env=env)
    assert (result.returncode, result.stderr.decode().strip()) == (2, f"Error: {said}")
