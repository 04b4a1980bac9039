"""``gate.client.hops.hops``: the lines ``request --wait`` prints, in the order things
happened."""

from __future__ import annotations

from typing import Any

from gate.client.hops import hops


def approval(
    revision: int, delivered: str | None, decisions: list[dict[str, Any]], state: str = "pending"
) -> dict[str, Any]:
    return {
        "approval_id": "01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        "state": state,
        "outcome": None,
        "revision": revision,
        "payload_hash": "sha256:" + "0" * 64,
        "receipt": None,
        "dispatch": {
            "revision": revision,
            "attempts": 1,
            "delivered_at": delivered,
            "last_error": None,
        },
        "decisions": decisions,
    }


def decision(verb: str, who: str, revision: int) -> dict[str, Any]:
    return {
        "decision": verb,
        "identity": who,
        "operator_id": 102,
        "revision": revision,
        "channel": "terminal",
    }


def test_an_adjust_is_reported_before_the_dispatch_of_the_revision_it_made() -> None:
    """New-user review: on a quorum-2 step, "dispatched revision 2" came before "decision
    adjust by bob (revision 1)" that made revision 2: the consequence before its cause."""
    before = approval(1, "2026-11-30T10:00:00Z", [])
    after = approval(2, "2026-11-30T10:00:05Z", [decision("adjust", "bob@example.com", 1)])
    lines = hops(before, after)
    assert [line.split(" ", 2)[:2] for line in lines] == [
        ["decision", "adjust"],
        ["dispatched", "revision"],
    ], lines
    assert lines[1].startswith("dispatched revision 2 to the relay"), lines


def test_the_first_dispatch_comes_before_the_decisions_on_it() -> None:
    before = approval(1, None, [])
    after = approval(1, "2026-11-30T10:00:00Z", [decision("approve", "alice@example.com", 1)])
    lines = hops(before, after)
    assert lines[0].startswith("dispatched revision 1 to the relay"), lines
    assert lines[1].startswith("decision approve by alice@example.com"), lines


def test_a_delegates_decision_says_on_whose_behalf() -> None:
    before = approval(1, "2026-11-30T10:00:00Z", [])
    delegated = decision("approve", "op04@example.com", 1) | {
        "operator_id": 104,
        "on_behalf_of": {"operator_id": 102, "identity": "bob@example.com"},
    }
    own = decision("approve", "alice@example.com", 1) | {"operator_id": 101, "on_behalf_of": None}
    assert hops(before, approval(1, "2026-11-30T10:00:00Z", [own, delegated])) == [
        "decision approve by alice@example.com (operator 101, revision 1, via terminal)",
        "decision approve by op04@example.com on behalf of bob@example.com (operator 104, "
        "revision 1, via terminal)",
    ]


def _question(version: int, response_type: str) -> dict[str, Any]:
    return {
        "question_id": "01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        "state": "pending",
        "version": version,
        "question": {"text": "never printed", "response_type": response_type},
        "dispatch": None,
        "answer": None,
    }


def test_a_revise_that_changes_the_response_type_says_so() -> None:
    """A pipeline that asked with --schema and parses stdout as JSON must be told when a
    revise made the answer free text (second new-user pass, finding 1); never the text."""
    from gate.client.hops import question_hops

    lines = question_hops(_question(1, "form"), _question(2, "free_text"))
    assert lines == ["question revised to version 2 (the answer is now free_text, was form)"]
    assert question_hops(_question(1, "form"), _question(2, "form")) == [
        "question revised to version 2"
    ]


def test_the_ack_time_is_shown_fixed_width_with_milliseconds() -> None:
    from gate.client.hops import question_hops

    assert hops(None, approval(1, "2026-12-07T10:20:16.4Z", [])) == [
        "dispatched revision 1 to the relay (attempt 1, acked 2026-12-07T10:20:16.400Z)"
    ]
    acked = dict(_question(1, "free_text"), dispatch={"version": 1, "attempts": 2})
    acked["dispatch"]["delivered_at"] = "2026-12-07T10:20:16Z"
    assert question_hops(None, acked) == [
        "dispatched question version 1 to the relay (attempt 2, acked 2026-12-07T10:20:16.000Z)"
    ]
