"""Bulk approve in a real browser: seeing is approving. The waiting list offers a checkbox
only for a draft its row shows whole; a 200-line draft, or one whose hidden character the
item page warns of (written as a JSON escape or a markdown entity), must be opened first.

Real processes (gate, inbox, pipelines) and Debian's headless Chromium; see tests/inbox_e2e.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_e2e import (
    WIDTHS,
    Browser,
    Stack,
    announced,
    answer_lost,
    browser_fixtures,
    enrolled,
    in_view,
    no_horizontal_scroll,
    pending,
    said_lost,
    screenshot,
    signin_ready,
)
from tests.support import CliProcess
from tests.test_inbox_bulk import LONG

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
BIDI_JSON = json.dumps({"pay_to": "ACME GmbH \u202eHBmG EMCA", "amount": 5})
BIDI_MARKDOWN = "Pay **ACME GmbH &#x202E;HBmG EMCA** 5 EUR."
SHORT = ("Refund 12 EUR to ACME Ltd\nfor order 4411.", "Refund 7 EUR to Globex for order 12.")

stack, browser, shots = browser_fixtures()


def row(page: Any, approval_id: str) -> Any:
    return page.locator(f'li[data-approval-id="{approval_id}"]')


def inside_viewport(page: Any, locator: Any) -> bool:
    """The element is shown, starts and ends within the viewport's width, and its text is
    not cut (no more content than its box shows)."""
    box = locator.bounding_box()
    width = page.viewport_size["width"]
    cut = locator.evaluate(
        "(e) => e.scrollWidth > e.clientWidth || e.scrollHeight > e.clientHeight"
    )
    return (
        bool(locator.is_visible() and box and box["x"] >= 0 and box["x"] + box["width"] <= width)
        and not cut
    )


def test_inbox_e2e_bulk_offers_only_drafts_its_rows_show_whole(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    waiting: dict[str, tuple[CliProcess, str]] = {
        "long": pending(stack, "one", LONG),
        "json": pending(stack, "one", BIDI_JSON, "--content-type", "application/json"),
        "markdown": pending(stack, "one", BIDI_MARKDOWN, "--content-type", "text/markdown"),
        "short-1": pending(stack, "one", SHORT[0]),
        "short-2": pending(stack, "one", SHORT[1]),
    }
    ids = {name: approval_id for name, (_, approval_id) in waiting.items()}
    page = alice.page
    try:
        page.goto(stack.inbox.origin + "/")
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            for name in ("long", "json", "markdown"):
                shown = row(page, ids[name])
                assert shown.locator("input[type=checkbox]").count() == 0, name
                review = shown.locator(".pick.review")
                assert inside_viewport(page, review), (name, width)
            long_said = row(page, ids["long"]).locator(".pick.review").inner_text()
            assert re.fullmatch(r"Open to review: 200 lines, \d+ KB", long_said), long_said
            for name in ("json", "markdown"):
                said = row(page, ids[name]).locator(".pick.review").inner_text()
                assert said == "Open to review: 1 hidden character", (name, said)
            for name, body in zip(("short-1", "short-2"), SHORT, strict=True):
                whole = row(page, ids[name]).locator(".whole-draft")
                assert whole.inner_text() == body
                assert inside_viewport(page, whole), (name, width)
                assert row(page, ids[name]).locator("input[type=checkbox]").is_visible()
            assert no_horizontal_scroll(page), width
        page.set_viewport_size({"width": 1280, "height": 900})
        screenshot(page, shots, "bulk-seen")

        for name in ("short-1", "short-2"):
            page.check(f'input[name="item:{ids[name]}"]')
        page.click("form[data-sign=bulk] button[type=submit]")
        page.wait_for_url(re.compile(r"/bulk/[^/]+$"), timeout=30_000)
        said = page.inner_text("main")
        assert said.count("recorded") == 2 and "refused" not in said, said
        for name, body in zip(("short-1", "short-2"), SHORT, strict=True):
            code, out, err = waiting[name][0].finish()
            assert (code, out.decode()) == (0, body), err
    finally:
        for pipeline, _ in waiting.values():
            if pipeline.proc.poll() is None:
                pipeline.stop()
    decided = {a for (a,) in stack.gate_rows("SELECT approval_id FROM decisions")}
    assert decided == {ids["short-1"], ids["short-2"]}
    alice.assert_clean("bulk-seen")


def overlaps(a: Any, b: Any) -> bool:
    """True when two bounding boxes share any area."""
    return bool(
        a["x"] < b["x"] + b["width"]
        and b["x"] < a["x"] + a["width"]
        and a["y"] < b["y"] + b["height"]
        and b["y"] < a["y"] + a["height"]
    )


def test_inbox_e2e_bulk_result_sits_beside_its_button_and_goes_once_acted_on(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    """What the bulk button answered never covers the button, even with the button at the
    bottom of the window, and goes away once the selection changes."""
    signin_ready(stack)
    ids = [pending(stack, "one", body)[1] for body in SHORT]
    for width in WIDTHS:
        alice = enrolled(stack, browser, f"alice{width}", 101, width)
        page = alice.page
        page.goto(stack.inbox.origin + "/")
        page.check(f'input[name="item:{ids[0]}"]')  # one alone: the inbox refuses (2 to 50)
        button = page.locator("form[data-sign=bulk] button[type=submit]")
        box = button.bounding_box()
        assert box is not None
        # the window ends just below the button, as at the foot of a long list
        page.set_viewport_size({"width": width, "height": int(box["y"] + box["height"] + 8)})
        button.click()
        said = page.get_by_text("Not sent: ")
        said.wait_for()
        assert "2" in said.inner_text(), said.inner_text()
        assert in_view(alice, said) and announced(alice, said), width
        assert in_view(alice, button), width
        assert not overlaps(said.bounding_box(), button.bounding_box()), width
        screenshot(page, shots, f"bulk-refused-at-{width}")

        page.check(f'input[name="item:{ids[1]}"]')  # acted on: the result goes

        assert page.get_by_text("Not sent: ").count() == 0, width
        assert button.is_enabled()
        alice.assert_clean(f"bulk refusal at {width}")


def test_inbox_e2e_a_bulk_answer_lost_at_the_balancer_stays_and_says_so(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    """A balancer's HTML 502 to the bulk decide: the waiting page stays (never a GET of
    ``/bulk/decide``, "Not found"), says the approvals may or may not be recorded and links
    Recent."""
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    waiting = [pending(stack, "one", body) for body in SHORT]
    page = alice.page
    try:
        page.goto(stack.inbox.origin + "/")
        answer_lost(alice, "**/bulk/decide")
        for _, approval_id in waiting:
            page.check(f'input[name="item:{approval_id}"]')
        page.click("form[data-sign=bulk] button[type=submit]")

        said_lost(alice, stack.inbox.origin + "/")
        assert "Not found" not in page.inner_text("main")
        screenshot(page, shots, "bulk-answer-lost", full_page=False)
    finally:
        for pipeline, _ in waiting:
            pipeline.stop()
    alice.assert_clean("bulk answer lost")
