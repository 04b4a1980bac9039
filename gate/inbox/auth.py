"""Sessions, CSRF and Origin checks of the inbox's pages.

A session is a cookie (``hitl_inbox``; ``__Host-hitl_inbox`` with Secure under an https
``base_url``; HttpOnly, SameSite=Strict, Path=/) holding 32 random bytes base64url; the
database keeps only their SHA-256 hex. Every POST is checked by ``read_post`` (Origin, then a
per-session CSRF token) before anything changes; GET routes never change anything."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from functools import partial
from html import escape
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from aiohttp import web

from gate.config.webauthn import origin_of
from gate.inbox.credentials_cache import UNKNOWN_EVERY_S, CredentialsCache
from gate.inbox.model import Session
from gate.inbox.state import state_of
from gate.protocol.credentials import ServedCredential
from gate.protocol.envelope import check_unicode
from gate.protocol.errors import ProtocolError
from gate.relay.inbound import read_whole

log = logging.getLogger(__name__)

COOKIE = "hitl_inbox"
SECURE_COOKIE = "__Host-hitl_inbox"
PRE_COOKIE = "hitl_inbox_pre"
MAX_POST_BYTES = 512 * 1024
CSRF_HEADER = "X-CSRF-Token"
JSON = "application/json"
SIGNED_OUT = ("signed_out", "You are signed out: sign in again.")
ORIGIN_NOT_ALLOWED = "This form was not sent from the inbox's own pages."
CSRF_MISMATCH = "This form is out of date: reload the page and try again."
REVOKED = (
    "Your passkey is no longer enrolled at the gate, so your session ended: ask your"
    " administrator for a new invite."
)


def new_token() -> str:
    """32 random bytes, base64url without padding (a session id, a CSRF token)."""
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """The SHA-256 hex of a cookie's token: what the database keeps."""
    return hashlib.sha256(token.encode("ascii", "replace")).hexdigest()


def is_https(request: web.Request) -> bool:
    """True when the inbox's ``base_url`` is https (cookies get Secure and ``__Host-``)."""
    return bool(state_of(request).config.base_url.startswith("https://"))


def cookie_name(request: web.Request) -> str:
    """``__Host-hitl_inbox`` under https, else ``hitl_inbox``."""
    return SECURE_COOKIE if is_https(request) else COOKIE


def set_cookie(
    request: web.Request,
    response: web.StreamResponse,
    name: str,
    value: str,
    max_age_s: int | None = None,
) -> None:
    """Set ``name`` HttpOnly, SameSite=Strict, Path=/ (Secure under https), for
    ``max_age_s`` seconds (default: the session's lifetime)."""
    ttl = int(state_of(request).config.session_ttl) if max_age_s is None else max_age_s
    response.set_cookie(
        name,
        value,
        httponly=True,
        samesite="Strict",
        path="/",
        secure=is_https(request),
        max_age=ttl,
    )


def drop_cookie(request: web.Request, response: web.StreamResponse, name: str) -> None:
    """Expire the cookie ``name`` (sign-out)."""
    response.del_cookie(name, path="/", secure=is_https(request), samesite="Strict")


async def start_session(
    request: web.Request, response: web.StreamResponse, credential: ServedCredential
) -> Session:
    """Create a session row (only the token's hash) for the approver who signed in with
    ``credential`` and set its cookie on ``response``; returns the Session (its fresh CSRF
    token included)."""
    state = state_of(request)
    token = new_token()
    now = state.now_ms()
    session = Session(
        identity=credential.identity,
        operator_id=credential.operator_id,
        credential_id=credential.credential_id,
        csrf=new_token(),
        created_at=now,
        expires_at=now + int(state.config.session_ttl * 1000),
    )
    await state.db.add_session(token_hash(token), session)
    set_cookie(request, response, cookie_name(request), token)
    return session


async def end_session(request: web.Request) -> None:
    """Delete the request's session row, if any (sign-out)."""
    token = request.cookies.get(cookie_name(request))
    if token:
        state = state_of(request)
        await state.db.end_sessions(state.now_ms(), token_hash(token))


async def current_session(request: web.Request) -> Session | None:
    """The request's session, or None: no cookie, unknown or expired, or its credential is
    no longer in force at the gate (``_revoked``: the row is marked ended,
    ``event=inbox_session_ended why=credential_revoked``, and ``request["inbox_revoked"]`` is set
    for this and every later request of the cookie). Cached on the request."""
    if "inbox_session" in request:
        cached: Session | None = request["inbox_session"]
        return cached
    state = state_of(request)
    token = request.cookies.get(cookie_name(request))
    session = None
    if token:
        session = await state.db.session(token_hash(token), state.now_ms())
        if session is not None and await _revoked(state.credentials, session.credential_id):
            await state.db.end_revoked(token_hash(token))
            log.info("event=inbox_session_ended why=credential_revoked")
            session = None
        if session is None:  # said to every later request of this cookie, not only the first
            ended = await state.db.session_ended(token_hash(token), state.now_ms())
            request["inbox_revoked"] = ended == "revoked"
    request["inbox_session"] = session
    return session


async def _revoked(cache: CredentialsCache, credential_id: str) -> bool:
    """True when the gate does not list ``credential_id``, as it answered within the last
    5 s: a credential this replica's copy lacks makes it ask the gate first
    (``refresh_for_unknown``: another replica may have signed in a passkey enrolled since
    this one's last fetch). Never True while the gate cannot be asked (the session is
    served; the gate refuses its decisions if the passkey is revoked)."""
    if not cache.loaded or cache.lookup(credential_id) is not None:
        return False
    await cache.refresh_for_unknown(credential_id)
    return cache.lookup(credential_id) is None and cache.fetched_within(UNKNOWN_EVERY_S)


