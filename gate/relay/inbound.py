"""A signed POST from the gate (a dispatch or a resolution notice) as a relay receives it:
the body read whole under a size limit, then opened by ``gate.protocol.relay_inbound``
(signature, window, JSON, protocol). One set of answers for the reference relay and the
inbox."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from aiohttp import web

from gate.errors import GateError
from gate.protocol import SIGNATURE_HEADER
from gate.protocol.relay_inbound import MAX_DISPATCH_BYTES, open_signed

TOO_LARGE = {"status": "invalid", "reason": "body_too_large"}


async def read_whole(request: web.Request, limit: int) -> bytes | None:
    """The request's whole body (bytes), or None when it is larger than ``limit`` bytes (a
    Content-Length over it is refused before reading; a body without one is read at most up
    to the app's ``client_max_size``, which must exceed ``limit``). The caller answers None
    with 413 ``body_too_large``. (``request.content.read(n)`` would answer with what has
    arrived so far: a body larger than one network read would be cut.)"""
    if request.content_length is not None and request.content_length > limit:
        return None
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None
    return raw if len(raw) <= limit else None


async def open_request(
    request: web.Request,
    secrets: Sequence[str],
    now: Callable[[], float],
    max_skew: float,
    log: logging.Logger,
    quiet: Collection[str] = (),
) -> tuple[bytes, dict[str, Any]] | web.Response:
    """The raw body and the envelope of a signed POST from the gate, or the answer refusing
    it: 413 ``body_too_large`` over MAX_DISPATCH_BYTES, else ``open_signed``'s refusal (401
    with the signature's reason, 400 ``invalid_json``/``invalid_protocol``) as its JSON body,
    logged on ``log`` as ``event=dispatch_refused`` unless its code is in ``quiet``.
    ``secrets`` are the relay secrets (current first), ``now()`` the clock (unix seconds),
    ``max_skew`` the window in seconds."""
    raw = await read_whole(request, MAX_DISPATCH_BYTES)
    if raw is None:
        return web.json_response(TOO_LARGE, status=413)
    try:
        envelope = open_signed(request.headers.get(SIGNATURE_HEADER), raw, secrets, now(), max_skew)
    except GateError as exc:
        if exc.code not in quiet:
            log.warning("event=dispatch_refused reason=%s", exc.code)
        return web.json_response(exc.body(), status=exc.status)
    return raw, envelope
