"""The inbox's draft and diff rendering (gate/inbox/render.py): hostile drafts come
out escaped, every hidden character marked and counted, markdown without raw HTML, clickable
links or loaded images, JSON pretty only when that hides nothing, the whole body always."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from gate.inbox.render import (
    diff_html,
    draft_view,
    first_line,
    hidden_count,
    marked_text,
    pretty_json,
    reference_definitions,
)


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text, of an HTML fragment."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    tags.close()
    return tags


ALLOWED_TAGS = {"pre", "mark", "div", "p", "span", "h1", "h2", "code", "em", "strong", "ul"}
ALLOWED_TAGS |= {"ol", "li", "blockquote", "hr", "br", "h3", "h4", "h5", "h6", "del", "ins"}


def assert_inert(html: str) -> None:
    """No tag outside the harmless set, no attribute but class and a mark's title."""
    for tag, attrs in parse(html).tags:
        assert tag in ALLOWED_TAGS, (tag, html[:300])
        for name in attrs:
            assert name in ("class", "title") or (tag == "ol" and name == "start"), (tag, name)
            assert not name.startswith("on")


HOSTILE = [
    pytest.param("<script>window.__pwned=1</script>", id="script"),
    pytest.param('<img src=x onerror="window.__pwned=1">', id="img-onerror"),
    pytest.param('"><svg onload=alert(1)>', id="attribute-breakout"),
    pytest.param("</pre><script>alert(1)</script>", id="close-pre"),
]


@pytest.mark.parametrize("body", HOSTILE)
@pytest.mark.parametrize("content_type", ["text/plain", "text/markdown", "application/json", "x/y"])
def test_draft_html_hostile_markup_is_escaped_text(body: str, content_type: str) -> None:
    html = draft_view(body, content_type).html
    assert_inert(html)
    assert body in "".join(parse(html).text)


def test_draft_text_plain_marks_bidi_and_zero_width_visibly_and_counts_them() -> None:
    view = draft_view("pay 12 to \u202eXYZ\u202c\u200b ok\r\x1b[2K", "text/plain")
    assert view.format == "text"
    assert view.marked == 5
    assert '<mark class="cc" title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</mark>' in view.html
    assert 'title="U+200B ZERO WIDTH SPACE">U+200B</mark>' in view.html
    assert 'title="U+000D control character">U+000D</mark>' in view.html
    assert 'title="U+001B control character">U+001B</mark>' in view.html
    for hidden in "\u202e\u202c\u200b\r\x1b":
        assert hidden not in view.html


