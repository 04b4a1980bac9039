"""Limits on the connections of ``hitl-gate mcp --http`` (uvicorn does not
time out a client that sends its request slowly, and 1100 idle connections exhausted a
1024-descriptor limit).

Two rules, on uvicorn's own h11 protocol (a subclass; its parsing is untouched):
- **read timeout**: from the moment a connection opens, or a kept-alive one starts its next
  request, the whole request (line, headers and body) must arrive within ``read_timeout``
  seconds, else the connection is closed without an answer. Answering is not bounded by it
  (a tool call may wait up to 50 s for a person).
- **connection cap**: a connection beyond ``max_connections`` open ones is closed at once,
  and ``event=mcp_connections_full`` is logged (at most once a minute).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 100
FULL_LOG_EVERY_S = 60.0


def guarded_protocol(read_timeout: float, max_connections: int) -> type[Any]:
    """uvicorn's h11 protocol class with the two rules of this module; pass it to
    ``uvicorn.Config(http=...)``. ``read_timeout`` in seconds (> 0), ``max_connections``
    ≥ 1. (uvicorn is imported here, not at start: the stdio server never loads it.)"""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    reading = (h11.IDLE, h11.SEND_BODY)  # the client's side of h11: a request not yet whole
    full_logged_at: list[float] = []

    class Guarded(H11Protocol):
        read_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                now = self.loop.time()
                if not full_logged_at or now - full_logged_at[0] >= FULL_LOG_EVERY_S:
                    full_logged_at[:] = [now]
                    log.warning(
                        "event=mcp_connections_full limit=%d: new connections are closed "
                        "until some end",
                        max_connections,
                    )
                transport.close()
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state in reading:
                self._arm()
            else:  # the request is whole (or the connection is done): answering is not bounded
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.timeout_keep_alive_task is None and self.conn.their_state in reading:
                self._arm()  # a pipelined request is being read
            else:  # idle and kept alive: uvicorn's own keep-alive timeout runs
                self._disarm()

        def _arm(self) -> None:
            if self.read_timer is None and not self.transport.is_closing():
                self.read_timer = self.loop.call_later(read_timeout, self._read_timed_out)

        def _disarm(self) -> None:
            if self.read_timer is not None:
                self.read_timer.cancel()
                self.read_timer = None

        def _read_timed_out(self) -> None:
            self.read_timer = None
            if self.conn.their_state in reading and not self.transport.is_closing():
                self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = "GuardedH11Protocol"
    return Guarded
