"""``hitl-gate mcp``: the MCP server an agent host mounts, over stdio or (with
``--http``) streamable HTTP behind a bearer token; it talks to the gate's pipeline API."""

from __future__ import annotations

import hmac
import logging
import os
import sys

import click

from gate.cli import (
    API_URL_OPTION,
    CONFIG_OPTION,
    LOG_LEVEL_OPTION,
    fail,
    main,
    read_config,
    require_extra,
)
from gate.cli.common import NumberType
from gate.mcp.guard import DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S
from gate.protocol.numbers import ascii_int

MIN_TOKEN_BYTES = 16  # as the gate's own secrets: shorter is refused


def parse_http(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT`` or ``PORT`` (host 127.0.0.1) -> ``(host, port)``; exits 2
    with one line naming ``--http`` otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    number = ascii_int(port)
    if number is None or number > 65535:
        fail(f"--http: {value!r} is not HOST:PORT (e.g. 127.0.0.1:8093)", 2)
    return host, number


def http_token(token_env: str | None) -> str:
    """The bearer token of ``--http`` from the variable ``--token-env`` names; exits 2 with
    one line when it is not given, not set, shorter than 16 bytes or not printable."""
    if token_env is None:
        fail("--http needs --token-env NAME: the variable holding the bearer token", 2)
    token = os.environ.get(token_env, "")
    if not token:
        fail(f"--token-env: {token_env} is not set", 2)
    if not token.isprintable() or token != token.strip():
        fail(f"--token-env: {token_env} has control characters or white space; remove them", 2)
    if len(token.encode("utf-8")) < MIN_TOKEN_BYTES:
        fail(
            f"--token-env: {token_env} is shorter than {MIN_TOKEN_BYTES} bytes "
            "(make one with `openssl rand -hex 32`)",
            2,
        )
    return token


def refuse_gate_token(token_env: str, token: str, api_token: str) -> None:
    """Exit 2 with one line when the MCP bearer token (from ``token_env``) is the gate's own
    pipeline API token (the README says never; an MCP client would then
    hold the gate's key). Compared in constant time; neither value is printed."""
    if hmac.compare_digest(token.encode("utf-8"), api_token.encode("utf-8")):
        fail(
            f"--token-env: {token_env} holds the gate's own API token; give the MCP server "
            "a token of its own (e.g. `openssl rand -hex 32`)",
            2,
        )


def check_gate_token(url: str, api_token: str, token_env: str) -> None:
    """Exit 2 with one line when the gate refuses this server's pipeline API token (one
    cheap authenticated call, gate.mcp.startup); a gate that is down only logs a WARNING."""
    import asyncio

    from gate.mcp.startup import refused_status

    status = asyncio.run(refused_status(url, api_token))
    if status is not None:
        fail(
            f"the gate refused this MCP server's token (HTTP {status}): set api.token_env "
            f"({token_env}) to the gate's pipeline API token",
            2,
        )


def http_limits(
    http_addr: str | None, read_timeout: float | None, max_connections: int | None
) -> tuple[float, int]:
    """``(read timeout in seconds, connection cap)`` of ``--http`` (defaults of
    gate.mcp.guard); exits 2 with one line naming the option when one is out of range or
    given without ``--http``."""
    for name, value in (("--read-timeout", read_timeout), ("--max-connections", max_connections)):
        if value is not None and http_addr is None:
            fail(f"{name}: only with --http", 2)
    if read_timeout is not None and not 1 <= read_timeout <= 3600:
        fail(f"--read-timeout: {read_timeout:g} is not from 1 to 3600 seconds", 2)
    if max_connections is not None and not 1 <= max_connections <= 10000:
        fail(f"--max-connections: {max_connections} is not from 1 to 10000", 2)
    return (
        DEFAULT_READ_TIMEOUT_S if read_timeout is None else read_timeout,
        DEFAULT_MAX_CONNECTIONS if max_connections is None else max_connections,
    )


@main.command("mcp")
@CONFIG_OPTION
@API_URL_OPTION
@click.option(
    "--http",
    "http_addr",
    default=None,
    metavar="HOST:PORT",
    help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (PORT alone: "
    "127.0.0.1; port 0: any free port). Needs --token-env.",
)
@click.option(
    "--token-env",
    default=None,
    metavar="NAME",
    help="With --http: the variable holding the bearer token every request must carry.",
)
@click.option(
    "--read-timeout",
    type=NumberType(),
    default=None,
    metavar="SECONDS",
    help="With --http: a request must arrive whole within this time, else its connection "
    f"is closed (1..3600; default {DEFAULT_READ_TIMEOUT_S:g}).",
)
@click.option(
    "--max-connections",
    type=NumberType(whole=True),
    default=None,
    metavar="N",
    help="With --http: connections beyond N open ones are closed at once "
    f"(1..10000; default {DEFAULT_MAX_CONNECTIONS}).",
)
@LOG_LEVEL_OPTION
def mcp(
    config_path: str,
    api_url: str | None,
    http_addr: str | None,
    token_env: str | None,
    read_timeout: float | None,
    max_connections: int | None,
    log_level: str,
) -> None:
    """Run the MCP server: tools request_approval, get_approval, cancel_approval, ask_human,
    get_question and list_pending for an agent host, over stdio (the host starts this
    command) or with --http over streamable HTTP. Only approved/adjusted allow an action;
    pending is never a yes. Logs go to stderr, never a draft or an answer.

    Needs the mcp extra (pip install 'hitl-gate[mcp]'). Exit 0 when stdin ends (stdio) or
    on SIGTERM/SIGINT (HTTP), 1 when it cannot listen, 2 usage (e.g. --http without
    --token-env, the MCP token equal to the gate's), without the mcp extra, or when the
    gate refuses this server's token at start (a gate that is down: a WARNING, it serves).

    Example: hitl-gate mcp -c config.yaml
    """
    require_extra("mcp")
    import asyncio

    from gate import logs
    from gate.cli.common import api_target
    from gate.mcp.server import bind, serve_http, serve_stdio
    from gate.sdk import AsyncGate

    if token_env is not None and http_addr is None:
        fail("--token-env: only with --http (over stdio the host starts this process)", 2)
    limits = http_limits(http_addr, read_timeout, max_connections)
    target = http_addr and parse_http(http_addr)
    token = http_token(token_env) if target else ""
    config = read_config(config_path)
    url, api_token = api_target(config, api_url)
    if target and token_env is not None:
        refuse_gate_token(token_env, token, api_token)
    logs.configure(log_level.upper(), "text")
    if log_level.upper() != "DEBUG":  # the mcp package's own INFO lines (session ids) are noise
        logging.getLogger("mcp").setLevel(logging.WARNING)
    check_gate_token(url, api_token, config.api.token_env)
    sock = None
    if target:
        try:
            sock = bind(*target)
        except OSError as exc:
            fail(f"--http: cannot listen on {http_addr}: {exc.strerror or exc}", 1)

    async def serve() -> None:
        async with AsyncGate(url, api_token) as gate:
            if sock is None:
                await serve_stdio(gate)
            else:
                await serve_http(gate, sock, token, *limits)

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)
