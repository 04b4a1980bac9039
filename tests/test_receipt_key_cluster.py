"""A receipt-key rotation started on three gates at once, on one PostgreSQL database: the
rotation runs in the write batch under the ``audit_head`` lock, so one gate appends the one
``receipt_key_rotated`` entry and the others find the log already on the new key; a gate
still on the retired key then refuses to start, as on SQLite, and writes nothing. In a
rolling rotation, a gate not restarted yet appends nothing after the rotation: it answers
503 ``receipt_key_retired`` until restarted with the new key. Real gate processes on a
throwaway server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.pg_server import pg_fixtures, psycopg_or_skip
from tests.support import (
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    logged,
    run_cli,
    wait_until,
)
from tests.test_gate_on_postgres import (
    DB_PASSWORD,
    assert_log_whole,
    decide,
    gate_fixtures,
    healthz,
    pg_config,
    rows,
    start_together,
)
from tests.test_receipt_key import RETIRED_AT

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()

server, url = pg_fixtures()
relay = gate_fixtures()[0]
OLD = "receipt-key-old-5b1e0c9d3a7f2e64"
NEW = "receipt-key-new-a7d42f1c8e0b5d93"
REFUSAL = (
    "receipts.key_env: HITL_RECEIPT_KEY does not verify the newest audit entry's "
    "receipt (seq {seq}); a typo? To rotate the key, set receipts.previous_key_env to "
    "the variable holding the old key"
)


def rotating(path: Path) -> Path:
    """``path``'s config with the rotation declared (``receipts.previous_key_env``)."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["receipts"]["previous_key_env"] = "HITL_RECEIPT_KEY_OLD"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def test_receipt_key_rotation_on_three_gates_at_once_writes_one_entry(
    tmp_path: Path, relay: CaptureRelay, url: str
) -> None:
    old_env = gate_env(HITL_DB_PASSWORD=DB_PASSWORD, HITL_RECEIPT_KEY=OLD)
    first = GateProcess(pg_config(tmp_path / "old", relay, url), env=old_env).start()
    approval_id = first.api().create("q1")["approval_id"]
    assert decide(first, decision_body(relay.wait_dispatch(approval_id)))[0] == 200
    first.api().wait_resolved(approval_id)
    first.stop()
    (last_old,) = rows(url, "SELECT max(seq) FROM audit_log")[0]

    env = gate_env(HITL_DB_PASSWORD=DB_PASSWORD, HITL_RECEIPT_KEY=NEW, HITL_RECEIPT_KEY_OLD=OLD)
    paths = [rotating(pg_config(tmp_path / name, relay, url)) for name in "abc"]
    gates = start_together([GateProcess(path, env=env) for path in paths])
    try:
        rotated = rows(url, "SELECT seq, entry FROM audit_log WHERE kind = 'receipt_key_rotated'")
        assert len(rotated) == 1, rotated
        assert rotated[0][0] == last_old + 1
        assert f'"previous_key_last_seq":{last_old}' in rotated[0][1]
        approval_id = gates[2].api().create("q1")["approval_id"]  # the gates go on writing
        assert decide(gates[1], decision_body(relay.wait_dispatch(approval_id)))[0] == 200
        gates[0].api().wait_resolved(approval_id)
    finally:
        for gate in gates:
            gate.stop()
    (newest,) = rows(url, "SELECT max(seq) FROM audit_log")[0]

    # a gate still on the retired key: refused, as on SQLite, and nothing written
    retired = pg_config(tmp_path / "retired", relay, url)
    done = run_cli("serve", "-c", str(retired), env=old_env)
    assert done.returncode == 2
    refusal = f"{retired}: {REFUSAL.format(seq=newest)}"
    assert done.stderr.decode().splitlines() == [refusal]
    assert rows(url, "SELECT max(seq) FROM audit_log") == [(newest,)]
    log = assert_log_whole(url, keys=(OLD, NEW))
    assert [row.kind for row in log].count("receipt_key_rotated") == 1


RETIRED = (
    "another gate rotated the receipt key; restart this gate with receipts.key_env "
    "holding the new key"
)


