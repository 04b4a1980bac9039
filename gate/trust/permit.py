"""Execution permits: compact JWS (EdDSA, RFC 8037) binding an approval to the body that may run.

A permit exists only for an approval resolved ``approved`` or ``adjusted`` by a gate with a
signing key. The tool that executes the action verifies it offline with the gate's public
key: signature, expiry, and that the body it is about to execute hashes to the permitted
``payload_hash``. ``verify`` is pure: ``now`` is an argument.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gate.errors import GateError
from gate.model import Approval
from gate.protocol.canonical import HASH_PREFIX, canonical_json, no_duplicate_keys
from gate.trust import keys

ALG = "EdDSA"
TYP = "hitl-permit+jwt"
ISSUER = "hitl-gate"
FIRING_OUTCOMES = ("approved", "adjusted")
MAX_TOKEN_CHARS = 16_384

# claim -> JSON type; every one is required
_STRING_CLAIMS = (
    "iss",
    "approval_id",
    "run_id",
    "pipeline",
    "step",
    "outcome",
    "payload_hash",
    "audit_entry_hash",
)
_INT_CLAIMS = ("revision", "quorum", "audit_seq", "iat", "exp")


class PermitError(GateError):
    """A permit that must not be honoured; ``code`` says why (``permit_expired``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message, status=403, kind="forbidden")


@dataclass(frozen=True, slots=True)
class Permit:
    """A verified permit: its ``claims``, protected ``header`` and signing ``key_id``."""

    claims: dict[str, Any] = field(hash=False)
    header: dict[str, Any] = field(hash=False)
    key_id: str

    @property
    def approval_id(self) -> str:
        """The approval this permit was issued for (use it to refuse a replayed permit)."""
        return str(self.claims["approval_id"])

    @property
    def payload_hash(self) -> str:
        """``sha256:<hex>`` of the exact body permitted to execute."""
        return str(self.claims["payload_hash"])

    @property
    def expires_at(self) -> int:
        """Unix seconds after which the permit is void (``exp``)."""
        return int(self.claims["exp"])


def _approver(approval: Approval, operator_id: int, identity: str | None) -> dict[str, Any]:
    """One ``approved_by`` item: ``operator_id``, ``identity`` and, for an approval the
    approver signed, the ``credential_id`` that signed it: of their approve of
    the current revision, or of their adjust that made it (an adjust counts as approval)."""
    item: dict[str, Any] = {"operator_id": operator_id, "identity": identity}
    made = any(
        r.revision == approval.revision and r.created_by == operator_id for r in approval.revisions
    )
    counted = next(
        (
            row
            for row in approval.decisions
            if row.operator_id == operator_id
            and (
                (row.revision == approval.revision and row.decision == "approve")
                or (made and row.revision == approval.revision - 1 and row.decision == "adjust")
            )
        ),
        None,
    )
    if counted is not None and counted.credential_id is not None:
        item["credential_id"] = counted.credential_id
    return item


def claims_for(
    approval: Approval,
    outcome: str,
    approved_by: Iterable[int],
    audit_seq: int,
    audit_entry_hash: str,
    now_ms: int,
    lifetime_s: float,
) -> dict[str, Any]:
    """Return the claims of the permit for a loaded approval resolved ``outcome`` at ``now_ms``.

    ``approved_by`` are the operator ids whose approvals counted (identities are taken from
    the approval's frozen scope, a delegate's from their decision); ``audit_seq`` and
    ``audit_entry_hash`` name the ``resolved`` audit entry. ``iat`` is the resolution time
    and ``exp`` = ``iat + lifetime_s``, both unix seconds. Raises ValueError for an
    outcome that does not fire.
    """
    if outcome not in FIRING_OUTCOMES:
        raise ValueError(f"no permit exists for outcome {outcome!r}")
    identities = {int(op_id): identity for op_id, identity in approval.scope}
    for row in approval.decisions:  # a delegate is not in the scope
        identities.setdefault(row.operator_id, row.identity)
    current = next(r for r in approval.revisions if r.revision == approval.revision)
    iat = now_ms // 1000
    claims: dict[str, Any] = {
        "iss": ISSUER,
        "approval_id": approval.approval_id,
        "run_id": approval.run_id,
        "pipeline": approval.pipeline,
        "step": approval.step,
        "outcome": outcome,
        "revision": approval.revision,
        "payload_hash": current.payload_hash,
        "approved_by": [_approver(approval, op_id, identities.get(op_id)) for op_id in approved_by],
        "quorum": approval.quorum_required,
        "audit_seq": audit_seq,
        "audit_entry_hash": audit_entry_hash,
        "iat": iat,
        "exp": iat + max(1, int(lifetime_s)),
    }
    if approval.requested_by:
        claims["requested_by"] = approval.requested_by
    return claims


def issue(signer: keys.Signer, claims: Mapping[str, Any]) -> str:
    """Return the compact JWS of ``claims``: header ``{"alg":"EdDSA","kid":<key id>,
    "typ":"hitl-permit+jwt"}`` (sorted keys), payload the canonical JSON of the claims."""
    token: str = jwt.PyJWS().encode(
        canonical_json(dict(claims)),
        signer.private_key,
        algorithm=ALG,
        headers={"kid": signer.key_id, "typ": TYP},
    )
    return token


