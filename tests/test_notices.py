"""Resolution notices: a relay that opted in gets a signed POST when an approval
resolves; one that did not gets none; retries, restarts and the reference relay.

Real daemon (``python -m gate serve``), real HTTP peers on loopback, the real SQLite file.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.daemon.approval_dispatch import dispatch_envelope
from gate.daemon.followups import awaiting, followup_envelope, notice_envelope
from gate.protocol import signing
from gate.protocol.times import rfc3339
from tests.support import (
    SECRET,
    CaptureRelay,
    GateProcess,
    decision_body,
    http_request,
    post_decision,
    wait_until,
    write_config,
)

NOTICE_KEYS = [
    "protocol",
    "type",
    "approval_id",
    "run_id",
    "pipeline",
    "step",
    "outcome",
    "resolved_at",
    "revision",
    "payload_hash",
    "decided_by",
    "reason",
]


def db_rows(config: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    """Rows read from the gate's SQLite file with the stdlib module (read-only)."""
    db = config.parent / yaml.safe_load(config.read_text(encoding="utf-8"))["storage"]["path"]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def notices(relay: CaptureRelay, approval_id: str, acked_only: bool = True) -> list[dict[str, Any]]:
    """The notice POSTs ``relay`` received about ``approval_id`` (raw records)."""
    with relay._cond:
        records = list(relay.received)
    return [
        r
        for r in records
        if json.loads(r["raw"]).get("type") == "notice"
        and json.loads(r["raw"])["approval_id"] == approval_id
        and (not acked_only or 200 <= r["status"] < 300)
    ]


def wait_notice(relay: CaptureRelay, approval_id: str) -> dict[str, Any]:
    """Wait for an acked notice about ``approval_id``; return its raw record."""
    found: list[dict[str, Any]] = wait_until(
        lambda: notices(relay, approval_id), what=f"a notice of {approval_id}"
    )
    return found[0]


def notice_row(config: Path, approval_id: str) -> sqlite3.Row | None:
    rows = db_rows(
        config,
        "SELECT * FROM followup_outbox WHERE approval_id = ? AND kind = 'notice'",
        approval_id,
    )
    return rows[0] if rows else None


# ---- the notice body (pure: the envelope builders over stored values) -------------------


def test_notice_envelope_names_deciders_principals_and_the_resolving_reason():
    from gate.model import Approval, DecisionRow, Revision

    full = Approval(
        approval_id="01KDWZ8B00J3Q9V5X7Z2M4N6PR",
        run_id="run-7",
        pipeline="p",
        step="q2",
        risk="normal",
        content_type="text/plain",
        quorum_required=2,
        scope=((101, "alice@example.com"), (102, "bob@example.com")),
        budget=None,
        spend=None,
        revision=2,
        state="resolved",
        outcome="skipped",
        created_at=1_767_225_600_000,
        expires_at=1_767_240_000_000,
        resolved_at=1_767_225_605_000,
        idempotency_key=None,
        request_hash="h",
        receipt=None,
        requested_by=None,
        requested_by_id=None,
        allow_self_approval=False,
        permit=None,
        revisions=(
            Revision(1, "a", "sha256:1", "n1", 1_767_225_600_000, None),
            Revision(2, "b", "sha256:2", "n2", 1_767_225_601_000, 101),
        ),
        decisions=(),
    )
    adjust = DecisionRow(
        1, 101, "Alice@example.com", None, None, "adjust", "sha256:1", "b", "t", 0, reason="typo"
    )
    skip = DecisionRow(
        2, 999, "dave@example.com", None, None, "skip", "sha256:2", None, "t", 0,
        reason="Wrong amount", on_behalf_of=102,
    )  # fmt: skip
    full = _replace(full, decisions=(adjust, skip))

    body = notice_envelope(full)

    assert list(body) == NOTICE_KEYS
    assert body["type"] == "notice" and "callback" not in body and "nonce" not in body
    assert body["decided_by"] == [
        {"identity": "Alice@example.com", "decision": "adjust", "on_behalf_of": None},
        {"identity": "dave@example.com", "decision": "skip", "on_behalf_of": "bob@example.com"},
    ]
    assert body["reason"] == "Wrong amount"
    assert (body["revision"], body["payload_hash"]) == (2, "sha256:2")
    assert body["resolved_at"] == rfc3339(1_767_225_605_000)
    # nobody is awaited on revision 2: alice made it, dave decided for bob
    assert awaiting(full) == ()
    assert awaiting(_replace(full, decisions=(adjust,))) == ("bob@example.com",)
    cancelled = notice_envelope(
        _replace(full, outcome="cancelled", decisions=(_replace(adjust, revision=2),))
    )
    assert cancelled["reason"] is None  # a cancel or a timeout has no deciding reason
    with pytest.raises(ValueError, match="not resolved"):
        notice_envelope(_replace(full, state="pending", outcome=None, resolved_at=None))
    pending = _replace(full, state="pending", decisions=(adjust,))
    base = dispatch_envelope(pending, 2, "https://g/hitl/v0/decisions")
    reminder = followup_envelope(base, pending, "reminder", 2)
    assert (reminder["reminder"], reminder["awaiting"]) == (2, ["bob@example.com"])
    assert reminder["callback"]["nonce"] == "n2" and reminder["revision"] == 2
    escalation = followup_envelope(
        dispatch_envelope(full, 2, "https://g/hitl/v0/decisions"), full, "escalation", 1
    )
    assert escalation["escalation"] == 1 and "reminder" not in escalation


