"""Passkey enrolment by one-time invite: the admin request that creates an
invite, what the invite page shows, and the registration that consumes it, each a write
transaction with its audit entry, plus ``Invites`` (``GateService.invites``), what the
admin API and the enrol page call. No HTTP, no SQL of its own.

The token is 32 random bytes (base64url) that appear only in the URL; the database and the
audit log keep its SHA-256. An invite is single use and expires (``ttl_s``, 60..86400 s).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gate.audit.credential_entries import CredentialEnrolledData, InviteCreatedData
from gate.config.webauthn import WebAuthnSettings, origin_of, resolve_webauthn, unavailable_reason
from gate.core.commands import Transaction
from gate.core.requests.fields import bad_field
from gate.errors import Conflict, GateError, NotFound
from gate.model import Credential
from gate.protocol.approver_signature import b64url, unb64
from gate.protocol.times import rfc3339
from gate.protocol.webauthn_registration import creation_options, verify_passkey
from gate.store.invites import Invite

if TYPE_CHECKING:
    from gate.config import Config
    from gate.core.requests.service import Shared
    from gate.core.transactions import Transactions
    from gate.store import WriteTx

DEFAULT_TTL_S = 900
MIN_TTL_S, MAX_TTL_S = 60, 86_400
ENROL_PATH = "/enrol/"


_TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{43}")  # 32 bytes, base64url unpadded


def _known_shape(token: str) -> str:
    """``token_hash(token)``, or 404 ``invite_unknown`` without touching the database when
    the token cannot be one the gate made (the enrol page is on the public listener: a
    flood of made-up URLs costs no write transaction)."""
    if not _TOKEN_RE.fullmatch(token):
        raise NotFound("invite_unknown", "no such invite", extra={"message": "no such invite"})
    return token_hash(token)


def token_hash(token: str) -> str:
    """The SHA-256 hex of an invite token (what the database and the audit log keep)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def user_handle(operator_id: int) -> bytes:
    """The stable, opaque WebAuthn user handle of an operator: the first 16 bytes of
    SHA-256 of ``"hitl-gate operator <id>"`` (never the identity itself)."""
    return hashlib.sha256(f"hitl-gate operator {operator_id}".encode()).digest()[:16]


def unavailable(config: Config) -> GateError:
    """409 ``webauthn_unavailable``: no relying party; the message says which
    setting to change (``unavailable_reason``)."""
    message = f"passkeys are unavailable: {unavailable_reason(config)}"
    return Conflict("webauthn_unavailable", message, extra={"message": message})


def parse_invite_request(obj: Any, config: Config) -> tuple[int, int, str | None]:
    """Check a ``POST /v1/admin/approvers/invites`` body ``{"operator_id": int, "ttl_s"?:
    60..86400 (default 900), "label"?: str}``; returns ``(operator_id, ttl_s, label)``.
    Raises 400 ``invalid_<field>``, or ``unknown_operator`` for an id not in
    ``relay.operators``."""
    from gate.core.credentials import MAX_LABEL_CHARS, parse_operator_id

    operator_id = parse_operator_id(obj, config)
    ttl = obj.get("ttl_s", DEFAULT_TTL_S)
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not MIN_TTL_S <= ttl <= MAX_TTL_S:
        raise bad_field("ttl_s", f"ttl_s must be an integer of seconds, {MIN_TTL_S}..{MAX_TTL_S}")
    label = obj.get("label")
    if label is not None and (
        not isinstance(label, str) or not label.strip() or len(label) > MAX_LABEL_CHARS
    ):
        raise bad_field("label", f"label must be 1..{MAX_LABEL_CHARS} characters")
    return operator_id, ttl, label


def usable_invite(t: Transactions, tx: WriteTx, hashed: str) -> Invite:
    """The invite with this hash if it can still enrol. Raises 404 ``invite_unknown``, 410
    ``invite_used`` or ``invite_expired`` (at the gate's now)."""
    invite = tx.invites.load(hashed)
    if invite is None:
        raise NotFound("invite_unknown", "no such invite", extra={"message": "no such invite"})
    if invite.used_at is not None:
        raise GateError("invite_used", "this invite was used already", status=410, kind="gone")
    if t.clock.now_ms() >= invite.expires_at:
        raise GateError("invite_expired", "this invite has expired", status=410, kind="gone")
    return invite


