"""Decisions through the inbox: a pipeline blocked on ``hitl-gate request
--wait`` against a real gate whose relay is the real inbox; approvers sign in and sign each
decision with a software passkey over real HTTP; the gate's and the inbox's SQLite files
are read as they are on disk."""

from __future__ import annotations

import contextlib
import http.client
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.inbox_harness import ENV, Answer, InboxClient, InboxWorld, start_world
from tests.support import CliProcess, wait_until

pytestmark = pytest.mark.e2e


@pytest.fixture
def world(tmp_path: Path) -> Iterator[InboxWorld]:
    started = start_world(tmp_path, enrol=(101, 102, 103))
    yield started
    started.stop()


def signed_in(world: InboxWorld, operator: int) -> InboxClient:
    client = world.client()
    answer = client.signin(world.passkeys[operator])
    assert answer.status == 200, answer.text
    return client


def pipeline(world: InboxWorld, step: str, draft: str) -> tuple[CliProcess, str]:
    """``hitl-gate request --wait`` on ``step`` and the approval id once the inbox keeps it."""
    assert world.gate is not None and world.inbox is not None
    before = {r["approval_id"] for r in world.inbox.rows("SELECT approval_id FROM items")}
    proc = CliProcess(
        "request", "-c", str(world.gate.config), "--api-url", world.gate.api_url,
        "--pipeline", "p", "--step", step, "--draft", draft, "--wait", env=ENV,
    )  # fmt: skip
    inbox = world.inbox

    def new_item() -> str | None:
        if not inbox.db.exists():
            return None
        ids = {r["approval_id"] for r in inbox.rows("SELECT approval_id FROM items")} - before
        return next(iter(ids), None)

    return proc, wait_until(new_item, what="the request at the inbox")


def gate_decisions(world: InboxWorld, approval_id: str) -> list[dict[str, Any]]:
    return [
        dict(r)
        for r in world.gate_rows(
            "SELECT * FROM decisions WHERE approval_id = ? ORDER BY decision_id", approval_id
        )
    ]


def followed(client: InboxClient, answer: Answer) -> str:
    assert answer.status == 200, answer.text
    page = client.get(answer.json()["location"])
    assert page.status == 200
    return page.text


def test_approve_through_the_inbox_releases_the_pipeline(world: InboxWorld) -> None:
    alice = signed_in(world, 101)
    proc, approval_id = pipeline(world, "q1", "Pay 12 EUR to ACME")
    assert approval_id in alice.get("/").text

    page = followed(alice, alice.decide(approval_id, world.passkeys[101]))

    assert "Your decision was recorded and the approval is resolved." in page
    code, out, err = proc.finish()
    assert code == 0, err
    assert out == b"Pay 12 EUR to ACME"
    [row] = gate_decisions(world, approval_id)
    assert (row["identity"], row["channel"], row["decision"]) == (
        "alice@example.com",
        "inbox",
        "approve",
    )
    assert row["credential_id"] == world.passkeys[101].credential_id
    assert world.inbox is not None
    [kept] = world.inbox.rows("SELECT * FROM decisions")
    assert (kept["approval_id"], kept["http_status"]) == (approval_id, 200)
    recent = alice.get("/recent").text
    assert f"/items/{approval_id}" in recent  # named as the waiting list names it
    assert 'p · q1</span>: <span class="first-line">Pay 12 EUR to ACME</span>' in recent
    [number] = [r["id"] for r in world.inbox.rows("SELECT id FROM decisions")]
    assert signed_in(world, 103).get(f"/decisions/{number}").status == 404  # not carol's


