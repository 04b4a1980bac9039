"""Delegation (out of office) through the real daemon on loopback: check 11 lets a
delegate in on behalf of a principal in scope, recorded in the decisions row, the audit entry
and the approval object; one human counts once; no self-approval through a delegation;
expiry and SIGHUP on the gate's clock; dispatches name the delegates in force."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import (
    API_TOKEN,
    CaptureRelay,
    GateProcess,
    http_request,
    logged,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)
from tests.support import db as db_rows
from tests.support import decision_body as answer_to

ALICE, BOB, CAROL, OP04 = (
    "alice@example.com",
    "bob@example.com",
    "carol@example.com",
    "op04@example.com",
)
FAR = "2999-01-01T00:00:00Z"


def delegation(frm: int, to: int, until: str = FAR) -> dict[str, Any]:
    return {"from": frm, "to": to, "until": until, "reason": "out of office"}


def configure(path: Path, delegations: list[dict[str, Any]]) -> Path:
    """Set the ``delegations`` of the test config at ``path`` (written by ``write_config``)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["delegations"] = delegations
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def relay() -> Iterator[CaptureRelay]:
    capture = CaptureRelay().start()
    yield capture
    capture.stop()


def start(tmp_path: Path, relay: CaptureRelay, delegations: list[dict[str, Any]]) -> GateProcess:
    return GateProcess(configure(write_config(tmp_path, relay.url), delegations)).start()


@pytest.fixture
def stop() -> Iterator[list[GateProcess]]:
    started: list[GateProcess] = []
    yield started
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.stop()


def decide(gate: GateProcess, dispatch: dict[str, Any], identity: str, verb: str = "approve"):
    status, answer, _ = post_decision(gate.callback_url, answer_to(dispatch, identity, verb))
    return status, answer


def decision_entries(gate: GateProcess, approval_id: str) -> list[dict[str, Any]]:
    rows = db_rows(
        gate,
        "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'decision' ORDER BY seq",
        approval_id,
    )
    return [json.loads(entry)["data"] for (entry,) in rows]


