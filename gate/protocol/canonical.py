"""Canonical JSON and the payload hash (SPEC §2, §7)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

HASH_PREFIX = "sha256:"


def payload_hash(body: str) -> str:
    """Return ``"sha256:" + lowercase hex SHA-256`` of ``body`` encoded as UTF-8 (SPEC §2).

    The body is never normalized: no trimming, no newline conversion.
    Raises UnicodeEncodeError for a string holding lone surrogates.
    """
    return HASH_PREFIX + hashlib.sha256(body.encode("utf-8")).hexdigest()


# built once: ``json.dumps`` with options builds a new encoder on every call
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
_WIRE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> bytes:
    """Return canonical JSON bytes: sorted keys, no spaces, UTF-8, non-ASCII unescaped (SPEC §7).

    Raises ValueError for NaN/Infinity, TypeError for a value JSON cannot hold.
    """
    return _CANONICAL.encode(value).encode("utf-8")


def wire_json(value: Any) -> bytes:
    """Return the bytes the gate sends for an envelope: compact UTF-8 JSON, non-ASCII unescaped.

    Serialized once; the same bytes are signed and sent (case H02). Raises as
    ``canonical_json``.
    """
    return _WIRE.encode(value).encode("utf-8")
