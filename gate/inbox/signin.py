"""Passkey sign-in at the inbox: usernameless WebAuthn with
the passkeys the gate enrolled (one relying party). Challenges live in the inbox database
(``gate.inbox.shortlived``: 5 min, single use, at most 1000 pending), each bound to a
pre-session CSRF cookie; at most 10 sign-in tries (past Origin and CSRF) per client address
and 10 failed ones per credential per 5 minutes, counted there too: every replica of the
inbox sees the same challenges and counts."""

from __future__ import annotations

import binascii
import json
import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from gate.inbox import auth, pages
from gate.inbox.shortlived import CHALLENGE_TTL_MS
from gate.inbox.state import InboxState, state_of
from gate.protocol.approver_signature import (
    ApproverAssertion,
    parse_approver_assertion,
    unb64,
)
from gate.protocol.approver_webauthn import verify_webauthn
from gate.protocol.credentials import ServedCredential
from gate.protocol.errors import ProtocolError

log = logging.getLogger(__name__)

CHALLENGE_TTL_S = CHALLENGE_TTL_MS / 1000
REASONS = {
    "unknown_credential": (
        "The gate does not know this passkey: it was never enrolled, or it was revoked."
        " If you enrolled it just now, try again."
    ),
    "not_a_passkey": "Only a passkey (WebAuthn) signs in here.",
    "challenge_unknown": "This sign-in page is out of date or was used already: reload it.",
    "rp_mismatch": "This passkey belongs to another site.",
    "origin_mismatch": "The passkey was used on a page of another origin.",
    "bad_signature": "The passkey's signature does not verify.",
    "user_not_verified": "Your authenticator did not verify you (PIN, fingerprint or face).",
    "malformed": "The browser sent a sign-in this inbox cannot read.",
    "unavailable": "Nobody can sign in now: ",
}
BUSY = "Too many sign-in pages are open right now; try again in a few minutes."
DETAILS = {"rp_id_mismatch": "rp_mismatch", "origin_mismatch": "origin_mismatch"}
DETAILS |= {"user_not_verified": "user_not_verified", "user_not_present": "user_not_verified"}
DETAILS |= {"malformed": "malformed", "wrong_type": "malformed"}


def safe_next(value: str | None) -> str:
    """A local path to go to after sign-in, else ``/`` (review rev17a finding 3): it starts
    with exactly one ``/``, has no backslash, whitespace or control character (a browser
    drops a tab or newline, turning ``/<TAB>/evil.example`` into ``//evil.example``), and
    parsed and rebuilt it has no scheme or host and reads the same."""
    if not value or not value.startswith("/") or value.startswith("//"):
        return "/"
    if any(c == "\\" or c.isspace() or not c.isprintable() for c in value):
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or urlunsplit(("", "", *parts[2:])) != value:
        return "/"
    return value


def wrong_host(request: web.Request) -> str | None:
    """A sentence when the page was opened at a loopback address (``127.0.0.1``, ``::1``)
    that none of the inbox's origins names: a passkey cannot sign in there (its origin is
    not allowed), so say where to open the inbox. None otherwise."""
    party = state_of(request).party
    host = (request.url.host or "").strip("[]").lower()
    if party is None or not party.origins or host not in ("127.0.0.1", "::1"):
        return None
    if any((urlsplit(origin).hostname or "").lower() == host for origin in party.origins):
        return None
    return (
        f"This page was opened at {request.host}; passkeys sign in only at"
        f" {party.origins[0]}: open {party.origins[0]}/signin."
    )


async def signin_get(request: web.Request) -> web.Response:
    """GET ``/signin[?next=/path]``: the sign-in page with a fresh challenge and a
    pre-session CSRF token (cookie ``hitl_inbox_pre``); when passkeys cannot sign in here
    (the relying parties differ, the gate has not answered), the page says why."""
    state = state_of(request)
    pre = auth.new_token()
    next_path = safe_next(request.query.get("next"))
    held = request.cookies.get(auth.PRE_COOKIE, "")
    challenge = await state.shortlived.issue_challenge(
        auth.token_hash(pre),
        next_path,
        state.now_ms(),
        request.remote or "?",
        auth.token_hash(held) if held else "",
    )
    if challenge is None:
        log.info("event=inbox_signin_refused reason=too_many_pages")
        title = "Try again in a few minutes"
        busy = pages.plain_page(request, title=title, sentence=BUSY, status=429)
        busy.headers["Retry-After"] = str(int(CHALLENGE_TTL_S))
        return busy
    problem = state.credentials.problem
    error = None if problem is None else REASONS["unavailable"] + problem + "."
    notice = auth.REVOKED if request.query.get("why") == "revoked" else wrong_host(request)
    response = pages.signin_page(request, challenge=challenge, csrf=pre, error=error, notice=notice)
    auth.set_cookie(request, response, auth.PRE_COOKIE, pre, int(CHALLENGE_TTL_S))
    return response


