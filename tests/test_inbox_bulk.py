"""Bulk approve at the inbox, the pure part: the ticked fields -> checked stored
items -> the batch challenge, which the gate's own digest rules reproduce."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from gate.inbox.bulk import batch_of, checked_items, picks_from
from gate.inbox.decide import Refused as BulkRefused
from gate.inbox.items import item_from
from gate.inbox.model import Item
from gate.inbox.words import bulk_heading
from gate.protocol.approver_signature import decision_digest
from gate.protocol.canonical import payload_hash


def item(
    n: int,
    *,
    revision: int = 1,
    state: str = "pending",
    kind: str = "approval",
    body: str = "",
    content_type: str = "text/plain",
) -> Item:
    body = body or f"draft {n}"
    dispatch: dict[str, Any] = {
        "approval_id": f"01A{n}",
        "pipeline": "p",
        "step": f"s{n}",
        "revision": revision,
        "draft": {"body": body, "content_type": content_type},
        "payload_hash": payload_hash(body),
        "approvers": ["alice@example.com"],
        "callback": {"url": "http://127.0.0.1:1/", "nonce": f"nonce-{n}-{revision}"},
    }
    row = {
        "approval_id": f"01A{n}",
        "kind": kind,
        "revision": revision,
        "nonce": f"nonce-{n}-{revision}",
        "payload_hash": payload_hash(body),
        "state": state,
        "expires_at": 10**13,
        "received_at": 0,
        "updated_seq": n,
        "previous_body": None,
        "outcome": None,
    }
    return item_from(row, dispatch, 0)


def mine(i: Item) -> bool:
    return "alice@example.com" in i.approvers


def test_the_batch_challenge_is_the_gate_s_batch_digest_of_stored_approves() -> None:
    stored = {f"01A{n}": item(n, revision=n) for n in range(1, 4)}
    fields = {"csrf": "x", "item:01A1": "1", "item:01A2": "2", "item:01A3": "3"}

    batch = batch_of(checked_items(picks_from(fields), stored, mine))

    expected = [
        decision_digest(
            approval_id=i.approval_id,
            revision=i.revision,
            nonce=i.nonce,
            payload_hash=i.payload_hash,
            decision="approve",
        ).hex()
        for i in stored.values()
    ]
    assert list(batch.hexes) == expected
    # by hand: SHA-256 of the sorted hex list's compact JSON
    by_hand = hashlib.sha256(json.dumps(sorted(expected), separators=(",", ":")).encode())
    assert batch.challenge == by_hand.digest()
    assert [i.approval_id for i in batch.items] == ["01A1", "01A2", "01A3"]


@pytest.mark.parametrize(
    ("fields", "status", "reason"),
    [
        ({"item:01A1": "1"}, 422, "batch_size"),
        ({f"item:01A{n}": "1" for n in range(51)}, 422, "batch_size"),
        ({"item:01A1": "1", "item:01A2": "x"}, 400, "invalid_batch"),
        ({"item:01A1": "1", "item:01A2": "0"}, 400, "invalid_batch"),
        ({"item:01A1": "1", "item:": "1"}, 400, "invalid_batch"),
        ({"item:01A1": "1", "item:01A2": "9" * 5000}, 400, "invalid_batch"),
    ],
)
def test_a_batch_that_is_not_as_the_page_sends_is_refused(
    fields: dict[str, Any], status: int, reason: str
) -> None:
    with pytest.raises(BulkRefused) as exc:
        picks_from(fields)
    assert (exc.value.status, exc.value.reason) == (status, reason)


def test_an_item_not_pending_changed_or_not_mine_is_named_in_words() -> None:
    stored: dict[str, Item | None] = {
        "01A1": item(1),
        "01A2": item(2, state="expired"),
        "01A3": item(3, revision=2),
        "01A4": item(4, kind="question"),
    }

    def refused(*ids: str, shown: int = 1) -> BulkRefused:
        with pytest.raises(BulkRefused) as exc:
            checked_items([(i, shown) for i in ids], stored, mine)
        return exc.value

    expired = refused("01A1", "01A2")
    assert (expired.status, expired.reason) == (409, "not_pending")
    assert expired.message == "p \u00b7 s2 (01A2) is now expired."
    changed = refused("01A1", "01A3")
    assert changed.reason == "changed"
    assert changed.message.endswith("changed since you opened it: reload to see revision 2.")
    for other in ("01A4", "01A9"):
        assert refused("01A1", other).reason == "not_available"
    with pytest.raises(BulkRefused) as not_mine:
        checked_items([("01A1", 1), ("01A1", 1)], stored, lambda i: False)
    assert not_mine.value.reason == "not_available"
    with pytest.raises(BulkRefused) as twice:
        batch_of(checked_items([("01A1", 1), ("01A1", 1)], stored, mine))
    assert twice.value.reason == "invalid_batch"


@pytest.mark.parametrize(
    ("kinds", "said"),
    [
        (["resolved", "resolved", "resolved"], "All 3 approved"),
        (
            ["resolved", "recorded", "resolved", "resolved"],
            "4 decisions recorded: 3 approved, 1 waits for another approver",
        ),
        (
            ["resolved", "refused", "refused", "recorded", "already_resolved"],
            "2 of 5 decisions recorded: 1 approved, 1 waits for another approver",
        ),
        (["recorded", "recorded"], "2 decisions recorded: 2 wait for another approver"),
        (["resolved", "refused"], "1 of 2 approved"),
        (["refused", "refused"], "None of 2 approved"),
        (["resolved", "sent"], "1 of 2 approved, 1 not answered"),
        (["unreachable", "sent", "refused"], "None of 3 approved, 2 not answered"),
        (
            ["resolved", "sent", *["not_sent"] * 13],
            "1 of 15 approved, 1 not answered, 13 not sent: nothing was recorded for them",
        ),
        (
            ["resolved", "resolved", "rate_limited"],
            "2 of 3 approved, 1 over the gate's limit of decisions a minute: select it again in"
            " a minute",
        ),
        (
            ["sent", "not_sent"],
            "None of 2 approved, 1 not answered, 1 not sent: nothing was recorded for it",
        ),
    ],
)
def test_bulk_heading_says_how_many_the_gate_recorded(kinds: list[str], said: str) -> None:
    assert bulk_heading(kinds) == said


LONG = "\n".join(
    f"Line {n:03}: order 2026-{n:03} shipped, tracking {n:07}."
    if n != 151
    else "ALSO wire 9.800,00 EUR to account DE00 9999 0000 0000 0000 00"
    for n in range(1, 201)
)


@pytest.mark.parametrize(
    ("body", "content_type", "why"),
    [
        pytest.param("Pay \u202eRUE 00021\u202c", "text/plain", "2 hidden characters", id="bidi"),
        pytest.param("Pay ACME\u200b Ltd", "text/plain", "1 hidden character", id="zero-width"),
        pytest.param(
            "See [terms][t]\n\n[t]: https://example.com/t",
            "text/markdown",
            "markdown with hidden parts",
            id="markdown-reference",
        ),
        pytest.param('{"amount": 1e-400}', "application/json", "JSON", id="json-fallback"),
        pytest.param(LONG, "text/plain", "200 lines, 10 KB", id="200-lines"),
        pytest.param(
            "Dear customer 1,\n\n" + "Your order has shipped. " * 30, "text/plain", "3 lines",
            id="letter",
        ),
        pytest.param(
            json.dumps({"pay_to": "ACME GmbH \u202eHBmG EMCA", "amount": 5}),
            "application/json",
            "1 hidden character",
            id="json-escaped-bidi",
        ),
        pytest.param(
            "Pay ACME GmbH &#x202E;HBmG EMCA 5 EUR.", "text/markdown", "1 hidden character",
            id="markdown-entity-bidi",
        ),
    ],
)  # fmt: skip
def test_an_item_that_must_be_opened_is_refused_in_a_batch_naming_it(
    body: str, content_type: str, why: str
) -> None:
    """Seeing is approving: bulk approve signs only a draft its row showed whole, judged on
    what the item page renders (an escaped or entity-encoded hidden character counts), even
    when a crafted request ticks another (server-side)."""
    stored: dict[str, Item | None] = {
        "01A1": item(1),
        "01A2": item(2, body=body, content_type=content_type),
    }
    with pytest.raises(BulkRefused) as exc:
        checked_items([("01A1", 1), ("01A2", 1)], stored, mine)
    assert (exc.value.status, exc.value.reason) == (409, "open_to_review")
    assert exc.value.message.startswith("p \u00b7 s2 (01A2) must be opened")
    assert why in exc.value.message


def test_a_bulk_result_never_names_an_item_by_a_revision_it_did_not_approve() -> None:
    """Revision 1 was approved in the batch; the item is now revision 2 (adjusted by another
    approver): its line must not show revision 2's first line as what was approved."""
    from gate.inbox.bulk_results import result_row
    from gate.inbox.model import DecisionRecord

    record = DecisionRecord("01A1", 1, "alice@example.com", "approve", 200, {"status": "recorded"})
    same = result_row(record, item(1, body="Pay 10 EUR to ACME"))
    now = result_row(record, item(1, revision=2, body="Pay 10000 EUR to EVIL"))

    assert same["first_line"] == "Pay 10 EUR to ACME"
    assert "EVIL" not in json.dumps(now), now
    assert now["changed_to"] == 2
