"""Every page of the inbox, and the gate's enrol page, checked by axe-core in Chromium: no
``serious`` or ``critical`` violation at 1280 or 390 px (sign-in; waiting: empty, with rows,
"Waiting for others", "Open to review"; item, item with hidden characters, item after an
adjust; question with choices and with a form; decision; recent; bulk results; 404 and 405).
Every page is checked before the test fails, so one run names every violation.

Real processes (gate, inbox, pipelines) and Debian's headless Chromium; see tests/inbox_e2e.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.inbox_e2e import (
    Browser,
    Stack,
    accessible,
    browser_fixtures,
    decide,
    enrol,
    open_item,
    pending,
    sign_in,
    signin_ready,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
FORM = {
    "type": "object",
    "properties": {
        "po": {"type": "string", "title": "PO number", "maxLength": 20},
        "amount": {"type": "integer", "minimum": 1, "maximum": 100, "description": "in EUR"},
        "checks": {"type": "array", "items": {"type": "string", "enum": ["credit", "sanctions"]}},
        "urgent": {"type": "boolean", "title": "Urgent"},
        "desk": {"type": "string", "enum": ["north", "south"]},
    },
    "required": ["po", "amount"],
}


stack, browser, shots = browser_fixtures()


def test_inbox_e2e_every_page_has_no_serious_axe_violation(
    stack: Stack, browser: Browser, shots: Path, tmp_path: Path
) -> None:
    signin_ready(stack)
    alice = browser.approver("alice")
    page, origin = alice.page, stack.inbox.origin
    invite = stack.invite(101, "alice chromium")
    page.goto(invite)
    found = accessible(page, shots, "a11y-enrol")
    enrol(alice, invite)
    found += accessible(page, shots, "a11y-enrol-done")
    page.goto(origin + "/signin")
    found += accessible(page, shots, "a11y-signin")
    sign_in(alice, stack.inbox)
    found += accessible(page, shots, "a11y-waiting-empty")

    # rows of every kind: bulkable, open to review (long; hidden characters), waiting for others
    _, approve_id = pending(stack, "one", "Dear Anna,\ninvoice 2026-114 is due.\n")
    _, adjust_id = pending(stack, "one", "Hallo Anna")
    pending(stack, "one", "Refund 12 EUR to order 4711.")
    pending(stack, "one", "".join(f"Line {n} of the contract.\n" for n in range(40)))
    _, hidden_id = pending(stack, "one", "Pay 40 EUR to \u202eACME\u202c GmbH\u200b")
    _, others_id = pending(stack, "two", "Pay 9,800.00 EUR to ACME GmbH")
    open_item(alice, stack, others_id)
    found += accessible(page, shots, "a11y-item")
    decide(alice, "approve")
    found += accessible(page, shots, "a11y-decision")
    page.goto(origin + "/")
    page.wait_for_selector(".pick.review")
    page.wait_for_selector(f'.others li[data-approval-id="{others_id}"]')
    found += accessible(page, shots, "a11y-waiting")
    page.goto(f"{origin}/items/{others_id}")
    found += accessible(page, shots, "a11y-item-waiting-for-others")
    open_item(alice, stack, hidden_id)
    found += accessible(page, shots, "a11y-item-hidden")

    open_item(alice, stack, adjust_id)
    page.fill("#adjust-text", "Hello Anna, kind regards")
    decide(alice, "adjust")
    page.goto(f"{origin}/items/{adjust_id}")
    page.wait_for_selector("#final-h")
    found += accessible(page, shots, "a11y-item-adjusted")

    choice = stack.ask("--text", "Which supplier?", "--choice", "Acme", "--choice", "Globex")
    question_id = choice.wait_for_line(r"asked question (\S+)").group(1)
    stack.inbox.wait_item(question_id)
    open_item(alice, stack, question_id)
    found += accessible(page, shots, "a11y-question-choice")
    schema = tmp_path / "form.json"
    schema.write_text(json.dumps(FORM), encoding="utf-8")
    form = stack.ask("--text", "PO details?", "--schema", str(schema))
    form_id = form.wait_for_line(r"asked question (\S+)").group(1)
    stack.inbox.wait_item(form_id)
    open_item(alice, stack, form_id)
    found += accessible(page, shots, "a11y-question-form")

    page.goto(origin + "/recent")
    found += accessible(page, shots, "a11y-recent")
    page.goto(origin + "/")
    page.check(f'input[name="item:{approve_id}"]')
    page.check("form[data-sign=bulk] input[type=checkbox]:not(:checked)")
    page.click("form[data-sign=bulk] button[type=submit]")
    page.wait_for_url(re.compile(r"/bulk/[^/]+$"), timeout=30_000)
    found += accessible(page, shots, "a11y-bulk-results")
    page.goto(origin + "/no/such/page")
    found += accessible(page, shots, "a11y-404")
    page.goto(origin + "/signout")
    assert page.inner_text("h1") == "Not here"
    found += accessible(page, shots, "a11y-405")
    assert found == [], "\n".join(found)
    alice.assert_clean("axe")


def test_inbox_e2e_accessible_names_each_serious_violation_at_both_widths(
    browser: Browser, shots: Path
) -> None:
    page = browser.approver("probe").page
    page.set_content(
        '<html lang="en"><title>probe</title><main><h1>Probe</h1><button id="b"></button>'
        '<p id="low" style="color:#aaa;background:#fff">faint text</p></main></html>'
    )
    found = accessible(page, shots, "a11y-probe")
    said = [re.fullmatch(r"a11y-probe (\d+)px: (\w+) ([\w-]+): .+ at (#\w+)", f) for f in found]
    assert [m.groups() if m else None for m in said] == [
        ("1280", "critical", "button-name", "#b"),
        ("1280", "serious", "color-contrast", "#low"),
        ("390", "critical", "button-name", "#b"),
        ("390", "serious", "color-contrast", "#low"),
    ], found
