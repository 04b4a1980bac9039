"""The inbox end to end in a real browser, its pages live: bulk
approve of 5 items with ONE passkey use; a question answered through its form (``hitl-gate
ask --wait`` gets the answer); an item expiring and one cancelled while its page is open
(the page says so without a reload and its buttons are disabled).

Real processes (gate, inbox, pipelines) and Debian's headless Chromium; see tests/inbox_e2e.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.inbox_e2e import (
    LIVE_S,
    Approver,
    Browser,
    Stack,
    announced,
    browser_fixtures,
    enrolled,
    has_post_route,
    in_view,
    needs,
    open_item,
    pending,
    screenshot,
    signin_ready,
)
from tests.support import decision_body, post_decision

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
BUTTONS_DISABLED = """() => {
  const buttons = [...document.querySelectorAll('form[data-sign] button')];
  return buttons.length === 0 || buttons.every((b) => b.disabled);
}"""


stack, browser, shots = browser_fixtures()


def test_inbox_e2e_bulk_approves_five_items_with_one_passkey_use(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    waiting = [pending(stack, "one", f"refund {n} of 5") for n in range(1, 6)]
    try:
        bulk_approve(alice, stack, shots, [approval_id for _, approval_id in waiting])
        for n, (pipeline, _) in enumerate(waiting, 1):
            code, out, err = pipeline.finish()
            assert (code, out.decode()) == (0, f"refund {n} of 5"), err
    finally:
        for pipeline, _ in waiting:
            if pipeline.proc.poll() is None:
                pipeline.stop()
    credentials = stack.gate_rows(
        "SELECT credential_id FROM decisions WHERE approval_id IN (?, ?, ?, ?, ?)",
        *[approval_id for _, approval_id in waiting],
    )
    assert len(credentials) == 5 and len(set(credentials)) == 1, credentials
    alice.assert_clean("bulk")


def test_inbox_e2e_question_answered_through_its_form(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    needs("question answers (POST /items/<id>/answer)", has_post_route(stack, "/items/x/answer"))
    alice = enrolled(stack, browser, "alice", 101)
    asking = stack.ask("--text", "Which supplier?", "--choice", "Acme", "--choice", "Globex")
    question_id = asking.wait_for_line(r"asked question (\S+)").group(1)
    stack.inbox.wait_item(question_id)
    open_item(alice, stack, question_id)
    page = alice.page
    assert "Which supplier?" in page.inner_text(".question-text")
    screenshot(page, shots, "question")
    page.check("input[name=value][value=Globex]")
    page.click("form.answer button[type=submit]")
    page.wait_for_url(re.compile(r"/decisions/\d+$"), timeout=30_000)
    code, out, err = asking.finish()
    assert (code, out.decode()) == (0, "Globex\n"), err
    [(state,)] = stack.gate_rows("SELECT state FROM questions WHERE question_id = ?", question_id)
    assert state == "resolved"
    alice.assert_clean("question")


def bulk_approve(who: Approver, stack: Stack, shots: Path, approval_ids: list[str]) -> None:
    """Tick each item on the waiting page, press "Approve selected" (one passkey use) and
    check the results page: every item recorded, none refused."""
    page = who.page
    page.goto(stack.inbox.origin + "/")
    needs("bulk approve (form[data-sign=bulk])", page.query_selector("form[data-sign=bulk]"))
    for approval_id in approval_ids:
        page.check(f'input[name="item:{approval_id}"]')
    screenshot(page, shots, "bulk")
    [before] = who.sign_counts()
    page.click("form[data-sign=bulk] button[type=submit]")
    page.wait_for_url(re.compile(r"/bulk/[^/]+$"), timeout=30_000)
    screenshot(page, shots, "bulk-results")
    [after] = who.sign_counts()
    assert after == before + 1  # one tap for the five
    said = page.inner_text("main")
    assert said.count("recorded") == len(approval_ids) and "refused" not in said, said


def closed_while_open(who: Approver, word: str) -> None:
    """The open item page says ``word`` (learnt from /live, no reload) at the top of the page
    (role=status, before the draft), hides its forms with their buttons disabled, and its
    time left says ``word`` too (the state was at the bottom, under
    disabled forms, while "Time left" still read "less than a minute")."""
    who.page.wait_for_function(
        "(word) => (document.getElementById('item-state') || {textContent: ''})"
        ".textContent.includes(word)",
        arg=word,
        timeout=LIVE_S,
    )
    assert who.page.evaluate(BUTTONS_DISABLED)
    top = who.page.evaluate(
        """() => {
          const state = document.getElementById('item-state');
          const draft = document.querySelector('.draft');
          const forms = [...document.querySelectorAll('article form')];
          return {role: state.getAttribute('role'), visible: !state.hidden,
                  first: !!(state.compareDocumentPosition(draft) & 4),
                  formsHidden: forms.every((f) => f.offsetParent === null),
                  left: document.querySelector('.facts .left dd').textContent};
        }"""
    )
    assert top == {
        "role": "status",
        "visible": True,
        "first": True,
        "formsHidden": True,
        "left": word,
    }, top


def test_inbox_e2e_item_expiring_and_one_cancelled_while_the_page_is_open(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)

    pipeline, approval_id = pending(stack, "brief", "this one expires in 8 s")
    open_item(alice, stack, approval_id)
    navigations: list[str] = []
    alice.page.on("framenavigated", lambda frame: navigations.append(frame.url))
    closed_while_open(alice, "expired")
    assert navigations == []  # no reload
    screenshot(alice.page, shots, "item-expired")
    code, _, err = pipeline.finish()
    assert code == 4, err

    pipeline, approval_id = pending(stack, "one", "this one gets cancelled")
    open_item(alice, stack, approval_id)
    navigations.clear()
    stack.cancel(approval_id)
    closed_while_open(alice, "cancelled")
    assert navigations == []
    code, _, err = pipeline.finish()
    assert code == 5, err
    alice.assert_clean("expiry and cancel")


def test_inbox_e2e_open_page_ignores_a_reminder_but_says_an_adjust_changed_it(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    pipeline, approval_id = pending(stack, "nag", "reminded, never changed")
    open_item(alice, stack, approval_id)
    changed = "This item changed"

    def reminder_count(row: object) -> int:
        return int(json.loads(row["dispatch"]).get("reminder", 0))  # type: ignore[index]

    kept = stack.inbox.wait_item(approval_id, lambda r: reminder_count(r) >= 1)
    # the page's next poll comes after the reminder was kept: it must not say "changed"
    with alice.page.expect_response(lambda r: "/live?" in r.url, timeout=LIVE_S):
        pass
    with alice.page.expect_response(lambda r: "/live?" in r.url, timeout=LIVE_S):
        pass
    assert changed not in alice.page.inner_text("body")
    assert not alice.page.evaluate(BUTTONS_DISABLED)

    adjust = decision_body(
        json.loads(kept["dispatch"]), "bob@example.com", "adjust", adjust_text="adjusted"
    )
    status, answer, _ = post_decision(stack.gate.callback_url, adjust)
    assert status == 200, answer
    alice.page.wait_for_function(
        "(word) => document.body.innerText.includes(word)", arg=changed, timeout=LIVE_S
    )
    assert alice.page.evaluate(BUTTONS_DISABLED)  # a changed item's forms are off at once
    said = alice.page.get_by_text(changed)
    assert in_view(alice, said) and announced(alice, said)
    screenshot(alice.page, shots, "item-changed", full_page=False)
    pipeline.stop()
    alice.assert_clean("reminder and adjust")
