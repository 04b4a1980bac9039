"""The credentials channel on the relay (callback) listener: ``POST
/hitl/v0/credentials`` answers a relay that signs approvers in with their public credentials,
signed with the relay secret. Off unless ``relay.credentials: true`` (404 then)."""

from __future__ import annotations

import logging

from aiohttp import web

from gate.errors import GateError
from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.credentials import (
    CREDENTIALS_PATH,
    build_credentials_answer,
    parse_credentials_request,
)
from gate.web.common import read_signed
from gate.web.keys import CALLBACK_SETTINGS, SERVICE

log = logging.getLogger(__name__)


async def post_credentials(request: web.Request) -> web.Response:
    """Answer a credentials request: 404 ``not_found`` unless
    ``relay.credentials`` is on; then SPEC §2 checks 1-4 exactly as for a decision (413
    ``body_too_large``, 401 ``signature_missing``/``signature_malformed``/
    ``timestamp_out_of_window``/``signature_mismatch``), an ``X-Hitl-Protocol`` other than
    hitl/v0 400, a body ``parse_credentials_request`` refuses 400 naming the field. Answers
    200 with ``build_credentials_answer`` (the relying party in force and the credentials in
    force) signed with the first active relay secret at the gate's now. Logs
    ``event=credentials_served count=N`` (never a key) or ``event=credentials_refused``."""
    service = request.app[SERVICE]
    if not service.config.relay.credentials:
        raise web.HTTPNotFound()
    settings = request.app[CALLBACK_SETTINGS]
    try:
        raw, now_s = await read_signed(request, settings, lambda: service.clock.now_ms() // 1000)
        parse_credentials_request(raw)
    except GateError as exc:
        log.info("event=credentials_refused status=%d reason=%s", exc.status, exc.code)
        raise
    rp = service.invites.webauthn()
    served = await service.credentials.in_force()
    body = build_credentials_answer(
        None if rp is None else {"rp_id": rp.rp_id, "origins": rp.origins}, served, now_s
    )
    log.info("event=credentials_served count=%d", len(served))
    return web.Response(
        body=body,
        content_type="application/json",
        headers={
            SIGNATURE_HEADER: signing.sign(settings.relay_secrets[0], now_s, body),
            PROTOCOL_HEADER: PROTOCOL,
            "Cache-Control": "no-store",
        },
    )


def add_credentials_routes(app: web.Application) -> None:
    """Register ``POST /hitl/v0/credentials`` on the callback app (always: whether it serves
    is read from the service's config per request, so a reload can turn it on or off)."""
    app.router.add_post(CREDENTIALS_PATH, post_credentials)
