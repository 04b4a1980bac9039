"""What a remembered approval may stand for, over the real daemon (the outside
review C5, M1, H2, H3): only the same spend, never an approver the request's scope leaves
out now (the requester themself, SPEC check 11's self-approval rule; an approver a reload
removed), and a deny rule on a step that requires approver signatures verifies.

The gate is ``python -m gate serve``, the relay the capturing relay of tests/support.py;
decisions are real signed envelopes posted to the callback listener.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import (
    CaptureRelay,
    GateProcess,
    decision_body,
    post_decision,
    run_cli,
    write_config,
)

pytestmark = pytest.mark.e2e

STEPS: list[dict[str, Any]] = [
    {"name": "mail", "approvers": [101, 102, 103], "timeout": "1h", "remember_approval": "1h"},
    {
        "name": "wire",
        "approvers": [101, 102],
        "timeout": "1h",
        "approver_signature": "required",
        "policy": [{"id": "no-weekend", "decide": "deny", "when": {"body_matches": "weekend"}}],
    },
]


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[tuple[GateProcess, CaptureRelay, Path]]:
    relay = CaptureRelay().start()
    config = write_config(tmp_path, relay.url, steps=STEPS)
    proc = GateProcess(config).start()
    try:
        yield proc, relay, config
    finally:
        proc.stop()
        relay.stop()


def create(gate: GateProcess, step: str, body: str, **extra: Any) -> dict[str, Any]:
    payload = {"pipeline": "p", "step": step, "draft": {"content_type": "text/plain", "body": body}}
    status, answer = gate.api().call("POST", "/v1/approvals", {**payload, **extra})
    assert status == 201, answer
    return dict(answer)


def approve_as(gate: GateProcess, relay: CaptureRelay, approval_id: str, who: str) -> None:
    dispatch = relay.wait_dispatch(approval_id)
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, identity=who))
    assert status == 200, answer
    assert gate.api().wait_resolved(approval_id)["outcome"] == "approved"


def decided_by(answer: dict[str, Any]) -> str | None:
    decisions = answer.get("decisions") or []
    return decisions[0].get("identity") if answer["state"] == "resolved" and decisions else None


def test_remembered_only_for_the_same_spend(gate: tuple[GateProcess, CaptureRelay, Path]) -> None:
    proc, relay, _ = gate
    first = create(proc, "mail", "Pay invoice 77\n", spend=1)
    approve_as(proc, relay, first["approval_id"], "alice@example.com")
    assert create(proc, "mail", "Pay invoice 77\n", spend=900000)["state"] == "pending"
    assert decided_by(create(proc, "mail", "Pay invoice 77\n", spend=1)) == "policy:remembered"


def test_a_requester_is_not_approved_by_their_own_earlier_approval(
    gate: tuple[GateProcess, CaptureRelay, Path],
) -> None:
    proc, relay, _ = gate
    first = create(proc, "mail", "Grant bob admin\n", requested_by="carol@example.com")
    approve_as(proc, relay, first["approval_id"], "bob@example.com")
    again = create(proc, "mail", "Grant bob admin\n", requested_by="bob@example.com")
    assert again["state"] == "pending"
    relay.wait_dispatch(again["approval_id"])
    other = create(proc, "mail", "Grant bob admin\n", requested_by="carol@example.com")
    assert decided_by(other) == "policy:remembered"


def test_an_approver_removed_by_a_reload_is_not_remembered(
    gate: tuple[GateProcess, CaptureRelay, Path], tmp_path: Path
) -> None:
    proc, relay, config = gate
    first = create(proc, "mail", "Rotate prod keys\n")
    approve_as(proc, relay, first["approval_id"], "alice@example.com")
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["pipelines"][0]["steps"][0]["approvers"] = [102, 103]
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGHUP)
    proc.wait_for_line(r"event=reloaded ")
    assert create(proc, "mail", "Rotate prod keys\n")["state"] == "pending"


def test_a_deny_on_a_step_that_requires_signatures_verifies(
    gate: tuple[GateProcess, CaptureRelay, Path],
) -> None:
    proc, _, config = gate
    denied = create(proc, "wire", "wire it on the weekend\n")
    assert (denied["outcome"], decided_by(denied)) == ("skipped", "policy:no-weekend")
    proc.stop()
    done = run_cli("audit", "verify", "-c", str(config))
    assert done.returncode == 0, done.stdout + done.stderr