def audit_verified(gate: GateProcess) -> None:
    proc = run_cli("audit", "verify", "-c", str(gate.config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.decode().startswith("ok: "), proc.stdout


def delegated_metric(gate: GateProcess) -> dict[str, float]:
    status, _, raw = http_request(
        gate.api_url + "/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"}
    )
    assert status == 200
    return {
        sample.labels["step"]: sample.value
        for family in text_string_to_metric_families(raw.decode("utf-8"))
        if family.name == "hitl_gate_delegated_decisions"
        for sample in family.samples
    }


@pytest.mark.e2e
def test_a_delegates_decision_is_recorded_on_behalf_of_the_principal(
    tmp_path: Path, relay: CaptureRelay, stop: list[GateProcess]
) -> None:
    gate = start(tmp_path, relay, [delegation(102, 104)])
    stop.append(gate)
    api = gate.api()
    approval_id = api.create("q2", body="pay the invoice")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    # the dispatch shows op04 the card, for bob
    assert dispatch["approvers"] == [ALICE, BOB, CAROL, OP04]
    assert dispatch["delegates"] == [{"identity": OP04, "on_behalf_of": BOB}]

    assert decide(gate, dispatch, ALICE) == (200, {"status": "recorded", "resolved": False})
    assert delegated_metric(gate) == {}
    assert decide(gate, dispatch, OP04) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    final = api.get(approval_id)
    assert [(d["operator_id"], d["identity"], d["on_behalf_of"]) for d in final["decisions"]] == [
        (101, ALICE, None),
        (104, OP04, {"operator_id": 102, "identity": BOB}),
    ]
    assert final["quorum"] == {"required": 2, "collected": 2}
    assert db_rows(
        gate,
        "SELECT operator_id, on_behalf_of FROM decisions WHERE approval_id = ?"
        " ORDER BY decision_id",
        approval_id,
    ) == [(101, None), (104, 102)]
    alice_entry, delegate_entry = decision_entries(gate, approval_id)
    assert "on_behalf_of" not in alice_entry  # written only for a delegate's decision
    assert (delegate_entry["operator_id"], delegate_entry["on_behalf_of"]) == (104, 102)
    resolved = db_rows(
        gate,
        "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'resolved'",
        approval_id,
    )
    assert json.loads(resolved[0][0])["data"]["approved_by"] == [101, 104]
    assert delegated_metric(gate) == {"q2": 1.0}
    logged(gate, "on_behalf_of=102")
    audit_verified(gate)
    # the cross-check reads the principal too: a row naming another one disagrees
    conn = sqlite3.connect(gate.config.parent / "gate.db")
    with conn:
        conn.execute("UPDATE decisions SET on_behalf_of = 103 WHERE operator_id = 104")
    conn.close()
    proc = run_cli("audit", "verify", "-c", str(gate.config))
    assert proc.returncode != 0
    assert (
        "'approve' by operator 104 on behalf of operator 103 on revision 1 is in the"
        in (proc.stdout + proc.stderr).decode()
    ), proc.stdout + proc.stderr


@pytest.mark.e2e
def test_one_human_counts_once_and_a_delegate_in_scope_decides_as_themselves(
    tmp_path: Path, relay: CaptureRelay, stop: list[GateProcess]
) -> None:
    # op04 stands in for alice and bob; bob (in scope himself) also stands in for carol
    gate = start(
        tmp_path, relay, [delegation(101, 104), delegation(102, 104), delegation(103, 102)]
    )
    stop.append(gate)
    api = gate.api()
    approval_id = api.create("q2", body="two humans, please")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    # one pair per delegate: the principal first in scope order; bob is in scope already
    assert dispatch["approvers"] == [ALICE, BOB, CAROL, OP04]
    assert dispatch["delegates"] == [{"identity": OP04, "on_behalf_of": ALICE}]

    assert decide(gate, dispatch, OP04) == (200, {"status": "recorded", "resolved": False})
    assert api.get(approval_id)["quorum"]["collected"] == 1
    status, answer = decide(gate, dispatch, OP04)
    assert (status, answer["reason"]) == (409, "duplicate")
    status, answer = decide(gate, dispatch, OP04, "skip")
    assert (status, answer["reason"]) == (409, "already_decided")
    assert api.get(approval_id)["quorum"]["collected"] == 1
    # bob decides as himself (in scope), not on carol's behalf; a principal deciding too is
    # a second human: the quorum of 2 is met
    assert decide(gate, dispatch, BOB) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    final = api.get(approval_id)
    assert [(d["operator_id"], d["on_behalf_of"]) for d in final["decisions"]] == [
        (104, {"operator_id": 101, "identity": ALICE}),
        (102, None),
    ]
    assert "on_behalf_of" not in decision_entries(gate, approval_id)[1]
    audit_verified(gate)


@pytest.mark.e2e
def test_no_self_approval_through_a_delegation(
    tmp_path: Path, relay: CaptureRelay, stop: list[GateProcess]
) -> None:
    gate = start(tmp_path, relay, [delegation(101, 104), delegation(102, 104)])
    stop.append(gate)
    api = gate.api()
    by_bob = api.create("q1", body="bob asks", requested_by=BOB)["approval_id"]
    by_op04 = api.create("q1", body="op04 asks", requested_by=OP04)["approval_id"]
    for approval_id in (by_bob, by_op04):
        dispatch = relay.wait_dispatch(approval_id)
        # op04 could not decide either: not shown the card, not named
        assert OP04 not in dispatch["approvers"] and "delegates" not in dispatch
        status, answer = decide(gate, dispatch, OP04)
        assert (status, answer["status"], answer["reason"]) == (403, "forbidden", "self_approval")
        assert api.get(approval_id)["decisions"] == []
    assert db_rows(gate, "SELECT COUNT(*) FROM decisions") == [(0,)]
    assert delegated_metric(gate) == {}


def utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.e2e
def test_sighup_adds_a_delegation_and_it_ends_at_until(
    tmp_path: Path, relay: CaptureRelay, stop: list[GateProcess]
) -> None:
    gate = start(tmp_path, relay, [])
    stop.append(gate)
    assert gate.proc is not None
    api = gate.api()
    first = api.create("q1", body="before the reload")["approval_id"]
    first_dispatch = relay.wait_dispatch(first)
    assert "delegates" not in first_dispatch
    status, answer = decide(gate, first_dispatch, OP04)
    assert (status, answer["reason"]) == (403, "approver_not_allowed")

    configure(gate.config, [delegation(101, 104)])
    gate.proc.send_signal(signal.SIGHUP)
    gate.wait_for_line(r"event=reloaded ")
    # the writer process's copy of the config has it too: the decision is accepted
    assert decide(gate, first_dispatch, OP04) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    assert api.get(first)["decisions"][0]["on_behalf_of"] == {
        "operator_id": 101,
        "identity": ALICE,
    }

    # a delegation ending a few seconds from now (whole seconds: RFC 3339 without fraction)
    until_ms = (int(time.time()) + 5) * 1000
    configure(gate.config, [delegation(101, 104, utc(until_ms))])
    gate.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: gate.log().count("event=reloaded ") == 2, what="the second reload")
    late = api.create("q1", body="after until")["approval_id"]
    late_dispatch = relay.wait_dispatch(late)
    wait_until(lambda: time.time() * 1000 > until_ms, timeout=30, what="until to pass")
    status, answer = decide(gate, late_dispatch, OP04)
    assert (status, answer["reason"]) == (403, "approver_not_allowed")
    assert api.get(late)["decisions"] == []
    # dispatched after until: no delegates, the envelope as without delegations
    after = api.create("q1", body="after until, dispatched")["approval_id"]
    envelope = relay.wait_dispatch(after)
    assert "delegates" not in envelope and envelope["approvers"] == [ALICE, BOB, CAROL]
    # the file still names the ended delegation: time passing must not break what reads it
    # (an ended delegation is check-config's error, everyone else's warning, and ignored)
    audit_verified(gate)
    gate.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: gate.log().count("event=reloaded ") == 3, what="the third reload")
    logged(gate, "event=delegation_ended warning=delegations[0].until: ")
    checked = run_cli("check-config", "-c", str(gate.config))
    assert checked.returncode == 2, checked.stderr
    assert (
        f"{gate.config}: delegations[0].until: {utc(until_ms)} is in the past".encode()
        in checked.stderr
    )
    # and a restart (systemd after a crash) starts, with the warning
    assert gate.stop() == 0
    again = GateProcess(gate.config).start()
    stop.append(again)
    again.wait_for_line(r"event=delegation_ended ")
    assert again.api().get(after)["state"] == "pending"
