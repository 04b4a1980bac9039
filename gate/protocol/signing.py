"""X-Draftcat-Signature: build, parse, verify (SPEC §2 checks 2-4). Pure; ``now`` is an argument."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER
from gate.protocol.errors import ProtocolError

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_DIGITS = re.compile(r"[0-9]{1,20}")
MAX_HEADER_CHARS = 4096


@dataclass(frozen=True, slots=True)
class SignatureHeader:
    """A parsed header: ``t`` in unix seconds and the ``v1`` digests (lowercase hex)."""

    t: int
    v1: tuple[str, ...]
    t_text: str = ""  # ``t`` exactly as sent: the HMAC covers these characters


def _unauthorized(code: str, message: str) -> ProtocolError:
    return ProtocolError(code, message, status=401, kind="unauthorized")


def compute(secret: str, t: int | str, body: bytes) -> str:
    """Return lowercase hex HMAC-SHA256(key=secret UTF-8, msg=ASCII ``t`` + ``.`` + body).

    ``t`` may be the header's own digits (a signer's leading zeros are then kept).
    """
    msg = str(t).encode("ascii") + b"." + body
    return hmac.new(secret.encode("utf-8"), msg, hashlib.sha256).hexdigest()


def sign(secret: str, t: int, body: bytes) -> str:
    """Return the header value ``t=<t>,v1=<hex>`` for ``body`` signed at unix second ``t``."""
    return f"t={t},v1={compute(secret, t, body)}"


def signed_headers(
    secret: str, t: int, body: bytes, signature: str | None = None
) -> dict[str, str]:
    """The headers of a signed hitl/v0 POST of ``body`` at unix second ``t`` (SPEC §2), the
    gate's dispatches and a relay's decisions alike; ``signature`` replaces the computed
    one (tests of relays send a wrong one on purpose)."""
    return {
        "Content-Type": "application/json; charset=utf-8",
        PROTOCOL_HEADER: PROTOCOL,
        SIGNATURE_HEADER: signature or sign(secret, t, body),
    }


def parse(header: str | None) -> SignatureHeader:
    """Parse a header leniently (spaces around ``,`` and ``=``; several ``v1``; unknown keys
    ignored). Returns ``t`` and the well-formed ``v1`` digests (64 hex digits, lowercased),
    in header order: a ``v1`` that is not 64 hex digits is skipped, since any one ``v1``
    matching is enough (SPEC §2: "a signature matches if any v1 matches any configured
    secret").

    Raises ProtocolError 401 ``signature_missing`` when absent or empty and
    ``signature_malformed`` when ``t`` is missing, repeated or not decimal, when an element
    has no ``=``, or when no ``v1`` is 64 hex digits (none sent, or every one malformed).
    """
    if header is None or not header.strip():
        raise _unauthorized("signature_missing", "X-Draftcat-Signature header is missing")
    if len(header) > MAX_HEADER_CHARS:
        raise _unauthorized("signature_malformed", "signature header is too long")
    t: int | None = None
    t_text = ""
    v1: list[str] = []
    malformed_v1 = False
    for part in header.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise _unauthorized("signature_malformed", f"signature element {key!r} has no '='")
        if key == "t":
            if t is not None:
                raise _unauthorized("signature_malformed", "signature has more than one t")
            if not _DIGITS.fullmatch(value):
                raise _unauthorized("signature_malformed", "signature t is not decimal seconds")
            t = int(value)
            t_text = value
        elif key == "v1":
            if _HEX64.fullmatch(value):
                v1.append(value.lower())
            else:
                malformed_v1 = True
    if t is None:
        raise _unauthorized("signature_malformed", "signature has no t")
    if not v1:
        raise _unauthorized(
            "signature_malformed",
            "signature v1 is not 64 hex digits" if malformed_v1 else "signature has no v1",
        )
    return SignatureHeader(t=t, v1=tuple(v1), t_text=t_text)


def check_window(t: int, now: float, max_skew: float) -> None:
    """Raise 401 ``timestamp_out_of_window`` unless ``|now - t| <= max_skew`` (seconds, inclusive).

    A ``t`` in milliseconds is simply far in the future and refused here (case H05).
    """
    if abs(now - t) > max_skew:
        raise _unauthorized(
            "timestamp_out_of_window",
            f"signature timestamp is more than {max_skew:g} s from the gate's clock",
        )


def check_hmac(parsed: SignatureHeader, body: bytes, secrets: Iterable[str]) -> None:
    """Raise 401 ``signature_mismatch`` unless some ``v1`` matches some secret (constant time)."""
    ok = False
    for secret in secrets:
        expected = compute(secret, parsed.t_text or parsed.t, body)
        for candidate in parsed.v1:
            # no early exit: every pair is compared
            ok |= hmac.compare_digest(expected, candidate)
    if not ok:
        raise _unauthorized("signature_mismatch", "signature does not match any active secret")


def verify(
    header: str | None, body: bytes, secrets: Sequence[str], now: float, max_skew: float
) -> SignatureHeader:
    """Run SPEC §2 checks 2, 3 and 4 in order over the raw received ``body`` bytes.

    Returns the parsed header; raises ProtocolError (401) with the first failing reason.
    """
    parsed = parse(header)
    check_window(parsed.t, now, max_skew)
    check_hmac(parsed, body, secrets)
    return parsed


def check_protocol_header(value: str | None) -> None:
    """SPEC §2 check 5's header part: an ``X-Hitl-Protocol`` header, when sent, must name
    ``hitl/v0`` (surrounding whitespace ignored). Raises ProtocolError 400
    ``invalid_protocol`` with ``field`` the header's name."""
    if value is not None and value.strip() != PROTOCOL:
        raise ProtocolError(
            "invalid_protocol",
            f"{PROTOCOL_HEADER} must be {PROTOCOL}",
            status=400,
            kind="invalid",
            extra={"field": PROTOCOL_HEADER},
        )
