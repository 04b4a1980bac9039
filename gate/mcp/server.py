"""The MCP server of ``hitl-gate mcp`` and its two transports: stdio (the agent
host starts it) and streamable HTTP on ``host:port`` behind a bearer token."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
from types import FrameType
from typing import Any

from mcp.server.mcpserver import MCPServer

from gate import __version__
from gate.mcp.auth import BearerAuth
from gate.mcp.guard import DEFAULT_MAX_CONNECTIONS, DEFAULT_READ_TIMEOUT_S
from gate.mcp.tools import register
from gate.sdk import AsyncGate

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
INSTRUCTIONS = (
    "hitl-gate puts a person between you and a real-world action. Before an action that "
    "needs approval, call request_approval with the exact draft; act only when the outcome "
    'is "approved" or "adjusted" (on "adjusted", act on the returned body). "pending" means '
    "not yet: keep asking with get_approval. Use ask_human for a question to a person."
)


def build_server(gate: AsyncGate) -> MCPServer[Any]:
    """The MCP server with the six tools of gate.mcp.tools, each calling ``gate``."""
    return MCPServer(
        "hitl-gate",
        version=__version__,
        instructions=INSTRUCTIONS,
        log_level="WARNING",
        tools=register(gate),
    )


async def serve_stdio(gate: AsyncGate) -> None:
    """Serve MCP on this process's stdin/stdout until stdin ends (the host closed it)."""
    server = build_server(gate)
    log.info("event=mcp_ready transport=stdio")
    await server.run_stdio_async()
    log.info("event=mcp_stopped transport=stdio")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _quiet_stop_server(config: Any) -> Any:
    """A uvicorn Server for which SIGTERM/SIGINT is a clean stop (exit 0, as ``serve``): the
    signal ends serving and is not raised again afterwards, as uvicorn does by default."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop without waiting
            self.should_exit = True

    return Server(config)


async def serve_http(
    gate: AsyncGate,
    sock: socket.socket,
    token: str,
    read_timeout: float = DEFAULT_READ_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Serve MCP over streamable HTTP at ``http://<sock's address>/mcp`` until SIGTERM or
    SIGINT; every request must carry ``Authorization: Bearer <token>`` (else 401). A request
    must arrive whole within ``read_timeout`` seconds and at most ``max_connections`` are
    open at once (gate.mcp.guard). Logs ``event=mcp_listening url=…`` once accepting."""
    import uvicorn

    from gate.mcp.guard import guarded_protocol

    host, port = sock.getsockname()[:2]
    server = build_server(gate)
    app = BearerAuth(server.streamable_http_app(streamable_http_path=MCP_PATH, host=host), token)
    config = uvicorn.Config(
        app,
        http=guarded_protocol(read_timeout, max_connections),
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    shown = f"[{host}]" if ":" in host else host
    if not is_loopback(host):
        log.warning(
            "event=mcp_not_loopback host=%s: the bearer token crosses the network in plain "
            "HTTP; put a TLS proxy in front",
            host,
        )
    log.info(
        "event=mcp_listening url=http://%s:%d%s read_timeout_s=%g max_connections=%d",
        shown,
        port,
        MCP_PATH,
        read_timeout,
        max_connections,
    )
    await _quiet_stop_server(config).serve(sockets=[sock])
    log.info("event=mcp_stopped transport=http")
