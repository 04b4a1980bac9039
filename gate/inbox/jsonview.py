"""Whether a JSON draft can be shown as data: re-indented only when
that hides nothing the draft says. Pure."""

from __future__ import annotations

import json

from gate.protocol.canonical import no_duplicate_keys, reject_json_constant


def _exact_float(source: str) -> float:
    value = float(source)
    if repr(value) != source:
        raise ValueError("a number would be shown other than as sent")
    return value


def _exact_int(source: str) -> int:
    value = int(source)
    if str(value) != source:
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
            parse_float=_exact_float,
            parse_int=_exact_int,
        )
        text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        return None
    return text
