"""The admin API on the API listener, under ``/v1/admin/``: enrol, list and revoke
approvers' credentials. Only the admin token (``api.admin_token_env``) opens these routes
(``gate.web.api.auth_middleware``); a pipeline token never does, so a pipeline cannot enrol
a key and approve itself."""

from __future__ import annotations

from aiohttp import web

from gate.protocol.envelope import decode_text_json
from gate.web.common import read_body
from gate.web.keys import SERVICE

MAX_ADMIN_BODY = 64 * 1024


async def enrol_approver_key(request: web.Request) -> web.Response:
    """POST /v1/admin/approvers ``{"operator_id", "type": "ed25519", "public_key": PEM,
    "label"?}``: 201 with the credential (``gate.core.credentials.credential_view``); 400
    ``unknown_operator``/``invalid_<field>``, 409 ``credential_exists``."""
    raw = await read_body(request, MAX_ADMIN_BODY, "body_too_large")
    view = await request.app[SERVICE].credentials.enrol(decode_text_json(raw))
    return web.json_response(view, status=201)


async def list_approver_credentials(request: web.Request) -> web.Response:
    """GET /v1/admin/approvers: ``{"items": [credential, ...]}``, revoked ones included."""
    return web.json_response({"items": await request.app[SERVICE].credentials.list_all()})


async def revoke_approver_credential(request: web.Request) -> web.Response:
    """POST /v1/admin/approvers/{credential_id}/revoke: 200 with the revoked credential; 404
    ``unknown_credential``, 409 ``credential_revoked``."""
    credential_id = request.match_info["credential_id"]
    return web.json_response(await request.app[SERVICE].credentials.revoke(credential_id))


async def create_invite(request: web.Request) -> web.Response:
    """POST /v1/admin/approvers/invites ``{"operator_id", "ttl_s"?, "label"?}``: 201 ``{url,
    operator_id, expires_at}`` (a one-time passkey invite); 400
    ``unknown_operator``/``invalid_<field>``, 409 ``webauthn_unavailable``."""
    raw = await read_body(request, MAX_ADMIN_BODY, "body_too_large")
    answer = await request.app[SERVICE].invites.create(decode_text_json(raw))
    return web.json_response(answer, status=201)


def add_admin_routes(app: web.Application) -> None:
    """Register the admin routes on the API app (auth: ``gate.web.api.auth_middleware``)."""
    app.router.add_post("/v1/admin/approvers", enrol_approver_key)
    app.router.add_get("/v1/admin/approvers", list_approver_credentials)
    app.router.add_post("/v1/admin/approvers/invites", create_invite)
    app.router.add_post("/v1/admin/approvers/{credential_id}/revoke", revoke_approver_credential)
