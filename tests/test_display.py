"""``gate.protocol.display``: what every screen of the project shows of a time and of a
text that spans lines."""

from __future__ import annotations

import pytest

from gate.protocol.display import display_time, hanging_indent


@pytest.mark.parametrize(
    ("wire", "shown"),
    [
        ("2026-12-07T10:20:16.4Z", "2026-12-07T10:20:16.400Z"),
        ("2026-12-07T10:20:16.45Z", "2026-12-07T10:20:16.450Z"),
        ("2026-12-07T10:20:16.395Z", "2026-12-07T10:20:16.395Z"),
        ("2026-12-07T10:20:16Z", "2026-12-07T10:20:16.000Z"),
        ("2026-12-07T10:20:16.123456789Z", "2026-12-07T10:20:16.123Z"),
        ("2026-12-07t10:20:16.5z", "2026-12-07T10:20:16.500Z"),
        ("2026-12-07T11:20:16.4+01:00", "2026-12-07T10:20:16.400Z"),
    ],
    ids=["1-digit", "2-digits", "3-digits", "no-fraction", "nanoseconds", "lower-case", "offset"],
)
def test_display_time_is_fixed_width_utc_with_milliseconds(wire: str, shown: str) -> None:
    assert display_time(wire) == shown


@pytest.mark.parametrize(
    "value",
    ["soon", "2026-12-07", "2026-13-07T10:20:16Z", "2026-12-07T10:20:16", None, 17],
    ids=["word", "date-only", "month-13", "no-offset", "none", "number"],
)
def test_display_time_shows_what_is_no_time_as_it_is(value: object) -> None:
    assert display_time(value) == str(value)


@pytest.mark.parametrize(
    ("text", "indent", "shown"),
    [
        ("one line", "", "one line"),
        ("first\nsecond\nthird", "", "first\n  second\n  third"),
        ("first\nsecond", "    ", "first\n      second"),
        ("first\n\nafter a blank line", "", "first\n  \n  after a blank line"),
    ],
    ids=["one-line", "three-lines", "indented-first", "blank-line"],
)
def test_hanging_indent_sets_continuation_lines_in(text: str, indent: str, shown: str) -> None:
    assert hanging_indent(text, indent) == shown
