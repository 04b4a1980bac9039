"""A waiting-list row's facts (gate/inbox/listing.py): a row shows a draft whole and offers
its checkbox, or says in words why it must be opened ("Open to review: 200 lines, 10 KB")."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gate.inbox.listing import decided_facts, row_facts
from gate.inbox.model import DecisionRecord
from tests.test_inbox_bulk import LONG, item


def test_a_long_draft_s_row_offers_no_checkbox_and_says_how_long_it_is() -> None:
    facts = row_facts(item(1, body=LONG))

    assert facts["bulkable"] is False
    assert facts["review"] == "200 lines, 10 KB"
    assert facts["first_line"].startswith("Line 001: order 2026-001 shipped")
    assert facts["whole"] == ""


def test_a_hidden_character_the_item_page_warns_of_takes_the_checkbox_away() -> None:
    escaped = json.dumps({"pay_to": "ACME GmbH \u202eHBmG EMCA", "amount": 5})
    for body, content_type in [
        (escaped, "application/json"),
        ("Pay ACME GmbH &#x202E;HBmG EMCA 5 EUR.", "text/markdown"),
    ]:
        facts = row_facts(item(1, body=body, content_type=content_type))
        assert (facts["bulkable"], facts["review"]) == (False, "1 hidden character"), body


def test_a_short_draft_s_row_shows_all_of_it() -> None:
    facts = row_facts(item(1, body="Refund 12 EUR to ACME Ltd\nfor order 4411.\n\nThanks."))

    assert facts["bulkable"] is True and facts["review"] is None
    assert "Refund 12 EUR to ACME Ltd\nfor order 4411.\n\nThanks." in str(facts["whole"])


def test_a_question_s_row_offers_no_checkbox() -> None:
    facts = row_facts(item(1, kind="question"))

    assert (facts["bulkable"], facts["review"], facts["whole"]) == (False, None, "")


@pytest.mark.parametrize(
    ("run_id", "shown"),
    [
        ("run-7", "run-7"),
        ("01j8z3k4q5r6s7t8v9w0x1y2z3", "01j8z3k4q5r6s7t8v9w0x1y2z3"),  # not the gate's upper case
        (
            "01J8Z3K4Q5R6S7T8V9W0X1Y2Z3",
            "01J8Z3K4Q5R6S7T8V9W0X1Y2Z3, in the gate's own id format: the gate makes one when"
            " the pipeline names no run",
        ),
        (None, None),
    ],
    ids=["named", "lower-case", "gate-format", "none"],
)
def test_a_run_id_in_the_gate_s_own_format_is_labelled_wherever_a_row_names_it(
    run_id: str | None, shown: str | None
) -> None:
    got = item(1)
    dispatch = {**got.dispatch, "run_id": run_id}
    with_run = replace(got, dispatch=dispatch)

    assert row_facts(with_run)["run_id"] == shown
    record = DecisionRecord(got.approval_id, 1, "alice@example.com", "approve", 200, {})
    assert decided_facts(record, with_run)["run_id"] == shown
