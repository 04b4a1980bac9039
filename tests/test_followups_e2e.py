"""Reminders and escalation reaching a relay, end to end.

The real daemon (``python -m gate serve``) and a real HTTP peer on loopback that records
every POST (a ``CaptureRelay`` that refuses the first attempt of reminder 1), real signed
decisions, the real SQLite file read with the stdlib module. What is asserted is what the
relay received, in order, and once, across a ``kill -9`` of the gate between escalation
levels 1 and 2; then the decision of a level-2 operator, and silence after the resolution
but for exactly one notice. tests/test_followups.py covers the schedule (rows queued);
tests/test_notices.py the notice itself.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from gate.protocol import signing
from tests.support import (
    SECRET,
    CaptureRelay,
    decision_body,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"

# remind at 1 s then every 1 s; level 1 (bob) at 2 s, level 2 (carol) at 5 s: 3 s between
# the levels for the kill -9 and the restart to fall in (level 2 may come due while the
# gate is down: then it is applied when it starts)
STEP = {
    "name": "fu",
    "quorum": 1,
    "approvers": [101],
    "timeout": "30s",
    "remind_after": "1s",
    "remind_every": "1s",
    "escalate": [{"after": "2s", "to": [102]}, {"after": "5s", "to": [103]}],
}


class RefusingRelay(CaptureRelay):
    """A ``CaptureRelay`` that answers 503 to the first attempt of each follow-up listed in
    ``refuse_once`` (``(kind, n)``, kind ``reminder`` or ``escalation``) and ``status`` to
    everything else; every POST is recorded with the status it got."""

    def __init__(self, refuse_once: set[tuple[str, int]]) -> None:
        super().__init__()
        self.refuse_once = set(refuse_once)

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        key = followup_key(json.loads(raw))
        with self._cond:
            status = self.status
            if key in self.refuse_once:
                self.refuse_once.discard(key)
                status = 503
            self.received.append(
                {"headers": dict(request.headers), "raw": raw, "status": status, "at": time.time()}
            )
            self._cond.notify_all()
        return web.json_response({"status": "ok"}, status=status)

    def records(self) -> list[dict[str, Any]]:
        """Every POST so far, in arrival order: the envelope plus ``status`` and ``headers``."""
        with self._cond:
            return [
                dict(
                    json.loads(r["raw"]), _status=r["status"], _headers=r["headers"], _raw=r["raw"]
                )
                for r in self.received
            ]


def followup_key(envelope: dict[str, Any]) -> tuple[str, int]:
    """``(kind, n)`` of a POST: ``("dispatch", revision)``, ``("reminder", n)``,
    ``("escalation", level)`` or ``("notice", 1)``."""
    if envelope.get("type") == "notice":
        return ("notice", 1)
    if "reminder" in envelope:
        return ("reminder", int(envelope["reminder"]))
    if "escalation" in envelope:
        return ("escalation", int(envelope["escalation"]))
    return ("dispatch", int(envelope.get("revision", 1)))


@pytest.fixture
def refusing_relay() -> Iterator[RefusingRelay]:
    """A relay that refuses reminder 1's first attempt (503), stopped after the test."""
    r = RefusingRelay({("reminder", 1)}).start()
    yield r
    r.stop()


def db_rows(config: Path, sql: str, *args: Any) -> list[sqlite3.Row]:
    """Rows read from the gate's SQLite file (read-only, stdlib)."""
    db = config.parent / yaml.safe_load(config.read_text(encoding="utf-8"))["storage"]["path"]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def outbox(config: Path, approval_id: str) -> list[sqlite3.Row]:
    """The approval's ``followup_outbox`` rows, in insertion order."""
    return db_rows(
        config, "SELECT * FROM followup_outbox WHERE approval_id = ? ORDER BY rowid", approval_id
    )


def acked_keys(relay: RefusingRelay, approval_id: str) -> list[tuple[str, int]]:
    """``(kind, n)`` of every POST about ``approval_id`` the relay acked, in arrival order."""
    return [
        followup_key(r)
        for r in relay.records()
        if r["approval_id"] == approval_id and 200 <= r["_status"] < 300
    ]