def _replace(full: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(full, **changes)


# ---- over the wire ---------------------------------------------------------------------


@pytest.mark.e2e
def test_notices_reach_an_opted_in_relay_signed_for_every_outcome(tmp_path, relay, spawn):
    config = write_config(tmp_path, relay.url, relay={"notices": True})
    gate = spawn(config)
    api = gate.api()
    approved = api.create("q1", "approve me", run_id="run-a")
    skipped = api.create("q2", "skip me")
    cancelled = api.create("q1", "cancel me")
    timed_out = api.create("short", "let me expire")
    for approval in (approved, skipped, cancelled, timed_out):
        relay.wait_dispatch(approval["approval_id"])

    dispatch = relay.wait_dispatch(approved["approval_id"])
    assert post_decision(gate.callback_url, decision_body(dispatch))[0] == 200
    dispatch = relay.wait_dispatch(skipped["approval_id"])
    assert post_decision(gate.callback_url, decision_body(dispatch, "bob@example.com"))[0] == 200
    assert post_decision(gate.callback_url, decision_body(dispatch, verb="skip"))[0] == 200
    status, _ = api.call("POST", f"/v1/approvals/{cancelled['approval_id']}/cancel")
    assert status == 200

    expected = {
        approved["approval_id"]: ("approved", [("alice@example.com", "approve")]),
        skipped["approval_id"]: (
            "skipped",
            [("bob@example.com", "approve"), ("alice@example.com", "skip")],
        ),
        cancelled["approval_id"]: ("cancelled", []),
        timed_out["approval_id"]: ("timeout", []),
    }
    for approval_id, (outcome, deciders) in expected.items():
        record = wait_notice(relay, approval_id)
        signing.verify(
            record["headers"].get("X-Draftcat-Signature"), record["raw"], [SECRET], time.time(), 300
        )
        assert record["headers"]["X-Hitl-Protocol"] == "hitl/v0"
        body = json.loads(record["raw"])
        final = api.get(approval_id)
        assert list(body) == NOTICE_KEYS
        assert body["type"] == "notice" and "callback" not in body and "draft" not in body
        assert (body["outcome"], body["revision"]) == (outcome, 1)
        assert body["payload_hash"] == final["payload_hash"]
        assert body["resolved_at"] == final["resolved_at"]
        assert (body["pipeline"], body["step"], body["run_id"]) == (
            "p",
            final["step"],
            final["run_id"],
        )
        assert [(d["identity"], d["decision"]) for d in body["decided_by"]] == deciders
        assert all(d["on_behalf_of"] is None for d in body["decided_by"])
        assert body["reason"] is None
        row = wait_until(
            lambda a=approval_id: (
                (r := notice_row(config, a)) is not None and r["delivered_at"] is not None and r
            ),
            what="the notice recorded as delivered",
        )
        assert (row["n"], row["revision"], row["failed_at"]) == (1, 1, None)
        assert row["give_up_at"] - row["next_attempt_at"] <= 3_600_000
    # a notice is sent once: the relay acked it
    assert all(len(notices(relay, a, acked_only=False)) == 1 for a in expected)
    status, _, raw = http_request(
        gate.api_url + "/metrics", headers={"Authorization": f"Bearer {gate.api().token}"}
    )
    assert status == 200
    assert 'hitl_gate_notices_total{result="delivered"} 4.0' in raw.decode()


@pytest.mark.e2e
def test_no_notice_goes_to_a_relay_that_did_not_opt_in(gate, relay):
    approval = gate.api().create("q1", "no notice for me")
    dispatch = relay.wait_dispatch(approval["approval_id"])
    assert post_decision(gate.callback_url, decision_body(dispatch))[0] == 200
    gate.api().wait_resolved(approval["approval_id"])

    # the notice would have been queued in the resolving transaction: there is none
    assert db_rows(gate.config, "SELECT * FROM followup_outbox") == []
    assert all("callback" in body for body in relay.dispatches(acked_only=False))


@pytest.mark.e2e
def test_notice_url_gets_the_notice_and_the_relay_url_only_dispatches(tmp_path, relay, spawn):
    notice_peer = CaptureRelay().start()
    try:
        config = write_config(tmp_path, relay.url, relay={"notice_url": notice_peer.url})
        gate = spawn(config)
        approval_id = gate.api().create("q1", "tell the other URL")["approval_id"]
        dispatch = relay.wait_dispatch(approval_id)
        assert post_decision(gate.callback_url, decision_body(dispatch, verb="skip"))[0] == 200

        body = json.loads(wait_notice(notice_peer, approval_id)["raw"])
        assert body["outcome"] == "skipped"
        assert notice_peer.dispatches() == [body]
        assert all("callback" in b for b in relay.dispatches(acked_only=False))
    finally:
        notice_peer.stop()


@pytest.mark.e2e
def test_a_refused_notice_is_sent_again_until_acked(tmp_path, relay, spawn):
    config = write_config(tmp_path, relay.url, relay={"notices": True})
    gate = spawn(config)
    approval_id = gate.api().create("q1", "retry the notice")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    relay.status = 503
    assert post_decision(gate.callback_url, decision_body(dispatch))[0] == 200

    wait_until(
        lambda: len(notices(relay, approval_id, acked_only=False)) >= 2,
        what="the notice refused twice",
    )
    relay.status = 202
    wait_notice(relay, approval_id)
    row = wait_until(
        lambda: (r := notice_row(config, approval_id))["delivered_at"] is not None and r,
        what="the notice recorded as delivered",
    )
    assert row["attempts"] >= 3
    assert row["failed_at"] is None


@pytest.mark.e2e
def test_kill9_before_delivery_keeps_the_notice_and_sends_it_after_restart(tmp_path, relay, spawn):
    config = write_config(tmp_path, relay.url, relay={"notices": True})
    gate = spawn(config)
    approval_id = gate.api().create("q1", "survive the crash")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    relay.status = 503
    assert post_decision(gate.callback_url, decision_body(dispatch))[0] == 200
    wait_until(
        lambda: (r := notice_row(config, approval_id)) is not None and r["attempts"] >= 1,
        what="a refused notice attempt recorded",
    )
    gate.kill9()
    killed_at = time.time()

    relay.status = 202
    spawn(config)
    record = wait_notice(relay, approval_id)
    assert record["at"] > killed_at
    assert json.loads(record["raw"])["outcome"] == "approved"
    wait_until(
        lambda: notice_row(config, approval_id)["delivered_at"] is not None,
        what="the notice recorded as delivered after the restart",
    )


# ---- the reference relay ---------------------------------------------------------------


@pytest.mark.e2e
def test_reference_relay_drops_the_prompt_of_an_approval_resolved_elsewhere(tmp_path):
    from tests.test_relay_terminal import ONE_KEY_PROMPT, PtyRelay, Tap

    relay = PtyRelay("--as", "alice@example.com")
    tap = Tap(relay.url)
    gate = GateProcess(write_config(tmp_path, tap.url, relay={"notices": True})).start()
    try:
        api = gate.api()
        skipped = api.create("q1", "Bob skips this elsewhere\n")["approval_id"]
        relay.wait_screen(ONE_KEY_PROMPT)
        dispatch = tap.dispatch(skipped, 1)
        status, _, _ = post_decision(
            gate.callback_url, decision_body(dispatch, "bob@example.com", "skip")
        )
        assert status == 200
        mark = relay.wait_screen(
            f"Approval {skipped} resolved elsewhere: skipped by bob@example.com;"
            " not asking any more."
        ).end()

        cancelled = api.create("q1", "The pipeline withdraws this\n")["approval_id"]
        mark = relay.wait_screen(ONE_KEY_PROMPT, relay.wait_screen("withdraws", mark).end()).end()
        assert api.call("POST", f"/v1/approvals/{cancelled}/cancel")[0] == 200
        mark = relay.wait_screen(
            f"Approval {cancelled} resolved elsewhere: cancelled; not asking any more.", mark
        ).end()

        answered = api.create("q1", "Alice answers this one\n")["approval_id"]
        mark = relay.wait_screen(ONE_KEY_PROMPT, relay.wait_screen("answers", mark).end()).end()
        relay.type("a\n")
        assert api.wait_resolved(answered)["outcome"] == "approved"
        relay.wait_screen("Recorded: approved; the approval is resolved.", mark)
        relay.wait_log(rf"event=notice_received approval_id={answered} outcome=approved")

        # a notice is never a request: three drafts were shown, and an unsigned one is refused
        assert relay.screen.count(ONE_KEY_PROMPT) == 3
        unsigned = json.dumps({"protocol": "hitl/v0", "type": "notice"}).encode()
        status, _, answer = http_request(
            relay.url,
            "POST",
            unsigned,
            {"Content-Type": "application/json", "X-Hitl-Protocol": "hitl/v0"},
        )
        assert status == 401, answer
    finally:
        tap.shutdown()
        tap.server_close()
        gate.stop()
    assert relay.stop() == 0
    assert "answer=409" not in relay.log() and "answer=410" not in relay.log()


@pytest.mark.e2e
def test_reference_relay_drops_the_prompt_of_a_question_resolved_elsewhere(tmp_path):
    """A question's resolution notice (kind question) closes its prompt."""
    from tests.test_relay_terminal import PtyRelay

    relay = PtyRelay("--as", "alice@example.com")
    steps = [{"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"}]
    config = write_config(
        tmp_path, relay.url, steps=steps, relay={"notices": True, "questions": True}
    )
    gate = GateProcess(config).start()
    try:
        body = {"pipeline": "p", "step": "ask", "text": "Which PO?", "response_type": "free_text"}
        status, question = gate.api().call("POST", "/v1/questions", body)
        assert status == 201, question
        qid = question["question_id"]
        mark = relay.wait_screen("Your answer (one line): ").end()
        assert gate.api().call("POST", f"/v1/questions/{qid}/cancel")[0] == 200
        relay.wait_screen(
            f"Question {qid} resolved elsewhere: cancelled; not asking any more.", mark
        )
        relay.wait_log(rf"event=notice_received question_id={qid} outcome=cancelled")
    finally:
        gate.stop()
    assert relay.stop() == 0


@pytest.mark.e2e
def test_reminder_and_escalation_rows_are_sent_as_the_current_dispatch_or_dropped(gate, relay):
    """The sender's side of the ``followup_outbox`` contract: rows queued as the
    scheduler queues them (here written into the file by the test) go out as the current
    revision's dispatch plus their fields; a row of a resolved approval is dropped."""
    api = gate.api()
    pending = api.create("q2", "remind us")["approval_id"]
    first = relay.wait_dispatch(pending)
    assert post_decision(gate.callback_url, decision_body(first, "bob@example.com"))[0] == 200
    done = api.create("q1", "already answered")["approval_id"]
    assert post_decision(gate.callback_url, decision_body(relay.wait_dispatch(done)))[0] == 200
    api.wait_resolved(done)
    db = gate.config.parent / "gate.db"
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        now = int(time.time() * 1000)
        rows = [
            (pending, "reminder", 1, now, now + 3_600_000),
            (pending, "escalation", 1, now, now + 3_600_000),
            (done, "reminder", 1, now, now + 3_600_000),
        ]
        conn.executemany(
            "INSERT INTO followup_outbox (approval_id, kind, n, revision, next_attempt_at,"
            " give_up_at) VALUES (?, ?, ?, 1, ?, ?)",
            rows,
        )
    finally:
        conn.close()
    api.create("q1", "wake the dispatcher")  # a new dispatch wakes its loop

    def sent(field: str) -> dict[str, Any] | None:
        return next(
            (b for b in relay.dispatches() if b["approval_id"] == pending and field in b), None
        )

    reminder = wait_until(lambda: sent("reminder"), what="the reminder")
    escalation = wait_until(lambda: sent("escalation"), what="the escalation")
    assert reminder["callback"]["nonce"] == first["callback"]["nonce"]
    assert (reminder["reminder"], reminder["awaiting"]) == (
        1,
        ["alice@example.com", "carol@example.com"],
    )
    assert reminder["quorum"] == {"required": 2, "collected": 1}
    # the dispatch as it stands now: the same request, with the quorum collected so far
    same = {k: v for k, v in reminder.items() if k not in ("reminder", "awaiting", "quorum")}
    assert same == {k: v for k, v in first.items() if k != "quorum"}
    assert escalation["escalation"] == 1 and "reminder" not in escalation
    dropped = wait_until(
        lambda: [
            r
            for r in db_rows(
                gate.config, "SELECT * FROM followup_outbox WHERE approval_id = ?", done
            )
            if r["failed_at"] is not None
        ],
        what="the reminder of a resolved approval dropped",
    )
    assert (dropped[0]["last_error"], dropped[0]["attempts"]) == ("resolved", 0)
    assert not [
        b
        for b in relay.dispatches(acked_only=False)
        if b["approval_id"] == done and "reminder" in b
    ]
    wait_until(
        lambda: all(
            r["delivered_at"] is not None
            for r in db_rows(
                gate.config, "SELECT * FROM followup_outbox WHERE approval_id = ?", pending
            )
        ),
        what="reminder and escalation recorded as delivered",
    )
