"""A receipt-key rotation started on three gates at once, on one PostgreSQL database: the
rotation runs in the write batch under the ``audit_head`` lock, so one gate appends the one
``receipt_key_rotated`` entry and the others find the log already on the new key; a gate
still on the retired key then refuses to start, as on SQLite, and writes nothing. Real gate
processes on a throwaway server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.pg_server import pg_fixtures, psycopg_or_skip
from tests.support import CaptureRelay, GateProcess, decision_body, gate_env, run_cli
from tests.test_gate_on_postgres import (
    DB_PASSWORD,
    assert_log_whole,
    decide,
    gate_fixtures,
    pg_config,
    rows,
    start_together,
)

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
