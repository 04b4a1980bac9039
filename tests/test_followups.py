"""Reminders and escalation levels: the schedule.

Three layers, none mocked: the pure due computation (``gate.core.approvals.followups``) with
explicit times; ``GateService`` over a real Store with a ManualClock (both writers, as
tests/test_core.py) for the follow-up transaction, check 11 on the widened scope and ``audit
verify``'s records check; and the real daemon (``python -m gate serve``) with the capturing
relay, reading the real SQLite file, across a ``kill -9``. The sender of ``followup_outbox``
rows is not part of this schedule: these tests read the rows it is given.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.audit.verify import verify_database
from gate.core.approvals.followups import Plan, due, next_followup_at, plan_for, reminders_reached
from tests.support import (
    GateProcess,
    decision_body,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)
from tests.test_core import (  # noqa: F401  (fixtures)
    BOB,
    CAROL,
    NOW_MS,
    RECEIPT_KEY,
    Gate,
    MakeGate,
    make_gate,
    writer_process,
)
from tests.test_e2e_lifecycle import epoch
from tests.test_metrics import scrape, value

S = 1000  # ms

# remind 1 s then every 1 s; level 1 (bob) at 2 s, level 2 (carol) at 3 s; timeout 10 s
PLAN = Plan(1 * S, 1 * S, ((2 * S, ((102, BOB),)), (3 * S, ((103, CAROL),))))
T0, EXPIRES = NOW_MS, NOW_MS + 10 * S

FU_STEP = {
    "name": "fu",
    "quorum": 1,
    "approvers": [101],
    "timeout": "10s",
    "remind_after": "1s",
    "remind_every": "1s",
    "escalate": [{"after": "2s", "to": [102]}, {"after": "3s", "to": [103]}],
}


# =========================================================================== pure schedule


def test_plan_for_resolves_levels_against_operators_and_allowed_users() -> None:
    plan = plan_for(1.0, 1.0, ((2.0, (102, 999)), (3.0, (103,))), {102: BOB, 103: CAROL}, {102})
    assert plan == Plan(1000, 1000, ((2000, ((102, BOB),)), (3000, ())))
    assert Plan.from_json(plan.to_json()) == plan
    assert plan_for(None, None, (), {}, set()) is None  # nothing frozen: followups stays NULL
    # remind_every alone (StepConfig.first_reminder_s): the first after one interval
    assert plan_for(5.0, 5.0, (), {}, set()) == Plan(5000, 5000, ())
    assert PLAN.without(102).levels == ((2000, ()), (3000, ((103, CAROL),)))


def test_first_followup_is_the_earlier_of_reminder_and_level() -> None:
    assert next_followup_at(PLAN, T0, EXPIRES, 0, 0) == T0 + 1 * S
    no_reminders = Plan(None, None, PLAN.levels)
    assert next_followup_at(no_reminders, T0, EXPIRES, 0, 0) == T0 + 2 * S
    assert next_followup_at(no_reminders, T0, EXPIRES, 0, 2) is None  # every level applied
    assert next_followup_at(None, T0, EXPIRES, 0, 0) is None
    # nothing is due at or after expires_at: expiry wins
    assert next_followup_at(PLAN, T0, T0 + 1 * S, 0, 0) is None


def test_due_applies_each_level_once_in_order_and_one_reminder() -> None:
    assert due(PLAN, T0, EXPIRES, 0, 0, T0 + 999) == due(PLAN, T0, EXPIRES, 0, 0, T0)
    assert due(PLAN, T0, EXPIRES, 0, 0, T0 + 999).levels == ()
    first = due(PLAN, T0, EXPIRES, 0, 0, T0 + 1 * S)
    assert (first.levels, first.reminder, first.next_at) == ((), 1, T0 + 2 * S)
    second = due(PLAN, T0, EXPIRES, 1, 0, T0 + 2 * S)
    assert (second.levels, second.reminder, second.next_at) == ((1,), 2, T0 + 3 * S)
    # after a downtime: both levels in order, the missed reminders coalesce into one
    late = due(PLAN, T0, EXPIRES, 0, 0, T0 + 5 * S + 500)
    assert (late.levels, late.reminder, late.next_at) == ((1, 2), 5, T0 + 6 * S)
    # once applied, neither is due again at the same time
    again = due(PLAN, T0, EXPIRES, 5, 2, T0 + 5 * S + 500)
    assert (again.levels, again.reminder, again.next_at) == ((), 0, T0 + 6 * S)
    # past the last reminder before expiry nothing more is planned
    assert due(PLAN, T0, EXPIRES, 0, 0, EXPIRES + 5 * S).next_at is None
    assert reminders_reached(PLAN, T0, EXPIRES, EXPIRES + 5 * S) == 9  # 1..9 s, not 10 s


def test_a_single_reminder_without_remind_every() -> None:
    once = Plan(3 * S, None, ())
    assert reminders_reached(once, T0, EXPIRES, T0 + 9 * S) == 1
    found = due(once, T0, EXPIRES, 0, 0, T0 + 9 * S)
    assert (found.reminder, found.next_at) == (1, None)


# =========================================================================== service, ManualClock


async def followup_rows(gate: Gate, approval_id: str) -> list[tuple[str, int, int, int]]:
    conn = sqlite3.connect(f"file:{gate.config.storage.path}?mode=ro", uri=True)
    try:
        return [
            (str(k), int(n), int(r), int(g))
            for k, n, r, g in conn.execute(
                "SELECT kind, n, revision, give_up_at FROM followup_outbox WHERE approval_id = ?"
                " ORDER BY rowid",
                (approval_id,),
            )
        ]
    finally:
        conn.close()


def approvals_row(path: Path, approval_id: str) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        row = conn.execute("SELECT * FROM approvals WHERE approval_id = ?", (approval_id,))
        return dict(row.fetchone())
    finally:
        conn.close()


def escalated_entries(path: Path, approval_id: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [
            json.loads(entry)["data"]
            for (entry,) in conn.execute(
                "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'escalated'"
                " ORDER BY seq",
                (approval_id,),
            )
        ]
    finally:
        conn.close()


async def test_followups_scope_widens_and_reminders_wait_for_the_ack(make_gate: MakeGate) -> None:  # noqa: F811
    gate = await make_gate(steps=[FU_STEP])
    view = await gate.create("fu")
    approval_id = view["approval_id"]
    assert (view["reminders_sent"], view["escalation"]) == (0, None)
    row = approvals_row(gate.config.storage.path, approval_id)
    assert Plan.from_json(row["followups"]) == PLAN
    assert row["next_followup_at"] == NOW_MS + 1 * S

    # 1 s: the reminder comes due while the dispatch is not acked: counted, not queued
    gate.clock.advance(1)
    assert await gate.service.followups_due() == (0, 0)
    assert await followup_rows(gate, approval_id) == []
    assert (await gate.service.get(approval_id))["reminders_sent"] == 1
    refused = await gate.refused(approval_id, BOB)
    assert (refused.status, refused.code) == (403, "approver_not_allowed")

    # acked; 2 s: level 1 (bob) and reminder 2, in one transaction
    await gate.service.dispatch_result(
        approval_id, 1, acked=True, error=None, retry_at_ms=NOW_MS + 60 * S
    )
    gate.clock.advance(1)
    assert await gate.service.followups_due() == (1, 1)
    assert await followup_rows(gate, approval_id) == [
        ("escalation", 1, 1, EXPIRES),
        ("reminder", 2, 1, EXPIRES),
    ]
    assert await gate.service.followups_due() == (0, 0)  # nothing due twice
    view = await gate.service.get(approval_id)
    assert view["escalation"] == {"level": 1, "approvers": ["alice@example.com", BOB]}
    assert view["approvers"] == ["alice@example.com", BOB]
    refused = await gate.refused(approval_id, CAROL)  # level 2 not yet
    assert (refused.status, refused.code) == (403, "approver_not_allowed")

    # 4.5 s at once: level 2 and one reminder (4; 3 coalesced)
    gate.clock.advance(2.5)
    assert await gate.service.followups_due() == (1, 1)
    assert [r[:2] for r in await followup_rows(gate, approval_id)][2:] == [
        ("escalation", 2),
        ("reminder", 4),
    ]
    assert escalated_entries(gate.config.storage.path, approval_id) == [
        {"level": 1, "added": [102], "approvers": [101, 102]},
        {"level": 2, "added": [103], "approvers": [101, 102, 103]},
    ]
    row = approvals_row(gate.config.storage.path, approval_id)
    assert (row["escalation_level"], row["reminders_sent"]) == (2, 4)
    assert row["next_followup_at"] == NOW_MS + 5 * S

    answer = await gate.decide(approval_id, CAROL)
    assert answer == {"status": "recorded", "resolved": True, "outcome": "approved"}
    gate.clock.advance(1)
    assert await gate.service.followups_due() == (0, 0)  # resolved: out of the index
    report = verify_database(gate.config.storage.path, RECEIPT_KEY)
    assert report.ok and report.records is not None and report.records.checked == 1, report


async def test_a_step_without_followups_writes_its_row_as_before(
    make_gate: MakeGate,  # noqa: F811
) -> None:
    gate = await make_gate()
    approval_id = (await gate.create("q1"))["approval_id"]
    row = approvals_row(gate.config.storage.path, approval_id)
    assert (row["followups"], row["next_followup_at"]) == (None, None)
    gate.clock.advance(3600)
    assert await gate.service.followups_due() == (0, 0)


async def test_records_check_names_a_scope_widened_without_its_escalated_entry(
    make_gate: MakeGate,  # noqa: F811
) -> None:
    gate = await make_gate(steps=[FU_STEP])
    await gate.create("fu")
    gate.clock.advance(2)
    await gate.service.followups_due()
    await gate.store.close()
    conn = sqlite3.connect(gate.config.storage.path)
    conn.execute("DELETE FROM audit_log WHERE kind = 'escalated'")  # the newest entry
    conn.commit()
    conn.close()
    report = verify_database(gate.config.storage.path, RECEIPT_KEY)
    assert report.records is not None and report.records.problem is not None, report
    assert "scope holds operators [101, 102]" in report.records.problem[1]
    await gate.store.open()


# =========================================================================== real daemon


def e2e_config(tmp_path: Path, relay_url: str, step: dict[str, Any]) -> Path:
    return write_config(tmp_path, relay_url, steps=[step])


def db_rows(config: Path, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    path = config.parent / yaml.safe_load(config.read_text(encoding="utf-8"))["storage"]["path"]
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def queued(config: Path, approval_id: str) -> list[tuple[str, int, int]]:
    """``(kind, n, next_attempt_at)`` of the approval's follow-up rows, in insertion order."""
    return [
        (str(k), int(n), int(at))
        for k, n, at in db_rows(
            config,
            "SELECT kind, n, next_attempt_at FROM followup_outbox WHERE approval_id = ?"
            " ORDER BY rowid",
            (approval_id,),
        )
    ]


