"""Canonical JSON and the payload hash (SPEC §2, §7), the hooks with which every JSON
reader of the gate refuses what is no JSON for it: keys given twice, NaN, numbers too large,
and the JSON type of a decoded value (``json_type``)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
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


def _duplicate_key(key: str) -> str:
    return f"duplicate key {json.dumps(key)}"


def no_duplicate_keys(
    pairs: list[tuple[str, Any]], twice: Callable[[str], str] = _duplicate_key
) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json``: raises ValueError naming a key that occurs twice
    (JSON itself would keep the last one silently): ``twice(key)`` says it, by default
    ``duplicate key "to"``; a reader with words of its own binds ``twice`` with
    ``functools.partial``."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(twice(key))
        out[key] = value
    return out


def reject_json_constant(name: str) -> Any:
    """``parse_constant`` hook for ``json``: NaN, Infinity and -Infinity are no JSON; raises
    ValueError naming the constant."""
    raise ValueError(f"{name} is not JSON")


def finite_float(text: str) -> float:
    """``parse_float`` hook for ``json``: a number whose value is not finite (``1e999`` would
    decode to infinity) is no JSON for the gate, like NaN; raises ValueError (the number is
    not quoted: it may be part of an answer's value)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number is too large to be finite")
    return value


MAX_INT_DIGITS = 4300  # Python's own limit for int() of text (sys.int_info)


def whole_int(text: str) -> int:
    """``parse_int`` hook for ``json``: an integer of more than ``MAX_INT_DIGITS`` digits is
    refused in the gate's words (ValueError), not Python's."""
    if len(text) - text.startswith("-") > MAX_INT_DIGITS:
        raise ValueError(f"a number has more than {MAX_INT_DIGITS} digits")
    return int(text)


def json_type(value: Any) -> str:
    """The JSON type of a decoded value: null, boolean, number, string, array, object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list | tuple) else "object"