def verify(
    token: str,
    public_keys: Iterable[Ed25519PublicKey] | keys.PublicKeys,
    body: str | bytes,
    now: float,
    *,
    pipeline: str | None = None,
    step: str | None = None,
) -> Permit:
    """Verify a permit before executing ``body``; return it, or raise PermitError.

    ``public_keys``: trusted Ed25519 public keys (a list, or ``{key id: key}``); ``body``:
    exactly what is about to execute (str is encoded UTF-8, bytes as given, never
    normalized); ``now``: unix seconds. Checks, in order: compact JWS form and header
    (``alg`` EdDSA, ``typ``, ``kid`` of a trusted key) -> ``permit_malformed`` /
    ``permit_unknown_key``; the signature -> ``permit_bad_signature``; the claims' shape ->
    ``permit_invalid_claims``; outcome approved/adjusted -> ``permit_not_approved``;
    ``now < exp`` -> ``permit_expired``; optional ``pipeline``/``step`` ->
    ``permit_wrong_step``; ``sha256(body) == payload_hash`` -> ``permit_body_mismatch``.
    """
    if not isinstance(token, str):
        raise PermitError("permit_malformed", "a permit is a compact JWS string")
    token = token.strip()
    if len(token) > MAX_TOKEN_CHARS or token.count(".") != 2:
        raise PermitError("permit_malformed", "not a compact JWS (header.payload.signature)")
    jws = jwt.PyJWS()
    try:
        header = jws.get_unverified_header(token)
    except jwt.PyJWTError as exc:
        raise PermitError("permit_malformed", f"unreadable JWS header: {exc}") from None
    if header.get("alg") != ALG:
        raise PermitError("permit_malformed", f"alg must be {ALG}, got {header.get('alg')!r}")
    if header.get("typ") != TYP:
        raise PermitError("permit_malformed", f"typ must be {TYP}, got {header.get('typ')!r}")
    if "crit" in header or "b64" in header:
        raise PermitError("permit_malformed", "crit/b64 header parameters are not allowed")
    kid = header.get("kid")
    trusted = public_keys if isinstance(public_keys, Mapping) else keys.trusted(public_keys)
    key = trusted.get(kid) if isinstance(kid, str) else None
    if key is None or not isinstance(kid, str):
        raise PermitError(
            "permit_unknown_key", f"signed by key {kid!r}, which is not a trusted public key"
        )
    try:
        decoded = jws.decode_complete(token, key, algorithms=[ALG])
    except jwt.InvalidSignatureError:
        raise PermitError(
            "permit_bad_signature", f"signature does not verify with key {kid} (altered or forged)"
        ) from None
    except jwt.PyJWTError as exc:
        raise PermitError("permit_malformed", f"not a valid JWS: {exc}") from None
    claims = _claims(decoded["payload"])
    if claims["outcome"] not in FIRING_OUTCOMES:
        raise PermitError("permit_not_approved", f"outcome {claims['outcome']!r} does not fire")
    if not now < claims["exp"]:
        raise PermitError("permit_expired", f"expired at {claims['exp']} (now {int(now)})")
    for name, wanted in (("pipeline", pipeline), ("step", step)):
        if wanted is not None and claims[name] != wanted:
            raise PermitError(
                "permit_wrong_step", f"permit is for {name} {claims[name]!r}, not {wanted!r}"
            )
    try:
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    except UnicodeEncodeError:
        raise PermitError("permit_body_mismatch", "the body is not valid Unicode") from None
    digest = HASH_PREFIX + hashlib.sha256(raw).hexdigest()
    if not hmac.compare_digest(digest, claims["payload_hash"]):
        raise PermitError(
            "permit_body_mismatch",
            f"the body hashes to {digest}, the permit allows {claims['payload_hash']}",
        )
    return Permit(claims, dict(decoded["header"]), kid)


_unique_claims = functools.partial(no_duplicate_keys, twice="duplicate claim {!r}".format)


def _claims(payload: bytes) -> dict[str, Any]:
    try:
        claims = json.loads(payload.decode("utf-8"), object_pairs_hook=_unique_claims)
    except (UnicodeDecodeError, ValueError) as exc:
        raise PermitError("permit_invalid_claims", f"payload is not a JSON object: {exc}") from None
    if not isinstance(claims, dict):
        raise PermitError("permit_invalid_claims", "payload is not a JSON object")
    for name in _STRING_CLAIMS:
        if not isinstance(claims.get(name), str):
            raise PermitError("permit_invalid_claims", f"claim {name} must be a string")
    for name in _INT_CLAIMS:
        value = claims.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise PermitError("permit_invalid_claims", f"claim {name} must be an integer")
    if not isinstance(claims.get("approved_by"), list):
        raise PermitError("permit_invalid_claims", "claim approved_by must be a list")
    if not claims["payload_hash"].startswith(HASH_PREFIX):
        raise PermitError("permit_invalid_claims", "claim payload_hash must be sha256:<hex>")
    return claims


def unverified_expiry(token: str) -> int | None:
    """Return the ``exp`` claim (unix seconds) of a compact permit, or None if unreadable.

    Nothing is checked (not the signature either): for a client of its own gate that wants to
    know whether a permit it just received has already lapsed. Executors use ``verify``.
    """
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    exp = claims.get("exp")
    return exp if isinstance(exp, int) and not isinstance(exp, bool) else None


def save(path: Path, token: str) -> None:
    """Write ``token`` (plus a newline) to ``path`` atomically, mode 0600."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".permit-", dir=target.parent or Path("."))
    try:
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(token + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read(path: Path) -> str:
    """Return the token stored in ``path`` (whitespace around it removed); OSError if unreadable."""
    return Path(path).read_text(encoding="ascii", errors="replace").strip()
