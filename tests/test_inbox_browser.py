"""The inbox's pages in a real browser: Debian's headless Chromium, driven by
Playwright for Python, opens the real templates and static assets served by a tiny aiohttp
app built from ``gate.inbox.pages`` (tests/inbox_pages_app.py) with hostile item data, at
1280 and 390 px wide. No script of a draft runs, no CSP violation is reported, every marked
character is visible, the whole 200 KiB draft is there, a phone needs no horizontal scroll,
every control has a label, Tab reaches the skip link, then the buttons in reading order.

Skipped when /usr/bin/chromium or playwright is absent, failed instead under HITL_CI=1.
Screenshots go to ``$HITL_ARTIFACTS/inbox/`` (or the test's tmp dir).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_pages_app import BIG_BODY, END, HIDDEN_IN_BIG, REFUSAL, serve_in_thread
from tests.test_passkeys_browser import ARGS, CHROMIUM, _playwright

WIDTHS = (1280, 390)
SHOTS = {
    "waiting": "/",
    "item": "/items/hostile",
    "item-diff": "/items/diff",
    "question": "/items/question",
    "recent": "/recent",
    "signin": "/signin",
}
LABELLED = """() => [...document.querySelectorAll('input, select, textarea')]
  .filter((el) => el.type !== 'hidden')
  .filter((el) => !el.labels || el.labels.length === 0
    || [...el.labels].every((l) => l.textContent.trim() === ''))
  .map((el) => el.outerHTML.slice(0, 120))"""
VISIBLE_MARKS = """(sel) => [...document.querySelectorAll(sel)].filter((el) => {
  const box = el.getBoundingClientRect(); const style = getComputedStyle(el);
  return box.width > 0 && box.height > 0 && style.visibility === 'visible'
    && style.display !== 'none' && el.textContent.startsWith('U+');
}).length"""
FOCUSED = """() => { const el = document.activeElement;
  return el ? (el.tagName + ':' + (el.textContent || '').trim().slice(0, 40)) : ''; }"""


LIMITS = {
    "amount": "A number from 0 to 100.",
    "count": "A whole number from 1 to 9.",
    "email": "At most 200 characters. An e-mail address, such as name@example.com.",
    "note": "2 to 500 characters.",
    "tags": "Choose at most 2.",
}


def _limits_beside_each_field(page: Any, width: int) -> None:
    """Before anything was sent, each limited field of the question's form says its limits
    in words, visible, between its label and its control, within the page's width."""
    for name, words in LIMITS.items():
        limits = page.locator(f"#f-{name}-l")
        assert limits.is_visible(), name
        assert " ".join(limits.inner_text().split()) == words, name
        box = limits.bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width, name
        control = page.locator(f"[name={name}]").first.bounding_box()
        assert control is not None and box["y"] + box["height"] <= control["y"] + 1, name
        assert control["y"] - (box["y"] + box["height"]) < 40, name  # beside it, not far off
        described = page.locator(f"[name={name}]").first.get_attribute("aria-describedby")
        if name != "tags":  # the group's fieldset carries it
            assert f"f-{name}-l" in (described or "").split(), name


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    base = Path(os.environ.get("HITL_ARTIFACTS") or tmp_path / "artifacts")
    directory = base / "inbox"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


