"""Reasons ("request changes") end to end: a decision's ``reason`` through SPEC §2
check 12, the decisions table, the audit entry (``audit verify -c``), the approval object,
``request --wait`` and ``list``, and the dispatch of a ``skip_reason: required`` step.

One real daemon for the module (``python -m gate serve``) dispatching to a real capturing
relay on loopback; decisions are real signed envelopes; the SQLite file is read with the
stdlib. Synchronisation is by condition with a deadline, never by sleeping.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.protocol.envelope import ACTIONS
from tests.support import (
    IDENTITIES,
    CaptureRelay,
    CliProcess,
    GateProcess,
    decision_body,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

ALICE, BOB = IDENTITIES[:2]
MAX_INPUT_LENGTH = 50  # security.max_input_length of the test config
REASON = "Wrong amount: the invoice says 1.200 EUR\nPlease fix and ask again. Ünïcode ✓"
STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h"},
    {
        "name": "need",
        "quorum": 1,
        "approvers": [101, 102, 103],
        "timeout": "1h",
        "skip_reason": "required",
    },
]
RECORDED_PENDING = {"status": "recorded", "resolved": False}
SKIPPED = {"status": "recorded", "resolved": True, "outcome": "skipped"}
APPROVED = {"status": "recorded", "resolved": True, "outcome": "approved"}
REASON_REQUIRED = {"status": "invalid", "reason": "reason_required"}
REASON_TOO_LONG = {"status": "invalid", "reason": "reason_too_long"}


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(relay: CaptureRelay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    config = write_config(
        tmp_path_factory.mktemp("reasons"),
        relay.url,
        steps=STEPS,
        security={"max_input_length": MAX_INPUT_LENGTH * 4},  # room for REASON below
    )
    proc = GateProcess(config).start()
    yield proc
    assert proc.stop() == 0
    assert "Traceback" not in proc.log()
    assert REASON.splitlines()[0] not in proc.log()  # a reason is never logged


def db_path(gate: GateProcess) -> Path:
    storage = yaml.safe_load(gate.config.read_text(encoding="utf-8"))["storage"]["path"]
    return gate.config.parent / storage


def rows(gate: GateProcess, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db_path(gate)}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def counts(gate: GateProcess) -> tuple[int, int]:
    """(decisions rows, audit entries): what a refused decision must not change."""
    return (
        rows(gate, "SELECT COUNT(*) FROM decisions")[0][0],
        rows(gate, "SELECT COUNT(*) FROM audit_log")[0][0],
    )


def decision_entry(gate: GateProcess, approval_id: str) -> dict[str, Any]:
    """The ``data`` of the approval's one ``decision`` audit entry, as logged."""
    found = rows(
        gate, "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'decision'", approval_id
    )
    assert len(found) == 1
    data: dict[str, Any] = json.loads(found[0][0])["data"]
    return data


def open_approval(
    gate: GateProcess, relay: CaptureRelay, step: str = "q1"
) -> tuple[str, dict[str, Any]]:
    """Create an approval and wait for its dispatch and the gate's record of the ack (from
    then on only a decision changes the approval and its rows)."""
    api = gate.api()
    approval_id = api.create(step, "Hallo Anna,\nRechnung 2026-114 ist fällig.\n")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    wait_until(
        lambda: api.get(approval_id)["dispatch"]["delivered_at"] is not None,
        what=f"the ack of {approval_id} recorded",
    )
    return approval_id, dispatch


def decide(gate: GateProcess, body: dict[str, Any]) -> tuple[int, Any]:
    status, answer, _ = post_decision(gate.callback_url, body)
    return status, answer


def refused_unchanged(
    gate: GateProcess, approval_id: str, body: dict[str, Any], answer: dict[str, Any]
) -> None:
    """The decision is answered 422 ``answer`` and the approval, its rows and the log stay."""
    before, before_counts = gate.api().get(approval_id), counts(gate)
    assert decide(gate, body) == (422, answer)
    assert gate.api().get(approval_id) == before
    assert counts(gate) == before_counts


def request_cli(
    gate: GateProcess, step: str, *extra: str, draft: str = "Rechnung 2026-114: 1.240,00 €"
) -> CliProcess:
    return CliProcess(
        "request",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        step,
        "--draft",
        draft,
        "--wait",
        *extra,
    )


# ---- the dispatch -------------------------------------------------------------------------


