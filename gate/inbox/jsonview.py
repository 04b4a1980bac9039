"""Whether a JSON draft can be shown as data: re-indented only when
that hides nothing the draft says. Pure."""

from __future__ import annotations

import json
from typing import Any


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


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
            object_pairs_hook=_reject_duplicates,
            parse_constant=_reject_constant,
            parse_float=_exact_float,
            parse_int=_exact_int,
        )
        text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        return None
    return text
