"""README's "Give your approvers an inbox" files: examples/inbox/gate.yaml and
examples/inbox/inbox.yaml pass their check-config and fit together (the gate's relay is the
inbox, the inbox calls back the gate's listener, one relying party whose origins list both),
so the few commands of the README work as written. The walk itself (enrol, sign in,
approve) is tests/test_inbox_e2e_decide.py in Chromium."""

from __future__ import annotations

import pytest
import yaml

from gate.inbox.config import load_inbox, relying_party
from tests.support import ROOT, gate_env, run_cli

pytestmark = pytest.mark.e2e
GATE = ROOT / "examples" / "inbox" / "gate.yaml"
INBOX = ROOT / "examples" / "inbox" / "inbox.yaml"
ENV = gate_env(HITL_ADMIN_TOKEN="test-admin-token-examples-5e0c2b9d71")


def test_inbox_examples_pass_check_config_and_fit_together() -> None:
    for args in (("check-config", "-c", str(GATE)), ("inbox", "check-config", "-c", str(INBOX))):
        proc = run_cli(*args, env=ENV)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    gate = yaml.safe_load(GATE.read_text(encoding="utf-8"))
    inbox, _, errors = load_inbox(INBOX, ENV)
    assert inbox is not None, errors
    party = relying_party(inbox)
    assert party is not None
    host, _, port = inbox.listen.rpartition(":")
    assert gate["relay"]["url"] == f"http://{host}:{port}/hitl/v0/relay"
    assert {"notices", "questions", "credentials"} <= {
        k for k, v in gate["relay"].items() if v is True
    }
    assert inbox.gate.callback_url.rstrip("/") == f"http://{gate['relay']['callback_addr']}"
    assert gate["webauthn"]["rp_id"] == party.rp_id == "localhost"
    assert set(party.origins) <= set(gate["webauthn"]["origins"])
    assert inbox.base_url in gate["webauthn"]["origins"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "examples/inbox/gate.yaml" in readme and "examples/inbox/inbox.yaml" in readme
