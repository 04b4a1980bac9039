"""What an approver reads after deciding through the inbox (findings of the
first browser runs): quorum progress on the item page from the inbox's own recorded decisions, and
the decision page naming the outcome. A real gate, the real inbox, software passkeys over
real HTTP (see tests/test_inbox_decide.py for the pipeline side)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest

from tests.inbox_harness import InboxClient, InboxWorld, reminded_world
from tests.test_inbox_decide import followed, pipeline, signed_in

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InboxWorld]:
    yield from reminded_world(tmp_path_factory, "progress")


_SIGNED_IN: dict[tuple[int, int], InboxClient] = {}


def once_signed_in(world: InboxWorld, operator: int) -> InboxClient:
    """``operator``'s session, signed in once per module's world: the inbox allows 10
    sign-ins per client address in 5 minutes, and every test here comes from 127.0.0.1."""
    key = (world.inbox_port, operator)
    if key not in _SIGNED_IN:
        _SIGNED_IN[key] = signed_in(world, operator)
    return _SIGNED_IN[key]


def approvals(client: InboxClient, approval_id: str) -> str:
    page = client.get(f"/items/{approval_id}").text
    found = re.search(r"<dt>Approvals</dt><dd>([^<]*)</dd>", page)
    assert found, page
    return found.group(1)


def test_quorum_progress_counts_a_decision_recorded_through_the_inbox(world: InboxWorld) -> None:
    alice, bob = once_signed_in(world, 101), once_signed_in(world, 102)
    proc, approval_id = pipeline(world, "q2", "Pay 12 EUR")
    assert approvals(bob, approval_id) == "0 of 2"

    page = followed(alice, alice.decide(approval_id, world.passkeys[101]))

    assert "<h1>Approved: recorded, 1 of 2</h1>" in page, page
    assert approvals(bob, approval_id) == "1 of 2"
    bob_page = bob.get(f"/items/{approval_id}").text
    assert "<dt>Approved so far by</dt><dd>alice@example.com</dd>" in bob_page, bob_page
    waiting = bob.get("/").text
    assert "Approvals: 1 of 2" in waiting, waiting
    proc.stop()


def test_the_decision_page_names_the_outcome(world: InboxWorld) -> None:
    alice = once_signed_in(world, 101)
    approved, approved_id = pipeline(world, "q1", "Pay 1 EUR")
    page = followed(alice, alice.decide(approved_id, world.passkeys[101]))
    assert "<h1>Approved</h1>" in page, page
    approved.finish()

    skipped, skipped_id = pipeline(world, "q1", "Pay 2 EUR")
    page = followed(alice, alice.decide(skipped_id, world.passkeys[101], "skip", reason="dup"))
    assert "<h1>Skipped</h1>" in page, page
    skipped.finish()

    adjusted, adjusted_id = pipeline(world, "q1", "Pay 3 EUR")
    answer = alice.decide(adjusted_id, world.passkeys[101], "adjust", adjust_text="Pay 4 EUR")
    page = followed(alice, answer)
    assert "<h1>Adjusted: revision 2</h1>" in page, page
    adjusted.finish()


def test_a_skip_reason_is_kept_by_the_inbox_and_shown_escaped_never_logged(
    world: InboxWorld,
) -> None:
    alice = once_signed_in(world, 101)
    proc, approval_id = pipeline(world, "q1", "Pay 5 EUR")
    reason = 'Wrong IBAN <b>"DE00"</b>\nask finance \u202e first'

    answer = alice.decide(approval_id, world.passkeys[101], "skip", reason=reason)

    page = followed(alice, answer)
    shown = (
        "Wrong IBAN &lt;b&gt;&#34;DE00&#34;&lt;/b&gt;\nask finance "
        '<mark class="cc" title="U+202E RIGHT-TO-LEFT OVERRIDE">U+202E</mark> first'
    )
    assert f'<p class="reason">Your reason: {shown}</p>' in page, page
    recent = alice.get("/recent").text
    assert f'skip<span class="reason">: {shown}</span>' in recent, recent
    assert world.inbox is not None
    [kept] = world.inbox.rows(
        "SELECT reason FROM decisions WHERE approval_id = ? AND decision = 'skip'", approval_id
    )
    assert kept["reason"] == reason
    code, _, err = proc.finish()
    assert code == 3, err
    assert "Wrong IBAN" not in world.inbox.log()


def test_an_approval_without_a_reason_shows_none(world: InboxWorld) -> None:
    alice = once_signed_in(world, 101)
    proc, approval_id = pipeline(world, "q1", "Pay 6 EUR")

    page = followed(alice, alice.decide(approval_id, world.passkeys[101]))

    assert 'class="reason"' not in page, page
    assert world.inbox is not None
    [kept] = world.inbox.rows("SELECT reason FROM decisions WHERE approval_id = ?", approval_id)
    assert kept["reason"] is None
    proc.finish()


def live(client: InboxClient, approval_id: str) -> dict[str, object]:
    answer = client.get(f"/live?since=0&item={approval_id}")
    assert answer.status == 200, answer.text
    body = answer.json()
    assert isinstance(body, dict)
    return body


def test_live_reports_the_open_items_quorum_progress_and_who_approved(world: InboxWorld) -> None:
    alice, bob = once_signed_in(world, 101), once_signed_in(world, 102)
    proc, approval_id = pipeline(world, "q2", "Pay 13 EUR")
    assert live(bob, approval_id)["progress"] == {
        "approval_id": approval_id, "revision": 1, "quorum": "0 of 2", "approved_by": [],
    }  # fmt: skip

    followed(alice, alice.decide(approval_id, world.passkeys[101]))

    assert live(bob, approval_id)["progress"] == {
        "approval_id": approval_id, "revision": 1, "quorum": "1 of 2",
        "approved_by": ["alice@example.com"],
    }  # fmt: skip
    assert set(bob.get("/live?since=0").json()) == {"seq", "changed"}  # as before without item
    assert "progress" not in live(bob, "no-such-item")
    followed(bob, bob.decide(approval_id, world.passkeys[102]))
    assert proc.finish()[0] == 0


def test_a_reminder_sent_after_an_inbox_approval_does_not_count_it_twice(
    world: InboxWorld,
) -> None:
    alice, bob = once_signed_in(world, 101), once_signed_in(world, 102)
    proc, approval_id = pipeline(world, "q2r", "Pay 14 EUR")
    followed(alice, alice.decide(approval_id, world.passkeys[101]))
    assert world.inbox is not None

    def reminded_after_alice(row: object) -> bool:
        dispatch = json.loads(row["dispatch"])  # type: ignore[index]
        awaiting = dispatch.get("awaiting")
        return awaiting is not None and "alice@example.com" not in awaiting

    kept = world.inbox.wait_item(approval_id, reminded_after_alice)

    assert json.loads(kept["dispatch"])["quorum"] == {"required": 2, "collected": 1}
    assert approvals(bob, approval_id) == "1 of 2"
    assert live(bob, approval_id)["progress"]["quorum"] == "1 of 2"  # type: ignore[index]
    followed(bob, bob.decide(approval_id, world.passkeys[102]))
    assert proc.finish()[0] == 0


def section(page: str, heading: str) -> str:
    """The part of a page from its ``<h2>heading</h2>`` to the next heading (or the end)."""
    start = page.find(f">{heading}</h")
    assert start >= 0, page
    end = page.find("<h2", start)
    return page[start : end if end >= 0 else len(page)]


def test_an_item_i_approved_waits_for_others_without_forms_or_a_checkbox(
    world: InboxWorld,
) -> None:
    alice = once_signed_in(world, 101)
    proc, approval_id = pipeline(world, "q2", "Pay 15 EUR")
    other, other_id = pipeline(world, "q2", "Pay 16 EUR")

    followed(alice, alice.decide(approval_id, world.passkeys[101]))

    waiting = alice.get("/").text
    mine = section(waiting, "Waiting for others")
    assert f'href="/items/{approval_id}"' in mine and "You approved; 1 more needed" in mine
    assert f'name="item:{approval_id}"' not in waiting  # no checkbox for another bulk
    assert f'href="/items/{approval_id}"' not in section(waiting, "Waiting for you")
    assert f'href="/items/{other_id}"' in section(waiting, "Waiting for you")
    page = alice.get(f"/items/{approval_id}").text
    assert 'name="decision"' not in page, page  # no form to decide again
    assert "You approved revision 1; 1 more approval needed." in page, page
    bob = once_signed_in(world, 102)
    assert f'href="/items/{approval_id}"' in section(bob.get("/").text, "Waiting for you")
    followed(bob, bob.decide(approval_id, world.passkeys[102]))
    followed(bob, bob.decide(other_id, world.passkeys[102]))
    followed(alice, alice.decide(other_id, world.passkeys[101]))
    assert proc.finish()[0] == 0 and other.finish()[0] == 0


def test_my_adjust_on_a_quorum_step_counts_and_its_revision_waits_for_others(
    world: InboxWorld,
) -> None:
    alice = once_signed_in(world, 101)
    proc, approval_id = pipeline(world, "q2", "Pay 17 EUR")

    followed(alice, alice.decide(approval_id, world.passkeys[101], "adjust", adjust_text="Pay 7"))
    assert world.inbox is not None
    world.inbox.wait_item(approval_id, lambda r: r["revision"] == 2)

    waiting = alice.get("/").text
    mine = section(waiting, "Waiting for others")
    assert f'href="/items/{approval_id}"' in mine, waiting
    assert "You adjusted it to revision 2; 1 more needed" in mine, mine
    assert f'name="item:{approval_id}"' not in waiting
    assert 'name="decision"' not in alice.get(f"/items/{approval_id}").text
    bob = once_signed_in(world, 102)
    followed(bob, bob.decide(approval_id, world.passkeys[102]))
    assert proc.finish()[:2] == (0, b"Pay 7")


def test_an_item_resolved_by_an_adjust_shows_the_final_text_and_what_changed(
    world: InboxWorld,
) -> None:
    alice = once_signed_in(world, 101)
    proc, approval_id = pipeline(world, "q1", "Pay 18 EUR to ACME")

    page = followed(
        alice, alice.decide(approval_id, world.passkeys[101], "adjust", adjust_text="Pay 8 EUR")
    )
    assert proc.finish()[:2] == (0, b"Pay 8 EUR")
    assert world.inbox is not None
    world.inbox.wait_item(approval_id, lambda r: r["state"] == "resolved")

    assert "p · q1" in page and "Pay 18 EUR to ACME" in page, page  # names the item decided
    item = alice.get(f"/items/{approval_id}").text
    final = section(item, "The final text (revision 2)")
    assert "Pay 8 EUR" in final and "Pay 18 EUR" not in final, item
    assert "What changed from revision 1" in item, item
    assert "0 of 1" not in item, item
    recent = alice.get("/recent").text
    assert "p · q1" in recent and "Pay 18 EUR to ACME" in recent, recent
    assert 'adjust<span class="sent">: Pay 8 EUR</span>' in recent, recent