@pytest.mark.parametrize(
    ("char", "title"),
    [
        ("\u2028", "U+2028 LINE SEPARATOR"),
        ("\u2029", "U+2029 PARAGRAPH SEPARATOR"),
        ("\ufeff", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
        ("\u2066", "U+2066 LEFT-TO-RIGHT ISOLATE"),
        ("\x85", "U+0085 control character"),
        ("\ud800", "U+D800 surrogate"),
        ("\U000e0001", "U+E0001 LANGUAGE TAG"),
        ("\U0010fffe", "U+10FFFE unassigned code point"),
    ],
)
def test_marked_text_names_every_hidden_category(char: str, title: str) -> None:
    html = marked_text(f"a{char}b")
    assert html == f'a<mark class="cc" title="{title}">{title.split()[0]}</mark>b'


def test_draft_text_keeps_newline_and_tab_and_visible_unicode() -> None:
    body = "Grüße\tnaïve\n日本語 👍 e\u0301"
    view = draft_view(body, "text/plain")
    assert view.marked == 0
    assert view.html == f'<pre class="draft-text">{body}</pre>'


def test_draft_a_200_kib_body_is_complete() -> None:
    line = "0123456789 abcdefghij <&> ÄÖÜ\n"
    body = line * (200 * 1024 // len(line.encode()) + 1) + "THE END\u202e"
    assert len(body.encode()) > 200 * 1024
    view = draft_view(body, "text/plain")
    assert "".join(parse(view.html).text) == body.replace("\u202e", "U+202E")
    assert view.marked == 1


def test_draft_markdown_raw_html_is_text_and_links_are_not_clickable() -> None:
    body = (
        "# Title\n\n<b onclick=x>bold?</b> <iframe src=https://evil.example></iframe>\n\n"
        "[harmless](javascript:window.__pwned=1) and [site](https://example.com/a?b=1)\n\n"
        "![tracker](https://evil.example/pixel.png) <https://auto.example/>\n"
    )
    view = draft_view(body, "text/markdown")
    assert view.format == "markdown"
    assert_inert(view.html)
    assert all(tag not in ("a", "img", "iframe", "b") for tag, _ in parse(view.html).tags)
    text = "".join(parse(view.html).text)
    assert "<b onclick=x>bold?</b>" in text
    assert "site (https://example.com/a?b=1)" in text
    assert "[image: tracker] (https://evil.example/pixel.png)" in text
    assert "auto.example" in text
    assert "javascript:window.__pwned=1" in text  # shown, never a link


def test_draft_markdown_marks_hidden_characters_in_text_code_and_urls() -> None:
    body = 'a\u202eb `c\u200bd`\n\n```js" onclick="x\ne\u2066f\n```\n\n'
    body += "[t](https://x.example/\u200b) &#x202E;"
    view = draft_view(body, "text/markdown")
    assert_inert(view.html)
    assert view.marked == 4, view.html  # the URL's is percent-encoded: visible too
    assert "https://x.example/%E2%80%8B" in "".join(parse(view.html).text)
    assert "js" not in "".join(a.get("class") or "" for _, a in parse(view.html).tags)


def test_draft_markdown_shows_link_and_image_titles_escaped_and_marked() -> None:
    # a title is text of the draft (a tooltip wherever it is published) that could carry a
    # URL or an instruction: the item page must show it, not only count it as "hidden parts"
    body = (
        '[docs](https://ok.example/ "https://evil.example/\u202ex <b>")\n\n'
        "![chart](https://img.example/c.png 'wire \"all\" funds')\n\n"
        '[ref][r]\n\n[r]: https://r.example/ "ref title"\n'
    )
    view = draft_view(body, "text/markdown")
    assert_inert(view.html)
    text = "".join(parse(view.html).text)
    assert 'docs (https://ok.example/) (title "https://evil.example/U+202Ex <b>")' in text
    assert '[image: chart] (https://img.example/c.png) (title "wire "all" funds")' in text
    assert 'ref (https://r.example/) (title "ref title")' in text
    assert view.marked == 1, view.html


def test_reference_definitions_are_listed_exactly_as_written_duplicates_too() -> None:
    body = (
        "[click](x) and [more][Dup]\n\n"
        '[x]: https://evil.example/\u00e4?a=1&b=<2> "Sign in"\n'
        "> [Dup]: <https://a.example/b c>\n\n"
        "- [dup]:\n  https://second.example/\u200b\n"
    )

    found = reference_definitions(body, "text/markdown; charset=utf-8")

    assert [(d.label, d.url, d.title) for d in found] == [
        ("x", "https://evil.example/\u00e4?a=1&b=<2>", "Sign in"),
        ("Dup", "https://a.example/b c", ""),
        ("dup", "https://second.example/\u200b", ""),
    ]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        ("[x]: https://evil.example", "text/plain"),
        ("[x]: https://evil.example", "application/json"),
        ("[click](https://shown.example) [x]: not a definition", "text/markdown"),
        ("[x]: javascript:alert(1)", "text/markdown"),  # not a definition: shown as text
        ("", "text/markdown"),
    ],
    ids=["plain-text", "json", "inline-only", "bad-protocol-is-text", "empty"],
)
def test_reference_definitions_none_where_the_page_shows_everything(
    body: str, content_type: str
) -> None:
    assert reference_definitions(body, content_type) == ()


def test_draft_markdown_counts_hidden_characters_of_reference_definitions() -> None:
    view = draft_view("Pay.\n\n[x]: https://e.example/\u202eexe.txt\n", "text/markdown")

    assert view.marked == 1
    assert [d.url for d in view.references] == ["https://e.example/\u202eexe.txt"]


