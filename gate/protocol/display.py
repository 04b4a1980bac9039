"""What a display shows: which characters are not shown as themselves, how a time is printed
and how a text of several lines is set in; one rule for every screen of the
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
from collections.abc import Container

from gate.protocol.times import rfc3339_ms, rfc3339_to_ms

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


def marked(text: str, *, keep: str = "\n\t", suspect: Container[str] = ()) -> str:
    """``text`` with every character a terminal would not show as itself (``is_hidden``,
    except those in ``keep``) and every one in ``suspect`` (a look-alike, say) replaced by
    its ``<U+XXXX>``."""
    return "".join(
        f"<{code_point(c)}>" if (c not in keep and is_hidden(c)) or c in suspect else c
        for c in text
    )


def describe(char: str) -> str:
    """``"U+202E RIGHT-TO-LEFT OVERRIDE"``: the code point and the character's Unicode name,
    or its category in words when it has none (``"U+001B control character"``)."""
    name = unicodedata.name(char, "") or _CATEGORY_WORDS.get(unicodedata.category(char), "")
    return f"{code_point(char)} {name}".rstrip()


def display_time(value: object) -> str:
    """An RFC 3339 time as the API or a dispatch sends it (``2026-12-07T10:20:16.4Z``, a
    fraction only when not zero) as every screen prints it: UTC, exactly three millisecond
    digits (``2026-12-07T10:20:16.400Z``), so times line up. Anything else (None, a word, a
    date without a time) is ``str(value)`` as it is."""
    ms = rfc3339_to_ms(value) if isinstance(value, str) else None
    return str(value) if ms is None else rfc3339_ms(ms)


def hanging_indent(text: str, indent: str = "") -> str:
    """``text`` (a reason, a label: given by a person, may span lines) for a line that
    starts with ``indent``: each line after the first starts two spaces further in, so the
    text reads as one item of the output, not as lines of its own."""
    return text.replace("\n", "\n" + indent + "  ")