def test_reasons_required_step_marks_the_skip_action_and_others_stay(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    _, need = open_approval(gate, relay, "need")
    _, plain = open_approval(gate, relay, "q1")

    assert need["actions"] == [
        {"verb": "approve"},
        {"verb": "skip", "reason": "required"},
        {"verb": "adjust", "accepts": "text"},
    ]
    assert plain["actions"] == ACTIONS
    assert not {"reminder", "escalation", "delegates", "awaiting"} & set(plain)


# ---- request --wait, --json, the approval object, the audit entry, list ---------------------


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_reasons_skip_reason_reaches_request_wait(
    gate: GateProcess, relay: CaptureRelay, as_json: bool
) -> None:
    cli = request_cli(gate, "need", *(["--json"] if as_json else []))
    approval_id = cli.wait_for_line(r"requested approval (\S+) ").group(1)
    dispatch = relay.wait_dispatch(approval_id)

    assert decide(gate, decision_body(dispatch, BOB, "skip", reason=REASON)) == (200, SKIPPED)

    code, stdout, stderr = cli.finish()
    assert code == 3, stderr
    first, second = REASON.split("\n")
    # the reason's second line is set in under the first: it reads as one reason, not as
    # another line of output
    assert f"skipped by {BOB}: {first}\n  {second}" in stderr
    if as_json:
        printed = json.loads(stdout)
        assert [(d["decision"], d["reason"]) for d in printed["decisions"]] == [("skip", REASON)]
    else:
        assert stdout == b""  # a skip prints no body, as before
    approval = gate.api().get(approval_id)
    assert [(d["identity"], d["reason"]) for d in approval["decisions"]] == [(BOB, REASON)]
    assert rows(gate, "SELECT reason FROM decisions WHERE approval_id = ?", approval_id) == [
        (REASON,)
    ]
    assert decision_entry(gate, approval_id)["reason"] == REASON


def test_reasons_quiet_request_still_prints_the_reason(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    draft = "quiet request: Rechnung 2026-115"
    cli = request_cli(gate, "q1", "--quiet", draft=draft)
    dispatch = wait_until(
        lambda: next((d for d in relay.dispatches() if d["draft"]["body"] == draft), None),
        what="the quiet request's dispatch",
    )

    body = decision_body(dispatch, ALICE, "skip", reason="no\x1b[2J")
    assert decide(gate, body) == (200, SKIPPED)
    code, stdout, stderr = cli.finish()
    assert (code, stdout) == (3, b"")
    assert stderr == f"skipped by {ALICE}: no<U+001B>[2J"  # a terminal escape is shown, not run


def test_reasons_audit_verify_covers_the_reason(gate: GateProcess, relay: CaptureRelay) -> None:
    approval_id, dispatch = open_approval(gate, relay, "q1")
    assert decide(gate, decision_body(dispatch, ALICE, "skip", reason="too late")) == (
        200,
        SKIPPED,
    )

    intact = run_cli("audit", "verify", "-c", str(gate.config))
    assert intact.returncode == 0, intact.stderr

    listed = run_cli(
        "list",
        "-c",
        str(gate.config),
        "--api-url",
        gate.api_url,
        "--state",
        "all",
        "--limit",
        "500",
    )
    assert listed.returncode == 0, listed.stderr
    line = next(li for li in listed.stdout.decode().splitlines() if li.startswith(approval_id))
    assert line.endswith('  reason "too late"')

    conn = sqlite3.connect(db_path(gate))
    try:
        with conn:
            conn.execute(
                "UPDATE decisions SET reason = 'looks fine' WHERE approval_id = ?", (approval_id,)
            )
        tampered = run_cli("audit", "verify", "-c", str(gate.config))
        with conn:
            conn.execute(
                "UPDATE decisions SET reason = 'too late' WHERE approval_id = ?", (approval_id,)
            )
    finally:
        conn.close()
    assert tampered.returncode == 1
    err = tampered.stdout.decode() + tampered.stderr.decode()
    assert approval_id in err
    assert re.search(
        r"the reason of the decision by operator 101 on revision 1 differs between the "
        r"decisions table and audit entry \d+",
        err,
    ), err
    assert "looks fine" not in err and "too late" not in err  # never quoted


# ---- check 12 ---------------------------------------------------------------------------


@pytest.mark.parametrize("reason", [None, "", " \t\n\u3000\u00a0"], ids=["none", "empty", "blank"])
def test_reasons_required_refuses_a_skip_without_one(
    gate: GateProcess, relay: CaptureRelay, reason: str | None
) -> None:
    approval_id, dispatch = open_approval(gate, relay, "need")
    extra = {} if reason is None else {"reason": reason}

    refused_unchanged(
        gate, approval_id, decision_body(dispatch, ALICE, "skip", **extra), REASON_REQUIRED
    )
    # a skip with a reason is taken
    assert decide(gate, decision_body(dispatch, ALICE, "skip", reason="x")) == (200, SKIPPED)


def test_reasons_too_long_is_refused_at_any_verb(gate: GateProcess, relay: CaptureRelay) -> None:
    limit = MAX_INPUT_LENGTH * 4
    approval_id, dispatch = open_approval(gate, relay, "q2")
    for verb in ("approve", "skip"):
        body = decision_body(dispatch, ALICE, verb, reason="é" * (limit + 1))
        refused_unchanged(gate, approval_id, body, REASON_TOO_LONG)

    assert decide(gate, decision_body(dispatch, ALICE, "approve", reason="é" * limit)) == (
        200,
        RECORDED_PENDING,
    )
    assert gate.api().get(approval_id)["decisions"][0]["reason"] == "é" * limit


def test_reasons_blank_reason_is_stored_null(gate: GateProcess, relay: CaptureRelay) -> None:
    approval_id, dispatch = open_approval(gate, relay, "q1")

    assert decide(gate, decision_body(dispatch, ALICE, "skip", reason=" \t\u2003")) == (
        200,
        SKIPPED,
    )
    assert rows(gate, "SELECT reason FROM decisions WHERE approval_id = ?", approval_id) == [
        (None,)
    ]
    assert "reason" not in decision_entry(gate, approval_id)
    assert gate.api().get(approval_id)["decisions"][0]["reason"] is None


def test_reasons_decision_without_reason_is_recorded_as_before(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    approval_id, dispatch = open_approval(gate, relay, "q1")

    assert decide(gate, decision_body(dispatch, ALICE, "approve")) == (200, APPROVED)
    assert set(decision_entry(gate, approval_id)) == {
        "operator_id",
        "decision",
        "revision",
        "payload_hash",
        "nonce",
        "effect",
    }
    assert rows(gate, "SELECT reason FROM decisions WHERE approval_id = ?", approval_id) == [
        (None,)
    ]
    assert gate.api().get(approval_id)["decisions"][0]["reason"] is None