@dataclass(frozen=True, slots=True)
class Registration:
    """A verified passkey registration: the credential to store, the RP ID it is for and the
    client-data ``origin`` it came from."""

    credential: Credential
    rp_id: str
    origin: str


@dataclass(frozen=True, slots=True)
class CreateInvite(Transaction[Invite]):
    """Store a fresh invite for the token hash ``hashed`` (its registration challenge: 32
    random bytes) at the gate's now with its ``approver_invite_created`` entry."""

    hashed: str
    operator_id: int
    ttl_s: int
    label: str | None

    def run(self, t: Transactions, tx: WriteTx) -> Invite:
        now = t.clock.now_ms()
        challenge = b64url(secrets.token_bytes(32))
        expires_at = now + self.ttl_s * 1000
        invite = Invite(self.hashed, self.operator_id, self.label, challenge, now, expires_at)
        tx.invites.insert(invite)
        data = InviteCreatedData(self.operator_id, expires_at, self.hashed, self.label)
        t.audit(tx, data.kind, None, now, data.to_data())
        return invite


@dataclass(frozen=True, slots=True)
class InvitePage(Transaction[tuple[Invite, list[str]]]):
    """What the invite page of ``hashed`` shows: the usable invite and the ids of its
    operator's passkeys in force (the page's ``excludeCredentials``). Changes nothing;
    raises as ``usable_invite``."""

    hashed: str

    def run(self, t: Transactions, tx: WriteTx) -> tuple[Invite, list[str]]:
        invite = usable_invite(t, tx, self.hashed)
        own = [
            c.credential_id
            for c in tx.credentials.all()
            if c.operator_id == invite.operator_id and c.type == "webauthn" and c.revoked_at is None
        ]
        return invite, own


@dataclass(frozen=True, slots=True)
class RegisterPasskey(Transaction[Credential]):
    """Consume the invite ``hashed`` and enrol its passkey, in one transaction: the invite
    must still be usable (raises as ``usable_invite``) and the credential id new (409
    ``credential_exists``); writes the ``approver_credential_enrolled`` entry."""

    hashed: str
    registration: Registration

    def run(self, t: Transactions, tx: WriteTx) -> Credential:
        invite = usable_invite(t, tx, self.hashed)
        cred = self.registration.credential
        if tx.credentials.load(cred.credential_id) is not None:
            message = "this passkey is enrolled already"
            raise Conflict("credential_exists", message, extra={"message": message})
        now = t.clock.now_ms()
        stored = replace(
            cred,
            operator_id=invite.operator_id,
            type="webauthn",
            label=invite.label,
            created_at=now,
        )
        tx.credentials.insert(stored)
        tx.invites.use(self.hashed, now, stored.credential_id)
        data = CredentialEnrolledData(
            stored.operator_id,
            stored.credential_id,
            "webauthn",
            stored.public_key,
            stored.label,
            rp_id=self.registration.rp_id,
            origin=self.registration.origin,
            sign_count=stored.sign_count,
        )
        t.audit(tx, data.kind, None, now, data.to_data())
        return stored


