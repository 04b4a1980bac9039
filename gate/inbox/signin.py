"""Passkey sign-in at the inbox: usernameless WebAuthn with
the passkeys the gate enrolled (one relying party). Challenges live in memory (5 min,
single use, at most 1000 pending), each bound to a pre-session CSRF cookie; at most 10
sign-in tries (past Origin and CSRF) per client address and 10 failed ones per credential
per 5 minutes."""

from __future__ import annotations

import binascii
import json
import logging
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web

from gate.inbox import auth, pages
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

CHALLENGE_TTL_S = 300.0
MAX_PENDING = 1000
PER_ADDRESS = 100  # live challenges one client address may hold (review rev17a)
RATE_LIMIT = 10
RATE_WINDOW_S = 300.0
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


@dataclass(frozen=True, slots=True)
class Pending:
    """A challenge issued: the pre-session token's hash it is bound to, where to go after,
    when it was issued (monotonic seconds)."""

    pre_hash: str
    next_path: str
    issued_at: float
    address: str = "?"


class Challenges:
    """Issued sign-in challenges (base64url → Pending), oldest first; single use. One per
    pre-session token (a new page replaces its own); at most ``PER_ADDRESS`` live per client
    address and ``MAX_PENDING`` in all. Only expired ones are evicted: a full pool (or
    address) refuses new pages rather than dropping someone's live challenge (review
    rev17a finding 5)."""

    def __init__(self) -> None:
        self._pending: OrderedDict[str, Pending] = OrderedDict()

    def issue(
        self, pre_hash: str, next_path: str, now: float, address: str = "?", replaces: str = ""
    ) -> str | None:
        """A fresh 32-byte challenge (base64url) bound to ``pre_hash``, or None when the pool
        holds ``MAX_PENDING`` live challenges or ``address`` holds ``PER_ADDRESS``.
        ``replaces``: the hash of the pre-session token the browser still holds (its
        challenge is dropped)."""
        while self._pending:
            oldest = next(iter(self._pending.values()))
            if now - oldest.issued_at < CHALLENGE_TTL_S:
                break
            self._pending.popitem(last=False)
        mine = [k for k, p in self._pending.items() if p.address == address]
        gone = [k for k in mine if self._pending[k].pre_hash == replaces and replaces]
        for key in gone:
            self._pending.pop(key, None)
        if len(mine) - len(gone) >= PER_ADDRESS or len(self._pending) >= MAX_PENDING:
            return None
        challenge = secrets.token_urlsafe(32)
        self._pending[challenge] = Pending(pre_hash, next_path, now, address)
        return challenge

    def take(self, challenge: str, now: float) -> Pending | None:
        """The challenge's Pending, removed (single use), or None if unknown or expired."""
        found = self._pending.pop(challenge, None)
        if found is None or now - found.issued_at >= CHALLENGE_TTL_S:
            return None
        return found


class RateLimit:
    """At most ``RATE_LIMIT`` attempts per key (a client address) per ``RATE_WINDOW_S``."""

    def __init__(self) -> None:
        self._seen: dict[str, deque[float]] = {}

    def blocked_for(self, key: str, now: float) -> int:
        """0 when ``key`` may try now (nothing counted); else the seconds until it may."""
        seen = self._seen.get(key)
        while seen and now - seen[0] >= RATE_WINDOW_S:
            seen.popleft()
        if seen and len(seen) >= RATE_LIMIT:
            return max(1, int(RATE_WINDOW_S - (now - seen[0])) + 1)
        return 0

    def retry_after(self, key: str, now: float) -> int:
        """0 and the attempt counted when allowed; else the seconds until one is."""
        wait = self.blocked_for(key, now)
        if not wait:
            self._seen.setdefault(key, deque()).append(now)
            if len(self._seen) > 10_000:
                self._seen = {k: v for k, v in self._seen.items() if v}
        return wait


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


def _parts(request: web.Request) -> tuple[Challenges, RateLimit]:
    extra = state_of(request).extra
    challenges = extra.setdefault("signin_challenges", Challenges())
    limits = extra.setdefault("signin_rate", RateLimit())
    return challenges, limits


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
    challenges, _ = _parts(request)
    pre = auth.new_token()
    next_path = safe_next(request.query.get("next"))
    held = request.cookies.get(auth.PRE_COOKIE, "")
    challenge = challenges.issue(
        auth.token_hash(pre),
        next_path,
        time.monotonic(),
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
    challenges, limits = _parts(request)
    fields = await auth.read_post(request, None)  # junk: 403, not counted (review rev17a)
    wait = limits.retry_after(request.remote or "?", time.monotonic())
    answer = _rate_limited(wait) if wait else await _signin(request, fields, challenges)
    state_of(request).metrics.signed_in(answer.status == 200)
    return answer


def _rate_limited(wait: int) -> web.Response:
    log.info("event=inbox_signin_refused reason=rate_limited")
    answer = auth.refusal(429, "rate_limited", "Too many sign-in attempts: wait a few minutes.")
    answer.headers["Retry-After"] = str(wait)
    return answer


async def _signin(
    request: web.Request, fields: dict[str, Any], challenges: Challenges
) -> web.Response:
    """The assertion's checks after Origin, CSRF and the per-address limit; a credential
    with ``RATE_LIMIT`` failed tries in ``RATE_WINDOW_S`` is refused 429 until one expires
    (review rev17a finding 4: a cap per credential beside the one per address)."""
    state = state_of(request)
    failures: RateLimit = state.extra.setdefault("signin_failures", RateLimit())
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
    wait = failures.blocked_for(credential.credential_id, time.monotonic())
    if wait:
        return _rate_limited(wait)
    answer = await _verified(request, state, challenges, credential, assertion)
    if answer.status != 200:
        failures.retry_after(credential.credential_id, time.monotonic())
    return answer


async def _verified(
    request: web.Request,
    state: InboxState,
    challenges: Challenges,
    credential: ServedCredential,
    assertion: ApproverAssertion,
) -> web.Response:
    if credential.type != "webauthn":
        return _refused("not_a_passkey")
    if state.party is None or state.credentials.problem is not None:
        return _refused("rp_mismatch", " " + (state.credentials.problem or ""))
    sent = _client_challenge(assertion.client_data_json)
    pending = None if sent is None else challenges.take(sent, time.monotonic())
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
