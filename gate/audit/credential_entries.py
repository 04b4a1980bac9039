"""Typed ``data`` of the approver-credential audit entries: enrolment and
revocation. Pure, like ``gate.audit.entries``, whose ``Payload`` they are: ``to_data()`` is what
the chain hashes (an optional field is left out, never null), ``from_data()`` reads a logged
object back as logged.

Both carry no approval id (``audit_log.approval_id`` is NULL). The enrolment carries the
public key itself, so an offline verifier of an export holds every key the log ever
trusted, and when.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gate.audit.entries import Payload

CREDENTIAL_ENROLLED = "approver_credential_enrolled"
CREDENTIAL_REVOKED = "approver_credential_revoked"
INVITE_CREATED = "approver_invite_created"


@dataclass(frozen=True, slots=True)
class CredentialEnrolledData(Payload):
    """``approver_credential_enrolled``: operator ``operator_id`` may sign decisions with
    ``credential_id`` from this entry on. ``type`` ed25519|webauthn; ``public_key``
    base64url (raw 32 bytes for Ed25519, the COSE key for a passkey); ``label`` only when
    one was given. A passkey's entry also has ``rp_id`` (what an assertion's rpIdHash is
    checked against offline), ``origin`` (the registration's client-data origin) and
    ``sign_count`` (the counter at registration); an Ed25519 entry has none of them."""

    kind: ClassVar[str] = CREDENTIAL_ENROLLED

    operator_id: int
    credential_id: str
    type: str
    public_key: str
    label: str | None = None
    rp_id: str | None = None
    origin: str | None = None
    sign_count: int | None = None


@dataclass(frozen=True, slots=True)
class CredentialRevokedData(Payload):
    """``approver_credential_revoked``: ``credential_id`` of ``operator_id`` signs nothing
    from this entry on."""

    kind: ClassVar[str] = CREDENTIAL_REVOKED

    operator_id: int
    credential_id: str


@dataclass(frozen=True, slots=True)
class InviteCreatedData(Payload):
    """``approver_invite_created``: a one-time passkey invite for ``operator_id``, usable
    until ``expires_at`` (unix ms); ``invite_hash`` is the SHA-256 hex of the token (the
    token itself appears only in the printed URL); ``label`` only when one was given."""

    kind: ClassVar[str] = INVITE_CREATED

    operator_id: int
    expires_at: int
    invite_hash: str
    label: str | None = None
