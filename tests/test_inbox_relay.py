"""The inbox as a hitl/v0 relay: a real gate dispatching to a real
``hitl-gate inbox serve``, its SQLite file read as it is on disk."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.inbox.credentials_cache import CredentialsCache
from gate.inbox.gate_client import GateRefused, GateUnreachable, fetch_credentials
from gate.inbox.gate_client import post_decision as post_decision_async
from gate.protocol.canonical import payload_hash, wire_json
from tests.support import (
    OLD_SECRET,
    SECRET,
    CliProcess,
    GateProcess,
    as_json,
    decision_body,
    free_port,
    http_request,
    logged,
    post_decision,
    sign_headers,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]
READY = r"event=inbox_ready url=(\S+) relay_url=(\S+)"


class Inbox:
    """``hitl-gate inbox serve`` on a fixed port (the gate's relay.url must outlive a
    restart) with its database in ``folder``."""

    def __init__(self, folder: Path, port: int) -> None:
        self.config = folder / "inbox.yaml"
        self.db = folder / "var" / "inbox.db"
        self.config.write_text(
            yaml.safe_dump(
                {
                    "listen": f"127.0.0.1:{port}",
                    "gate": {
                        "secret_env": "HITL_RELAY_SECRET",
                        "callback_url": "http://127.0.0.1:9/",
                    },
                }
            ),
            encoding="utf-8",
        )
        self.relay_url = f"http://127.0.0.1:{port}/hitl/v0/relay"
        self.proc: CliProcess | None = None

    def start(self) -> Inbox:
        self.proc = CliProcess("inbox", "serve", "-c", str(self.config))
        match = self.proc.wait_for_line(READY)
        assert match.group(2) == self.relay_url
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.proc.poll() is None:
            assert self.proc.stop() == 0, self.proc.log()

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.proc.kill()
        self.proc.proc.wait(20)

    def rows(self, sql: str, *args: Any) -> list[sqlite3.Row]:
        """Read the inbox's file as it is on disk (a connection of the test's own)."""
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def item(self, approval_id: str) -> sqlite3.Row | None:
        found = self.rows("SELECT * FROM items WHERE approval_id = ?", approval_id)
        return found[0] if found else None

    def wait_item(self, approval_id: str, check: Callable[[sqlite3.Row], bool]) -> sqlite3.Row:
        def ready() -> sqlite3.Row | None:
            if not self.db.exists():
                return None
            row = self.item(approval_id)
            return row if row is not None and check(row) else None

        return wait_until(ready, what=f"inbox row of {approval_id}")


@pytest.fixture
def inbox(tmp_path: Path) -> Iterator[Inbox]:
    box = Inbox(tmp_path, free_port()).start()
    yield box
    box.stop()


@pytest.fixture
def gate(tmp_path: Path, inbox: Inbox) -> Iterator[GateProcess]:
    folder = tmp_path / "gate"
    folder.mkdir()
    config = write_config(
        folder, inbox.relay_url, steps=STEPS, relay={"notices": True, "questions": True}
    )
    proc = GateProcess(config).start()
    yield proc
    proc.stop()


def dispatch_of(row: sqlite3.Row) -> dict[str, Any]:
    return dict(json.loads(row["dispatch"]))


def test_inbox_keeps_a_dispatch_exactly_as_received(gate: GateProcess, inbox: Inbox) -> None:
    approval = gate.api().create("q1", body="Pay 12 EUR to ACME\u202e\n")

    row = inbox.wait_item(approval["approval_id"], lambda r: True)

    text = row["dispatch"]
    assert wire_json(json.loads(text)) == text.encode("utf-8")  # the gate's bytes, unchanged
    sent = json.loads(text)
    assert sent["draft"]["body"] == "Pay 12 EUR to ACME\u202e\n"
    assert (row["kind"], row["revision"], row["state"]) == ("approval", 1, "pending")
    assert row["payload_hash"] == payload_hash("Pay 12 EUR to ACME\u202e\n")
    assert row["nonce"] == sent["callback"]["nonce"]
    assert row["previous_body"] is None and row["outcome"] is None
    # the gate saw the ack (200 after the commit)
    wait_until(lambda: gate.api().get(approval["approval_id"])["dispatch"]["delivered_at"])


def test_inbox_refuses_a_bad_signature_and_keeps_nothing(inbox: Inbox) -> None:
    envelope = {"protocol": "hitl/v0", "approval_id": "01FORGED", "draft": {"body": "x"}}
    raw = wire_json(envelope)

    status, _, answer = http_request(
        inbox.relay_url, "POST", raw, sign_headers(raw, secret="another-secret-0123456789abcdef")
    )
    stale, _, stale_answer = http_request(
        inbox.relay_url, "POST", raw, sign_headers(raw, t=1_000_000_000)
    )
    missing, _, missing_answer = http_request(inbox.relay_url, "POST", raw, {})

    assert (status, as_json(answer)) == (
        401,
        {"status": "unauthorized", "reason": "signature_mismatch"},
    )
    assert (stale, as_json(stale_answer)["reason"]) == (401, "timestamp_out_of_window")
    assert (missing, as_json(missing_answer)["reason"]) == (401, "signature_missing")
    assert inbox.rows("SELECT COUNT(*) FROM items")[0][0] == 0
    assert inbox.proc is not None
    logged(inbox.proc, "event=dispatch_refused reason=signature_mismatch")


def test_inbox_refuses_a_signed_dispatch_it_cannot_use(inbox: Inbox) -> None:
    raw = wire_json({"protocol": "hitl/v0", "approval_id": "01X", "callback": {"url": "u"}})

    status, _, answer = http_request(inbox.relay_url, "POST", raw, sign_headers(raw))
    other, _, other_answer = http_request(inbox.relay_url, "POST", b"[1]", sign_headers(b"[1]"))

    assert (status, as_json(answer)) == (
        400,
        {"status": "invalid", "reason": "invalid_dispatch", "field": "callback.nonce"},
    )
    assert (other, as_json(other_answer)["reason"]) == (400, "invalid_protocol")
    assert inbox.rows("SELECT COUNT(*) FROM items")[0][0] == 0


def test_inbox_a_resent_dispatch_is_acked_again_without_a_second_item(
    gate: GateProcess, inbox: Inbox
) -> None:
    approval = gate.api().create("q1", body="once")
    row = inbox.wait_item(approval["approval_id"], lambda r: True)
    raw = row["dispatch"].encode("utf-8")

    status, _, answer = http_request(inbox.relay_url, "POST", raw, sign_headers(raw))
    # a rotated secret: the gate signs with the old one too during a rotation (here: not
    # configured at the inbox, so refused)
    old, _, _ = http_request(inbox.relay_url, "POST", raw, sign_headers(raw, secret=OLD_SECRET))

    assert (status, as_json(answer)) == (200, {"status": "ok"})
    assert old == 401
    again = inbox.rows("SELECT * FROM items")
    assert len(again) == 1
    assert again[0]["updated_seq"] == row["updated_seq"]  # nothing changed


def test_inbox_an_adjust_replaces_the_revision_and_keeps_the_body_before(
    gate: GateProcess, inbox: Inbox
) -> None:
    approval = gate.api().create("q2", body="Dear Anna,\nold text\n")
    first = inbox.wait_item(approval["approval_id"], lambda r: True)
    decision = decision_body(
        dispatch_of(first), "alice@example.com", "adjust", adjust_text="Dear Anna,\nnew text\n"
    )

    status, answer, _ = post_decision(gate.callback_url, decision)

    assert (status, answer["status"]) == (200, "recorded"), answer
    second = inbox.wait_item(approval["approval_id"], lambda r: r["revision"] == 2)
    assert second["previous_body"] == "Dear Anna,\nold text\n"
    assert dispatch_of(second)["draft"]["body"] == "Dear Anna,\nnew text\n"
    assert second["payload_hash"] == payload_hash("Dear Anna,\nnew text\n")
    assert second["nonce"] != first["nonce"]
    assert second["state"] == "pending"
    assert second["updated_seq"] > first["updated_seq"]
    assert inbox.rows("SELECT COUNT(*) FROM items")[0][0] == 1


def test_inbox_a_cancel_notice_closes_the_item(gate: GateProcess, inbox: Inbox) -> None:
    approval = gate.api().create("q1", body="to be withdrawn")
    inbox.wait_item(approval["approval_id"], lambda r: True)

    status, _ = gate.api().call("POST", f"/v1/approvals/{approval['approval_id']}/cancel")

    assert status == 200
    row = inbox.wait_item(approval["approval_id"], lambda r: r["state"] != "pending")
    assert (row["state"], row["outcome"]) == ("cancelled", "cancelled")


def test_inbox_keeps_a_question_as_received_and_its_notice_closes_it(
    gate: GateProcess, inbox: Inbox
) -> None:
    body = {"pipeline": "p", "step": "ask", "text": "Which supplier?", "response_type": "free_text"}
    status, question = gate.api().call("POST", "/v1/questions", body)
    assert status == 201, question
    qid = question["question_id"]

    row = inbox.wait_item(qid, lambda r: True)
    sent = dispatch_of(row)
    assert (row["kind"], row["revision"], row["payload_hash"]) == (
        "question",
        1,
        sent["request_hash"],
    )
    assert sent["question"]["text"] == "Which supplier?"
    assert gate.api().call("POST", f"/v1/questions/{qid}/cancel")[0] == 200
    closed = inbox.wait_item(qid, lambda r: r["state"] != "pending")
    assert (closed["state"], closed["outcome"]) == ("cancelled", "cancelled")


def test_inbox_restarted_with_items_pending_keeps_them(gate: GateProcess, inbox: Inbox) -> None:
    ids = [gate.api().create("q1", body=f"item {n}")["approval_id"] for n in range(3)]
    for approval_id in ids:
        inbox.wait_item(approval_id, lambda r: True)

    inbox.stop()
    inbox.start()

    assert {r["approval_id"] for r in inbox.rows("SELECT * FROM items")} == set(ids)
    assert gate.api().call("POST", f"/v1/approvals/{ids[0]}/cancel")[0] == 200
    # the restarted inbox holds them: the notice closes the one it names
    inbox.wait_item(ids[0], lambda r: r["state"] == "cancelled")
    assert {
        r["state"] for r in inbox.rows("SELECT * FROM items WHERE approval_id != ?", ids[0])
    } == {"pending"}


def test_inbox_killed_right_after_an_ack_has_the_row(gate: GateProcess, inbox: Inbox) -> None:
    approval = gate.api().create("q1", body="acked means kept")
    wait_until(
        lambda: gate.api().get(approval["approval_id"])["dispatch"]["delivered_at"],
        what="the gate to see the inbox's ack",
    )

    inbox.kill9()

    row = inbox.item(approval["approval_id"])
    assert row is not None and row["state"] == "pending"
    assert json.loads(row["dispatch"])["draft"]["body"] == "acked means kept"


def test_inbox_gate_client_posts_a_signed_decision_and_never_retries_an_answer(
    gate: GateProcess, inbox: Inbox
) -> None:
    approval = gate.api().create("q1", body="approve me")
    row = inbox.wait_item(approval["approval_id"], lambda r: True)
    sent = dispatch_of(row)
    decision = decision_body(sent, "bob@example.com", "approve")

    status, answer = asyncio.run(post_decision_async(sent["callback"]["url"], decision, SECRET))
    again = asyncio.run(post_decision_async(sent["callback"]["url"], decision, SECRET))

    assert (status, answer["status"], answer["resolved"]) == (200, "recorded", True)
    assert again == (409, again[1]) and again[1]["reason"] in ("duplicate", "already_resolved")
    assert gate.api().get(approval["approval_id"])["outcome"] == "approved"
    closed = inbox.wait_item(approval["approval_id"], lambda r: r["state"] != "pending")
    assert (closed["state"], closed["outcome"]) == ("resolved", "approved")


def test_inbox_gate_client_retries_only_an_unreachable_gate() -> None:
    url = f"http://127.0.0.1:{free_port()}/hitl/v0/decisions"  # nothing listens there

    with pytest.raises(GateUnreachable, match="cannot reach the gate"):
        asyncio.run(post_decision_async(url, {"protocol": "hitl/v0"}, SECRET))


@pytest.mark.e2e
def test_inbox_gate_client_fetches_the_credentials_the_gate_serves(
    tmp_path: Path, inbox: Inbox, caplog: pytest.LogCaptureFixture
) -> None:
    """The credentials channel end to end: off by default (404 from the gate), then with
    ``relay.credentials: true`` a signed answer the client verifies; a wrong secret is
    refused by the gate (401)."""
    folder = tmp_path / "gate2"
    folder.mkdir()
    off = GateProcess(
        write_config(folder, inbox.relay_url, steps=STEPS, relay={"questions": True})
    ).start()
    try:
        base = off.callback_url.removesuffix("/hitl/v0/decisions")
        with pytest.raises(GateRefused) as refused:
            asyncio.run(fetch_credentials(base, [SECRET], 300))
        assert refused.value.status == 404
        # the log line says what the gate answered and where
        cache = CredentialsCache(lambda: fetch_credentials(base, [SECRET], 300), None)
        with caplog.at_level(logging.WARNING, logger="gate.inbox.credentials_cache"):
            assert asyncio.run(cache.refresh()) is False
        line = " ".join(
            r.getMessage() for r in caplog.records if "credentials_unavailable" in r.getMessage()
        )
        assert f"404 {refused.value.reason}" in line and refused.value.reason
        assert f"{base}/hitl/v0/credentials" in line
        assert SECRET not in line
    finally:
        off.stop()
    on = GateProcess(
        write_config(
            folder, inbox.relay_url, steps=STEPS, relay={"credentials": True, "questions": True}
        )
    ).start()
    try:
        base = on.callback_url.removesuffix("/hitl/v0/decisions")
        answer = asyncio.run(fetch_credentials(base, [SECRET], 300))
        assert answer.credentials == ()  # none enrolled yet
        assert answer.webauthn is not None and answer.webauthn.rp_id == "localhost"
        with pytest.raises(GateRefused) as wrong:
            asyncio.run(fetch_credentials(base, ["another-secret-of-32-bytes-000000"], 300))
        assert (wrong.value.status, wrong.value.reason) == (401, "signature_mismatch")
        assert str(wrong.value) == (
            f"the gate answered 401 signature_mismatch at {base}/hitl/v0/credentials"
        )
    finally:
        on.stop()


def test_inbox_refuses_a_question_whose_text_does_not_hash_to_its_request_hash(
    gate: GateProcess, inbox: Inbox
) -> None:
    """The reference relay refuses 400 ``request_hash_mismatch``; the inbox
    kept such a question (session 11 review): with the relay secret, a dispatch could show
    one question while the answer's echoed hash covered another."""
    body = {"pipeline": "p", "step": "ask", "text": "Which supplier?", "response_type": "free_text"}
    status, question = gate.api().call("POST", "/v1/questions", body)
    assert status == 201, question
    sent = dispatch_of(inbox.wait_item(question["question_id"], lambda r: True))
    forged = dict(sent, question_id="01FORGEDQUESTION000000000", question=dict(sent["question"]))
    forged["question"]["text"] = "Pay the other supplier?"
    raw = wire_json(forged)

    status, _, answer = http_request(inbox.relay_url, "POST", raw, sign_headers(raw))

    assert (status, as_json(answer)) == (
        400,
        {"status": "invalid", "reason": "request_hash_mismatch"},
    )
    assert inbox.item("01FORGEDQUESTION000000000") is None
    assert inbox.proc is not None
    logged(inbox.proc, "event=dispatch_refused reason=request_hash_mismatch")