def _cross_site_page(url: str) -> bytes:
    """The page a cross-site GET gets: a meta refresh (and a link) to ``url``."""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="0;url={escape(url)}">'
        "<title>hitl-gate inbox</title></head><body>"
        f'<p><a href="{escape(url)}">Continue to the inbox</a></p></body></html>'
    ).encode()


async def require_session(request: web.Request) -> Session:
    """The request's session, else: a POST (or /live) raises 401 JSON ``signed_out``; a GET
    from a cross-site link (``Sec-Fetch-Site: cross-site``, no ``r=1``: SameSite=Strict
    withheld the cookie) answers a meta refresh to the same path with ``?r=1`` (a same-site
    reload carries the cookie); any other GET raises 303 to ``/signin?next=<path>`` (plus
    ``&why=revoked`` when the session ended because its passkey was revoked; a POST or
    /live then answers 401 ``passkey_revoked`` with the sentence)."""
    session = await current_session(request)
    if session is not None:
        return session
    if request.method != "GET" or request.path == "/live":
        said = ("passkey_revoked", REVOKED) if request.get("inbox_revoked") else SIGNED_OUT
        raise _refused(web.HTTPUnauthorized, *said)
    if request.headers.get("Sec-Fetch-Site") == "cross-site" and request.query.get("r") != "1":
        raise web.HTTPOk(body=_cross_site_page(request.path + "?r=1"), content_type="text/html")
    why = "&why=revoked" if request.get("inbox_revoked") else ""
    raise web.HTTPSeeOther("/signin?next=" + quote(request.path, safe="/") + why)


def refusal(status: int, reason: str, message: str, said: str = "refused") -> web.Response:
    """A refusal as JSON for ``inbox.js`` (or a monitor): ``{"status":"refused","reason",
    "message"}``; ``said`` is its ``status`` word (``unavailable`` for a 503 health check)."""
    return web.Response(text=_json(reason, message, said), status=status, content_type=JSON)


def _json(reason: str, message: str, said: str = "refused") -> str:
    return json.dumps({"status": said, "reason": reason, "message": message})


def _refused(error: Callable[..., web.HTTPError], reason: str, message: str) -> web.HTTPError:
    """``error`` (401, 403, 400, 413) to raise, with ``refusal``'s JSON body."""
    return error(text=_json(reason, message), content_type=JSON)


def _origin_ok(request: web.Request) -> bool:
    """True when the Origin (or, without one, the Referer's origin) is one of the inbox's
    own: its relying party's origins, or ``base_url``'s when it has none."""
    state = state_of(request)
    allowed = state.party.origins if state.party else (origin_of(state.config.base_url),)
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin in allowed
    referer = request.headers.get("Referer")
    if not referer:
        return False
    parts = urlsplit(referer)
    return f"{parts.scheme}://{parts.netloc}" in allowed


async def read_post(request: web.Request, session: Session | None) -> dict[str, Any]:
    """Read a POST's JSON or form-urlencoded body (at most 512 KiB, else 413
    ``body_too_large``) and check it may act: the Origin header (or, without one, the
    Referer's origin) is one of the inbox's origins (else 403 ``origin_not_allowed``), and
    its ``csrf`` field equals the session's token — the pre-session cookie's without a
    session — compared in constant time; a JSON body must ALSO carry it in ``X-CSRF-Token``
    (else 403 ``csrf_mismatch``). Returns the fields (a form's as strings; a name posted
    more than once — checkboxes, a multi choice — as the list of its strings). A field holding
    a lone surrogate or U+0000 (a form's ``%00``) is 400 ``invalid_<field>``
    (``check_unicode``)."""
    raw = await read_whole(request, MAX_POST_BYTES)
    if raw is None:
        size = request.content_length or MAX_POST_BYTES + 1
        too_large = partial(web.HTTPRequestEntityTooLarge, MAX_POST_BYTES, size)
        raise _refused(too_large, "body_too_large", "The form is too large.")
    if not _origin_ok(request):
        raise _refused(web.HTTPForbidden, "origin_not_allowed", ORIGIN_NOT_ALLOWED)
    is_json = request.content_type == JSON
    fields: dict[str, Any]
    try:
        if is_json:
            loaded = json.loads(raw)
            fields = loaded if isinstance(loaded, dict) else {}
        else:
            fields = _form_fields(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        fields = {}
    expected = session.csrf if session is not None else request.cookies.get(PRE_COOKIE, "")
    sent = fields.get("csrf")
    ok = bool(expected) and isinstance(sent, str) and hmac.compare_digest(sent, expected)
    if ok and is_json:
        header = request.headers.get(CSRF_HEADER, "")
        ok = hmac.compare_digest(header.encode(), expected.encode())
    if not ok:
        raise _refused(web.HTTPForbidden, "csrf_mismatch", CSRF_MISMATCH)
    try:  # a form's fields are UTF-8 decoded (never a surrogate, maybe a NUL); JSON either
        check_unicode(fields)
    except ProtocolError as exc:
        raise _refused(web.HTTPBadRequest, exc.code, exc.message) from None
    return fields


def _form_fields(text: str) -> dict[str, Any]:
    """A form-urlencoded body's fields: a name posted once -> its string, more than once ->
    the list of its strings in the order sent (a question's checkboxes)."""
    posted = parse_qs(text, keep_blank_values=True)
    return {name: values[0] if len(values) == 1 else values for name, values in posted.items()}
