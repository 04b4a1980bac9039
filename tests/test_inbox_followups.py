"""Reminders and escalations at the inbox (gate/inbox/followups.py): an item the gate reminded
about says "Reminder N" on its waiting row and its page, an escalated one says "Escalated to
you" to the approvers the escalation added and "Escalated: level N" to those who already had
it, and both survive the next dispatch that does not repeat them (the gate's reminder carries
no ``escalation``). A real gate that reminds and escalates every second, the real inbox,
software passkeys over real HTTP."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.inbox_harness import SIGNED, STEPS, InboxClient, InboxWorld, rows, start_world
from tests.support import wait_until
from tests.test_inbox_decide import signed_in

pytestmark = pytest.mark.e2e

# alice and bob decide; carol joins at level 1 after 1 s; a reminder every second
ESCALATING = {"name": "esc", "quorum": 1, "approvers": [101, 102], "timeout": "1h",
              "remind_every": "1s", "escalate": [{"after": "1s", "to": [103]}],
              **SIGNED}  # fmt: skip
TAGS = re.compile(r'<span class="tag followup">([^<]*)</span>')


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InboxWorld]:
    started = start_world(
        tmp_path_factory.mktemp("followups"), enrol=(101, 102, 103), steps=[*STEPS, ESCALATING]
    )
    yield started
    started.stop()


def reminded_after_escalation(gate_db: Path, inbox_db: Path, approval_id: str) -> bool:
    """Whether the gate escalated ``approval_id`` to level 1 and the inbox (file
    ``inbox_db``) then kept a reminder of it: a dispatch without ``escalation`` whose
    ``awaiting`` names carol, whom the level added."""
    [(level,)] = rows(gate_db, "SELECT escalation_level FROM approvals WHERE approval_id = ?",
                      approval_id)  # fmt: skip
    if level != 1 or not inbox_db.exists():
        return False
    kept = rows(inbox_db, "SELECT dispatch FROM items WHERE approval_id = ?", approval_id)
    sent = json.loads(kept[0][0]) if kept else {}
    return "escalation" not in sent and "carol@example.com" in sent.get("awaiting", [])


@pytest.fixture(scope="module")
def escalated(world: InboxWorld) -> str:
    """An item of ``esc`` once the inbox holds a reminder dispatch sent AFTER its escalation
    (the stored dispatch no longer says ``escalation``)."""
    assert world.gate is not None and world.inbox is not None
    approval_id = str(world.gate.api().create("esc", body="Pay 40 EUR to Initech")["approval_id"])
    gate_db, inbox_db = world.folder / "gate" / "gate.db", world.inbox.db
    wait_until(
        lambda: reminded_after_escalation(gate_db, inbox_db, approval_id),
        what="a reminder after the escalation at the inbox",
    )
    return approval_id


def row_tags(client: InboxClient, approval_id: str) -> list[str]:
    page = client.get("/").text
    found = re.search(
        rf'<li class="item[^"]*" data-approval-id="{approval_id}".*?</li>', page, re.S
    )
    assert found, page
    return TAGS.findall(found.group(0))


def page_tags(client: InboxClient, approval_id: str) -> list[str]:
    page = client.get(f"/items/{approval_id}")
    assert page.status == 200, page.text
    return TAGS.findall(page.text)


def reminder_number(tags: list[str]) -> int:
    [reminder] = [t for t in tags if t.startswith("Reminder ")]
    return int(reminder.removeprefix("Reminder "))


def test_followups_an_escalation_says_escalated_to_you_to_whom_it_added(
    world: InboxWorld, escalated: str
) -> None:
    carol = signed_in(world, 103)

    for tags in (row_tags(carol, escalated), page_tags(carol, escalated)):
        assert "Escalated to you" in tags, tags
        assert reminder_number(tags) >= 1, tags


def test_followups_an_escalation_says_its_level_to_who_already_had_the_item(
    world: InboxWorld, escalated: str
) -> None:
    alice = signed_in(world, 101)

    for tags in (row_tags(alice, escalated), page_tags(alice, escalated)):
        assert "Escalated: level 1" in tags and "Escalated to you" not in tags, tags
        assert reminder_number(tags) >= 1, tags


def test_followups_a_new_item_says_nothing_of_reminders(world: InboxWorld) -> None:
    assert world.gate is not None and world.inbox is not None
    approval_id = str(world.gate.api().create("q1", body="Pay 3 EUR")["approval_id"])
    world.inbox.wait_item(approval_id)
    bob = signed_in(world, 102)

    assert row_tags(bob, approval_id) == [] and page_tags(bob, approval_id) == []
