"""``hitl-gate mcp``: what is refused before anything starts (one ``Error:`` line,
exit 2), and the pure parts of the server: the results an agent reads, the derived
idempotency key and the bearer check."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gate.cli import main
from gate.mcp.auth import BearerAuth, bearer_matches
from gate.mcp.results import approval_result, question_result, refused_argument
from gate.mcp.server import is_loopback
from gate.sdk import Approval, Question

BASE = ["mcp", "-c", "/nonexistent/config.yaml"]
TOKEN = "a-bearer-token-of-32-bytes-00000"


def invoke(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        pytest.param(
            ["--http", "127.0.0.1:0"],
            {},
            "Error: --http needs --token-env NAME: the variable holding the bearer token",
            id="http-without-token-env",
        ),
        pytest.param(
            ["--http", "127.0.0.1:0", "--token-env", "HITL_MCP_T"],
            {"HITL_MCP_T": ""},
            "Error: --token-env: HITL_MCP_T is not set",
            id="token-not-set",
        ),
        pytest.param(
            ["--http", "127.0.0.1:0", "--token-env", "HITL_MCP_T"],
            {"HITL_MCP_T": "short"},
            "Error: --token-env: HITL_MCP_T is shorter than 16 bytes (make one with "
            "`openssl rand -hex 32`)",
            id="token-short",
        ),
        pytest.param(
            ["--http", "127.0.0.1:0", "--token-env", "HITL_MCP_T"],
            {"HITL_MCP_T": TOKEN + "\n"},
            "Error: --token-env: HITL_MCP_T has control characters or white space; remove them",
            id="token-newline",
        ),
        pytest.param(
            ["--token-env", "HITL_MCP_T"],
            {"HITL_MCP_T": TOKEN},
            "Error: --token-env: only with --http (over stdio the host starts this process)",
            id="token-env-without-http",
        ),
        pytest.param(
            ["--http", "localhost:http", "--token-env", "HITL_MCP_T"],
            {"HITL_MCP_T": TOKEN},
            "Error: --http: 'localhost:http' is not HOST:PORT (e.g. 127.0.0.1:8093)",
            id="bad-port",
        ),
    ],
)
def test_mcp_usage_errors_are_one_line_exit_2(args, env, message):
    result = invoke([*BASE, *args], env=env)

    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [message]


def approval(**fields: Any) -> Approval:
    obj = {
        "approval_id": "01J0000000000000000000000A",
        "state": "resolved",
        "outcome": "approved",
        "final_body": "the body",
        "content_type": "text/plain",
        "payload_hash": "sha256:ab",
        "decisions": [{"identity": "alice@example.com", "decision": "approve"}],
        "receipt": {"seq": 3},
    }
    obj.update(fields)
    return Approval.from_json(obj)


@pytest.mark.parametrize("outcome", ["skipped", "timeout", "cancelled"])
def test_mcp_result_only_approved_or_adjusted_is_allowed(outcome):
    got = approval_result(approval(outcome=outcome, final_body="should not be shown"))

    assert (got["outcome"], got["allowed"], got["body"]) == (outcome, False, None)


def test_mcp_result_pending_is_not_yet():
    got = approval_result(approval(state="pending", outcome=None, final_body=None))

    assert got == {
        "approval_id": "01J0000000000000000000000A",
        "state": "pending",
        "outcome": None,
        "allowed": False,
        "ask_again_after_seconds": 1,
    }


def test_mcp_result_question_unanswered_has_no_answer():
    q = Question.from_json(
        {"question_id": "01J0000000000000000000000Q", "state": "resolved", "outcome": "timeout"}
    )

    assert question_result(q)["answer"] is None and question_result(q)["outcome"] == "timeout"


@pytest.mark.parametrize(
    ("reason", "field", "argument"),
    [
        pytest.param("unknown_step", None, "step", id="step"),
        pytest.param("unknown_pipeline", None, "pipeline", id="pipeline"),
        pytest.param("idempotency_key_reused", None, "idempotency_key", id="key"),
        pytest.param("invalid_draft", "draft.body", "draft", id="draft-field"),
        pytest.param("not_found", None, "approval_id", id="default"),
    ],
)
def test_mcp_refusal_names_the_tool_argument(reason, field, argument):
    assert refused_argument(reason, field, "approval_id") == argument


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        (None, False),
        (b"Bearer " + TOKEN.encode(), True),
        (b"bearer " + TOKEN.encode(), True),
        (b"Bearer " + TOKEN.encode() + b"x", False),
        (b"Basic " + TOKEN.encode(), False),
        (TOKEN.encode(), False),
    ],
)
def test_mcp_bearer_matches(header, ok):
    assert bearer_matches(header, TOKEN.encode()) is ok


def test_mcp_bearer_auth_refuses_before_the_app_and_passes_lifespan():
    seen: list[str] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {}

    auth = BearerAuth(app, TOKEN)
    asyncio.run(auth({"type": "http", "headers": [], "path": "/mcp"}, receive, send))
    asyncio.run(auth({"type": "lifespan"}, receive, send))
    good = [(b"authorization", f"Bearer {TOKEN}".encode())]
    asyncio.run(auth({"type": "http", "headers": good, "path": "/mcp"}, receive, send))

    assert seen == ["lifespan", "http"]
    assert sent[0]["status"] == 401 and sent[1]["body"] == (
        b'{"error": "unauthorized", "reason": "missing_token"}'
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.0.1", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("gate.example", False)],
)  # fmt: skip
def test_mcp_http_warns_off_loopback(host, loopback):
    assert is_loopback(host) is loopback
