"""Test support for ``hitl-gate mcp``: the real MCP client of the ``mcp`` package
connected to a real ``python -m gate mcp`` over stdio or streamable HTTP, and the gate's
dispatches and SQLite file read back. Nothing mocked."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent

from tests.support import ROOT, CaptureRelay, GateProcess, gate_env, wait_until

MCP_TOKEN = "test-mcp-token-4b1e9c2d7a3f6085"


def mcp_args(gate: GateProcess, *extra: str, api_url: str | None = None) -> list[str]:
    """``-m gate mcp`` arguments for a server that talks to ``gate`` (or ``api_url``)."""
    url = api_url or gate.api_url
    return ["-m", "gate", "mcp", "-c", str(gate.config), "--api-url", url, *extra]


@asynccontextmanager
async def stdio_mcp(
    gate: GateProcess, errlog: TextIO, api_url: str | None = None
) -> AsyncIterator[Client]:
    """The MCP client over stdio of a fresh ``python -m gate mcp`` (its stderr in ``errlog``)
    talking to ``gate`` (or ``api_url``); leaving the block ends the server process."""
    params = StdioServerParameters(
        command=sys.executable, args=mcp_args(gate, api_url=api_url), env=gate_env(), cwd=str(ROOT)
    )
    async with Client(stdio_client(params, errlog=errlog)) as client:
        yield client


@asynccontextmanager
async def http_mcp(url: str, token: str | None = MCP_TOKEN) -> AsyncIterator[Client]:
    """The MCP client over streamable HTTP at ``url``, sending ``token`` as bearer."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def result_json(result: CallToolResult) -> dict[str, Any]:
    """The structured answer of a tool call that succeeded."""
    assert not result.is_error, error_text(result)
    assert isinstance(result.structured_content, dict), result
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    """The text of a tool error (``isError``)."""
    return " ".join(c.text for c in result.content if isinstance(c, TextContent))


async def dispatch_for(relay: CaptureRelay, draft: str) -> dict[str, Any]:
    """The relay's dispatch whose draft body is ``draft`` (waited for with a deadline)."""

    def find() -> dict[str, Any] | None:
        for d in relay.dispatches():
            if d.get("draft", {}).get("body") == draft:
                return d
        return None

    found: dict[str, Any] = await asyncio.to_thread(wait_until, find, what=f"dispatch of {draft}")
    return found


def rows(gate: GateProcess, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of the gate's real SQLite file."""
    conn = sqlite3.connect(Path(gate.config).parent / "gate.db")
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()
