"""The credentials channel: a relay that signs approvers in asks the gate for their
public credentials; both bodies are canonical JSON signed with the relay secret. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate.protocol import PROTOCOL, signing
from gate.protocol.canonical import canonical_json
from gate.protocol.envelope import decode_text_json, is_unicode
from gate.protocol.errors import ProtocolError
from gate.protocol.times import _is_rfc3339, rfc3339

CREDENTIALS_PATH = "/hitl/v0/credentials"
REQUEST_TYPE = "credentials_request"
ANSWER_TYPE = "credentials"
CREDENTIAL_TYPES = ("ed25519", "webauthn")
CREDENTIAL_FIELDS = ("credential_id", "operator_id", "identity", "type", "public_key", "label")
MAX_ID_CHARS = 1366  # a WebAuthn credential id is at most 1023 bytes: 1364 base64url chars
MAX_KEY_CHARS = 4096
MAX_IDENTITY_CHARS = 320
MAX_LABEL_CHARS = 256
MAX_ORIGIN_CHARS = 2048
_B64URL = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class RelyingParty:
    """The gate's passkey relying party: ``rp_id`` (a domain) and the exact ``origins``
    (``scheme://host[:port]``) whose assertions it accepts."""

    rp_id: str
    origins: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ServedCredential:
    """One approver credential in force, as the gate serves it: ``credential_id`` and
    ``public_key`` base64url (the raw Ed25519 key, or a passkey's COSE key), the
    ``operator_id`` and its configured ``identity``, ``type`` ed25519|webauthn, ``label``."""

    credential_id: str
    operator_id: int
    identity: str
    type: str
    public_key: str
    label: str | None


@dataclass(frozen=True, slots=True)
class CredentialsAnswer:
    """A parsed credentials answer: when the gate wrote it (``issued_at``, RFC 3339), its
    relying party (None: passkeys unavailable at the gate) and the credentials in force,
    ordered by ``credential_id``."""

    issued_at: str
    webauthn: RelyingParty | None
    credentials: tuple[ServedCredential, ...]


def _invalid(field: str, message: str) -> ProtocolError:
    code = "invalid_" + re.split(r"[.\[]", field, maxsplit=1)[0]
    return ProtocolError(code, message, status=400, kind="invalid", extra={"field": field})


def _envelope(raw: bytes, kind: str) -> dict[str, Any]:
    """The JSON object of ``raw`` with ``protocol`` hitl/v0, ``type`` ``kind`` and an RFC 3339
    ``issued_at`` (unknown fields ignored: v0 is additive)."""
    obj = decode_text_json(raw)
    if not isinstance(obj, dict):
        raise _invalid("json", "body must be a JSON object")
    if obj.get("protocol") != PROTOCOL:
        raise _invalid("protocol", f"protocol must be {PROTOCOL}")
    if obj.get("type") != kind:
        raise _invalid("type", f"type must be {kind}")
    issued = obj.get("issued_at")
    if not isinstance(issued, str) or not _is_rfc3339(issued):
        raise _invalid("issued_at", "issued_at must be an RFC 3339 date-time")
    return obj


def build_credentials_request(issued_at_s: int) -> bytes:
    """The body a relay POSTs to ``/hitl/v0/credentials``: canonical JSON ``{"issued_at":
    RFC 3339 UTC, "protocol": "hitl/v0", "type": "credentials_request"}``."""
    return canonical_json(
        {"protocol": PROTOCOL, "type": REQUEST_TYPE, "issued_at": rfc3339(issued_at_s * 1000)}
    )


def parse_credentials_request(raw: bytes) -> None:
    """Check a credentials request body (after SPEC §2 checks 1-4): a JSON object with
    ``protocol`` hitl/v0, ``type`` credentials_request and an RFC 3339 ``issued_at``.
    Raises ProtocolError 400 ``invalid_<field>`` naming the field."""
    _envelope(raw, REQUEST_TYPE)


def build_credentials_answer(
    rp: Mapping[str, Any] | None,
    credentials: Iterable[Mapping[str, Any]],
    issued_at_s: int,
) -> bytes:
    """The gate's answer body: canonical JSON ``{"protocol", "type": "credentials",
    "issued_at", "webauthn": {"rp_id", "origins"} | null, "credentials": [...]}``.

    ``rp`` needs ``rp_id`` and ``origins`` (other keys are dropped); each credential needs
    ``CREDENTIAL_FIELDS`` (others dropped). A credential with a non-null ``revoked_at`` is
    left out: only credentials in force are served, ordered by ``credential_id``."""
    served = [
        {name: c[name] for name in CREDENTIAL_FIELDS}
        for c in credentials
        if c.get("revoked_at") is None
    ]
    served.sort(key=lambda c: str(c["credential_id"]))
    webauthn = None if rp is None else {"rp_id": rp["rp_id"], "origins": list(rp["origins"])}
    return canonical_json(
        {
            "protocol": PROTOCOL,
            "type": ANSWER_TYPE,
            "issued_at": rfc3339(issued_at_s * 1000),
            "webauthn": webauthn,
            "credentials": served,
        }
    )


def _text(obj: Mapping[str, Any], key: str, field: str, limit: int) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise _invalid(field, f"{field} must be a non-empty string")
    if len(value) > limit:
        raise _invalid(field, f"{field} is longer than {limit} characters")
    if not is_unicode(value):
        raise _invalid(field, f"{field} is not valid Unicode (lone surrogate)")
    return value


def _b64url(obj: Mapping[str, Any], key: str, field: str, limit: int) -> str:
    value = _text(obj, key, field, limit)
    if not _B64URL.fullmatch(value):
        raise _invalid(field, f"{field} must be base64url without padding")
    return value


def _relying_party(value: Any) -> RelyingParty | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid("webauthn", "webauthn must be an object or null")
    rp_id = _text(value, "rp_id", "webauthn.rp_id", 253)
    origins = value.get("origins")
    if not isinstance(origins, list) or not origins:
        raise _invalid("webauthn.origins", "webauthn.origins must be a non-empty list")
    for i in range(len(origins)):
        _text({"o": origins[i]}, "o", f"webauthn.origins[{i}]", MAX_ORIGIN_CHARS)
    return RelyingParty(rp_id, tuple(origins))


def _credential(value: Any, i: int) -> ServedCredential:
    at = f"credentials[{i}]"
    if not isinstance(value, dict):
        raise _invalid(at, f"{at} must be an object")
    operator_id = value.get("operator_id")
    if isinstance(operator_id, bool) or not isinstance(operator_id, int):
        raise _invalid(f"{at}.operator_id", f"{at}.operator_id must be an integer")
    kind = value.get("type")
    if kind not in CREDENTIAL_TYPES:
        raise _invalid(f"{at}.type", f"{at}.type must be one of {', '.join(CREDENTIAL_TYPES)}")
    label = value.get("label")
    if label is not None:
        label = _text(value, "label", f"{at}.label", MAX_LABEL_CHARS)
    return ServedCredential(
        credential_id=_b64url(value, "credential_id", f"{at}.credential_id", MAX_ID_CHARS),
        operator_id=operator_id,
        identity=_text(value, "identity", f"{at}.identity", MAX_IDENTITY_CHARS),
        type=kind,
        public_key=_b64url(value, "public_key", f"{at}.public_key", MAX_KEY_CHARS),
        label=label,
    )


def parse_credentials_answer(raw: bytes) -> CredentialsAnswer:
    """Parse the gate's answer strictly: ``protocol``, ``type`` credentials,
    ``issued_at`` RFC 3339, ``webauthn`` null or ``{rp_id, origins: [non-empty]}``,
    ``credentials`` a list of objects with every field of ``CREDENTIAL_FIELDS`` of the right
    type (``type`` ed25519|webauthn, ids and keys base64url, ``label`` string or null), no
    ``credential_id`` twice. Raises ProtocolError 400 ``invalid_<field>`` whose ``field``
    names the path (``credentials[2].type``)."""
    obj = _envelope(raw, ANSWER_TYPE)
    rp = _relying_party(obj.get("webauthn"))
    items = obj.get("credentials")
    if not isinstance(items, list):
        raise _invalid("credentials", "credentials must be a list")
    parsed = tuple(_credential(item, i) for i, item in enumerate(items))
    seen: set[str] = set()
    for i, credential in enumerate(parsed):
        if credential.credential_id in seen:
            field = f"credentials[{i}].credential_id"
            raise _invalid(field, f"{field} is listed twice")
        seen.add(credential.credential_id)
    return CredentialsAnswer(obj["issued_at"], rp, parsed)


def verify_credentials_answer(
    raw: bytes, header: str | None, secrets: Sequence[str], now_s: float, max_skew: float
) -> CredentialsAnswer:
    """The relay side: check the answer's signature header over the raw ``raw``
    bytes (SPEC §2 checks 2-4 with the relay's own ``secrets``, current first; ``now_s`` and
    ``max_skew`` in seconds), then parse it. Raises ProtocolError 401 (``signature_missing``,
    ``signature_malformed``, ``timestamp_out_of_window``, ``signature_mismatch``) or 400 as
    ``parse_credentials_answer``."""
    signing.verify(header, raw, secrets, now_s, max_skew)
    return parse_credentials_answer(raw)
