"""``gate.audit.records`` on records built by hand (pure): an adjusted approval's second
revision, and approvals written after the verified chain. The daemon-level cases (rows
edited in a real database, ``audit verify -c`` and ``doctor``) are in test_e2e_lifecycle.py."""

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
FIRST, SECOND = "Pay 12 EUR to ACME\n", "Pay 12.50 EUR to ACME\n"


def adjusted_record(up_to: int = 0) -> ApprovalRecord:
    """An approval adjusted by operator 101 (revision 2), then approved by 102."""
    entries: list[audit.AuditRow] = []
    prev = audit.GENESIS_HASH

    def add(kind: str, data: dict[str, Any]) -> audit.AuditRow:
        nonlocal prev
        seq = up_to + len(entries) + 1
        entry = audit.make_entry(seq, kind, "A1", 1_767_225_600_000 + seq, data)
        text, digest, receipt = audit.seal(prev, entry, KEY)
        row = audit.AuditRow(seq, "A1", kind, text, prev, digest, receipt)
        entries.append(row)
        prev = digest
        return row

    h1, h2 = payload_hash(FIRST), payload_hash(SECOND)
    add(
        "created",
        {
            "pipeline": "p",
            "step": "s",
            "revision": 1,
            "payload_hash": h1,
            "quorum": 1,
            "approvers": [101, 102],
            "expires_at": 99,
        },
    )
    add(
        "decision",
        {
            "operator_id": 101,
            "decision": "adjust",
            "revision": 1,
            "payload_hash": h1,
            "nonce": "n1",
            "effect": "adjust",
            "new_revision": 2,
            "new_payload_hash": h2,
        },
    )
    add(
        "decision",
        {
            "operator_id": 102,
            "decision": "approve",
            "revision": 2,
            "payload_hash": h2,
            "nonce": "n2",
            "effect": "approve",
        },
    )
    resolved = add(
        "resolved",
        {
            "outcome": "adjusted",
            "revision": 2,
            "payload_hash": h2,
            "approved_by": [102],
            "quorum": 1,
        },
    )
    row = {
        "approval_id": "A1",
        "pipeline": "p",
        "step": "s",
        "quorum_required": 1,
        "revision": 2,
        "state": "resolved",
        "outcome": "adjusted",
        "expires_at": 99,
        "receipt": json.dumps(receipt_object(resolved)),
        "scope": json.dumps([[101, "alice@example.com"], [102, "bob@example.com"]]),
    }
    return ApprovalRecord(
        "A1",
        row,
        [(1, FIRST, h1), (2, SECOND, h2)],
        [(1, 101, "adjust", h1), (2, 102, "approve", h2)],
        entries,
    )


def test_an_adjusted_approval_matches_and_its_second_revision_is_checked() -> None:
    record = adjusted_record()
    assert audit_records.check([record], up_to_seq=4) == audit_records.RecordsResult(1, None)
    changed = ApprovalRecord(
        record.approval_id,
        record.approval,
        [record.revisions[0], (2, "Pay 9000 EUR\n", record.revisions[1][2])],
        record.decisions,
        record.entries,
    )
    result = audit_records.check([changed], up_to_seq=4)
    assert result.checked == 0 and result.problem is not None
    assert result.problem[1].startswith("revision 2's body hashes to sha256:"), result.problem
    assert result.problem[1].endswith(
        f"audit entry 2 holds {payload_hash(SECOND)} (the draft was changed)"
    )
    stale = ApprovalRecord(
        record.approval_id,
        {**(record.approval or {}), "revision": 1},
        record.revisions,
        record.decisions,
        record.entries,
    )
    assert audit_records.problem(stale) == (
        "current revision is 1 in the approvals table but 2 in the audit log"
    )


def test_approvals_with_entries_after_the_verified_chain_are_not_checked() -> None:
    newer = adjusted_record(up_to=4)  # entries 5..8: written after a chain of 4 was verified
    broken = ApprovalRecord(newer.approval_id, None, [], [], newer.entries)
    assert audit_records.check([broken], up_to_seq=4) == audit_records.RecordsResult(
        0, None, newer=1
    )
    assert audit_records.check([broken], up_to_seq=8).problem == (
        "A1",
        "named by audit entry 5 but missing from the approvals table (deleted?)",
    )


def test_rows_of_an_unknown_approval_and_values_of_the_wrong_type_are_named_not_raised() -> None:
    """Review: a decision row for an approval neither table nor log has raised IndexError;
    a revision stored as text raised ValueError (a traceback, no TAMPERED line)."""
    orphan = ApprovalRecord("ZZ", None, [], [(1, 101, "approve", "h")], [])
    assert audit_records.problem(orphan) == (
        "rows in the revisions, decisions or outbox table for an approval that neither the "
        "approvals table nor the audit log has"
    )
    record = adjusted_record()
    typed = ApprovalRecord(
        record.approval_id,
        record.approval,
        [("abc", FIRST, record.revisions[0][2]), record.revisions[1]],
        record.decisions,
        record.entries,
    )
    reason = audit_records.problem(typed)
    assert reason is not None and reason.startswith(
        "a row or entry holds a value of a type the gate never writes"
    ), reason
    fractional = ApprovalRecord(
        record.approval_id,
        record.approval,
        record.revisions,
        [(1.5, 101, "adjust", record.decisions[0][3]), record.decisions[1]],
        record.entries,
    )
    assert audit_records.problem(fractional) is not None