class Invites:
    """The passkey invites of a gate over its ``Shared`` state. ``callback_bound`` is the
    relay listener's bound ``host:port`` once ``serve`` bound it (the default origin)."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.store = shared.store
        self.callback_bound: str | None = None
        self._webauthn_for: tuple[Config, str | None, WebAuthnSettings | None] | None = None

    def webauthn(self) -> WebAuthnSettings | None:
        """The relying party in force (``resolve_webauthn``), None when unavailable; resolved
        once per config (a reload replaces ``config``) and bound address, not per decision."""
        memo = self._webauthn_for
        if memo is None or memo[0] is not self.shared.config or memo[1] != self.callback_bound:
            settings = resolve_webauthn(self.shared.config, self.callback_bound)
            memo = self._webauthn_for = (self.shared.config, self.callback_bound, settings)
        return memo[2]

    async def create(self, body: Any) -> dict[str, Any]:
        """Create the invite a ``POST /v1/admin/approvers/invites`` body asks for; returns
        ``{url, operator_id, expires_at (RFC 3339)}``. Raises as ``parse_invite_request``
        and 409 ``webauthn_unavailable``."""
        operator_id, ttl_s, label = parse_invite_request(body, self.shared.config)
        settings = self.webauthn()
        if settings is None:
            raise unavailable(self.shared.config)
        token = b64url(secrets.token_bytes(32))
        invite = await self.store.transact(
            CreateInvite(token_hash(token), operator_id, ttl_s, label)
        )
        base = invite_base(self.shared.config.relay.public_url, settings)
        return {
            "url": base.rstrip("/") + ENROL_PATH + token,
            "operator_id": operator_id,
            "expires_at": rfc3339(invite.expires_at),
        }

    def sign_in_origins(self) -> tuple[str, ...]:
        """Where an approver who just enrolled signs in: the relying party's origins other
        than the invite page's own (``invite_base``), e.g. the inbox's; () when none or
        passkeys are unavailable."""
        settings = self.webauthn()
        if settings is None:
            return ()
        own = origin_of(invite_base(self.shared.config.relay.public_url, settings))
        return tuple(o for o in settings.origins if o != own)

    async def enrol_page(self, token: str) -> tuple[str, str, dict[str, Any]]:
        """What the invite page of ``token`` shows: the operator's identity, the invite's
        expiry (RFC 3339) and the registration options (``creation_options``). Changes
        nothing. Raises as
        ``usable_invite`` and 409 ``webauthn_unavailable``."""
        settings = self.webauthn()
        if settings is None:
            raise unavailable(self.shared.config)
        invite, own = await self.store.transact(InvitePage(_known_shape(token)))
        identity = self._identity(invite.operator_id)
        options = creation_options(
            rp_id=settings.rp_id,
            rp_name=settings.rp_name,
            user_id=user_handle(invite.operator_id),
            user_name=identity,
            challenge=unb64(invite.challenge),
            exclude=[unb64(c) for c in own],
        )
        return identity, rfc3339(invite.expires_at), options

    async def register_passkey(self, token: str, body: Any) -> dict[str, Any]:
        """Verify the registration ``body`` against the invite of ``token`` and enrol it
        (``RegisterPasskey``); returns ``{credential_id, operator_id}``. Raises as
        ``usable_invite``, ``verify_passkey`` (400 ``invalid_registration``), 409
        ``credential_exists`` or ``webauthn_unavailable``; nothing is stored then."""
        settings = self.webauthn()
        if settings is None:
            raise unavailable(self.shared.config)
        invite, _ = await self.store.transact(InvitePage(_known_shape(token)))
        verified = verify_passkey(body, unb64(invite.challenge), settings.rp_id, settings.origins)
        credential = Credential(
            verified.credential_id,
            invite.operator_id,
            "webauthn",
            verified.public_key,
            verified.sign_count,
            invite.label,
            0,
        )
        registration = Registration(credential, settings.rp_id, verified.origin)
        stored = await self.store.transact(RegisterPasskey(token_hash(token), registration))
        return {"credential_id": stored.credential_id, "operator_id": stored.operator_id}

    def _identity(self, operator_id: int) -> str:
        found = (op.identity for op in self.shared.config.relay.operators if op.id == operator_id)
        return next(found, f"operator {operator_id}")


def invite_base(public_url: str | None, settings: WebAuthnSettings) -> str:
    """Where an invite page opens: it must be an allowed origin (WebAuthn checks it), so
    ``relay.public_url`` when it is one, else the first allowed origin (e.g. public_url on
    127.0.0.1 and the relying party localhost)."""
    if public_url and origin_of(public_url) in settings.origins:
        return public_url
    return settings.origins[0]