@pytest.mark.e2e
@pytest.mark.slow
def test_reminders_and_levels_reach_the_relay_in_order_and_once_across_kill9(
    tmp_path, refusing_relay, spawn
) -> None:
    relay = refusing_relay
    config = write_config(tmp_path, relay.url, steps=[STEP], relay={"notices": True})
    gate = spawn(config)
    approval_id = gate.api().create("fu", "please look")["approval_id"]
    first = relay.wait_dispatch(approval_id)
    assert "reminder" not in first and "escalation" not in first
    assert first["approvers"] == [ALICE]

    # level 1 and reminder 1 (refused once, then sent again) delivered: all rows acked
    wait_until(
        lambda: ("escalation", 1) in acked_keys(relay, approval_id),
        what="escalation 1 at the relay",
    )
    # carol is level 2's: refused now, and nothing changes
    status, answer, _ = post_decision(gate.callback_url, decision_body(first, CAROL))
    assert (status, answer["reason"]) == (403, "approver_not_allowed"), answer
    assert (
        db_rows(
            config, "SELECT escalation_level FROM approvals WHERE approval_id = ?", approval_id
        )[0][0]
        == 1
    )  # it was refused before level 2, not after
    wait_until(
        lambda: all(r["delivered_at"] is not None for r in outbox(config, approval_id)),
        what="every follow-up queued so far delivered",
    )
    gate.kill9()
    delivered_before = {
        (r["kind"], r["n"]) for r in outbox(config, approval_id) if r["delivered_at"] is not None
    }
    received_before = len(relay.records())
    assert ("reminder", 1) in delivered_before and ("escalation", 1) in delivered_before

    restarted = spawn(config)
    wait_until(
        lambda: ("escalation", 2) in acked_keys(relay, approval_id),
        timeout=25,
        what="escalation 2 at the relay after the restart",
    )
    second = [r for r in relay.records() if followup_key(r) == ("escalation", 2)][0]
    status, answer, _ = post_decision(restarted.callback_url, decision_body(second, CAROL))
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    resolved_ms = time.time() * 1000
    received_at_resolution = len(relay.records())

    # exactly one notice; then nothing more while two reminders would have come due
    wait_until(
        lambda: ("notice", 1) in acked_keys(relay, approval_id), what="the resolution notice"
    )
    wait_until(lambda: time.time() * 1000 > resolved_ms + 2500, what="2.5 s past the resolution")
    restarted.stop()

    records = [r for r in relay.records() if r["approval_id"] == approval_id]
    keys = [followup_key(r) for r in records if 200 <= r["_status"] < 300]
    after_restart = [followup_key(r) for r in relay.records()[received_before:]]
    # nothing delivered before the kill was sent again after it
    assert not delivered_before & set(after_restart), (delivered_before, after_restart)
    # each acked once; the first dispatch first, the notice last
    assert len(keys) == len(set(keys)), keys
    assert keys[0] == ("dispatch", 1) and keys[-1] == ("notice", 1), keys
    assert [n for kind, n in keys if kind == "escalation"] == [1, 2]
    reminders = [n for kind, n in keys if kind == "reminder"]
    assert reminders[:1] == [1] and reminders == sorted(reminders), keys
    # the refused attempt of reminder 1 was the only non-2xx answer, and it came again
    refused = [followup_key(r) for r in records if r["_status"] == 503]
    assert refused == [("reminder", 1)]
    row = {(r["kind"], r["n"]): r for r in outbox(config, approval_id)}[("reminder", 1)]
    assert row["attempts"] == 2 and row["failed_at"] is None

    # follow-ups are the first dispatch again: same nonce, revision, hash; signed
    scopes = {0: [ALICE], 1: [ALICE, BOB], 2: [ALICE, BOB, CAROL]}
    level = 0
    for record in records:
        body = record["_raw"]
        header = record["_headers"]["X-Draftcat-Signature"]
        parsed = signing.parse(header)
        signing.check_hmac(parsed, body, [SECRET])  # raises unless signed with the secret
        kind, n = followup_key(record)
        if kind in ("dispatch", "notice"):
            continue
        assert record["callback"]["nonce"] == first["callback"]["nonce"]
        assert (record["revision"], record["payload_hash"]) == (1, first["payload_hash"])
        assert record["draft"] == first["draft"]
        if kind == "escalation":
            level = n
            assert record["approvers"] == scopes[n], record
        else:
            # widened as of its level (never narrower than the last level seen)
            assert record["approvers"] in scopes.values(), record
            assert len(record["approvers"]) >= len(scopes[level])
            assert record["awaiting"] == record["approvers"]  # nobody decided yet
    # nothing about the approval after the resolution but the notice
    late = [
        followup_key(r)
        for r in relay.records()[received_at_resolution:]
        if r["approval_id"] == approval_id
    ]
    assert late == [("notice", 1)], late
    notice = [r for r in records if followup_key(r) == ("notice", 1)]
    assert len(notice) == 1 and notice[0]["outcome"] == "approved"
    assert notice[0]["decided_by"] == [
        {"identity": CAROL, "decision": "approve", "on_behalf_of": None}
    ]
    proc = run_cli("audit", "verify", "-c", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