def test_a_log_that_breaks_the_frozen_rules_is_named_even_when_the_rows_match_it() -> None:
    """Review: loosen a pending approval's rows (scope, quorum), let the gate resolve it,
    put the rows back: the rows matched the log, and the log shows the breach."""
    record = adjusted_record()
    widened = ApprovalRecord(
        record.approval_id,
        {
            **(record.approval or {}),
            "scope": json.dumps([[101, "alice@example.com"], [104, "op04@example.com"]]),
        },
        record.revisions,
        record.decisions,
        record.entries,
    )
    assert audit_records.problem(widened) == (
        "scope holds operators [101, 104] in the approvals table but audit entry 1 froze [101, 102]"
    )
    prev = record.entries[2].entry_hash
    entry = audit.make_entry(
        4,
        "resolved",
        "A1",
        1_767_225_600_004,
        {
            "outcome": "adjusted",
            "revision": 2,
            "payload_hash": payload_hash(SECOND),
            "approved_by": [102],
            "quorum": 2,
        },
    )
    text, digest, receipt = audit.seal(prev, entry, KEY)
    loosened_log = audit.AuditRow(4, "A1", "resolved", text, prev, digest, receipt)
    loosened = ApprovalRecord(
        record.approval_id,
        {**(record.approval or {}), "receipt": json.dumps(receipt_object(loosened_log))},
        record.revisions,
        record.decisions,
        [*record.entries[:3], loosened_log],
    )
    assert audit_records.problem(loosened) == (
        "audit entry 4 resolved with quorum 2, entry 1 froze quorum 1"
    )


def _with_dispatches(
    record: ApprovalRecord, acks: list[dict[str, Any]], outbox: list[tuple[Any, Any, Any]]
) -> ApprovalRecord:
    """``record`` with ``dispatch_ack`` entries holding ``acks`` (chained after its own
    entries) and ``outbox`` rows ``(revision, attempts, delivered_at)``."""
    entries = list(record.entries)
    for data in acks:
        last = entries[-1]
        seq = last.seq + 1
        entry = audit.make_entry(
            seq, "dispatch_ack", record.approval_id, 1_767_225_600_000 + seq, data
        )
        text, digest, receipt = audit.seal(last.entry_hash, entry, KEY)
        entries.append(
            audit.AuditRow(
                seq, record.approval_id, "dispatch_ack", text, last.entry_hash, digest, receipt
            )
        )
    return ApprovalRecord(
        record.approval_id, record.approval, record.revisions, record.decisions, entries, outbox
    )


ACKED_AT = 1_767_225_600_123


@pytest.mark.parametrize(
    ("acks", "outbox", "reason"),
    [
        (
            [{"revision": 1, "attempts": 2}, {"revision": 2, "attempts": 1}],
            [(1, 2, ACKED_AT), (2, 1, ACKED_AT)],
            None,
        ),
        (
            [{"revision": 1, "attempts": 2}],
            [(1, 2, ACKED_AT), (2, 1, ACKED_AT)],
            "its outbox row says the relay acked the dispatch of revision 2 (after 1 attempt), but "
            "the audit log holds no dispatch_ack entry for it (deleted?)",
        ),
        (
            [{"revision": 1, "attempts": 2}],
            [(1, 3, ACKED_AT)],
            "its outbox row counts 3 attempts for the acked dispatch of revision 1, "
            "audit entry 5 2",
        ),
        (
            [{"revision": 1, "attempts": 2}],
            [(1, 2, None)],
            "its outbox row says the dispatch of revision 1 was never acked, but audit entry 5 "
            "records the relay's ack",
        ),
        (
            [{"revision": 1, "attempts": 1}, {"revision": 1, "attempts": 1}],
            [(1, 1, ACKED_AT)],
            "2 dispatch_ack entries for revision 1 in the audit log (expected at most 1)",
        ),
        (
            [{"revision": 3, "attempts": 1}],
            [],
            "audit entry 5 records the relay's ack of revision 3, "
            "which the audit log does not hold",
        ),
        (
            [],
            [(3, 0, None)],
            "its outbox row dispatches revision 3, which the audit log does not hold",
        ),
        ([{"revision": 1, "attempts": 1}], [], None),  # an outbox row gone: not named
        ([], [(1, 0, None), (2, 4, None)], None),  # never acked, no entry: agree
    ],
    ids=[
        "match",
        "ack-deleted",
        "attempts",
        "reset",
        "twice",
        "ack-unknown-revision",
        "row-unknown-revision",
        "row-gone",
        "never-acked",
    ],
)
def test_every_delivered_dispatch_needs_its_dispatch_ack_entry(
    acks: list[dict[str, Any]], outbox: list[tuple[Any, Any, Any]], reason: str | None
) -> None:
    """Item 3: the newest ``dispatch_ack`` entry deleted left ``audit verify -c``
    at "intact"; the outbox, written in the same transaction, still says delivered."""
    record = _with_dispatches(adjusted_record(), acks, outbox)
    assert audit_records.problem(record) == reason