def test_an_unreachable_gate_is_said_and_the_row_kept(world: InboxWorld) -> None:
    alice = signed_in(world, 101)
    proc, approval_id = pipeline(world, "q1", "Pay 12 EUR")
    assert world.gate is not None and world.gate.stop() == 0

    answer = alice.decide(approval_id, world.passkeys[101])

    assert (answer.status, answer.json()["reason"]) == (502, "gate_unreachable"), answer.text
    assert world.inbox is not None
    [kept] = world.inbox.rows("SELECT * FROM decisions")
    assert (kept["http_status"], kept["answer"]) == (0, '{"error": "gate_unreachable"}')
    assert "The gate could not be reached; it may not have" in alice.get("/recent").text
    proc.stop()


def test_a_request_the_gate_lost_in_a_restore_is_closed_and_said(world: InboxWorld) -> None:
    """The gate's database restored from a backup older than the request: the gate answers
    404 ``unknown_approval``; the inbox closes the item and says why, in words."""
    alice = signed_in(world, 101)
    assert world.gate is not None and world.inbox is not None
    gate_db = world.folder / "gate" / "gate.db"
    backup = world.folder / "gate-backup.db"
    with contextlib.closing(sqlite3.connect(gate_db)) as src:
        with contextlib.closing(sqlite3.connect(backup)) as dst:
            src.backup(dst)
    proc, approval_id = pipeline(world, "q1", "Pay 12 EUR")
    proc.stop()
    assert world.gate.stop() == 0
    for leftover in ("-wal", "-shm"):
        gate_db.with_name(gate_db.name + leftover).unlink(missing_ok=True)
    backup.replace(gate_db)
    world.start_gate()

    page = followed(alice, alice.decide(approval_id, world.passkeys[101]))

    assert "The gate no longer has this request" in page, page
    assert "unknown_approval" not in page
    [item] = world.inbox.rows("SELECT state FROM items WHERE approval_id = ?", approval_id)
    assert item["state"] == "cancelled"
    assert f"/items/{approval_id}" not in alice.get("/").text  # no longer waiting
    shown = alice.get(f"/items/{approval_id}").text
    assert "the gate no longer has it" in shown, shown


def test_skip_with_a_reason_ends_the_pipeline_with_exit_3(world: InboxWorld) -> None:
    bob = signed_in(world, 102)
    proc, approval_id = pipeline(world, "skipr", "Send the newsletter")

    answer = bob.decide(approval_id, world.passkeys[102], "skip", reason="wrong audience")

    followed(bob, answer)
    code, out, err = proc.finish()
    assert code == 3, err
    assert "skipped by bob@example.com: wrong audience" in err
    [row] = gate_decisions(world, approval_id)
    assert (row["decision"], row["reason"]) == ("skip", "wrong audience")


def test_adjust_hands_the_pipeline_the_edited_body(world: InboxWorld) -> None:
    alice = signed_in(world, 101)
    proc, approval_id = pipeline(world, "q1", "Pay 12 EUR")

    answer = alice.decide(approval_id, world.passkeys[101], "adjust", adjust_text="Pay 11 EUR")

    followed(alice, answer)
    code, out, err = proc.finish()
    assert (code, out) == (0, b"Pay 11 EUR"), err


def test_a_revision_changed_after_the_challenge_is_refused(world: InboxWorld) -> None:
    alice, bob = signed_in(world, 101), signed_in(world, 102)
    proc, approval_id = pipeline(world, "q2", "Pay 12 EUR")
    csrf, shown = alice.item_form(approval_id)
    fields = {"csrf": csrf, "decision": "approve", "revision": shown}
    got = alice.post_json(f"/items/{approval_id}/challenge", fields)
    assert got.status == 200, got.text
    # meanwhile bob adjusts: the gate sends revision 2 to the inbox
    followed(bob, bob.decide(approval_id, world.passkeys[102], "adjust", adjust_text="Pay 9 EUR"))
    assert world.inbox is not None
    world.inbox.wait_item(approval_id, lambda r: r["revision"] == 2)
    signed = world.passkeys[101].assert_(got.json()["challenge"], "localhost", alice.origin)

    answer = alice.post_json(f"/items/{approval_id}/decide", {**fields, "assertion": signed})

    assert (answer.status, answer.json()["reason"]) == (409, "changed"), answer.text
    assert "reload to see revision 2" in answer.json()["message"]
    assert [r["identity"] for r in gate_decisions(world, approval_id)] == ["bob@example.com"]
    proc.stop()


