"""The callbacks a relay sends ``hitl-gate verify``'s ephemeral gate (SPEC §6): recorded by an
observer middleware, picked by the id they name, waited for, and re-signed for the gate
probes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import decode_json
from gate.tools.conformance.checks import Observed
from gate.web.common import Handler


def observer(seen: list[Observed], changed: asyncio.Event, now: Callable[[], float]) -> Middleware:
    """A callback-listener middleware that records every request (raw body, headers,
    ``now()`` seconds at receipt, the gate's status and decoded answer) in ``seen`` and sets
    ``changed``."""

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPException:
            raw = b""
        received = now()
        response = await handler(request)
        answer: Any = None
        if isinstance(response, web.Response) and response.body is not None:
            try:
                answer = json.loads(bytes(response.body))  # type: ignore[arg-type]
            except (ValueError, TypeError):
                answer = None
        seen.append(
            Observed(
                raw,
                {k.lower(): v for k, v in request.headers.items()},
                received,
                response.status,
                answer,
            )
        )
        changed.set()
        return response

    return observe


def callbacks_for(seen: list[Observed], approval_id: str) -> list[Observed]:
    """The callbacks in ``seen`` whose body names ``approval_id``."""
    out = []
    for obs in seen:
        try:
            body = decode_json(obs.raw)
        except Exception:  # noqa: BLE001 - any undecodable body simply is not this approval's
            continue
        if isinstance(body, dict) and body.get("approval_id") == approval_id:
            out.append(obs)
    return out


async def wait_for(
    lookup: Callable[[str], list[Observed]], changed: asyncio.Event, key: str, wait_s: float
) -> Observed | None:
    """The first of ``lookup(key)`` (callbacks naming an approval or question id), waiting up
    to ``wait_s`` seconds for one (woken by ``changed``); None when none came."""
    deadline = time.monotonic() + wait_s
    while True:
        found = lookup(key)
        if found:
            return found[0]
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        changed.clear()
        try:
            await asyncio.wait_for(changed.wait(), timeout=left)
        except TimeoutError:
            return None


def resign(
    template: dict[str, Any], secret: str, changes: dict[str, Any], drop: tuple[str, ...] = ()
) -> tuple[bytes, dict[str, str]]:
    """``template`` (a callback the relay sent) without the ``drop`` keys, updated with
    ``changes``, signed now with ``secret``: a gate probe's body and headers."""
    body = {k: v for k, v in template.items() if k not in drop}
    body.update(changes)
    raw = wire_json(body)
    headers = {
        "Content-Type": "application/json",
        PROTOCOL_HEADER: PROTOCOL,
        SIGNATURE_HEADER: signing.sign(secret, int(time.time()), raw),
    }
    return raw, headers