def rolling(
    tmp_path: Path, relay: CaptureRelay, url: str
) -> tuple[dict[str, str], dict[str, str], Path, Path]:
    """A rolling rotation's two environments (the old key alone; the new key with the old as
    the previous one) and two gates' configs on ``url``."""
    old_env = gate_env(HITL_DB_PASSWORD=DB_PASSWORD, HITL_RECEIPT_KEY=OLD)
    new_env = gate_env(HITL_DB_PASSWORD=DB_PASSWORD, HITL_RECEIPT_KEY=NEW, HITL_RECEIPT_KEY_OLD=OLD)
    path_a, path_b = (pg_config(tmp_path / name, relay, url) for name in "ab")
    return old_env, new_env, path_a, path_b


def test_rolling_rotation_a_gate_not_restarted_appends_nothing_until_restarted(
    tmp_path: Path, relay: CaptureRelay, url: str
) -> None:
    old_env, new_env, path_a, path_b = rolling(tmp_path, relay, url)
    a, b = start_together([GateProcess(path_a, env=old_env), GateProcess(path_b, env=old_env)])
    try:
        b.api().create("q1")
        a.stop()  # the rolling rotation, step 1: gate a restarted with the new key
        a = GateProcess(rotating(path_a), env=new_env).start()
        assert rows(url, "SELECT count(*) FROM audit_log WHERE kind = 'receipt_key_rotated'") == [
            (1,)
        ]
        # the rotation entry (gate a, now the lease holder, may append after it: an ack)
        ((newest,),) = rows(url, "SELECT seq FROM audit_log WHERE kind = 'receipt_key_rotated'")

        # gate b still holds the old key: its next heartbeat finds the rotation, so its
        # /healthz is 503 (the balancer drains it, the timers go to another gate) before any
        # write was refused; it appends nothing after the rotation entry
        wait_until(lambda: healthz(b)[0] == 503, what="gate b's /healthz 503 without a write")
        for _ in range(2):
            status, answer = b.api().call(
                "POST",
                "/v1/approvals",
                {
                    "pipeline": "p",
                    "step": "q1",
                    "draft": {"content_type": "text/plain", "body": "x"},
                },
            )
            assert status == 503, (status, answer)
            assert answer == {
                "status": "unavailable",
                "reason": "receipt_key_retired",
                "message": RETIRED,
            }
        assert rows(url, "SELECT count(*) FROM audit_log WHERE kind = 'created'") == [(1,)]
        assert healthz(b) == (
            503,
            {"status": "unavailable", "reason": "receipt_key_retired", "message": RETIRED},
        )
        assert logged(b, "event=receipt_key_retired") == 1
        verified = run_cli("audit", "verify", "-c", str(path_a), env=new_env)
        assert verified.returncode == 0, verified.stderr
        doctor = run_cli("doctor", "-c", str(path_b), env=old_env, timeout=60).stdout.decode()
        assert "FAIL audit: " + RETIRED_AT.format(seq=newest) in doctor.splitlines(), doctor

        # the rolling rotation, step 2: gate b restarted the same way starts and writes
        b.stop()
        b = GateProcess(rotating(path_b), env=new_env).start()
        approval_id = b.api().create("q1")["approval_id"]
        assert decide(a, decision_body(relay.wait_dispatch(approval_id)))[0] == 200
        b.api().wait_resolved(approval_id)
        assert healthz(b)[0] == 200
    finally:
        a.stop()
        b.stop()
    log = assert_log_whole(url, keys=(OLD, NEW))
    assert [row.kind for row in log].count("receipt_key_rotated") == 1


def test_rolling_rotation_a_gate_not_restarted_gives_up_the_timers_lease(
    tmp_path: Path, relay: CaptureRelay, url: str
) -> None:
    old_env, new_env, path_a, path_b = rolling(tmp_path, relay, url)
    b = GateProcess(path_b, env=old_env).start()  # alone: it takes the timers' lease
    b.wait_for_line("event=lease_acquired")
    a = GateProcess(rotating(path_a), env=new_env).start()  # a rotates; b keeps the lease
    try:
        assert "event=lease_acquired" not in a.log()
        # a's approval is dispatched by the lease holder: b cannot write, so it stands aside
        approval_id = a.api().create("q1")["approval_id"]
        relay.wait_dispatch(approval_id)
        assert logged(b, "event=receipt_key_retired") == 1
        assert logged(b, "event=lease_released") == 1
        assert logged(a, "event=lease_acquired") == 1
    finally:
        a.stop()
        b.stop()
    assert_log_whole(url, keys=(OLD, NEW))
