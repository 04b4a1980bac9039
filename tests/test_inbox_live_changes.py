"""What ``/live`` reports as changed (session 11 finding): a new revision, never a reminder
or an escalation re-dispatch of the same revision and draft (an open item page would say
"This item changed" for nothing). A real gate reminding every second, the real inbox, a
software passkey over real HTTP."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.inbox_harness import InboxWorld, reminded_world
from tests.test_inbox_decide import followed, pipeline, signed_in

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InboxWorld]:
    yield from reminded_world(tmp_path_factory, "live")


def reminded(row: object) -> int:
    """The reminder count of a kept dispatch (0 before the first reminder)."""
    return int(json.loads(row["dispatch"]).get("reminder", 0))  # type: ignore[index]


def test_live_does_not_report_a_reminder_as_a_change_but_an_adjust(world: InboxWorld) -> None:
    bob = signed_in(world, 102)
    proc, approval_id = pipeline(world, "q2r", "Pay 15 EUR")
    assert world.inbox is not None
    first = world.inbox.wait_item(approval_id, lambda r: True)
    since = first["updated_seq"]

    later = world.inbox.wait_item(approval_id, lambda r: reminded(r) > reminded(first))

    assert later["revision"] == first["revision"]
    changed = bob.get(f"/live?since={since}").json()["changed"]
    assert [approval_id, "pending"] not in changed, changed
    followed(bob, bob.decide(approval_id, world.passkeys[102], "adjust", adjust_text="16"))
    world.inbox.wait_item(approval_id, lambda r: r["revision"] == 2)
    changed = bob.get(f"/live?since={since}").json()["changed"]
    assert [approval_id, "pending"] in changed, changed
    proc.stop()
