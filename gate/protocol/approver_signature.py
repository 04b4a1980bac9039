"""Approver signatures: the decision digest, batches, the ``approver_assertion``
field and Ed25519 verification. Pure: no I/O, no clock.

The construction, for relay authors, is in docs/protocol.md ("Approver signatures:
the construction"); known answers are in conformance/vectors/approver_signature.json.
WebAuthn verification lives in ``approver_webauthn``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from gate.protocol import PROTOCOL
from gate.protocol.canonical import canonical_json
from gate.protocol.envelope import string_or_none
from gate.protocol.errors import ProtocolError

VERBS = ("approve", "skip", "adjust")
TYPES = ("ed25519", "webauthn")
FIELD = "approver_assertion"
# sizes in bytes after base64url decoding (WebAuthn L3: a credential id is at most 1023 bytes,
# a user handle at most 64; authenticator data is at least 37: rpIdHash, flags, signCount)
MAX_CREDENTIAL_ID = 1023
MAX_AUTHENTICATOR_DATA = 1024
MAX_CLIENT_DATA_JSON = 4096
MAX_SIGNATURE = 1024
MAX_USER_HANDLE = 64
ED25519_SIGNATURE = 64
MAX_BATCH_ITEMS = 256

_B64URL = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_BASE64URL = "a base64url string"


def sha256_hex(text: str) -> str:
    """Lowercase hex SHA-256 of ``text``'s UTF-8 bytes: how a signed text is covered."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def decision_digest(
    *,
    approval_id: str,
    revision: int,
    nonce: str,
    payload_hash: str,
    decision: str,
    adjust_text: str | None = None,
    reason: str | None = None,
) -> bytes:
    """Return the 32-byte SHA-256 an approver signs for one decision.

    The digest covers the canonical JSON (sorted keys, no spaces, UTF-8, non-ASCII unescaped:
    ``canonical_json``) of ``{"protocol": "hitl/v0", "approval_id", "revision" (integer, as
    in the dispatch), "nonce", "payload_hash", "decision"}`` plus ``"adjust_text_sha256"``
    (lowercase hex SHA-256 of the text's UTF-8 bytes) for an ``adjust`` whose text is not
    None, and ``"reason_sha256"`` likewise when ``reason`` is not None (an empty reason is
    present; null is absent). ``adjust_text`` is left out for approve and skip, since the
    gate ignores it there (check 5). Texts are hashed exactly as sent, never normalized.

    Raises ValueError for a decision outside approve|skip|adjust or a revision that is not a
    positive integer, UnicodeEncodeError for a lone surrogate.
    """
    return decision_digest_of_hashes(
        approval_id=approval_id,
        revision=revision,
        nonce=nonce,
        payload_hash=payload_hash,
        decision=decision,
        adjust_text_sha256=None if adjust_text is None else sha256_hex(adjust_text),
        reason_sha256=None if reason is None else sha256_hex(reason),
    )


def decision_digest_of_hashes(
    *,
    approval_id: str,
    revision: int,
    nonce: str,
    payload_hash: str,
    decision: str,
    adjust_text_sha256: str | None = None,
    reason_sha256: str | None = None,
) -> bytes:
    """``decision_digest`` from the texts' SHA-256 (lowercase hex) instead of the texts: what
    an offline verifier of an audit export has (``gate.audit.signature_checks``). Same rules
    (``adjust_text_sha256`` only for an adjust) and the same ValueError."""
    if decision not in VERBS:
        raise ValueError(f"decision must be one of {', '.join(VERBS)}")
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise ValueError("revision must be a positive integer")
    signed: dict[str, Any] = {
        "protocol": PROTOCOL,
        "approval_id": approval_id,
        "revision": revision,
        "nonce": nonce,
        "payload_hash": payload_hash,
        "decision": decision,
    }
    if decision == "adjust" and adjust_text_sha256 is not None:
        signed["adjust_text_sha256"] = adjust_text_sha256
    if reason_sha256 is not None:
        signed["reason_sha256"] = reason_sha256
    return hashlib.sha256(canonical_json(signed)).digest()


