"""``hitl-gate mcp`` as a new agent developer meets it: ``spend`` and unknown
arguments of request_approval, a question step used with the wrong tool, the gate token
refused (at start and later) and the MCP token equal to the gate's. The real MCP client over
stdio, a real gate and a capturing relay on loopback; waits are conditions with deadlines."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.mcp_support import error_text, mcp_args, result_json, rows, stdio_mcp
from tests.support import (
    API_TOKEN,
    CaptureRelay,
    GateProcess,
    free_port,
    gate_env,
    module_gate,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
    {
        "name": "small",
        "quorum": 1,
        "approvers": [101, 102],
        "timeout": "1h",
        "policy": [{"id": "petty", "decide": "approve", "when": {"max_spend": 20}}],
    },
]
WRONG = "a-wrong-gate-token-0123456789abcdef"


relay, gate = module_gate("mcpdx", steps=STEPS, relay={"questions": True})


def read(errlog: Any) -> str:
    return Path(errlog.name).read_text(encoding="utf-8")


async def test_mcp_request_approval_passes_spend_to_the_gate(gate, errlog):
    async with stdio_mcp(gate, errlog) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        call = {"pipeline": "p", "step": "q1", "draft": "pay 12.50", "wait_seconds": 0}
        answer = result_json(await client.call_tool("request_approval", {**call, "spend": 12.5}))
        negative = await client.call_tool("request_approval", {**call, "spend": -1})

    schema = tools["request_approval"].input_schema
    assert schema["properties"]["spend"]["anyOf"][0]["minimum"] == 0
    assert schema.get("additionalProperties") is False
    assert rows(
        gate, "SELECT spend FROM approvals WHERE approval_id = ?", answer["approval_id"]
    ) == [(12.5,)]
    assert negative.is_error and "spend" in error_text(negative)


async def test_mcp_spend_lets_a_max_spend_rule_decide(gate, errlog):
    call = {"pipeline": "p", "step": "small", "wait_seconds": 0}
    async with stdio_mcp(gate, errlog) as client:
        cheap = result_json(
            await client.call_tool("request_approval", {**call, "draft": "tea", "spend": 4})
        )
        unsaid = result_json(await client.call_tool("request_approval", {**call, "draft": "?"}))

    assert (cheap["state"], cheap["outcome"], cheap["allowed"]) == ("resolved", "approved", True)
    assert cheap["decided_by"] == ["policy:petty"]
    assert unsaid["state"] == "pending"  # no spend: the rule cannot match, a person decides


async def test_mcp_unknown_arguments_are_a_tool_error_naming_them(gate, errlog):
    before = rows(gate, "SELECT COUNT(*) FROM approvals")
    async with stdio_mcp(gate, errlog) as client:
        call = {"pipeline": "p", "step": "q1", "draft": "typo", "wait_seconds": 0}
        result = await client.call_tool("request_approval", {**call, "max_spend": 5, "wait": 1})
        other = await client.call_tool("get_approval", {"approval_id": "x", "timeout": 3})

    assert result.is_error
    assert "unknown arguments: max_spend, wait" in error_text(result)
    assert other.is_error and "unknown argument: timeout" in error_text(other)
    assert rows(gate, "SELECT COUNT(*) FROM approvals") == before  # nothing was created


async def test_mcp_wrong_kind_of_step_names_the_right_tool(gate, errlog):
    async with stdio_mcp(gate, errlog) as client:
        approval = await client.call_tool(
            "request_approval", {"pipeline": "p", "step": "ask", "draft": "x", "wait_seconds": 0}
        )
        question = await client.call_tool(
            "ask_human", {"pipeline": "p", "step": "q1", "text": "which?", "wait_seconds": 0}
        )

    assert approval.is_error
    assert error_text(approval).endswith("step: this step asks a question: use the ask_human tool")
    assert question.is_error
    assert error_text(question).endswith(
        "step: this step is an approval step: use the request_approval tool"
    )


def test_mcp_refuses_to_start_when_the_gate_refuses_its_token(gate):
    done = run_cli(*mcp_args(gate)[2:], stdin=b"", env=gate_env(HITL_API_TOKEN=WRONG))

    assert done.returncode == 2, done.stderr.decode()
    lines = [ln for ln in done.stderr.decode().splitlines() if ln.startswith("Error:")]
    assert lines == [
        "Error: the gate refused this MCP server's token (HTTP 401): set api.token_env "
        "(HITL_API_TOKEN) to the gate's pipeline API token"
    ]
    assert WRONG not in done.stderr.decode() and API_TOKEN not in done.stderr.decode()


async def test_mcp_starts_while_the_gate_is_down_and_reports_a_refused_token(
    tmp_path: Path, relay: CaptureRelay, errlog: Any
) -> None:
    """Started before the gate (an agent host starts it early): a WARNING, and it serves.
    The gate then comes up with another token: the tool error says the MCP server's gate
    token is refused, not that an argument is wrong."""
    port = free_port()
    listen = {"listen": f"127.0.0.1:{port}"}
    config = write_config(tmp_path, relay.url, steps=STEPS[:1], api=listen)
    down = GateProcess(config, env=gate_env(HITL_API_TOKEN=WRONG))
    async with stdio_mcp(down, errlog, api_url=f"http://127.0.0.1:{port}") as client:
        await asyncio.to_thread(
            wait_until, lambda: "mcp_gate_unreachable" in read(errlog), what="w"
        )
        down.start()
        try:
            result = await client.call_tool(
                "request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": 0}
            )
        finally:
            down.stop()

    log = read(errlog)
    assert "WARNING" in log and "event=mcp_gate_unreachable" in log
    assert result.is_error
    assert error_text(result).endswith(
        "the gate refused this MCP server's token (HTTP 401): not an argument's fault; "
        "the operator must set the token hitl-gate mcp uses (api.token_env)"
    )


@pytest.mark.parametrize("name", ["HITL_API_TOKEN", "HITL_MCP_SAME"])
def test_mcp_http_refuses_the_gate_token_as_its_own(gate, name):
    env = gate_env(HITL_MCP_SAME=API_TOKEN)
    done = run_cli(*mcp_args(gate)[2:], "--http", "127.0.0.1:0", "--token-env", name, env=env)

    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"Error: --token-env: {name} holds the gate's own API token; give the MCP server "
        "a token of its own (e.g. `openssl rand -hex 32`)"
    ]
