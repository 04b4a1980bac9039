"""The arguments of ``hitl-gate mcp``'s tools (gate.mcp.tools): the real MCP client of the
``mcp`` package spawns ``python -m gate mcp`` over stdio, which talks to a real gate; a
capturing relay on loopback receives the dispatches."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.mcp_support import dispatch_for, error_text, result_json, stdio_mcp
from tests.support import module_gate, wait_until

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]
BOB = "bob@example.com"
MUST_BE = "must be an operator's identity in relay.operators"

relay, gate = module_gate("mcptools", steps=STEPS, relay={"questions": True})


async def test_mcp_tools_request_approval_names_who_asks(gate, relay, errlog):
    draft = f"asked by bob {time.monotonic_ns()}"
    call = {"pipeline": "p", "step": "q1", "draft": draft, "wait_seconds": 0}
    async with stdio_mcp(gate, errlog) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        pending = result_json(
            await client.call_tool("request_approval", {**call, "requested_by": " Bob@Example.com"})
        )
        refused = await client.call_tool(
            "request_approval", {**call, "draft": f"{draft}!", "requested_by": "agent-7"}
        )

    schema = tools["request_approval"].input_schema["properties"]["requested_by"]
    assert MUST_BE in schema["description"]
    assert gate.api().get(pending["approval_id"])["requested_by"] == BOB
    assert (await dispatch_for(relay, draft))["requested_by"] == BOB
    assert refused.is_error
    assert 'requested_by: requested_by "agent-7" is not the identity' in error_text(refused)


async def test_mcp_tools_ask_human_names_who_asks(gate, relay, errlog):
    text = f"Which PO? {time.monotonic_ns()}"
    call = {"pipeline": "p", "step": "ask", "text": text, "wait_seconds": 0}
    async with stdio_mcp(gate, errlog) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        asked = result_json(await client.call_tool("ask_human", {**call, "requested_by": BOB}))

    schema = tools["ask_human"].input_schema["properties"]["requested_by"]
    assert MUST_BE in schema["description"]
    dispatch = await asyncio.to_thread(
        wait_until,
        lambda: next(
            (d for d in relay.dispatches() if d.get("question_id") == asked["question_id"]), None
        ),
        what="the question's dispatch",
    )
    assert dispatch["requested_by"] == BOB
