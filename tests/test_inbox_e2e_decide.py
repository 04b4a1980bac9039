"""The inbox end to end in a real browser: an approver
enrols a passkey at the gate's invite page, signs in at the inbox with it, finds the item
a pipeline waits on and approves, skips with a reason or adjusts it; the pipeline
(``hitl-gate request --wait``) gets the outcome. Quorum 2 with two approvers in two browser
contexts (two authenticators): the second sees the progress, the resolution removes the
item for both without a reload.

Real processes (gate, inbox, pipeline) and Debian's headless Chromium; see tests/inbox_e2e.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.inbox_e2e import (
    LIVE_S,
    Browser,
    Stack,
    accessible,
    announced,
    answer_lost,
    browser_fixtures,
    decide,
    enrolled,
    in_view,
    open_item,
    pending,
    said_lost,
    screenshot,
    signin_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


stack, browser, shots = browser_fixtures()


def test_inbox_e2e_enrol_sign_in_approve_skip_and_adjust(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    assert alice.page.url.rstrip("/") == stack.inbox.origin
    screenshot(alice.page, shots, "waiting-empty")

    # approve: the pipeline exits 0 with the body
    draft = "Dear Anna,\ninvoice 2026-114 over 1,240.00 EUR is due.\n"
    pipeline, approval_id = pending(stack, "one", draft)
    alice.page.reload()
    row = alice.page.wait_for_selector(f'li[data-approval-id="{approval_id}"]')
    assert row is not None and "Approvals: 0 of 1" in row.inner_text()
    screenshot(alice.page, shots, "waiting")
    open_item(alice, stack, approval_id)
    assert alice.page.text_content(".draft pre") == draft
    screenshot(alice.page, shots, "item")
    said = decide(alice, "approve")
    screenshot(alice.page, shots, "decision")
    code, out, err = pipeline.finish()
    assert (code, out.decode()) == (0, draft), err
    assert "recorded and the approval is resolved" in said, said
    [(identity, channel, credential)] = stack.gate_rows(
        "SELECT identity, channel, credential_id FROM decisions WHERE approval_id = ?",
        approval_id,
    )
    assert (identity, channel) == ("alice@example.com", "inbox") and credential

    # skip with a reason (required on this step): exit 3, the reason on stderr
    pipeline, approval_id = pending(stack, "why", "Refund 40 EUR to order 4711.")
    open_item(alice, stack, approval_id)
    alice.page.fill("#reason", "the order was never paid")
    decide(alice, "skip")
    code, out, err = pipeline.finish()
    assert code == 3 and "the order was never paid" in err, (code, out, err)

    # adjust: the pipeline gets the edited body
    pipeline, approval_id = pending(stack, "one", "Hallo Anna")
    open_item(alice, stack, approval_id)
    alice.page.fill("#adjust-text", "Hello Anna, kind regards")
    decide(alice, "adjust")
    code, out, err = pipeline.finish()
    assert (code, out.decode()) == (0, "Hello Anna, kind regards"), err
    alice.page.goto(stack.inbox.origin + "/recent")
    screenshot(alice.page, shots, "recent")
    alice.assert_clean("approve, skip, adjust")


def test_inbox_e2e_quorum_two_in_two_browser_contexts_live(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    bob = enrolled(stack, browser, "bob", 102)
    pipeline, approval_id = pending(stack, "two", "Pay 9,800.00 EUR to ACME GmbH")
    row = f'li[data-approval-id="{approval_id}"]'

    # both see it waiting; each keeps a waiting page open in a second tab
    alice_list = alice.page.context.new_page()
    bob_list = bob.page.context.new_page()
    for tab in (alice_list, bob_list):
        tab.goto(stack.inbox.origin + "/")
        tab.wait_for_selector(row)

    # bob has the item open before alice decides: his page follows the progress live
    open_item(bob, stack, approval_id)
    facts = "() => document.querySelector('dl.facts').innerText"
    assert "0 of 2" in bob.page.evaluate(facts)
    open_item(alice, stack, approval_id)
    said = decide(alice, "approve")
    assert "recorded" in said.lower() or "1 of 2" in said, said

    # the second approver sees the progress and who approved without a reload (/live?item=)
    bob.page.wait_for_function(
        "() => /1 of 2/.test(document.querySelector('dl.facts').innerText)"
        " && document.querySelector('dl.facts').innerText.includes('alice@example.com')",
        timeout=LIVE_S,
    )
    assert "Approvals: 1 of 2." in bob.page.inner_text("#sign-status")  # said, politely
    screenshot(bob.page, shots, "item-quorum")
    decide(bob, "approve")
    code, out, err = pipeline.finish()
    assert (code, out.decode()) == (0, "Pay 9,800.00 EUR to ACME GmbH"), err
    assert len(stack.gate_rows("SELECT 1 FROM decisions WHERE approval_id = ?", approval_id)) == 2

    # resolution removes the item from both open waiting pages without a reload
    # (the row was only greyed out and stayed a link)
    for tab in (alice_list, bob_list):
        tab.wait_for_selector(f"{row}.gone", state="attached", timeout=LIVE_S)
        assert tab.query_selector(f"{row} a") is None and tab.query_selector(f"{row} input") is None
        assert "resolved" in tab.inner_text(row), tab.inner_text(row)
        assert "resolved" in tab.inner_text("#live"), tab.inner_text("#live")
    screenshot(alice_list, shots, "waiting-resolved")
    bob.page.goto(stack.inbox.origin + "/")
    assert bob.page.query_selector(row) is None
    alice.assert_clean("quorum alice")
    bob.assert_clean("quorum bob")


def test_inbox_e2e_a_result_is_said_where_the_approver_looks(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    long_draft = "".join(f"Line {n}: the terms of the contract, at length.\n" for n in range(150))
    pipeline, approval_id = pending(stack, "one", long_draft)
    open_item(alice, stack, approval_id)
    stack.gate.stop()  # the gate goes down while the page is open

    alice.page.locator("form.verb-approve button[type=submit]").click()

    said = alice.page.get_by_text("Not sent: The gate could not be reached")
    said.wait_for(timeout=30_000)
    assert in_view(alice, said), said.bounding_box()
    assert announced(alice, said)
    alice.page.set_viewport_size({"width": 390, "height": 900})
    assert in_view(alice, said), said.bounding_box()
    screenshot(alice.page, shots, "item-gate-down", full_page=False)
    alice.assert_clean("gate down")
    pipeline.proc.terminate()
    pipeline.finish()


def test_inbox_e2e_a_decision_whose_answer_was_lost_stays_and_says_so(
    stack: Stack, browser: Browser, shots: Path
) -> None:
    """A balancer's HTML 502 to the decide: the page stays (never a GET of the decide
    URL, "405"), says the decision may or may not be recorded and links Recent."""
    signin_ready(stack)
    alice = enrolled(stack, browser, "alice", 101)
    pipeline, approval_id = pending(stack, "one", "Pay 12 EUR to ACME")
    open_item(alice, stack, approval_id)
    answer_lost(alice, "**/items/*/decide")
    url = alice.page.url

    alice.page.locator("form.verb-approve button[type=submit]").click()

    said = said_lost(alice, url)
    assert "405" not in alice.page.inner_text("main")
    screenshot(alice.page, shots, "item-answer-lost", full_page=False)
    assert accessible(alice.page, shots, "item-answer-lost-axe") == []  # its link readable
    said.get_by_role("link", name="Recent decisions").click()
    alice.page.wait_for_url("**/recent")
    alice.assert_clean("answer lost")
    pipeline.proc.terminate()
    pipeline.finish()