def challenged(
    world: InboxWorld, verb: str
) -> tuple[InboxClient, CliProcess, str, dict[str, Any], Any]:
    """Alice signed in, a pipeline waiting on a new q1 item, and her challenge for ``verb``
    signed: ``(alice, pipeline process, approval_id, the form's fields, the assertion)``."""
    alice = signed_in(world, 101)
    proc, approval_id = pipeline(world, "q1", "Pay 12 EUR")
    csrf, shown = alice.item_form(approval_id)
    fields = {"csrf": csrf, "decision": verb, "revision": shown}
    got = alice.post_json(f"/items/{approval_id}/challenge", fields)
    signed = world.passkeys[101].assert_(got.json()["challenge"], "localhost", alice.origin)
    return alice, proc, approval_id, fields, signed


def test_forged_posts_change_nothing(world: InboxWorld) -> None:
    alice, proc, approval_id, fields, signed = challenged(world, "approve")
    csrf, base = fields["csrf"], f"/items/{approval_id}"
    body = {**fields, "assertion": signed}
    forged = [
        ("csrf_mismatch", alice.post_json(base + "/decide", {**body, "csrf": ""}, csrf=csrf)),
        ("csrf_mismatch", alice.post_json(base + "/decide", {**body, "csrf": "x" * 43})),
        ("csrf_mismatch", alice.post_json(base + "/decide", body, csrf="")),
        (
            "origin_not_allowed",
            alice.post_json(base + "/decide", body, Origin="http://evil.example"),
        ),
        (
            "origin_not_allowed",
            alice.request(
                "POST",
                base + "/decide",
                b'{"csrf": "' + csrf.encode() + b'"}',
                {"Content-Type": "application/json", "X-CSRF-Token": csrf},
            ),
        ),
        ("csrf_mismatch", alice.post_form("/signout", {"csrf": "nope"})),
    ]
    for reason, answer in forged:
        assert answer.status == 403, (reason, answer.status, answer.text)
        assert answer.json()["reason"] == reason, answer.text
    for path in (base + "/decide", base + "/challenge", "/signout"):
        assert alice.get(path).status == 405, path
    assert gate_decisions(world, approval_id) == []
    assert world.inbox is not None
    assert world.inbox.rows("SELECT * FROM decisions") == []
    assert alice.get("/").status == 200  # still signed in: the forged sign-out did nothing
    proc.stop()


def test_another_operators_passkey_and_item_are_refused(world: InboxWorld) -> None:
    alice, carol = signed_in(world, 101), signed_in(world, 103)
    proc, approval_id = pipeline(world, "skipr", "Pay 12 EUR")  # approvers 101, 102

    wrong = alice.decide(approval_id, world.passkeys[102])

    assert (wrong.status, wrong.json()["reason"]) == (403, "wrong_credential"), wrong.text
    hidden = carol.get(f"/items/{approval_id}")
    assert hidden.status == 404 and "Pay 12 EUR" not in hidden.text
    page = carol.get("/")  # not listed; her own session's token does not open it either
    assert approval_id not in page.text
    token = page.text.split('name="csrf" value="')[1].split('"')[0]
    refused = carol.post_json(
        f"/items/{approval_id}/challenge", {"csrf": token, "decision": "approve", "revision": "1"}
    )
    assert refused.status == 404
    assert gate_decisions(world, approval_id) == []
    assert world.inbox is not None
    assert world.inbox.rows("SELECT * FROM decisions") == []
    proc.stop()


