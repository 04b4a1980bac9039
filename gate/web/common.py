"""What both listeners share: the error middleware (one JSON error shape), bounded body reads
and the signed reads of a relay's requests on the callback listener."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from gate.errors import GateError
from gate.protocol import MAX_DECISION_BYTES, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.web.keys import CallbackSettings

log = logging.getLogger(__name__)

# an approval_id: a ULID (Crockford base32, 26 characters)
ULID_RE = re.compile(r"[0-9A-HJKMNP-TV-Z]{26}")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Seconds = TypeVar("Seconds", int, float)

DEFAULT_BODY_TIMEOUT_S = 10.0
# Seconds a client has, once its headers arrived, to send the whole body (``http.body_timeout``);
# an app without it uses DEFAULT_BODY_TIMEOUT_S.
BODY_TIMEOUT = web.AppKey("body_timeout", float)

_HTTP_REASONS = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


def error_response(exc: GateError, *, say_why: bool = False) -> web.Response:
    """Return the JSON answer for a GateError: ``{"status", "reason", ...}`` (+ Retry-After;
    a 408 also closes the connection). With ``say_why`` a 400 also carries the error's
    sentence as ``message`` (the pipeline API: what the sender must fix)."""
    body = exc.body()
    if say_why and exc.status == 400:
        body.setdefault("message", exc.message)
    headers = {}
    if "retry_after" in exc.extra:
        headers["Retry-After"] = str(exc.extra["retry_after"])
    response = web.json_response(body, status=exc.status, headers=headers)
    if exc.status == 408:
        response.force_close()
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map GateError to its JSON answer, aiohttp HTTP errors to the same shape, anything
    unexpected to 500 ``internal_error`` (logged with its traceback, never sent)."""
    return await _answer(request, handler, say_why=False)


@web.middleware
async def api_error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``error_middleware`` for the pipeline API: every 400 also says why in ``message``."""
    return await _answer(request, handler, say_why=True)


async def _answer(request: web.Request, handler: Handler, *, say_why: bool) -> web.StreamResponse:
    try:
        return await handler(request)
    except GateError as exc:
        return error_response(exc, say_why=say_why)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = _HTTP_REASONS.get(exc.status, "http_error")
        return web.json_response(
            {"status": "invalid" if exc.status == 413 else reason, "reason": reason},
            status=exc.status,
        )
    except Exception:
        log.exception("event=internal_error method=%s path=%s", request.method, request.path)
        return web.json_response({"status": "error", "reason": "internal_error"}, status=500)


async def read_body(request: web.Request, limit: int, reason: str = "body_too_large") -> bytes:
    """Read the raw request body, refusing more than ``limit`` bytes with 413 ``reason``.

    A Content-Length over the limit is refused before reading; a chunked body is read at
    most up to the app's ``client_max_size``. Nothing is decoded or trimmed. The bytes are
    cached by aiohttp, so a middleware may read them too. A body still incomplete after the
    app's ``BODY_TIMEOUT`` is refused 408 ``request_timeout`` and its connection closed, so a
    client trickling bytes cannot hold a handler for long.
    """
    if request.content_length is not None and request.content_length > limit:
        raise too_large(reason, limit)
    try:
        if request.content.is_eof():  # the whole body has arrived: nothing to wait for
            raw = await request.read()
        else:
            timeout_s = request.app.get(BODY_TIMEOUT, DEFAULT_BODY_TIMEOUT_S)
            try:
                async with asyncio.timeout(timeout_s):
                    raw = await request.read()
            except TimeoutError:
                # the answer says "Connection: close"; aiohttp then discards what still
                # trickles in for at most its lingering time (10 s) and closes the connection
                raise GateError(
                    "request_timeout",
                    f"the request body did not arrive within {timeout_s:g} s",
                    status=408,
                ) from None
    except web.HTTPRequestEntityTooLarge:
        raise too_large(reason, limit) from None
    except ConnectionResetError:
        # the client hung up before its body was complete: nothing was read, nothing is
        # recorded, and nobody is left to answer; not an internal error
        raise GateError(
            "client_disconnected", "the client closed the connection mid-body"
        ) from None
    if len(raw) > limit:
        raise too_large(reason, limit)
    return raw


def too_large(reason: str, limit: int, what: str = "body") -> GateError:
    """413 ``reason``: ``what`` (the body, or a part of it) is larger than ``limit`` bytes."""
    return GateError(reason, f"{what} is larger than {limit} bytes", status=413)


async def read_signed(
    request: web.Request, settings: CallbackSettings, now_s: Callable[[], Seconds]
) -> tuple[bytes, Seconds]:
    """SPEC §2 checks 1-4 of a relay's request, then its ``X-Hitl-Protocol``: the raw body (at
    most ``MAX_DECISION_BYTES``, else 413 ``body_too_large``), then its signature with one of
    ``settings.relay_secrets`` within ``settings.max_skew_s`` of ``now_s()`` (read once the
    body is in; 401), over the raw received bytes. Returns ``(raw body, that now)``."""
    raw = await read_body(request, MAX_DECISION_BYTES)  # check 1
    now = now_s()
    signing.verify(
        request.headers.get(SIGNATURE_HEADER),
        raw,
        settings.relay_secrets,
        now,
        settings.max_skew_s,
    )  # checks 2-4
    signing.check_protocol_header(request.headers.get(PROTOCOL_HEADER))
    return raw, now
