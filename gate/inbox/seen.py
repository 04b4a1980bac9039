"""What an approver sees of a draft, decided in one place for the item page and the waiting
list, so that "the human approved this text" holds for a bulk approval too. Pure.

``visible_text`` is the text the item page's draft shows, read back from the very HTML the
page renders (``render.draft_view``): JSON strings decoded, markdown rendered (its link URLs
and titles written out, entities decoded), a hidden character as itself (the page marks it
with its code point). ``bulk_eligibility`` says whether a waiting-list row can show ALL of
that text: a short draft (at most ``ROW_LINES`` lines, ``ROW_BYTES`` bytes, ``ROW_WIDTH``
characters a line) that nothing hides. Such a row shows the whole text and may offer a
checkbox; any other draft is "Open to review: 200 lines, 11 KB" and bulk approve refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser

from markupsafe import Markup

from gate.inbox.jsonview import pretty_json
from gate.inbox.render import (
    definitions_marked,
    draft_view,
    hidden_count,
    markdown_hides,
    marked_text,
    reference_definitions,
)
from gate.protocol.whitespace import is_blank

ROW_LINES = 5
"""At most this many lines of shown text for a draft a row shows whole."""
ROW_BYTES = 400
"""At most this many bytes (UTF-8) of shown text for a draft a row shows whole."""
ROW_WIDTH = 80
"""At most this many characters on one line of a draft a row shows whole."""


class _Text(HTMLParser):
    """The text of the draft's HTML; a ``<mark class="cc">U+XXXX</mark>`` read back as the
    character it stands for."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.in_mark = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.in_mark = tag == "mark" and ("class", "cc") in attrs

    def handle_endtag(self, tag: str) -> None:
        self.in_mark = False

    def handle_data(self, data: str) -> None:
        self.parts.append(chr(int(data[2:], 16)) if self.in_mark else data)


def visible_text(body: str, content_type: str) -> str:
    """The text of ``body`` as the item page shows it (``render.draft_view``), hidden
    characters as themselves, without the blank lines around it. An empty or whitespace-only
    draft is the sentence the page says instead ("The draft is empty.")."""
    parser = _Text()
    parser.feed(str(draft_view(body, content_type).html))
    parser.close()
    return "".join(parser.parts).strip("\n")


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} byte{'s' if count != 1 else ''}"
    return f"{round(count / 1024)} KB"


@dataclass(frozen=True, slots=True)
class Eligibility:
    """Whether a waiting-list row may offer a draft for bulk approve: ``text`` (its
    ``visible_text``) and ``reason``, None when the row shows all of ``text`` and may offer a
    checkbox, else why it must be opened in words ("200 lines, 11 KB", "1 hidden character")."""

    text: str
    reason: str | None

    @property
    def bulkable(self) -> bool:
        """True when the row shows the whole draft (and offers a checkbox)."""
        return self.reason is None


def bulk_eligibility(body: str, content_type: str) -> Eligibility:
    """Decide on what the item page renders (``visible_text``) whether a row can show the
    whole draft: refused for a hidden character the page marks (also inside a markdown link
    reference definition), a markdown draft with parts its text does not show (a reference
    definition, a link's or image's title), JSON shown as sent rather than as data, or more
    than ``ROW_LINES`` lines / ``ROW_BYTES`` bytes / ``ROW_WIDTH`` characters on a line."""
    text = visible_text(body, content_type)
    hidden = hidden_count(text) + definitions_marked(reference_definitions(body, content_type))
    if hidden:
        return Eligibility(text, f"{hidden} hidden character{'s' if hidden != 1 else ''}")
    kind = content_type.split(";", 1)[0].strip().lower()
    if not is_blank(body) and kind == "text/markdown" and markdown_hides(body):
        return Eligibility(text, "markdown with hidden parts")
    if not is_blank(body) and kind == "application/json" and pretty_json(body) is None:
        return Eligibility(text, "JSON that is shown as sent, not as data")
    lines = text.split("\n")
    size = len(text.encode("utf-8"))
    widest = max(len(line) for line in lines)
    if len(lines) > ROW_LINES or size > ROW_BYTES or widest > ROW_WIDTH:
        said = f"{len(lines)} line{'s' if len(lines) != 1 else ''}, {_size(size)}"
        wide = f", a line of {widest} characters" if widest > ROW_WIDTH else ""
        return Eligibility(text, said + wide)
    return Eligibility(text, None)


def whole_draft_html(seen: Eligibility) -> Markup:
    """A bulkable draft's whole text as its row shows it (escaped; lines kept; the page's CSS
    wraps, never cuts, a line); "" for a draft the row cannot show whole."""
    if not seen.bulkable:
        return Markup("")
    return Markup('<span class="whole-draft">{}</span>').format(marked_text(seen.text))