E2E_STEP = dict(
    FU_STEP, timeout="30s", escalate=[{"after": "3s", "to": [102]}, {"after": "4s", "to": [103]}]
)


@pytest.mark.e2e
@pytest.mark.slow
def test_daemon_reminds_and_escalates_in_order(tmp_path, relay, spawn) -> None:  # noqa: F811
    config = e2e_config(tmp_path, relay.url, E2E_STEP)
    gate = spawn(config)
    api = gate.api()
    approval_id = api.create("fu", "please look")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, BOB))
    level_after = db_rows(
        config, "SELECT escalation_level FROM approvals WHERE approval_id = ?", (approval_id,)
    )[0][0]
    assert level_after == 0  # refused while bob was still outside the scope
    assert (status, answer["reason"]) == (403, "approver_not_allowed"), answer

    wait_until(
        lambda: ("escalation", 2) in [r[:2] for r in queued(config, approval_id)],
        timeout=15,
        what="escalation level 2 queued",
    )
    rows = queued(config, approval_id)
    levels = [(n, at) for kind, n, at in rows if kind == "escalation"]
    assert [n for n, _ in levels] == [1, 2] and levels[0][1] < levels[1][1]
    reminders = [(n, at) for kind, n, at in rows if kind == "reminder"]
    assert reminders and [n for n, _ in reminders] == sorted({n for n, _ in reminders})
    assert all(a[1] < b[1] for a, b in zip(reminders, reminders[1:], strict=False))
    entries = [
        json.loads(e)["data"]
        for (e,) in db_rows(
            config,
            "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'escalated' ORDER BY seq",
            (approval_id,),
        )
    ]
    assert entries == [
        {"level": 1, "added": [102], "approvers": [101, 102]},
        {"level": 2, "added": [103], "approvers": [101, 102, 103]},
    ]
    view = api.get(approval_id)
    assert view["escalation"]["level"] == 2 and view["reminders_sent"] >= 1
    listed = run_cli("list", "-c", str(config), "--api-url", gate.api_url)
    assert listed.returncode == 0, listed.stderr
    assert re.search(
        rf"^{approval_id} .* reminded \d+  escalated level 2$", listed.stdout.decode(), re.M
    ), listed.stdout
    # the oldest pending age per step, read at the scrape
    families, samples = scrape(gate)
    age = value(samples, "hitl_gate_step_oldest_pending_age_seconds", pipeline="p", step="fu")
    assert 4 <= age <= time.time() - epoch(view["created_at"]) + 0.01
    assert families["hitl_gate_step_oldest_pending_age_seconds"].documentation

    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, BOB))
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )
    proc = run_cli("audit", "verify", "-c", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_kill9_never_queues_a_level_twice_nor_skips_one(tmp_path, relay, spawn) -> None:  # noqa: F811
    config = e2e_config(tmp_path, relay.url, E2E_STEP)
    gate: GateProcess = spawn(config)
    api = gate.api()
    approval_id = api.create("fu", "please look")["approval_id"]
    created_at = db_rows(
        config, "SELECT created_at FROM approvals WHERE approval_id = ?", (approval_id,)
    )[0][0]
    wait_until(
        lambda: ("escalation", 1) in [r[:2] for r in queued(config, approval_id)],
        timeout=15,
        what="escalation level 1 queued",
    )
    gate.kill9()
    before = queued(config, approval_id)
    # the gate is down while level 2 (4 s) and more reminder times pass
    wait_until(lambda: time.time() * 1000 > created_at + 5500, what="level 2 due while down")
    restarted = spawn(config)
    wait_until(
        lambda: ("escalation", 2) in [r[:2] for r in queued(config, approval_id)],
        timeout=15,
        what="escalation level 2 queued after the restart",
    )
    after = queued(config, approval_id)
    assert after[: len(before)] == before  # nothing queued before the kill was lost or redone
    kinds = [r[:2] for r in after]
    assert len(kinds) == len(set(kinds))
    assert [n for kind, n in kinds if kind == "escalation"] == [1, 2]
    # the missed reminders coalesced: one reminder row after the restart, counting them all
    new_reminders = [n for kind, n, _ in after[len(before) :] if kind == "reminder"]
    assert new_reminders and new_reminders[0] >= 5, after
    levels = [
        json.loads(e)["data"]["level"]
        for (e,) in db_rows(
            config,
            "SELECT entry FROM audit_log WHERE approval_id = ? AND kind = 'escalated' ORDER BY seq",
            (approval_id,),
        )
    ]
    assert levels == [1, 2]
    assert restarted.api().get(approval_id)["escalation"]["level"] == 2
    restarted.stop()
    proc = run_cli("audit", "verify", "-c", str(config))
    assert proc.returncode == 0, proc.stdout + proc.stderr
