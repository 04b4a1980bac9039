"""The approver's day in the inbox with the keyboard only (Tab, Shift+Tab, Enter, Space and
typing; no mouse, no ``page.click``): enrol, sign in, open an item from the waiting list and
approve it, skip one with a reason, answer a question, select two items and bulk approve
them. Every element the focus lands on shows a focus style, lies inside the viewport and
follows (Shift+Tab: precedes) the one before in the document; an outline has at least 3:1
contrast with the background around it. And no single key approves:
every printable key pressed on an item page's body records nothing and changes nothing.

Real processes (gate, inbox, pipelines) and Debian's headless Chromium; see tests/inbox_e2e.py.
"""

from __future__ import annotations

import re
import string
from typing import Any

import pytest

from tests.inbox_e2e import (
    Approver,
    Browser,
    Stack,
    browser_fixtures,
    enrolled,
    in_view,
    pending,
    screenshot,
    signin_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
# the focused element: its place in the document, a name, whether a focus style shows and
# the contrast of its outline with the background around it (WCAG 1.4.11 asks 3:1; an
# "auto" outline is the browser's own two-tone ring)
FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return null;
  const s = getComputedStyle(el);
  const ring = (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0)
    || s.boxShadow !== 'none';
  const rgba = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = (c) => rgba(c).slice(0, 3).map((v) => v / 255)
    .map((v) => (v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4))
    .reduce((sum, v, i) => sum + v * [0.2126, 0.7152, 0.0722][i], 0);
  const fill = (node) => (node ? getComputedStyle(node).backgroundColor : 'rgb(255, 255, 255)');
  let around = el.parentElement;
  while (around && rgba(fill(around))[3] === 0) around = around.parentElement;
  const [a, b] = [lum(s.outlineColor), lum(fill(around))];
  const contrast = s.outlineStyle === 'auto' || s.outlineStyle === 'none' ? 21
    : (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  return {at: [...document.querySelectorAll('*')].indexOf(el), ring, contrast,
          name: el.tagName.toLowerCase() + ' ' + (el.innerText || el.id || el.value || '').trim()};
}"""
TAB_LIMIT = 60  # presses before a control counts as unreachable


stack, browser, shots = browser_fixtures()


def tab_to(who: Approver, selector: str, key: str = "Tab") -> list[str]:
    """Press ``key`` (Tab or Shift+Tab) until the focus is on ``selector``; every element the
    focus passes shows a focus style (outline or box-shadow), lies inside the viewport and
    comes after (Shift+Tab: before) the previous one in document order. Returns their names."""
    page, passed, before = who.page, [], None
    for _ in range(TAB_LIMIT):
        page.keyboard.press(key)
        now = page.evaluate(FOCUSED)
        assert now is not None, f"{key} left the page before reaching {selector}: {passed}"
        passed.append(now["name"])
        assert now["ring"], f"no visible focus style on {now['name']!r}"
        assert now["contrast"] >= 3, f"focus ring of {now['name']!r}: {now['contrast']:.1f}:1"
        assert in_view(who, page.locator(":focus")), f"{now['name']!r} is outside the viewport"
        if before is not None:
            forward = now["at"] > before["at"]
            assert forward == (key == "Tab"), f"{key} went back in the page: {passed}"
        before = now
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return passed
    raise AssertionError(f"{selector} not reached with {key}: {passed}")


def press_on(who: Approver, selector: str, key: str, then: str) -> None:
    """Tab to ``selector``, press ``key`` on it and wait for the URL ``then`` (a regex)."""
    tab_to(who, selector)
    who.page.keyboard.press(key)
    who.page.wait_for_url(re.compile(then), timeout=30_000)


def back_to_waiting(who: Approver) -> None:
    """From a decision's page, the "Back to what is waiting" link, by keyboard."""
    press_on(who, 'main a[href="/"]', "Enter", r"/$")


def test_inbox_e2e_an_approvers_day_by_keyboard_only(
    stack: Stack, browser: Browser, shots: Any
) -> None:
    signin_ready(stack)
    alice = browser.approver("alice")
    page = alice.page
    page.goto(stack.invite(101, "alice chromium"))
    tab_to(alice, "#create")
    page.keyboard.press("Enter")
    page.wait_for_selector("#status.ok", timeout=30_000)
    page.goto(stack.inbox.origin + "/")
    page.wait_for_url("**/signin**")
    press_on(alice, "form[data-sign=signin] button[type=submit]", "Enter", r"/$")

    approve, approve_id = pending(stack, "one", "Dear Anna,\ninvoice 2026-114 is due.\n")
    skip, skip_id = pending(stack, "why", "Refund 40 EUR to order 4711.")
    asking = stack.ask("--text", "Which supplier?", "--choice", "Acme", "--choice", "Globex")
    question_id = asking.wait_for_line(r"asked question (\S+)").group(1)
    stack.inbox.wait_item(question_id)
    bulk = [pending(stack, "one", f"refund {n} of 2") for n in (1, 2)]
    page.reload()

    press_on(alice, f'li[data-approval-id="{approve_id}"] a', "Enter", approve_id)
    screenshot(page, shots, "keyboard-item", full_page=False)
    press_on(alice, "form.verb-approve button[type=submit]", "Enter", r"/decisions/\d+$")
    assert page.inner_text("h1").startswith("Approved"), page.inner_text("main")
    back_to_waiting(alice)

    press_on(alice, f'li[data-approval-id="{skip_id}"] a', "Enter", skip_id)
    tab_to(alice, "form.verb-skip button[type=submit]")
    tab_to(alice, "#reason", key="Shift+Tab")
    page.keyboard.type("the order was never paid")
    press_on(alice, "form.verb-skip button[type=submit]", "Space", r"/decisions/\d+$")
    back_to_waiting(alice)

    press_on(alice, f'li[data-approval-id="{question_id}"] a', "Enter", question_id)
    tab_to(alice, "input[name=value][value=Acme]")
    page.keyboard.press("Space")
    press_on(alice, "form.answer button[type=submit]", "Enter", r"/decisions/\d+$")
    back_to_waiting(alice)

    for _, approval_id in bulk:
        tab_to(alice, f'input[name="item:{approval_id}"]')
        page.keyboard.press("Space")
    screenshot(page, shots, "keyboard-bulk", full_page=False)
    press_on(alice, "form[data-sign=bulk] button[type=submit]", "Enter", r"/bulk/[^/]+$")
    assert page.inner_text("main").count("recorded") == 2, page.inner_text("main")

    assert (approve.finish()[0], skip.finish()[0]) == (0, 3)
    assert skip_id and "the order was never paid" in skip.finish()[2]
    code, out, err = asking.finish()
    assert (code, out.decode()) == (0, "Acme\n"), err
    assert [pipeline.finish()[0] for pipeline, _ in bulk] == [0, 0]
    alice.assert_clean("keyboard day")


def test_inbox_e2e_no_single_key_decides_on_an_item_page(
    stack: Stack, browser: Browser, shots: Any
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    pipeline, approval_id = pending(stack, "one", "Pay 9,800.00 EUR to ACME GmbH")
    page = alice.page
    url = f"{stack.inbox.origin}/items/{approval_id}"
    page.goto(url)
    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method != "GET" else None)
    signs = alice.sign_counts()
    keys = [*string.ascii_lowercase, *string.ascii_uppercase, *string.digits, "Space", "Enter"]
    for key in keys:
        assert page.evaluate("document.activeElement === document.body"), key
        page.keyboard.press(key)
    page.evaluate("() => document.readyState")  # one round trip: request events came first
    assert posts == [] and alice.sign_counts() == signs, posts
    assert page.url == url and page.is_enabled("form.verb-approve button[type=submit]")
    assert stack.inbox.rows("SELECT * FROM decisions") == []
    assert stack.gate_rows("SELECT * FROM decisions WHERE approval_id = ?", approval_id) == []
    assert stack.gate_rows("SELECT state FROM approvals WHERE approval_id = ?", approval_id) == [
        ("pending",)
    ]
    assert pipeline.proc.poll() is None
    alice.assert_clean("single keys")