def batch_digest(digests: Sequence[bytes]) -> bytes:
    """Return the 32-byte SHA-256 one approver signs for several decisions.

    It covers the canonical JSON of the items' digests as lowercase hex strings, sorted:
    ``["0a…","9f…"]`` (no spaces). In a browser that is
    ``JSON.stringify(hexes.slice().sort())`` hashed with ``crypto.subtle.digest``; the
    default JS sort orders lowercase hex as the bytes would, and the list hashed is the list
    sent in ``approver_assertion.batch``. Order does not matter; duplicates are refused.
    Raises ValueError for an empty list, a duplicate or an item that is not 32 bytes.
    """
    if not digests:
        raise ValueError("a batch holds at least one digest")
    if any(len(d) != 32 for d in digests):
        raise ValueError("every batch item is a 32-byte SHA-256 digest")
    hexes = sorted(d.hex() for d in digests)
    if len(set(hexes)) != len(hexes):
        raise ValueError("a batch lists each digest once")
    return hashlib.sha256(canonical_json(hexes)).digest()


def signature_invalid(detail: str, message: str) -> ProtocolError:
    """The refusal of a signature that does not verify: 403 ``forbidden`` /
    ``approver_signature_invalid`` with ``detail`` in the body (the details are listed in
    docs/protocol.md, "Approver signatures: the construction")."""
    return ProtocolError(
        "approver_signature_invalid",
        message,
        status=403,
        kind="forbidden",
        extra={"detail": detail},
    )


def check_in_batch(digest: bytes, batch: Sequence[str]) -> None:
    """Raise 403 ``approver_signature_invalid`` / ``not_in_batch`` unless this decision's
    ``digest`` (32 bytes) is in ``batch`` (lowercase hex strings, as parsed)."""
    if digest.hex() not in batch:
        raise signature_invalid("not_in_batch", "this decision's digest is not in the signed batch")


@dataclass(frozen=True, slots=True)
class ApproverAssertion:
    """A decision's ``approver_assertion`` after ``parse_approver_assertion`` (shape only).

    Binary parts are the decoded bytes; ``batch`` is the tuple, in the order sent, of lowercase hex
    digests, or None for a single decision. WebAuthn parts are ``b""``/None for Ed25519.
    """

    type: str  # ed25519 | webauthn
    credential_id: bytes
    signature: bytes
    authenticator_data: bytes = b""
    client_data_json: bytes = b""
    user_handle: bytes | None = None
    batch: tuple[str, ...] | None = None

    @property
    def credential_id_b64(self) -> str:
        """The credential id as base64url without padding (how credentials are looked up)."""
        return b64url(self.credential_id)


def b64url(raw: bytes) -> str:
    """base64url without padding (RFC 4648 §5), the WebAuthn JSON convention."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def unb64(text: str) -> bytes:
    """Decode base64url with or without padding (RFC 4648 §5); binascii.Error or ValueError
    when it is not base64url, TypeError when ``text`` is no string."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _invalid(part: str, message: str) -> ProtocolError:
    field = f"{FIELD}.{part}" if part else FIELD
    return ProtocolError(
        "invalid_approver_assertion", message, status=400, kind="invalid", extra={"field": field}
    )


def _bytes(obj: dict[str, Any], part: str, low: int, high: int, *, required: bool) -> bytes | None:
    name, refuse = f"{FIELD}.{part}", functools.partial(_invalid, part)
    value = string_or_none(obj, part, refuse, name=name, required=required, what=_BASE64URL)
    if value is None:
        return None
    if len(value) > (high * 4 + 2) // 3 + 2 or not _B64URL.fullmatch(value):
        raise _invalid(part, f"{FIELD}.{part} must be base64url of at most {high} bytes")
    bare = value.rstrip("=")
    try:
        raw = unb64(bare)
    except (binascii.Error, ValueError):
        raise _invalid(part, f"{FIELD}.{part} is not valid base64url") from None
    if not low <= len(raw) <= high:
        raise _invalid(part, f"{FIELD}.{part} must decode to {low}..{high} bytes")
    if b64url(raw) != bare:  # other unused trailing bits: one spelling per value
        raise _invalid(part, f"{FIELD}.{part} is not canonical base64url (unused bits set)")
    return raw


def _batch(obj: dict[str, Any]) -> tuple[str, ...] | None:
    value = obj.get("batch")
    if value is None:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_BATCH_ITEMS:
        raise _invalid("batch", f"batch must be a list of 1..{MAX_BATCH_ITEMS} digests")
    if not all(isinstance(item, str) and _HEX64.fullmatch(item) for item in value):
        raise _invalid("batch", "every batch item is 64 lowercase hex digits")
    if len(set(value)) != len(value):
        raise _invalid("batch", "batch lists a digest twice")
    return tuple(value)