def test_kill_9_after_the_gate_recorded_keeps_the_decision(world: InboxWorld) -> None:
    alice = signed_in(world, 101)
    proc, approval_id = pipeline(world, "q2", "Pay 12 EUR")  # quorum 2: stays pending

    def decide() -> None:
        with contextlib.suppress(OSError, http.client.HTTPException):  # killed mid-answer
            alice.decide(approval_id, world.passkeys[101])

    thread = threading.Thread(target=decide)
    thread.start()
    wait_until(lambda: gate_decisions(world, approval_id), what="the gate to record it")
    assert world.inbox is not None
    world.inbox.kill9()
    thread.join(30)
    # the row was written before the post: it is on disk whatever the inbox got to
    [kept] = world.inbox.rows("SELECT * FROM decisions")
    assert (kept["approval_id"], kept["identity"]) == (approval_id, "alice@example.com")
    assert kept["http_status"] in (0, 200)

    world.start_inbox()
    recent = alice.get("/recent")
    assert recent.status == 200 and f"/items/{approval_id}" in recent.text
    words = (
        "Sent to the gate; the gate&#39;s answer was not received"
        if kept["http_status"] == 0
        else "The step needs more approvals"
    )
    assert words in recent.text, recent.text
    if kept["http_status"] == 200:  # recorded: the page offers no form to decide again
        page = alice.get(f"/items/{approval_id}").text
        assert "You approved revision 1" in page and 'name="decision"' not in page, page
    else:  # the row said "not answered": the gate itself says it has it
        again = alice.decide(approval_id, world.passkeys[101])
        assert "You have already decided on this revision" in followed(alice, again)
    assert len(gate_decisions(world, approval_id)) == 1
    proc.stop()


def test_live_reports_a_cancel(world: InboxWorld) -> None:
    alice, carol = signed_in(world, 101), signed_in(world, 103)
    start = alice.get("/").text.split('data-live-seq="')[1].split('"')[0]
    proc, approval_id = pipeline(world, "skipr", "Pay 12 EUR")
    first = alice.get(f"/live?since={start}").json()
    assert [approval_id, "pending"] in first["changed"]
    assert carol.get(f"/live?since={start}").json()["changed"] == []  # not carol's
    assert world.gate is not None
    status, _ = world.gate.api().call("POST", f"/v1/approvals/{approval_id}/cancel")
    assert status == 200
    assert world.inbox is not None
    world.inbox.wait_item(approval_id, lambda r: r["state"] == "cancelled")

    live = alice.get(f"/live?since={first['seq']}").json()

    assert live["changed"] == [[approval_id, "cancelled"]]
    assert live["seq"] > first["seq"]
    code, _, _ = proc.finish()
    assert code == 5


def test_a_lone_surrogate_in_a_posted_field_is_refused_and_changes_nothing(
    world: InboxWorld,
) -> None:
    """A JSON post whose adjust_text or reason holds ``\\ud800`` (no UTF-8 text: it could be
    neither signed nor sent to the gate) or U+0000 (which every gate refuses) is 400
    ``invalid_<field>`` with a sentence."""
    alice, proc, approval_id, fields, signed = challenged(world, "adjust")
    base = f"/items/{approval_id}"
    for bad, said in (("\ud800", "lone surrogate"), ("\x00", "U+0000")):
        posts = [
            ("invalid_adjust_text", base + "/challenge", {**fields, "adjust_text": f"Pay {bad}"}),
            ("invalid_adjust_text", base + "/decide", {**fields, "assertion": signed,
                                                       "adjust_text": bad}),
            ("invalid_reason", base + "/decide", {**fields, "decision": "skip",
                                                  "assertion": signed, "reason": f"no {bad}"}),
        ]  # fmt: skip
        for reason, path, body in posts:
            answer = alice.post_json(path, body)
            assert (answer.status, answer.json()["reason"]) == (400, reason), answer.text
            assert said in answer.json()["message"]
    assert gate_decisions(world, approval_id) == []
    assert world.inbox is not None
    assert world.inbox.rows("SELECT * FROM decisions") == []
    proc.stop()
