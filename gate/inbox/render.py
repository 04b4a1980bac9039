"""How the inbox shows a draft and an adjust's diff as HTML. Pure.

Everything from a dispatch is untrusted: it is escaped, and every character a display would
not show as itself (``gate.protocol.display``; newline and tab excepted) is shown as a
visible ``<mark class="cc">U+XXXX</mark>`` whose title names it, so the approver sees what the
payload hash covers. Markdown is rendered with raw HTML off, links as their text followed by
the URL and title (nothing to click) and images as their description, URL and title (nothing
loaded); its link reference definitions, which a rendering never shows, are listed apart
(``reference_definitions``).
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from markupsafe import Markup, escape

from gate.inbox.jsonview import pretty_json
from gate.protocol.display import code_point, describe, is_hidden
from gate.protocol.whitespace import is_blank

MARK_OPEN = '<mark class="cc"'
"""How every marked character starts in the HTML (the count of a warning banner)."""


@dataclass(frozen=True, slots=True)
class Definition:
    """A markdown link reference definition (``[label]: url "title"``) as written in the
    draft: ``label`` and ``url`` exactly as written (backslash escapes and entities
    resolved, no percent-encoding), ``title`` "" when it has none."""

    label: str
    url: str
    title: str


@dataclass(frozen=True, slots=True)
class DraftView:
    """A draft as the item page shows it: ``html`` (safe to insert), ``marked`` (how many
    characters are shown as their code point, in ``html`` and in ``references``: a warning
    banner when > 0), ``format`` (how it was shown: ``text``, ``markdown``, ``json`` or
    ``empty``) and ``references`` (``reference_definitions``: a notice listing them)."""

    html: Markup
    marked: int
    format: str
    references: tuple[Definition, ...] = ()


def marked_text(text: str, *, keep: str = "\n\t") -> Markup:
    """``text`` escaped for HTML with every hidden character (but those in ``keep``) replaced
    by ``<mark class="cc" title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</mark>``."""
    out: list[str] = []
    for char in text:
        if char not in keep and is_hidden(char):
            out.append(f'{MARK_OPEN} title="{escape(describe(char))}">{code_point(char)}</mark>')
        else:
            out.append(str(escape(char)))
    return Markup("".join(out))


def _count(html: str) -> int:
    return html.count(MARK_OPEN)


def _blank(body: str) -> Markup:
    """An empty or whitespace-only draft in words: which whitespace, how many of each."""
    if not body:
        return Markup('<p class="draft-empty">The draft is empty.</p>')
    counts = Counter(body)  # in the order first seen
    names = {"\n": "newline", "\t": "tab", " ": "space"}
    parts = ", ".join(f"{n} × {names.get(c) or describe(c)}" for c, n in counts.items())
    return Markup('<p class="draft-empty">The draft holds only whitespace: {}.</p>').format(parts)


Tokens = Sequence[Token]


class _Renderer(RendererHTML):
    """The draft's markdown rules (markdown-it calls each method by its token type): text
    and code escaped and marked, a link as its text then its URL and title, an image as its
    description, URL and title (nothing to click, nothing loaded)."""

    def text(self, tokens: Tokens, idx: int, options: OptionsDict, env: EnvType) -> str:
        return str(marked_text(tokens[idx].content))

    def code_inline(self, tokens: Tokens, idx: int, options: OptionsDict, env: EnvType) -> str:
        return f"<code>{marked_text(tokens[idx].content)}</code>"

    def code_block(self, tokens: Tokens, idx: int, options: OptionsDict, env: EnvType) -> str:
        # a fence's info string is not used: no class attribute comes from the draft
        return f"<pre><code>{marked_text(tokens[idx].content)}</code></pre>\n"

    fence = code_block

    def link_open(self, tokens: Tokens, idx: int, options: OptionsDict, env: EnvType) -> str:
        token = tokens[idx]
        env.setdefault("links", []).append((str(token.attrGet("href") or ""), _title(token)))
        return '<span class="md-link">'

    def link_close(self, tokens: Tokens, idx: int, options: OptionsDict, env: EnvType) -> str:
        href, title = env["links"].pop()
        return f'</span> <span class="md-url">({marked_text(href)})</span>{title}'

    def image(self, tokens: Tokens, idx: int, options: OptionsDict, env: EnvType) -> str:
        token = tokens[idx]
        alt = self.renderInlineAsText(token.children or [], options, env)
        src = str(token.attrGet("src") or "")
        return (
            f'<span class="md-image">[image: {marked_text(alt)}]</span> '
            f'<span class="md-url">({marked_text(src)})</span>{_title(token)}'
        )


def _title(token: Token) -> str:
    """A link's or image's title as shown after its URL (escaped, marked), "" when none: a
    rendering shows it only as a tooltip, so the page writes it out."""
    title = str(token.attrGet("title") or "")
    return f' <span class="md-title">(title &#34;{marked_text(title)}&#34;)</span>' if title else ""


_MD = MarkdownIt(
    "commonmark", {"html": False, "linkify": False, "typographer": False}, renderer_cls=_Renderer
)


class _AsWritten(MarkdownIt):
    """A parser that keeps each link reference definition as a ``definition`` token with
    its URL as written (``normalizeLink`` does not percent-encode): never used to render."""

    def normalizeLink(self, url: str) -> str:  # noqa: N802 - markdown-it's name
        return url


_DEFINITIONS = _AsWritten("commonmark", {"html": False, "inline_definitions": True})


def _is_markdown(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() == "text/markdown"


def reference_definitions(body: str, content_type: str) -> tuple[Definition, ...]:
    """Every link reference definition of a ``text/markdown`` ``body`` (at any depth: in
    quotes and list items too), in the order written, a repeated label each time (the
    rendering uses the first and shows none of them); () for another content type or none.
    The approver sees every URL the draft holds."""
    if not _is_markdown(content_type):
        return ()
    return tuple(
        Definition(str(t.meta["label"]), str(t.meta["url"]), str(t.meta["title"] or ""))
        for t in _DEFINITIONS.parse(body, {})
        if t.type == "definition"
    )


def definitions_marked(found: Sequence[Definition]) -> int:
    """How many characters of the reference definitions ``found`` a page marks."""
    return sum(hidden_count(d.label + d.url + d.title, keep="") for d in found)


def draft_view(body: str, content_type: str) -> DraftView:
    """Show ``body`` by its ``content_type``: ``text/markdown`` rendered safely,
    ``application/json`` pretty-printed when that hides nothing (``pretty_json``), anything
    else (``text/plain`` and unknown types) as preformatted text; an empty or whitespace-only
    draft said in words. A markdown draft's view carries its ``reference_definitions``.
    Parameters after ``;`` in the type are ignored. The whole body is shown, however long."""
    if is_blank(body):
        return DraftView(_blank(body), 0, "empty")
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "text/markdown":
        html = Markup('<div class="draft-markdown">{}</div>').format(
            Markup(_MD.render(body, {"links": []}))
        )
        found = reference_definitions(body, content_type)
        return DraftView(html, _count(html) + definitions_marked(found), "markdown", found)
    pretty = pretty_json(body) if kind == "application/json" else None
    html = Markup('<pre class="draft-text">{}</pre>').format(
        marked_text(body if pretty is None else pretty)
    )
    return DraftView(html, _count(html), "text" if pretty is None else "json")


def hidden_count(text: str, *, keep: str = "\n\t") -> int:
    """How many characters of ``text`` (but those in ``keep``) a page marks as their code
    point (``marked_text``): controls, direction overrides, zero-width, unassigned."""
    return sum(1 for char in text if char not in keep and is_hidden(char))


def markdown_hides(body: str) -> bool:
    """True when rendering ``body`` as markdown leaves part of its text out of the draft's
    HTML: a link reference definition (listed apart), or a link's or image's title."""
    env: dict[str, Any] = {"links": []}
    stack = _MD.parse(body, env)
    if env.get("references"):
        return True
    while stack:
        token = stack.pop()
        if token.attrGet("title"):
            return True
        stack.extend(token.children or [])
    return False


def first_line(body: str, limit: int = 80) -> str:
    """The first line of ``body`` that holds a letter or digit (else the first non-blank
    one: a JSON draft's ``{`` tells nothing), stripped, cut to ``limit`` characters (the last
    one then "…"); "" for a blank body. The waiting list's line per item."""
    lines = [ln.strip() for ln in body.splitlines() if not is_blank(ln)]
    line = next((ln for ln in lines if any(c.isalnum() for c in ln)), lines[0] if lines else "")
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


def diff_html(old: str, new: str) -> Markup:
    """A line-level diff of two drafts (an adjust's revision before and after): a ``<pre
    class="diff">`` whose lines are ``<del>`` (only in ``old``, prefixed ``-``), ``<ins>``
    (only in ``new``, ``+``) or unchanged (two spaces), escaped and marked like a draft."""
    a, b = old.split("\n"), new.split("\n")
    lines: list[str] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            lines.extend(f'<span class="same">  {marked_text(line)}</span>' for line in a[i1:i2])
            continue
        lines.extend(f"<del>- {marked_text(line)}</del>" for line in a[i1:i2])
        lines.extend(f"<ins>+ {marked_text(line)}</ins>" for line in b[j1:j2])
    # each line is a block of its own: no newline between them (it would show as a blank line)
    return Markup('<pre class="diff">{}</pre>').format(Markup("".join(lines)))
