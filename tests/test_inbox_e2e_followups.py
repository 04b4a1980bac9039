"""Reminders and escalations as an approver sees them in a real browser
(gate/inbox/followups.py): a reminded, escalated item's waiting row says "Reminder N" and
"Escalated: level 1" to who already had it, and its page says "Escalated to you" to the
approver the escalation added, near the top of the page at 1280 and 390 px.

Real processes (gate, inbox, a pipeline) and Debian's headless Chromium; see
tests/inbox_e2e.py. Screenshots: ``followups-row-*.png`` and ``followups-item-*.png``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import inbox_e2e as e2e
from tests.support import wait_until
from tests.test_inbox_followups import reminded_after_escalation

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

stack, browser, shots = e2e.browser_fixtures()


def shown_at_each_width(who: e2e.Approver, locator: str, shots: Path, name: str) -> list[str]:
    """The texts of ``locator`` (follow-up tags), asserted inside the viewport at 1280 and
    390 px with no sideways scroll; screenshots ``<name>-<width>.png``."""
    page = who.page
    for width in e2e.WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        tags = page.locator(locator)
        assert tags.count() >= 1
        for n in range(tags.count()):
            assert e2e.in_view(who, tags.nth(n)), (width, tags.nth(n).inner_text())
        assert e2e.no_horizontal_scroll(page), width
    e2e.screenshot(page, shots, name, full_page=False)
    page.set_viewport_size({"width": 1280, "height": 900})
    return [str(t) for t in page.locator(locator).all_inner_texts()]


def test_inbox_e2e_followups_a_reminded_row_and_an_escalated_item_page(
    stack: e2e.Stack, browser: e2e.Browser, shots: Path
) -> None:
    e2e.signin_ready(stack)
    alice = e2e.enrolled(stack, browser, "alice", 101)
    carol = e2e.enrolled(stack, browser, "carol", 103)
    _, approval_id = e2e.pending(stack, "esc", "Pay 40 EUR to Initech for the March invoice")
    gate_db = stack.world.folder / "gate" / "gate.db"
    wait_until(
        lambda: reminded_after_escalation(gate_db, stack.inbox.db, approval_id),
        what="a reminder after the escalation at the inbox",
    )

    alice.page.goto(stack.inbox.origin + "/")
    row = f'li[data-approval-id="{approval_id}"] .tag.followup'
    said = shown_at_each_width(alice, row, shots, "followups-row")
    assert len(said) == 2 and re.fullmatch(r"Reminder \d+", said[0]), said
    assert said[1] == "Escalated: level 1", said

    e2e.open_item(carol, stack, approval_id)
    said = shown_at_each_width(carol, ".followups .tag.followup", shots, "followups-item")
    assert said[1:] == ["Escalated to you"] and said[0].startswith("Reminder "), said
    alice.assert_clean("followups row")
    carol.assert_clean("followups item")
