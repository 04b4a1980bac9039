"""Whether a JSON draft can be shown as data: re-indented only when
that hides nothing the draft says. Pure."""

from __future__ import annotations

import json
from typing import TypeVar

from gate.protocol.canonical import no_duplicate_keys, reject_json_constant

T = TypeVar("T", int, float)


def _exact(source: str, value: T) -> T:
    """``value`` (a number parsed from ``source``) when it is shown as sent (``repr``)."""
    if repr(value) != source:
        raise ValueError("a number would be shown other than as sent")
    return value


def pretty_json(body: str) -> str | None:
    """``body`` re-indented with 2 spaces (non-ASCII kept), or None when showing it so could
    hide something: it does not parse, repeats a key (a parser would keep one of them),
    holds NaN/Infinity, or a number whose re-serialised text differs from its text in the
    draft (``100.000000000000000001``, ``1e-400``, ``1.50``). Then it
    is shown as text."""
    try:
        value = json.loads(
            body,
            object_pairs_hook=no_duplicate_keys,
            parse_constant=reject_json_constant,
            parse_float=lambda source: _exact(source, float(source)),
            parse_int=lambda source: _exact(source, int(source)),
        )
        text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        return None
    return text
