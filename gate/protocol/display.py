"""Which characters a display does not show as themselves: one rule for every screen of the
project (the reference relay, the CLI's hop lines and ``--json``, the inbox's pages). Pure.

Controls (C0, DEL, C1: carriage return, escape sequences), format characters (bidi overrides
and isolates, zero-width space/joiners, soft hyphen, BOM), line and paragraph separators,
surrogates and unassigned code points: a draft of ``"pay 12000 to X\\r\\x1b[2Kpay 12 to Y"``
or one with a RIGHT-TO-LEFT OVERRIDE would otherwise show something other than what the
payload hash covers (security review). Newline and tab are shown as they are by callers that
keep lines.
"""

from __future__ import annotations

import unicodedata

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
"""Unicode general categories of the characters shown as their code point instead."""

_CATEGORY_WORDS = {
    "Cc": "control character",
    "Cf": "format character",
    "Zl": "line separator",
    "Zp": "paragraph separator",
    "Cs": "surrogate",
    "Cn": "unassigned code point",
}


def is_hidden(char: str) -> bool:
    """True when the one character ``char`` is in ``HIDDEN_CATEGORIES`` (newline and tab
    included: a caller that keeps lines tests them first)."""
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def code_point(char: str) -> str:
    """``"U+202E"``: the character's code point, at least four hex digits, upper case."""
    return f"U+{ord(char):04X}"


def describe(char: str) -> str:
    """``"U+202E RIGHT-TO-LEFT OVERRIDE"``: the code point and the character's Unicode name,
    or its category in words when it has none (``"U+001B control character"``)."""
    name = unicodedata.name(char, "") or _CATEGORY_WORDS.get(unicodedata.category(char), "")
    return f"{code_point(char)} {name}".rstrip()