def test_draft_json_is_pretty_printed_with_two_spaces_and_marked() -> None:
    view = draft_view('{"to":"X\u202e","amount":[1, 2.5],"ok":true}', "application/json")
    assert view.format == "json"
    text = "".join(parse(view.html).text)
    expected = json.dumps(
        {"to": "XU+202E", "amount": [1, 2.5], "ok": True}, indent=2, ensure_ascii=False
    )
    assert text == expected
    assert view.marked == 1


@pytest.mark.parametrize(
    "body",
    [
        pytest.param('{"to":"alice","to":"mallory"}', id="duplicate-key"),
        pytest.param('{"n": NaN}', id="nan"),
        pytest.param('{"n": 1e400}', id="overflow"),
        pytest.param('{"a": 1', id="truncated"),
        pytest.param("[" * 100_000 + "]" * 100_000, id="deep"),
        pytest.param('{"amount": 100.000000000000000001}', id="float-precision"),
        pytest.param('{"po": 12345678901234567890.12}', id="float-digits"),
        pytest.param('{"fee": 1e-400}', id="underflow"),
        pytest.param('{"n": 1.50}', id="trailing-zero"),
        pytest.param('{"n": 1E5}', id="exponent"),
        pytest.param('{"n": -0}', id="negative-zero-int"),
    ],
)
def test_draft_json_that_pretty_printing_would_change_is_shown_as_sent(body: str) -> None:
    assert pretty_json(body) is None
    view = draft_view(body, "application/json; charset=utf-8")
    assert view.format == "text"
    assert "".join(parse(view.html).text) == body


def test_draft_json_numbers_shown_exactly_as_sent_stay_pretty() -> None:
    """Pretty JSON only when every number reads as in the draft."""
    body = '{"a": 12345678901234567890123, "b": -0.5, "c": 1e+100, "d": 0}'
    pretty = pretty_json(body)
    assert pretty is not None
    for number in ("12345678901234567890123", "-0.5", "1e+100", "0"):
        assert re.search(rf"(?<![\d.e+-]){re.escape(number)}(?![\d.e])", pretty), number


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("", "The draft is empty."),
        ("  \n", "The draft holds only whitespace: 2 × space, 1 × newline."),
        ("\u2028", "The draft holds only whitespace: 1 × U+2028 LINE SEPARATOR."),
    ],
)
def test_draft_empty_or_whitespace_only_is_said_in_words(body: str, words: str) -> None:
    view = draft_view(body, "text/plain")
    assert view.format == "empty"
    assert "".join(parse(view.html).text) == words


def test_draft_of_an_information_separator_is_not_blank_but_marked() -> None:
    view = draft_view("\x1f", "text/plain")
    assert (view.format, view.marked) == ("text", 1)


def test_diff_html_marks_deleted_and_inserted_lines_escaped() -> None:
    html = diff_html("pay 10 to <a>\nsame\n", "pay 1000 to <a>\u202e\nsame\nmore")
    assert_inert(html)
    tags = [tag for tag, _ in parse(html).tags]
    assert tags.count("del") == 2 and tags.count("ins") == 2  # "" -> "more" too
    assert "<del>- pay 10 to &lt;a&gt;</del>" in html
    assert re.search(
        r"<ins>\+ pay 1000 to &lt;a&gt;<mark class=\"cc\"[^>]*>U\+202E</mark></ins>", html
    )
    assert '<span class="same">  same</span>' in html


def test_diff_html_of_equal_drafts_has_no_change() -> None:
    html = diff_html("a\nb", "a\nb")
    assert "<del>" not in html and "<ins>" not in html


def test_hidden_count_counts_what_the_draft_marks_but_newline_and_tab() -> None:
    assert hidden_count("a\u202eb\u200b\n\tc\r") == 3
    assert hidden_count("plain\n") == 0


@pytest.mark.parametrize(
    ("body", "line"),
    [
        ("\n\n  Refund 12 EUR  \nsecond", "Refund 12 EUR"),
        ('{\n  "pay_to": "ACME",\n  "amount": 5\n}', '"pay_to": "ACME",'),
        ("---\n***\n", "---"),
        ("x" * 100, "x" * 79 + "\u2026"),
        ("", ""),
        (" \n ", ""),
    ],
)
def test_first_line_is_the_first_non_blank_line_truncated(body: str, line: str) -> None:
    assert first_line(body) == line