def _refused(reason: str, extra: str = "") -> web.Response:
    log.info("event=inbox_signin_refused reason=%s", reason)
    return auth.refusal(401, reason, REASONS.get(reason, "Sign-in refused.") + extra)


def _client_challenge(client_data_json: bytes) -> str | None:
    try:
        data = json.loads(client_data_json)
        challenge = data.get("challenge") if isinstance(data, dict) else None
    except ValueError:
        return None
    return challenge if isinstance(challenge, str) else None


async def signin_post(request: web.Request) -> web.Response:
    """POST ``/signin`` (JSON ``{csrf, assertion}`` from inbox.js): Origin and pre-session
    CSRF (``auth.read_post``: 403, not counted), then the rate limits (429 ``rate_limited``
    + Retry-After: per client address, counting only tries that passed them; per credential,
    counting failures), then the assertion: a webauthn credential in force at the gate, a
    challenge we issued (single use, bound to the pre-session cookie), verified by
    ``verify_webauthn`` (UP+UV, the inbox's origins and rp_id). Success: a session and its
    cookie, 200 ``{"location"}``. Failure: 401 ``{"reason", "message"}`` and nothing stored."""
    state = state_of(request)
    fields = await auth.read_post(request, None)  # junk: 403, not counted (review rev17a)
    wait = await state.shortlived.count_try("address", request.remote or "?", state.now_ms())
    answer = _rate_limited(wait) if wait else await _signin(request, fields)
    state.metrics.signed_in(answer.status == 200)
    return answer


def _rate_limited(wait: int) -> web.Response:
    log.info("event=inbox_signin_refused reason=rate_limited")
    answer = auth.refusal(429, "rate_limited", "Too many sign-in attempts: wait a few minutes.")
    answer.headers["Retry-After"] = str(wait)
    return answer


async def _signin(request: web.Request, fields: dict[str, Any]) -> web.Response:
    """The assertion's checks after Origin, CSRF and the per-address limit; a credential
    with ``TRY_LIMIT`` failed tries in ``TRY_WINDOW_MS`` is refused 429 until one expires
    (review rev17a finding 4: a cap per credential beside the one per address)."""
    state = state_of(request)
    try:
        assertion = parse_approver_assertion(fields.get("assertion"))
    except ProtocolError:
        return _refused("malformed")
    if assertion is None:
        return _refused("malformed")
    if assertion.type != "webauthn":
        return _refused("not_a_passkey")
    wanted = assertion.credential_id_b64
    credential = state.credentials.lookup(wanted)
    if credential is None and await state.credentials.refresh_for_unknown(wanted):
        credential = state.credentials.lookup(wanted)
    if credential is None:
        return _refused("unknown_credential")
    tries = state.shortlived
    if wait := await tries.blocked_for("credential", credential.credential_id, state.now_ms()):
        return _rate_limited(wait)
    answer = await _verified(request, state, credential, assertion)
    if answer.status != 200:
        await tries.count_try("credential", credential.credential_id, state.now_ms())
    return answer


async def _verified(
    request: web.Request,
    state: InboxState,
    credential: ServedCredential,
    assertion: ApproverAssertion,
) -> web.Response:
    if credential.type != "webauthn":
        return _refused("not_a_passkey")
    if state.party is None or state.credentials.problem is not None:
        return _refused("rp_mismatch", " " + (state.credentials.problem or ""))
    sent = _client_challenge(assertion.client_data_json)
    pending = None if sent is None else await state.shortlived.take_challenge(sent, state.now_ms())
    pre = request.cookies.get(auth.PRE_COOKIE, "")
    if pending is None or sent is None or pending.pre_hash != auth.token_hash(pre):
        return _refused("challenge_unknown")
    try:
        key, challenge = unb64(credential.public_key), unb64(sent)
        verify_webauthn(key, 0, assertion, challenge, state.party.rp_id, state.party.origins)
    except ProtocolError as exc:
        return _refused(DETAILS.get(str(exc.extra.get("detail")), "bad_signature"))
    except (ValueError, binascii.Error):
        return _refused("bad_signature")
    response = web.json_response({"location": pending.next_path})
    await auth.start_session(request, response, credential)
    auth.drop_cookie(request, response, auth.PRE_COOKIE)
    log.info(
        "event=inbox_signin identity=%s credential_id=%s",
        credential.identity,
        credential.credential_id,
    )
    return response


async def signout(request: web.Request) -> web.Response:
    """POST ``/signout`` (form, CSRF): delete the session row and its cookie; 303 to
    ``/signin``. Without a session: 303 to ``/signin`` and nothing changes."""
    session = await auth.current_session(request)
    response = web.HTTPSeeOther("/signin")
    if session is not None:
        await auth.read_post(request, session)
        await auth.end_session(request)
        auth.drop_cookie(request, response, auth.cookie_name(request))
        log.info("event=inbox_signout")
    raise response


def add_routes(app: web.Application) -> None:
    """GET/POST ``/signin`` and POST ``/signout``."""
    app.router.add_get("/signin", signin_get)
    app.router.add_post("/signin", signin_post)
    app.router.add_post("/signout", signout)
