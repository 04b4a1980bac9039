"""The passkey enrolment pages on the relay (callback) listener: ``GET
/enrol/{token}`` shows the invite, ``POST /enrol/{token}`` enrols the passkey the browser
made, ``GET /enrol/static/{name}`` serves the page's script and style. Thin handlers: one
service call each. Every answer under ``/enrol/`` carries ``SECURITY_HEADERS``; a GET never
changes anything."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from importlib import resources
from string import Template

from aiohttp import web

from gate.errors import GateError
from gate.protocol.envelope import decode_text_json
from gate.web.common import read_body
from gate.web.keys import SERVICE

ENROL_PREFIX = "/enrol/"
MAX_REGISTRATION_BYTES = 64 * 1024
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
_ASSETS = resources.files("gate.web") / "enrol_assets"
_STATIC = {"enrol.js": "text/javascript", "enrol.css": "text/css", "favicon.svg": "image/svg+xml"}
_PAGE = Template((_ASSETS / "page.html").read_text(encoding="utf-8"))
_GONE = {
    "invite_used": ("Invite already used", "This invite was used already. Ask for a new one."),
    "invite_expired": ("Invite expired", "This invite has expired. Ask for a new one."),
    "invite_unknown": ("Unknown invite", "This invite does not exist. Check the link."),
    "webauthn_unavailable": (
        "Passkeys unavailable",
        "This gate has no relying party for passkeys (relay.public_url / webauthn.rp_id).",
    ),
}


def _page(title: str, body: str, status: int) -> web.Response:
    text = _PAGE.substitute(title=html.escape(title), body=body)
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


async def enrol_page(request: web.Request) -> web.Response:
    """GET /enrol/{token} (a trailing slash is the same page): the invite page (200:
    identity, expiry, a "Create passkey" button, the options as a JSON data block), or a
    page without a button: 404 unknown, 410 used or expired, 409 passkeys unavailable."""
    token = request.match_info["token"].rstrip("/")
    try:
        identity, expires, options = await request.app[SERVICE].invites.enrol_page(token)
    except GateError as exc:
        title, text = _GONE.get(exc.code, ("Invite refused", exc.message))
        return _page(title, f"<p>{html.escape(text)}</p>", exc.status)
    data = json.dumps(options).replace("<", "\\u003c").replace(">", "\\u003e")
    body = (
        f'<p>Create a passkey to sign your decisions as <span class="identity">'
        f"{html.escape(identity)}</span>.</p>\n"
        f'<p>This invite expires at <time id="expires" datetime="{html.escape(expires)}">'
        f"{html.escape(_utc(expires))}</time>.</p>\n"
        '<button id="create" type="button">Create passkey</button>\n'
        '<p id="status" role="status"></p>\n'
        f"{_sign_in_at(request.app[SERVICE].invites.sign_in_origins())}"
        f'<script type="application/json" id="options">{data}</script>\n'
        '<script src="/enrol/static/enrol.js"></script>'
    )
    return _page("Enrol a passkey", body, 200)


def _utc(rfc3339: str) -> str:
    """``2026-08-02T09:14:22Z`` as ``2026-08-02 09:14 UTC`` (the zone said, as the CLI
    prints it), the text itself when it does not parse."""
    try:
        when = datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return rfc3339
    return when.strftime("%Y-%m-%d %H:%M UTC")


def _sign_in_at(origins: tuple[str, ...]) -> str:
    """The hidden paragraph enrol.js shows once the passkey is enrolled: where to sign in
    (the relying party's other origins, e.g. the inbox), or "" when there is none."""
    if not origins:
        return ""
    links = ", ".join(f'<a href="{html.escape(o)}/">{html.escape(o)}</a>' for o in origins)
    return f'<p id="sign-in-at" hidden>Sign in with it at {links} to see what waits for you.</p>\n'


async def register(request: web.Request) -> web.Response:
    """POST /enrol/{token} (the credential as JSON, from an allowed ``Origin``): 200
    ``{credential_id, operator_id}``; 403 ``origin_not_allowed``, 400
    ``invalid_registration``, 404 ``invite_unknown``, 409 ``credential_exists`` /
    ``webauthn_unavailable``, 410 ``invite_used``/``invite_expired``; nothing stored then."""
    service = request.app[SERVICE]
    settings = service.invites.webauthn()
    if settings is None or request.headers.get("Origin") not in settings.origins:
        raise GateError(
            "origin_not_allowed",
            "the enrolment must come from the gate's own page (Origin)",
            status=403,
            kind="forbidden",
        )
    raw = await read_body(request, MAX_REGISTRATION_BYTES, "body_too_large")
    answer = await service.invites.register_passkey(
        request.match_info["token"], decode_text_json(raw)
    )
    return web.json_response(answer)


async def static(request: web.Request) -> web.Response:
    """GET /enrol/static/{name}: the page's script or style (404 for anything else)."""
    name = request.match_info["name"]
    if name not in _STATIC:
        raise web.HTTPNotFound()
    text = (_ASSETS / name).read_text(encoding="utf-8")
    return web.Response(text=text, content_type=_STATIC[name], charset="utf-8")


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.startswith(ENROL_PREFIX):
        response.headers.update(SECURITY_HEADERS)


def add_enrol_routes(app: web.Application) -> None:
    """Register the enrolment routes and their headers on the callback app."""
    app.router.add_get(ENROL_PREFIX + "static/{name}", static)
    app.router.add_get(ENROL_PREFIX + "{token:[^/]+/?}", enrol_page)
    app.router.add_post(ENROL_PREFIX + "{token}", register)
    app.on_response_prepare.append(_security_headers)
