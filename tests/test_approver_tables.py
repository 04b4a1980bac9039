"""The review's F1 (2026-12-01): someone who can write the database file can swap
an approver's key, move it to another operator, add a key the log never enrolled, or turn a
pending approval's frozen ``approver_signature`` off. The gate reads those tables when it
decides, so ``audit verify -c`` compares them with the verified log and names what differs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gate.protocol.approver_signature import b64url
from tests.support import GateProcess, run_cli, write_config
from tests.test_approver_keys import ENV, STEPS, db_of, enrol, new_key


def verify(gate: GateProcess) -> tuple[int, str]:
    proc = run_cli("audit", "verify", "-c", str(gate.config), env=ENV)
    return proc.returncode, (proc.stdout + proc.stderr).decode()


@pytest.mark.e2e
def test_verify_compares_credentials_and_frozen_modes_with_the_log(
    tmp_path: Path, relay: Any
) -> None:
    config = write_config(
        tmp_path, relay.url, steps=STEPS, api={"admin_token_env": "HITL_ADMIN_TOKEN"}
    )
    gate = GateProcess(config, env=ENV).start()
    _, alice_pub = new_key(tmp_path, "alice")
    _, bob_pub = new_key(tmp_path, "bob")
    alice_id = enrol(gate, 101, alice_pub)
    bob_id = enrol(gate, 102, bob_pub)
    revoked = run_cli(
        "approvers", "revoke", "-c", str(config), "--api-url", gate.api_url, "--", bob_id, env=ENV
    )
    assert revoked.returncode == 0, revoked.stderr
    approval_id = gate.api().create("req", "pay 1.250,00 EUR")["approval_id"]
    relay.wait_dispatch(approval_id)
    assert gate.stop() == 0
    assert verify(gate)[0] == 0
    db = db_of(gate)
    attacker = b64url(bytes(range(32)))

    cases = [
        (
            "UPDATE approver_credentials SET public_key = ? WHERE credential_id = ?",
            (attacker, alice_id),
            f"credential {alice_id}: public_key differs from its enrolment entry",
        ),
        (
            "UPDATE approver_credentials SET operator_id = 102 WHERE credential_id = ?",
            (alice_id,),
            f"credential {alice_id}: operator_id is 102 in the table but 101 in its enrolment",
        ),
        (
            "UPDATE approver_credentials SET revoked_at = NULL WHERE credential_id = ?",
            (bob_id,),
            f"credential {bob_id}: in force in the table but revoked by audit entry",
        ),
        (
            "INSERT INTO approver_credentials (credential_id, operator_id, type, public_key,"
            " created_at) VALUES ('AAAAAAAAAAAAAAAAAAAAAA', 101, 'ed25519', ?, 0)",
            (attacker,),
            "credential AAAAAAAAAAAAAAAAAAAAAA: in the table but never enrolled in the audit log",
        ),
        (
            "DELETE FROM approver_credentials WHERE credential_id = ?",
            (alice_id,),
            f"credential {alice_id}: enrolled in the audit log but missing from the table",
        ),
        (
            "UPDATE approvals SET approver_signature = 'off' WHERE approval_id = ?",
            (approval_id,),
            f"approval {approval_id}: approver_signature is 'off' in the approvals table but"
            " 'required' in audit entry",
        ),
        (
            "UPDATE approvals SET approver_signature = NULL WHERE approval_id = ?",
            (approval_id,),
            f"approval {approval_id}: approver_signature is None in the approvals table but"
            " 'required' in audit entry",
        ),
    ]
    pristine = db.read_bytes()
    for sql, args, expected in cases:
        db.write_bytes(pristine)
        conn = sqlite3.connect(db)
        with conn:
            conn.execute(sql, args)
        conn.close()
        code, out = verify(gate)
        assert code == 1, (sql, out)
        assert expected in out, (sql, out)
        assert "Traceback" not in out
