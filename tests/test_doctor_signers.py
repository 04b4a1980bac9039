"""``hitl-gate doctor`` on who else may have to sign (gate/tools/doctor_passkeys.py): the
operators a signing step (``approver_signature: required``) escalates to and the delegates of
its approvers, when they hold no approver credential (they could never decide it). The real
CLI against a real gate's database holding real enrolments."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support import write_config
from tests.test_passkeys_first_use import ADMIN, cli, enrolled_at

SIGNING = {"name": "req", "approvers": [101], "approver_signature": "required", "timeout": "1h",
           "escalate": [{"after": "10m", "to": [102, 103]}]}  # fmt: skip
UNSIGNED = {"name": "free", "approvers": [102], "timeout": "1h",
            "escalate": [{"after": "10m", "to": [105]}]}  # fmt: skip
DELEGATIONS = [
    {"from": 101, "to": 104, "until": "2999-01-01T00:00:00Z"},  # alice's delegate: no passkey
    {"from": 103, "to": 102, "until": "2999-01-01T00:00:00Z"},  # carol's: bob holds one
    {"from": 106, "to": 107, "until": "2999-01-01T00:00:00Z"},  # op06 decides no signing step
]


def config(tmp_path: Path) -> Path:
    path = write_config(tmp_path, "http://127.0.0.1:9/relay", steps=[SIGNING, UNSIGNED], api=ADMIN)
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["delegations"] = DELEGATIONS
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.e2e
def test_doctor_signers_warns_of_escalation_targets_and_delegates_without_a_passkey(
    tmp_path: Path,
) -> None:
    path = config(tmp_path)
    enrolled_at(path, "101", "102")

    _, out, err = cli("doctor", "-c", str(path))

    warned = [line for line in (out + err).splitlines() if "could never decide" in line]
    assert warned == [
        "WARN passkeys: pipelines[0].steps[0].escalate[0].to: operator 103 (carol@example.com)"
        " has no approver credential: escalated to, they could never decide this step"
        " (approver_signature: required)",
        "WARN passkeys: delegations[0].to: operator 104 (op04@example.com) has no approver"
        " credential: as delegate of 101 (alice@example.com) they could never decide"
        " pipelines[0].steps[0] (approver_signature: required)",
    ], out + err