class Watched:
    """A page whose console messages, dialogs and page errors are recorded."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.console: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, url: str) -> None:
        answer = self.page.goto(url, wait_until="load")
        assert answer is not None and answer.status == 200, url
        self.page.wait_for_function("document.readyState === 'complete'")

    def assert_clean(self, where: str) -> None:
        assert self.page.evaluate("typeof window.__pwned") == "undefined", where
        assert self.dialogs == [], (where, self.dialogs)
        assert self.errors == [], (where, self.errors)
        violations = [m for m in self.console if "Content Security Policy" in m or "Refused" in m]
        assert violations == [], (where, violations)


@pytest.fixture
def site() -> Iterator[str]:
    with serve_in_thread() as url:
        yield url


@pytest.fixture
def chromium() -> Iterator[Any]:
    sync_api = _playwright()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


def _page(chromium: Any, width: int) -> Watched:
    context = chromium.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1)
    return Watched(context.new_page())


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("width", WIDTHS)
def test_inbox_browser_pages_are_inert_readable_and_labelled(
    chromium: Any, site: str, artifacts: Path, width: int
) -> None:
    watched = _page(chromium, width)
    page = watched.page
    for name, path in SHOTS.items():
        watched.open(site + path)
        watched.assert_clean(f"{name} at {width}px")
        overflow = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert overflow[0] <= overflow[1], (name, width, overflow)
        assert page.evaluate(LABELLED) == [], (name, width)
        if name == "question":
            _limits_beside_each_field(page, width)
        full = name != "item"  # the 200 KiB draft is taller than a screenshot can be
        page.screenshot(path=str(artifacts / f"{name}-{width}.png"), full_page=full)
    page.context.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_inbox_browser_item_shows_the_whole_draft_with_every_mark_visible(
    chromium: Any, site: str
) -> None:
    watched = _page(chromium, 390)
    page = watched.page
    watched.open(site + "/items/hostile")
    shown = BIG_BODY
    for char in "\u202e\u202c\u200b\r\x1b":
        shown = shown.replace(char, f"U+{ord(char):04X}")
    assert page.text_content(".draft pre") == shown
    assert page.evaluate(VISIBLE_MARKS, ".draft mark.cc") == HIDDEN_IN_BIG
    assert page.evaluate(VISIBLE_MARKS, "h1 mark.cc") == 1  # the pipeline's RLO
    clipped = "(el) => [el.scrollHeight, el.clientHeight, el.scrollWidth, el.clientWidth]"
    height, shown_height, wide, shown_wide = page.locator(".draft").evaluate(clipped)
    assert height <= shown_height + 1 and wide <= shown_wide + 1  # nothing cut off or hidden
    assert page.locator(".draft pre").evaluate("(el, end) => el.textContent.endsWith(end)", END)
    watched.open(site + "/items/diff")
    assert page.evaluate(VISIBLE_MARKS, "pre.diff mark.cc") == 1
    assert page.evaluate(VISIBLE_MARKS, ".draft mark.cc") == 1
    assert page.locator("pre.diff del").count() == 2 and page.locator("pre.diff ins").count() == 2
    assert page.evaluate("document.querySelectorAll('a[href^=\"javascript\"], img').length") == 0
    watched.assert_clean("item pages")
    page.context.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_inbox_browser_tab_reaches_skip_link_then_buttons_in_reading_order(
    chromium: Any, site: str
) -> None:
    watched = _page(chromium, 1280)
    page = watched.page
    watched.open(site + "/items/diff")
    seen: list[str] = []
    for _ in range(40):
        page.keyboard.press("Tab")
        seen.append(page.evaluate(FOCUSED))
        if seen[-1].startswith("BUTTON:Send adjusted draft"):
            break
    assert seen[0] == "A:Skip to content"
    order = [s for s in seen if s.startswith(("BUTTON:", "TEXTAREA:"))]
    assert [s.split(":")[0] + ":" + s.split(":", 1)[1][:20] for s in order] == [
        "BUTTON:Sign out",
        "BUTTON:Approve",
        "TEXTAREA:",
        "BUTTON:Skip",
        "TEXTAREA:# Refund for order 4",
        "BUTTON:Send adjusted draft",
    ]
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"  # focus is visible
    watched.assert_clean("tab order")
    page.context.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_inbox_browser_script_loads_under_the_csp_and_polls_live(chromium: Any, site: str) -> None:
    watched = _page(chromium, 1280)
    page = watched.page
    with page.expect_request(lambda r: "/live?since=7" in r.url, timeout=15_000):
        watched.open(site + "/")
    watched.assert_clean("live polling")
    page.context.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_inbox_browser_says_the_inbox_s_refusal_sentence(chromium: Any, site: str) -> None:
    """A refused challenge shows the inbox's ``message``, not its status
    code, as one sentence (no doubled full stop)."""
    watched = _page(chromium, 1280)
    page = watched.page
    watched.open(site + "/items/diff")
    page.click("form.verb-skip button[type=submit]")
    page.wait_for_function(
        "() => (document.getElementById('sign-status').textContent || '').startsWith('Not sent')",
        timeout=15_000,
    )
    assert page.text_content("#sign-status") == f"Not sent: {REFUSAL}"
    watched.assert_clean("refused challenge")
    page.context.close()


ONE_LINE = """(sel) => [...document.querySelectorAll(sel)].filter((el) => {
  const range = document.createRange(); range.selectNodeContents(el);
  return new Set([...range.getClientRects()].map((box) => Math.round(box.top))).size > 1;
}).map((el) => el.textContent.trim())"""  # the elements whose text takes more than one line
BROKEN_WORDS = """() => [...document.querySelectorAll('button, label, dt')].filter((el) =>
  [...el.childNodes].filter((n) => n.nodeType === 3).some((n) => {
    const text = n.textContent; let at = 0;
    return text.split(/(\\s+)/).some((word) => {
      const start = at; at += word.length;
      if (word.trim().length < 2) return false;
      const range = document.createRange(); range.setStart(n, start); range.setEnd(n, at);
      return new Set([...range.getClientRects()].map((b) => Math.round(b.top))).size > 1;
    });
  })).map((el) => el.textContent.trim())"""  # a word of a button, label or term on two lines


@pytest.mark.e2e
@pytest.mark.slow
def test_inbox_browser_words_of_terms_labels_and_buttons_never_break_inside(
    chromium: Any, site: str, artifacts: Path
) -> None:
    """At 390 px a long value beside its term ("Delegate", "Pipeline") wraps the value, not
    the term; buttons and labels break between words only."""
    watched = _page(chromium, 390)
    page = watched.page
    for path in ("/items/delegated", "/items/plain-a", "/?bulk=1"):
        watched.open(site + path)
        assert page.evaluate(ONE_LINE, "dl.facts dt") == [], path
        broken = page.evaluate(BROKEN_WORDS)
        assert broken == [], (path, broken)
        assert page.evaluate(
            "() => document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        ), path
    watched.open(site + "/items/delegated")
    page.screenshot(path=str(artifacts / "item-delegated-390.png"), full_page=True)
    page.set_viewport_size({"width": 1280, "height": 900})
    page.screenshot(path=str(artifacts / "item-delegated-1280.png"), full_page=True)
    watched.assert_clean("terms at 390 px")
    page.context.close()
