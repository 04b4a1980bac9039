"""The gate's one rule for numbers, and for digits in text. Pure.

Every bound, limit and amount the gate takes (a form's ``minimum``/``maximum``, a form
answer's number, a policy's ``min``/``max``/``max_spend``, a budget's caps) is a finite
number within ±2**53, ints and floats alike (docs/design.md "Numbers"): where JSON numbers
stop being exact across implementations (RFC 7493 I-JSON), and every such number fits a
float. Digits in text (a list index in a JSON pointer, a port, a count in a query) are
ASCII ``0``-``9`` only: ``str.isdigit`` is also true for ``²`` and ``٣``.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeGuard

MAX_MAGNITUDE = 2**53
"""The largest magnitude of a number the gate takes: 9007199254740992."""
RANGE_WORDS = "between -2**53 and 2**53 (±9007199254740992)"
"""How an error says the range: ``... must be a number between -2**53 and 2**53 ...``."""

ASCII_DIGITS = re.compile(r"[0-9]+")
"""What a count, a port or seconds written as text must fully match."""
INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,30}")
"""An integer as a person types it: ASCII digits, an optional sign (``int()`` alone also
takes ``٣``, ``1_000`` and spaces)."""
NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
"""A decimal number as a person types it (``float()`` alone also takes ``nan``, ``inf``,
``1_0`` and non-ASCII digits)."""
LIST_INDEX = re.compile(r"0|[1-9][0-9]*")
"""What a list index in a JSON pointer must fully match (RFC 6901: no sign, no leading
zero, ASCII digits)."""


def is_json_number(value: Any) -> bool:
    """True for an int or a float, not a bool (any size: see ``in_range``)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def in_range(value: Any) -> TypeGuard[int | float]:
    """True for a JSON number (not a bool) that is finite and within ±``MAX_MAGNITUDE``
    (inclusive). Never raises: an int of any size is compared exactly, never made a float."""
    if not is_json_number(value):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return bool(-MAX_MAGNITUDE <= value <= MAX_MAGNITUDE)


def number_text(value: Any) -> str:
    """A JSON number as a person reads it, exactly: ``12``, ``0.5``, ``1e+300``; an int too
    long to print (Python's digit limit) as ``<a number of N bits>``. Never raises."""
    if isinstance(value, float):
        return repr(value)
    try:
        return str(value)
    except ValueError:
        return f"<a number of {int(value).bit_length()} bits>"


def brief_number(value: Any) -> str:
    """``number_text`` for an error line: an int of more than 40 digits as ``a 401-digit
    number`` (the line stays readable; the digits say nothing more)."""
    text = number_text(value)
    digits = len(text.lstrip("-"))
    if isinstance(value, int) and digits > 40:
        return f"a {digits}-digit number" if text[0] != "<" else text
    return text


def _whole(pattern: re.Pattern[str], text: str) -> int | None:
    if pattern.fullmatch(text) is None or len(text) > _MAX_DIGITS:
        return None
    return int(text)


_MAX_DIGITS = 100  # far above any count; int() refuses 4301+ digits with a ValueError


def ascii_int(text: str) -> int | None:
    """``text`` (no sign, no spaces) as an int when it is ASCII digits only (at most 100),
    else None."""
    return _whole(ASCII_DIGITS, text)


def list_index(part: str) -> int | None:
    """A JSON pointer segment as a list index when it is one (``LIST_INDEX``), else None."""
    return _whole(LIST_INDEX, part)


def looks_like_index(part: str) -> bool:
    """True for a path segment a person would read as a list index but that is none: only
    numeric characters (``²``, ``٣``, ``01``) yet not ``LIST_INDEX`` (a config refuses it)."""
    return part.isnumeric() and list_index(part) is None