def parse_approver_assertion(obj: object) -> ApproverAssertion | None:
    """Parse a decision's additive ``approver_assertion``: None when the
    field is absent or null. Unknown keys are ignored (v0 is additive).

    Shapes: ``{"type": "ed25519", "credential_id", "signature"}`` (a 64-byte signature) or
    ``{"type": "webauthn", "credential_id", "authenticator_data", "client_data_json",
    "signature", "user_handle"?}``; binary parts are base64url (padding optional); either may
    carry ``"batch"``: 1..256 distinct lowercase hex digests. Raises ProtocolError 400
    ``invalid_approver_assertion`` with ``field`` naming the part (e.g.
    ``approver_assertion.signature``) for a wrong type, size or encoding.
    """
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise _invalid("", f"{FIELD} must be an object or null")
    kind = obj.get("type")
    if kind not in TYPES:
        raise _invalid("type", f"{FIELD}.type must be one of {', '.join(TYPES)}")
    credential_id = _bytes(obj, "credential_id", 1, MAX_CREDENTIAL_ID, required=True)
    if kind == "ed25519":
        signature = _bytes(obj, "signature", ED25519_SIGNATURE, ED25519_SIGNATURE, required=True)
        assert credential_id is not None and signature is not None
        return ApproverAssertion("ed25519", credential_id, signature, batch=_batch(obj))
    auth_data = _bytes(obj, "authenticator_data", 37, MAX_AUTHENTICATOR_DATA, required=True)
    client_data = _bytes(obj, "client_data_json", 1, MAX_CLIENT_DATA_JSON, required=True)
    signature = _bytes(obj, "signature", 1, MAX_SIGNATURE, required=True)
    user_handle = _bytes(obj, "user_handle", 1, MAX_USER_HANDLE, required=False)
    assert credential_id is not None and signature is not None
    assert auth_data is not None and client_data is not None
    return ApproverAssertion(
        "webauthn", credential_id, signature, auth_data, client_data, user_handle, _batch(obj)
    )


def challenge_for(assertion: ApproverAssertion, digest: bytes) -> bytes:
    """What the assertion's signature must cover for the decision whose digest is ``digest``:
    the digest itself, or for a batch ``batch_digest`` of the listed digests after checking
    this one is among them (raises 403 ``approver_signature_invalid`` / ``not_in_batch``)."""
    if assertion.batch is None:
        return digest
    check_in_batch(digest, assertion.batch)
    return batch_digest([bytes.fromhex(item) for item in assertion.batch])


def ed25519_credential_id(raw_public_key: bytes) -> str:
    """The credential id of an Ed25519 approver key (as conformance/vectors/
    approver_signature.json uses it): base64url, unpadded, of the first 16 bytes of SHA-256
    of the raw 32-byte public key. Here, in the pure layer, so relays derive it too."""
    return b64url(hashlib.sha256(raw_public_key).digest()[:16])


def load_ed25519_public_key(key: bytes | str) -> Ed25519PublicKey:
    """An Ed25519 public key from its 32 raw bytes or a PEM (SubjectPublicKeyInfo) text.

    Raises ValueError when it is neither (a stored key is the gate's, never a relay's).
    """
    if isinstance(key, bytes) and len(key) == 32:
        return Ed25519PublicKey.from_public_bytes(key)
    pem = key.encode("ascii") if isinstance(key, str) else key
    try:
        loaded = load_pem_public_key(pem)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ValueError("not an Ed25519 public key (32 raw bytes or PEM)") from exc
    if not isinstance(loaded, Ed25519PublicKey):
        raise ValueError("the PEM key is not Ed25519")
    return loaded


def verify_ed25519(public_key: bytes | str, assertion: ApproverAssertion, challenge: bytes) -> None:
    """Check an Ed25519 assertion: ``signature`` is RFC 8032 Ed25519 over the 32 ``challenge``
    bytes (``challenge_for``) with the enrolled key (raw 32 bytes or PEM).

    Raises 403 ``approver_signature_invalid`` with detail ``wrong_type`` (a WebAuthn assertion)
    or ``bad_signature``; ValueError for an unusable stored key.
    """
    key = load_ed25519_public_key(public_key)
    if assertion.type != "ed25519":
        raise signature_invalid("wrong_type", "the credential is an Ed25519 key")
    try:
        key.verify(assertion.signature, challenge)
    except InvalidSignature:
        raise signature_invalid("bad_signature", "the Ed25519 signature does not verify") from None
