"""``gate.audit.records`` on a policy's decision, records built by hand (pure):
the shape the gate writes passes; operator 0 in any other shape, or counted without a policy
decision, is named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gate.audit import chain as audit
from gate.audit import records as audit_records
from gate.audit.approval_kind import ApprovalRecord
from gate.audit.receipts import receipt_object
from gate.protocol.canonical import payload_hash

KEY = b"receipt-key"
BODY = '{"function": "send_invoice", "arguments": {"amount": 40}}'
HASH = payload_hash(BODY)
POLICY_DECISION = {
    "operator_id": 0,
    "decision": "approve",
    "revision": 1,
    "payload_hash": HASH,
    "nonce": "n1",
    "effect": "approve",
    "by": "policy:small",
    "rule": "small",
}


def policy_record(decision: dict[str, Any] | None, approved_by: list[int]) -> ApprovalRecord:
    """An approval created, decided by ``decision`` (None: no decision entry) and resolved
    approved counting ``approved_by``; the decisions table matches the log."""
    entries: list[audit.AuditRow] = []
    prev = audit.GENESIS_HASH

    def add(kind: str, data: dict[str, Any]) -> audit.AuditRow:
        nonlocal prev
        seq = len(entries) + 1
        entry = audit.make_entry(seq, kind, "A1", 1_767_225_600_000 + seq, data)
        text, digest, receipt = audit.seal(prev, entry, KEY)
        row = audit.AuditRow(seq, "A1", kind, text, prev, digest, receipt)
        entries.append(row)
        prev = digest
        return row

    created = {"pipeline": "p", "step": "s", "revision": 1, "payload_hash": HASH, "quorum": 1,
               "approvers": [101, 102], "expires_at": 99}  # fmt: skip
    add("created", created)
    if decision is not None:
        add("decision", decision)
    resolved = add(
        "resolved",
        {"outcome": "approved", "revision": 1, "payload_hash": HASH, "approved_by": approved_by,
         "quorum": 1},
    )  # fmt: skip
    row = {
        "approval_id": "A1",
        "pipeline": "p",
        "step": "s",
        "quorum_required": 1,
        "revision": 1,
        "state": "resolved",
        "outcome": "approved",
        "expires_at": 99,
        "receipt": json.dumps(receipt_object(resolved)),
        "scope": json.dumps([[101, "alice@example.com"], [102, "bob@example.com"]]),
    }
    table = (
        []
        if decision is None
        else [(1, decision["operator_id"], decision["decision"], decision["payload_hash"])]
    )
    return ApprovalRecord("A1", row, [(1, BODY, HASH)], table, entries)


def test_the_shape_the_gate_writes_passes() -> None:
    assert audit_records.problem(policy_record(POLICY_DECISION, [0])) is None
    remembered = {**POLICY_DECISION, "by": "policy:remembered", "rule": "remembered",
                  "remembered_from": "01JEARLIER"}  # fmt: skip
    assert audit_records.problem(policy_record(remembered, [0])) is None


@pytest.mark.parametrize(
    "changed",
    [
        {"by": "policy:other"},  # by and rule disagree
        {"by": None, "rule": None},  # operator 0 as if a person
        {"operator_id": 101},  # a person's id claiming a policy
        {"decision": "adjust", "effect": "adjust"},  # a policy never edits
    ],
)
def test_any_other_policy_shape_is_named(changed: dict[str, Any]) -> None:
    decision = {k: v for k, v in {**POLICY_DECISION, **changed}.items() if v is not None}
    reason = audit_records.problem(policy_record(decision, [decision["operator_id"]]))
    assert reason is not None and reason.startswith(
        "audit entry 2 records a policy decision the gate never writes"
    ), reason


def test_operator_0_counted_without_a_policy_decision_is_named() -> None:
    assert audit_records.problem(policy_record(None, [0])) == (
        "audit entry 2 counts operators [0] outside the approvers [101, 102] of entry 1"
    )
