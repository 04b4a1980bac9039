"""Unicode White_Space: what is trimmed from identities and what makes a text blank.

One definition for the whole gate: the characters with the Unicode ``White_Space`` property
(Unicode PropList.txt, unchanged since Unicode 6.3). Python's ``str.strip()`` and
``str.isspace()`` also take U+001C..U+001F (the C0 "information separators"), which are not
White_Space: ``"alice@example.com\\x1f"`` is not ``alice@example.com``, and a draft of
``"\\x1f"`` is not blank (a relay shows it as ``<U+001F>``).
"""

from __future__ import annotations

# Unicode PropList.txt, property White_Space: 25 code points
WHITE_SPACE = (
    "\t\n\x0b\x0c\r"  # U+0009..U+000D
    " "  # U+0020
    "\x85"  # U+0085 NEXT LINE
    "\xa0"  # U+00A0 NO-BREAK SPACE
    "\u1680"  # OGHAM SPACE MARK
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"  # U+2000..U+200A
    "\u2028\u2029"  # LINE SEPARATOR, PARAGRAPH SEPARATOR
    "\u202f"  # NARROW NO-BREAK SPACE
    "\u205f"  # MEDIUM MATHEMATICAL SPACE
    "\u3000"  # IDEOGRAPHIC SPACE
)


def trim(text: str) -> str:
    """Return ``text`` without leading and trailing White_Space characters (nothing else)."""
    return text.strip(WHITE_SPACE)


def is_blank(text: str) -> bool:
    """True when ``text`` is empty or holds only White_Space characters."""
    return not trim(text)


def is_trimmed(text: str) -> bool:
    """True when ``text`` has no leading or trailing White_Space character."""
    return trim(text) == text


def identity_key(identity: str) -> str:
    """The comparison form of an identity: White_Space-trimmed, then Unicode casefolded
    (SPEC §2 check 11: "identities compared after trim + casefold"). Look-alike characters
    are not folded (a Cyrillic ``а`` stays a different identity)."""
    return trim(identity).casefold()
