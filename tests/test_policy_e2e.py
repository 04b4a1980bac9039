"""Policy over the real daemon: a rule approves or denies at creation, a
remembered approval approves a draft a person approved before; no dispatch reaches the
relay for them; ``audit verify`` accepts the entries; receipts and permits name the policy.

The gate is ``python -m gate serve``, the relay the capturing relay of tests/support.py,
the pipeline ``python -m gate request --wait``; decisions are real signed envelopes.
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.protocol.canonical import payload_hash
from tests.support import (
    API_TOKEN,
    CaptureRelay,
    GateProcess,
    decision_body,
    http_request,
    post_decision,
    run_cli,
    write_config,
)
from tests.test_signed_audit import sign_config

pytestmark = pytest.mark.e2e

AUTH = {"Authorization": f"Bearer {API_TOKEN}"}

INVOICE = json.dumps(
    {"function": "send_invoice", "arguments": {"amount": 40, "to": "a@example.com"}}
)
BIG = json.dumps({"function": "send_invoice", "arguments": {"amount": 900, "to": "a@example.com"}})
STEPS: list[dict[str, Any]] = [
    {
        "name": "send",
        "approvers": [101, 102],
        "timeout": "1h",
        "policy": [
            {
                "id": "small-invoices",
                "decide": "approve",
                "when": {
                    "content_type": "application/json",
                    "max_spend": 100,
                    "arguments": {
                        "/arguments/amount": {"max": 100},
                        "arguments.to": {"glob": "*@example.com"},
                    },
                },
            },
            {
                "id": "no-prod",
                "decide": "deny",
                "reason": "never touch prod from here",
                "when": {"body_matches": r"\bprod\b"},
            },
        ],
    },
    {"name": "mail", "approvers": [101, 102], "timeout": "1h", "remember_approval": "1h"},
    {
        "name": "wire",
        "approvers": [101, 102],
        "risk": "high",
        "timeout": "1h",
        "policy": [{"id": "no-weekend", "decide": "deny", "when": {"body_matches": "weekend"}}],
    },
]


@pytest.fixture
def gate(tmp_path: Path) -> Iterator[tuple[GateProcess, CaptureRelay, Path]]:
    relay = CaptureRelay().start()
    config = write_config(tmp_path, relay.url, steps=STEPS)
    sign_config(config)  # the public key: keys/hitl-gate-ed25519.pub
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    data["pipelines"][0]["budget_cap"] = 50  # a day's spend on pipeline p
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    proc = GateProcess(config).start()
    try:
        yield proc, relay, config
    finally:
        proc.stop()
        relay.stop()


def request(gate: GateProcess, config: Path, step: str, body: Path, *extra: str) -> Any:
    return run_cli(
        "request", "-c", str(config), "--api-url", gate.api_url, "--pipeline", "p",
        "--step", step, "--draft-file", str(body), "--wait", "--json", *extra,
    )  # fmt: skip


def rows(config: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{config.parent / 'gate.db'}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def audit_data(config: Path, approval_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (kind, json.loads(entry)["data"])
        for kind, entry in rows(
            config, "SELECT kind, entry FROM audit_log WHERE approval_id = ? ORDER BY seq",
            approval_id,
        )
    ]  # fmt: skip


def test_rule_approves_at_once_without_dispatch_and_audit_verifies(
    gate: tuple[GateProcess, CaptureRelay, Path], tmp_path: Path
) -> None:
    proc, relay, config = gate
    draft = tmp_path / "invoice.json"
    draft.write_text(INVOICE, encoding="utf-8")
    done = request(
        proc, config, "send", draft, "--content-type", "application/json", "--spend", "40"
    )
    assert done.returncode == 0, done.stderr
    approval = json.loads(done.stdout)
    assert (approval["state"], approval["outcome"]) == ("resolved", "approved")
    assert approval["final_body"] == INVOICE
    (decision,) = approval["decisions"]
    assert (decision["identity"], decision["operator_id"]) == ("policy:small-invoices", 0)
    assert approval["quorum"] == {"required": 1, "collected": 0}  # no person approved
    assert (
        "decision approve by policy:small-invoices at creation (a policy rule of the step: no"
        " person was asked)" in done.stderr.decode()
    )
    assert b"dispatched" not in done.stderr, done.stderr
    # the permit names the policy as its approver
    claims = json.loads(run_permit_claims(approval["permit"]))
    assert claims["approved_by"] == [{"operator_id": 0, "identity": "policy:small-invoices"}]
    # no outbox row, and a person's approval made after it is the only dispatch the relay saw
    assert rows(
        config, "SELECT count(*) FROM outbox WHERE approval_id = ?", approval["approval_id"]
    ) == [(0,)]  # noqa: E501
    human = proc.api().create(step="send", body="deploy to staging\n")
    relay.wait_dispatch(human["approval_id"])
    assert [d["approval_id"] for d in relay.dispatches(acked_only=False)] == [human["approval_id"]]
    entries = audit_data(config, approval["approval_id"])
    assert [kind for kind, _ in entries] == ["created", "decision", "resolved"]
    assert entries[1][1]["by"] == "policy:small-invoices"
    assert entries[1][1]["rule"] == "small-invoices"
    assert entries[2][1]["approved_by"] == [0]
    # the permit verifies offline for this body and step, as any permit does
    permit_file = tmp_path / "permit.jws"
    permit_file.write_text(approval["permit"], encoding="ascii")
    checked = run_cli(
        "permit", "verify", str(permit_file), "--public-key",
        str(config.parent / "keys" / "hitl-gate-ed25519.pub"), "--body-file", str(draft),
        "--pipeline", "p", "--step", "send",
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    # counted as a resolution in the metrics
    status, _, raw = http_request(proc.api_url + "/metrics", "GET", None, AUTH)
    assert status == 200
    assert 'hitl_gate_approvals_resolved_total{outcome="approved"} 1.0' in raw.decode()
    receipt = tmp_path / "receipt.json"
    receipt.write_text(json.dumps(approval["receipt"]), encoding="utf-8")
    verified = run_cli("audit", "verify", "-c", str(config), "--expect", str(receipt))
    assert verified.returncode == 0, verified.stderr + verified.stdout


def run_permit_claims(token: str) -> str:
    payload = token.split(".")[1]
    return base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)).decode()


def test_deny_wins_and_skips_with_the_reason(
    gate: tuple[GateProcess, CaptureRelay, Path], tmp_path: Path
) -> None:
    proc, _, config = gate
    # matches the approve rule too: the deny wins
    body = json.dumps({"function": "deploy", "arguments": {"amount": 1, "to": "prod@example.com"},
                       "env": "prod"})  # fmt: skip
    draft = tmp_path / "deploy.json"
    draft.write_text(body, encoding="utf-8")
    done = request(
        proc, config, "send", draft, "--content-type", "application/json", "--spend", "1"
    )
    assert done.returncode == 3, done.stderr
    assert b"skipped by policy:no-prod: never touch prod from here" in done.stderr
    approval = json.loads(done.stdout)
    assert approval["outcome"] == "skipped" and approval["permit"] is None
    assert approval["decisions"][0]["reason"] == "never touch prod from here"
    verified = run_cli("audit", "verify", "-c", str(config))
    assert verified.returncode == 0, verified.stderr + verified.stdout


def test_no_rule_matches_a_person_decides(
    gate: tuple[GateProcess, CaptureRelay, Path],
) -> None:
    proc, relay, _ = gate
    api = proc.api()
    status, answer = api.call(
        "POST", "/v1/approvals",
        {"pipeline": "p", "step": "send", "spend": 900,
         "draft": {"content_type": "application/json", "body": BIG}},
    )  # fmt: skip
    assert status == 201 and answer["state"] == "pending", answer
    relay.wait_dispatch(answer["approval_id"])
    # a high-risk step takes deny rules: one matches, the other draft waits for a person
    denied = api.create(step="wire", body="pay on the weekend\n")
    assert (denied["outcome"], denied["decisions"][0]["identity"]) == (
        "skipped",
        "policy:no-weekend",
    )
    assert denied["decisions"][0]["reason"] is None
    waiting = api.create(step="wire", body="pay on monday\n")
    assert waiting["state"] == "pending"
    relay.wait_dispatch(waiting["approval_id"])


def test_remembered_approval(gate: tuple[GateProcess, CaptureRelay, Path], tmp_path: Path) -> None:
    proc, relay, config = gate
    api = proc.api()
    first = api.create(step="mail", body="Hello Anna\n")
    dispatch = relay.wait_dispatch(first["approval_id"])
    status, answer, _ = post_decision(proc.callback_url, decision_body(dispatch))
    assert status == 200, answer
    assert api.wait_resolved(first["approval_id"])["outcome"] == "approved"

    draft = tmp_path / "mail.txt"
    draft.write_text("Hello Anna\n", encoding="utf-8")
    done = request(proc, config, "mail", draft)
    assert done.returncode == 0, done.stderr
    again = json.loads(done.stdout)
    assert again["decisions"][0]["identity"] == "policy:remembered"
    entries = audit_data(config, again["approval_id"])
    assert entries[1][1]["remembered_from"] == first["approval_id"]
    assert entries[1][1]["payload_hash"] == payload_hash("Hello Anna\n")
    # a remembered approval is not remembered again: only a person's counts; another draft
    # waits for a person
    other = api.create(step="mail", body="Hello Bob\n")
    assert other["state"] == "pending"
    relay.wait_dispatch(other["approval_id"])
    verified = run_cli("audit", "verify", "-c", str(config))
    assert verified.returncode == 0, verified.stderr + verified.stdout


def test_idempotency_key_replays_the_policy_decision(
    gate: tuple[GateProcess, CaptureRelay, Path],
) -> None:
    proc, _, _ = gate
    api = proc.api()
    payload = {"pipeline": "p", "step": "send", "spend": 5,
               "draft": {"content_type": "application/json", "body": INVOICE}}  # fmt: skip
    s1, a1 = api.call("POST", "/v1/approvals", payload, headers={"Idempotency-Key": "k-1"})
    s2, a2 = api.call("POST", "/v1/approvals", payload, headers={"Idempotency-Key": "k-1"})
    assert (s1, s2) == (201, 200)
    assert a1["approval_id"] == a2["approval_id"] and a2["outcome"] == "approved"


def test_no_rule_approves_over_the_budget_cap(
    gate: tuple[GateProcess, CaptureRelay, Path],
) -> None:
    """The rule allows 40 a request, the pipeline 50 a day: the second 40 goes to a person,
    who sees the budget context."""
    proc, relay, _ = gate
    api = proc.api()
    payload = {"pipeline": "p", "step": "send", "spend": 40,
               "draft": {"content_type": "application/json", "body": INVOICE}}  # fmt: skip
    status, first = api.call("POST", "/v1/approvals", payload)
    assert (status, first["outcome"]) == (201, "approved"), first
    status, second = api.call("POST", "/v1/approvals", payload)
    assert (status, second["state"], second["decisions"]) == (201, "pending", []), second
    dispatch = relay.wait_dispatch(second["approval_id"])
    assert dispatch["budget"]["spent_pipeline"] == 40
