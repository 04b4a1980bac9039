"""Approver credentials: the admin requests that enrol, list and revoke them, the
write transactions that do it (each with its audit entry) and ``Credentials``
(``GateService.credentials``), what the admin API calls. No HTTP, no SQL of its own.

Only Ed25519 keys are enrolled here; passkeys (``type: webauthn``) arrive through the
passkey invite page (``gate.core.invites``), into the same table.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gate.audit.credential_entries import CredentialEnrolledData, CredentialRevokedData
from gate.core.commands import Transaction
from gate.core.views import named
from gate.errors import Conflict, GateError, NotFound, refused
from gate.model import Credential
from gate.protocol.approver_signature import (
    b64url,
    ed25519_credential_id,
    load_ed25519_public_key,
)
from gate.protocol.times import rfc3339

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from gate.config import Config
    from gate.core.requests.service import Shared
    from gate.core.transactions import Transactions
    from gate.store import WriteTx

MAX_LABEL_CHARS = 200
MAX_PEM_CHARS = 4096


def _invalid(field: str, message: str) -> GateError:
    return refused(f"invalid_{field}", field, message)


def parse_operator_id(obj: Any, config: Config) -> int:
    """The ``operator_id`` of an admin request body (a JSON object): an id of
    ``relay.operators``. Raises 400 ``invalid_json`` (not an object), ``invalid_operator_id``
    (not an integer) or ``unknown_operator`` naming the id."""
    if not isinstance(obj, dict):
        raise _invalid("json", "body must be a JSON object")
    operator_id = obj.get("operator_id")
    if isinstance(operator_id, bool) or not isinstance(operator_id, int):
        raise _invalid("operator_id", "operator_id must be an integer")
    if not any(op.id == operator_id for op in config.relay.operators):
        message = f"operator id {operator_id} is not in relay.operators"
        raise refused("unknown_operator", "operator_id", message)
    return operator_id


def parse_enrolment(obj: Any, config: Config) -> Credential:
    """Check a ``POST /v1/admin/approvers`` body ``{"operator_id": int, "type": "ed25519",
    "public_key": PEM text, "label"?: str}`` and return the credential to store (its
    ``created_at`` 0: the transaction sets it). Raises 400 ``invalid_<field>`` naming the
    field (``unknown_operator`` for an id the config does not define, naming it)."""
    operator_id = parse_operator_id(obj, config)
    if obj.get("type", "ed25519") != "ed25519":
        raise _invalid("type", "type must be ed25519 (passkeys are enrolled by invite)")
    pem = obj.get("public_key")
    if not isinstance(pem, str) or not 0 < len(pem) <= MAX_PEM_CHARS:
        raise _invalid("public_key", "public_key must be an Ed25519 public key in PEM")
    try:
        key: Ed25519PublicKey = load_ed25519_public_key(pem)
    except (ValueError, UnicodeEncodeError):
        raise _invalid("public_key", "public_key is not an Ed25519 public key in PEM") from None
    label = obj.get("label")
    if label is not None and (
        not isinstance(label, str) or not label.strip() or len(label) > MAX_LABEL_CHARS
    ):
        raise _invalid("label", f"label must be 1..{MAX_LABEL_CHARS} characters")
    raw = key.public_bytes_raw()
    return Credential(
        credential_id=ed25519_credential_id(raw),
        operator_id=operator_id,
        type="ed25519",
        public_key=b64url(raw),
        sign_count=0,
        label=label,
        created_at=0,
    )


def credential_view(credential: Credential, config: Config) -> dict[str, Any]:
    """The JSON object of one credential (``approvers list``): ids, the operator's
    configured ``identity`` (None if no longer configured), type, public key (base64url),
    label, ``created_at``/``revoked_at`` (RFC 3339 or None)."""
    identity = next(
        (op.identity for op in config.relay.operators if op.id == credential.operator_id), None
    )
    return {
        **named(credential, "credential_id", "operator_id"),
        "identity": identity,
        **named(credential, "type", "public_key", "label"),
        "created_at": rfc3339(credential.created_at),
        "revoked_at": None if credential.revoked_at is None else rfc3339(credential.revoked_at),
    }


@dataclass(frozen=True, slots=True)
class EnrolCredential(Transaction[Credential]):
    """Store ``credential`` at the gate's now with its ``approver_credential_enrolled``
    entry. Raises 409 ``credential_exists`` when its id is enrolled already."""

    credential: Credential

    def run(self, t: Transactions, tx: WriteTx) -> Credential:
        credential = self.credential
        existing = tx.credentials.load(credential.credential_id)
        if existing is not None:
            message = f"this key is enrolled already as {credential.credential_id}"
            if existing.revoked_at is not None:
                message = (
                    f"this key was enrolled as {credential.credential_id} and is revoked; a"
                    " revoked key is never trusted again: make a new key"
                )
            raise Conflict("credential_exists", message, extra={"message": message})
        now = t.clock.now_ms()
        stored = replace(credential, created_at=now, revoked_at=None)
        tx.credentials.insert(stored)
        data = CredentialEnrolledData(
            stored.operator_id, stored.credential_id, stored.type, stored.public_key, stored.label
        )
        t.audit(tx, data.kind, None, now, data.to_data())
        return stored


@dataclass(frozen=True, slots=True)
class RevokeCredential(Transaction[Credential]):
    """Revoke the credential ``credential_id`` at the gate's now with its
    ``approver_credential_revoked`` entry. Raises 404 ``unknown_credential``, 409
    ``credential_revoked`` when it already is."""

    credential_id: str

    def run(self, t: Transactions, tx: WriteTx) -> Credential:
        credential_id = self.credential_id
        found = tx.credentials.load(credential_id)
        if found is None:
            message = f"no approver credential {credential_id!r}"
            raise NotFound("unknown_credential", message, extra={"message": message})
        if found.revoked_at is not None:
            message = f"credential {credential_id!r} is revoked already"
            raise Conflict("credential_revoked", message, extra={"message": message})
        now = t.clock.now_ms()
        tx.credentials.revoke(credential_id, now)
        data = CredentialRevokedData(found.operator_id, credential_id)
        t.audit(tx, data.kind, None, now, data.to_data())
        return replace(found, revoked_at=now)


@dataclass(frozen=True, slots=True)
class ListCredentials(Transaction[list[Credential]]):
    """Every credential, revoked ones included (read on the writer: one source of truth)."""

    def run(self, t: Transactions, tx: WriteTx) -> list[Credential]:
        return tx.credentials.all()


class Credentials:
    """The approver credentials of a gate over its ``Shared`` state, for the admin API."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.store = shared.store

    async def enrol(self, body: Any) -> dict[str, Any]:
        """Enrol the key a ``POST /v1/admin/approvers`` body names; returns its view.
        Raises as ``parse_enrolment`` and ``EnrolCredential``."""
        credential = parse_enrolment(body, self.shared.config)
        stored = await self.store.transact(EnrolCredential(credential))
        log.info(
            "event=approver_credential_enrolled operator_id=%d credential_id=%s type=%s",
            stored.operator_id,
            stored.credential_id,
            stored.type,
        )
        return credential_view(stored, self.shared.config)

    async def revoke(self, credential_id: str) -> dict[str, Any]:
        """Revoke a credential; returns its view. Raises as ``RevokeCredential``."""
        stored = await self.store.transact(RevokeCredential(credential_id))
        log.info(
            "event=approver_credential_revoked operator_id=%d credential_id=%s",
            stored.operator_id,
            stored.credential_id,
        )
        return credential_view(stored, self.shared.config)

    async def list_all(self) -> list[dict[str, Any]]:
        """Every credential's view, by operator id then enrolment time."""
        rows = await self.store.transact(ListCredentials())
        return [credential_view(row, self.shared.config) for row in rows]

    async def in_force(self) -> list[dict[str, Any]]:
        """The credentials not revoked, for the credentials channel, read on the
        read connection: ``credential_id``, ``operator_id``, ``identity`` (the operator's in
        ``relay.operators``), ``type``, ``public_key``, ``label``, by credential_id. A
        credential whose operator is no longer configured is left out (nobody to sign in)."""
        rows = await self.store.reads.credentials_in_force()
        views = [credential_view(row, self.shared.config) for row in rows]
        # ``credential_view`` without its times (the other keys in their order)
        return [
            {key: value for key, value in view.items() if key not in ("created_at", "revoked_at")}
            for view in views
            if view["identity"] is not None
        ]
