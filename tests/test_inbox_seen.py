"""What an approver sees of a draft (gate/inbox/seen.py): the item page's visible text and
whether a waiting-list row shows ALL of it (else bulk approve refuses the draft). Seeing is
signing: the property test generates drafts of every kind and checks that a row offered for
bulk approve shows every visible character, and that the item page shows all of them."""

from __future__ import annotations

import html
import json
import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.inbox.render import draft_view
from gate.inbox.seen import ROW_BYTES, ROW_LINES, bulk_eligibility, visible_text, whole_draft_html
from gate.protocol.display import code_point, is_hidden

LONG = "\n".join(
    f"Line {n:03}: order 2026-{n:03} shipped, tracking {n:07}."
    if n != 151
    else "ALSO wire 9.800,00 EUR to account DE00 9999 0000 0000 0000 00"
    for n in range(1, 201)
)
BIDI_JSON = json.dumps({"pay_to": "ACME GmbH \u202eHBmG EMCA", "amount": 5})
BIDI_MARKDOWN = "Pay **ACME GmbH &#x202E;HBmG EMCA** 5 EUR."
LETTER = "Dear customer 1,\n\nyour order 2026-001 has shipped.\n\n" + "More words. " * 40


def text_of(markup: str) -> str:
    """The text a browser shows of ``markup`` (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


@pytest.mark.parametrize(
    ("body", "content_type", "reason"),
    [
        pytest.param(LONG, "text/plain", "200 lines, 10 KB", id="200-lines"),
        pytest.param(LETTER, "text/plain", "5 lines, 532 bytes, a line of 480", id="letter"),
        pytest.param("x" * 81, "text/plain", "1 line, 81 bytes, a line of 81", id="wide"),
        pytest.param(BIDI_JSON, "application/json", "1 hidden character", id="json-escaped"),
        pytest.param(BIDI_MARKDOWN, "text/markdown", "1 hidden character", id="md-entity"),
        pytest.param("Pay \u202eRUE\u202c", "text/plain", "2 hidden characters", id="raw"),
        pytest.param(
            "[t][r]\n\n[r]: https://e.example/\u200b", "text/markdown", "1 hidden", id="ref"
        ),
        pytest.param('[t](https://e.example "x")', "text/markdown", "hidden parts", id="title"),
        pytest.param("Pay 12\u200b EUR", "text/markdown", "1 hidden character", id="md-raw"),
        pytest.param('{"to": "X\u202e"}', "application/json", "1 hidden", id="json-raw"),
        pytest.param('{"a": 1, "a": 2}', "application/json", "shown as sent", id="json-twice"),
        pytest.param(
            '{"fee": 1e-400}', "application/json; charset=utf-8", "shown as sent", id="json-text"
        ),
    ],
)
def test_a_draft_a_row_cannot_show_whole_must_be_opened(
    body: str, content_type: str, reason: str
) -> None:
    seen = bulk_eligibility(body, content_type)

    assert not seen.bulkable
    assert seen.reason is not None and reason in seen.reason, seen.reason
    assert whole_draft_html(seen) == ""


@pytest.mark.parametrize(
    ("body", "content_type", "text"),
    [
        ("Refund 12 EUR to ACME Ltd.", "text/plain", "Refund 12 EUR to ACME Ltd."),
        ("Refund 12 EUR\nto ACME Ltd.\n", "text/plain", "Refund 12 EUR\nto ACME Ltd."),
        ("Pay **12 EUR** to [ACME](https://a.example).", "text/markdown",
         "Pay 12 EUR to ACME (https://a.example)."),
        ('{"pay_to":"ACME \\u00e9","amount":5}', "application/json",
         '{\n  "pay_to": "ACME \u00e9",\n  "amount": 5\n}'),
        ("", "text/plain", "The draft is empty."),
    ],
)  # fmt: skip
def test_a_short_draft_is_shown_whole_in_its_row_as_the_item_page_shows_it(
    body: str, content_type: str, text: str
) -> None:
    seen = bulk_eligibility(body, content_type)

    assert visible_text(body, content_type) == text
    assert seen.bulkable and seen.text == text
    assert text_of(str(whole_draft_html(seen))) == text


def test_a_hidden_character_written_as_an_escape_is_judged_as_the_page_shows_it() -> None:
    """The JSON's bytes are ASCII, but the page decodes the string and warns: so must bulk."""
    assert BIDI_JSON.isascii()
    assert draft_view(BIDI_JSON, "application/json").marked == 1
    assert "\u202e" in visible_text(BIDI_JSON, "application/json")
    assert draft_view(BIDI_MARKDOWN, "text/markdown").marked == 1
    assert "\u202e" in visible_text(BIDI_MARKDOWN, "text/markdown")


