"""The relay callback listener: POST /hitl/v0/decisions (SPEC §2)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gate.core.service import GateService
from gate.protocol import DECISIONS_PATH, MAX_DECISION_BYTES, PROTOCOL, PROTOCOL_HEADER
from gate.protocol import SIGNATURE_HEADER, signing
from gate.protocol.envelope import parse_decision
from gate.protocol.errors import ProtocolError
from gate.web.common import error_middleware, read_body


@dataclass(frozen=True, slots=True)
class CallbackSettings:
    """Secrets accepted on decisions (current first, then previous) and the skew window (s)."""

    relay_secrets: Sequence[str]
    max_skew_s: float


SERVICE = web.AppKey("service", GateService)
SETTINGS = web.AppKey("callback_settings", CallbackSettings)


async def post_decision(request: web.Request) -> web.Response:
    """Run SPEC §2 checks 1-5 here, 6-14 in ``GateService.decide``; answer per the table."""
    service = request.app[SERVICE]
    settings = request.app[SETTINGS]
    raw = await read_body(request, MAX_DECISION_BYTES)  # check 1
    now_s = service.clock.now_ms() / 1000
    signing.verify(request.headers.get(SIGNATURE_HEADER), raw, settings.relay_secrets, now_s,
                   settings.max_skew_s)  # checks 2-4, over the raw received bytes
    protocol = request.headers.get(PROTOCOL_HEADER)
    if protocol is not None and protocol.strip() != PROTOCOL:
        raise ProtocolError("invalid_protocol", f"{PROTOCOL_HEADER} must be {PROTOCOL}",
                            status=400, kind="invalid", extra={"field": PROTOCOL_HEADER})
    decision = parse_decision(raw)  # check 5
    return web.json_response(await service.decide(decision))


def create_callback_app(service: GateService, settings: CallbackSettings,
                        outer_middlewares: Sequence[Any] = ()) -> web.Application:
    """Return the callback app: one route, the error middleware, bodies read by the handler.

    ``outer_middlewares`` run outside the error middleware (they see every final answer);
    ``hitl-gate verify`` uses one to observe what a relay sent.
    """
    app = web.Application(middlewares=[*outer_middlewares, error_middleware],
                          client_max_size=MAX_DECISION_BYTES * 4)
    app[SERVICE] = service
    app[SETTINGS] = settings
    app.router.add_post(DECISIONS_PATH, post_decision)
    return app
