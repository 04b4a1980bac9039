"""The bearer check of ``hitl-gate mcp --http``: an ASGI wrapper that answers 401
to every HTTP request without ``Authorization: Bearer <token>`` (compared in constant time)
before the MCP app sees it. The token is never logged."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def bearer_matches(header: bytes | None, token: bytes) -> bool:
    """True when ``header`` (the raw Authorization value) is ``Bearer <token>``; the scheme
    is case-insensitive (RFC 6750), the token compared with ``hmac.compare_digest``."""
    if header is None:
        return False
    scheme, _, given = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(given.strip(), token)


class BearerAuth:
    """``BearerAuth(app, token)``: an ASGI app that passes an HTTP request on to ``app`` only
    with the right bearer token, else answers 401 ``{"error": "unauthorized", "reason":
    "missing_token"|"wrong_token"}`` with ``WWW-Authenticate: Bearer``. Lifespan events pass
    through."""

    def __init__(self, app: App, token: str) -> None:
        self._app = app
        self._token = token.encode("utf-8")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization")
        if bearer_matches(header, self._token):
            await self._app(scope, receive, send)
            return
        reason = "missing_token" if header is None else "wrong_token"
        log.warning("event=mcp_refused reason=%s path=%s", reason, scope.get("path"))
        body = json.dumps({"error": "unauthorized", "reason": reason}).encode("utf-8")
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode("ascii")),
                    (b"www-authenticate", b'Bearer realm="hitl-gate-mcp"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