# --- seeing is signing: generated drafts of every kind ------------------------------------

LETTERS = "abcXYZ0189\u00e9\u00df\u6f22"
HIDDEN = "\u202e\u200b\u2066\u00ad\u0007\ufeff"


def _entity(char: str, encode: bool) -> str:
    # markdown-it decodes a numeric entity of any character but a C0/C1 control
    return f"&#x{ord(char):X};" if encode and unicodedata.category(char) != "Cc" else char


words = st.text(alphabet=LETTERS + HIDDEN, min_size=1, max_size=14)
plain_words = st.text(alphabet=LETTERS, min_size=1, max_size=14)


def _lines(of: st.SearchStrategy[str]) -> st.SearchStrategy[list[list[str]]]:
    return st.lists(st.lists(of, min_size=1, max_size=10), min_size=1, max_size=8)


@st.composite
def drafts(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    """A draft (body, content type) and the pieces of text its reader must see."""
    kind = draw(st.sampled_from(["plain", "markdown", "json"]))
    rows = draw(_lines(words) if draw(st.booleans()) else _lines(plain_words))
    pieces = [w for row in rows for w in row]
    if kind == "plain":
        return "\n".join(" ".join(row) for row in rows), "text/plain", pieces
    if kind == "json":
        value = {f"k{n}": " ".join(row) for n, row in enumerate(rows)}
        body = json.dumps(value, ensure_ascii=draw(st.booleans()))
        # the page shows a decoded string, a control character in it as JSON escapes it
        return body, "application/json", [json.dumps(w, ensure_ascii=False)[1:-1] for w in pieces]
    encode = draw(st.booleans())
    text = [" ".join("".join(_entity(c, encode) for c in w) for w in row) for row in rows]
    url = "https://e.example/" + draw(st.text(alphabet="abc019", max_size=8))
    link = draw(st.sampled_from(["", "inline", "titled", "reference"]))
    if link == "inline":
        text.append(f"[see]({url})")
    elif link == "titled":
        text.append(f'[see]({url} "{draw(words)}")')
    elif link == "reference":
        text.append(f"[see][r]\n\n[r]: {url}")
    return "\n\n".join(text), "text/markdown", [*pieces, url] if link else pieces


def _as_marked(piece: str) -> str:
    return "".join(code_point(c) if is_hidden(c) else c for c in piece)


@settings(max_examples=300, deadline=None)
@given(drafts())
def test_seeing_is_signing_a_row_offered_for_bulk_shows_every_visible_character(
    draft: tuple[str, str, list[str]],
) -> None:
    body, content_type, pieces = draft
    view = draft_view(body, content_type)
    page = text_of(str(view.html)) + "".join(d.url + d.title for d in view.references)
    for piece in pieces:
        assert _as_marked(piece) in page, (piece, page)
    seen = bulk_eligibility(body, content_type)
    if not seen.bulkable:
        return
    row = text_of(str(whole_draft_html(seen)))
    assert row == text_of(str(view.html)).strip("\n")
    for piece in pieces:
        assert not any(is_hidden(c) for c in piece), (piece, seen)
        assert piece in row, (piece, row)
    shown = row.split("\n")
    assert len(shown) <= ROW_LINES and len(row.encode()) <= ROW_BYTES
    assert not view.references
