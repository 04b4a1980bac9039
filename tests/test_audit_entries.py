"""The typed audit entry payloads (gate.audit.entries) write the very bytes the gate's dict
literals wrote before them (the chain hashes them), and read logged objects back as logged."""

from __future__ import annotations

from typing import Any

import pytest

from gate.audit import chain as audit
from gate.audit.entries import (
    CreatedData,
    DecisionData,
    DispatchAckData,
    ReceiptKeyRotatedData,
    ResolvedData,
)

HASH = "sha256:" + "ab" * 32
HASH2 = "sha256:" + "cd" * 32


def _created_old(requester: tuple[int, str] | None, allow: bool) -> dict[str, Any]:
    # the dict literal of GateService._tx_create before the reshape
    created: dict[str, Any] = {
        "pipeline": "newsletter",
        "step": "send",
        "revision": 1,
        "payload_hash": HASH,
        "quorum": 2,
        "approvers": [op_id for op_id, _ in ((1, "a@x"), (2, "b@x"))],
        "expires_at": 1_700_000_000_000,
    }
    if requester is not None:
        created["requested_by"] = requester[0]
        created["allow_self_approval"] = allow
    return created


def _created_new(requester: tuple[int, str] | None, allow: bool) -> CreatedData:
    return CreatedData(
        pipeline="newsletter",
        step="send",
        revision=1,
        payload_hash=HASH,
        quorum=2,
        approvers=[op_id for op_id, _ in ((1, "a@x"), (2, "b@x"))],
        expires_at=1_700_000_000_000,
        requested_by=requester[0] if requester is not None else None,
        allow_self_approval=allow if requester is not None else None,
    )


def _decision_old(adjust: bool) -> dict[str, Any]:
    audit_data: dict[str, Any] = {
        "operator_id": 2,
        "decision": "adjust" if adjust else "approve",
        "revision": 1,
        "payload_hash": HASH,
        "nonce": "n0nce-é",
        "effect": "adjust" if adjust else "approve",
    }
    if adjust:
        audit_data["new_revision"] = 2
        audit_data["new_payload_hash"] = HASH2
    return audit_data


def _decision_new(adjust: bool) -> DecisionData:
    made = DecisionData(
        operator_id=2,
        decision="adjust" if adjust else "approve",
        revision=1,
        payload_hash=HASH,
        nonce="n0nce-é",
        effect="adjust" if adjust else "approve",
    )
    if adjust:
        return DecisionData(**{**_fields(made), "new_revision": 2, "new_payload_hash": HASH2})
    return made


def _fields(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__slots__}


CASES = [
    ("created", _created_old(None, False), _created_new(None, False)),
    ("created", _created_old((7, "op@x"), True), _created_new((7, "op@x"), True)),
    ("created", _created_old((7, "op@x"), False), _created_new((7, "op@x"), False)),
    ("decision", _decision_old(False), _decision_new(False)),
    ("decision", _decision_old(True), _decision_new(True)),
    (
        "resolved",
        {
            "outcome": "approved",
            "revision": 2,
            "payload_hash": HASH2,
            "approved_by": list((1, 2)),
            "quorum": 2,
        },
        ResolvedData("approved", 2, HASH2, [1, 2], 2),
    ),
    (
        "resolved",
        {"outcome": "expired", "revision": 1, "payload_hash": HASH, "approved_by": [], "quorum": 1},
        ResolvedData("expired", 1, HASH, [], 1),
    ),
    ("dispatch_ack", {"revision": 1, "attempts": 3}, DispatchAckData(1, 3)),
    (
        "receipt_key_rotated",
        {"previous_key_last_seq": 41, "key_env": "NEW_KEY", "previous_key_env": "OLD_KEY"},
        ReceiptKeyRotatedData(41, "NEW_KEY", "OLD_KEY"),
    ),
    (
        "receipt_key_rotated",
        {"previous_key_last_seq": 41, "key_env": "NEW_KEY", "previous_key_env": None},
        ReceiptKeyRotatedData(41, "NEW_KEY", None),
    ),
]
IDS = [
    "created",
    "created-by-operator",
    "created-by-operator-no-self",
    "decision",
    "decision-adjust",
    "resolved-approved",
    "resolved-expired",
    "dispatch_ack",
    "rotated",
    "rotated-no-previous-env",
]


@pytest.mark.parametrize(("kind", "old", "typed"), CASES, ids=IDS)
def test_entries_typed_payload_seals_to_the_same_bytes(
    kind: str, old: dict[str, Any], typed: Any
) -> None:
    key = b"k" * 32
    approval_id = None if kind == "receipt_key_rotated" else "01HZAPPROVAL"
    before = audit.seal(
        audit.GENESIS_HASH, audit.make_entry(5, kind, approval_id, 1_700_000_000_123, old), key
    )
    after = audit.seal(
        audit.GENESIS_HASH,
        audit.make_entry(5, typed.kind, approval_id, 1_700_000_000_123, typed.to_data()),
        key,
    )

    assert typed.kind == kind
    assert after == before  # entry_json, entry_hash and receipt


@pytest.mark.parametrize(("kind", "old", "typed"), CASES, ids=IDS)
def test_entries_from_data_reads_back_what_to_data_wrote(
    kind: str, old: dict[str, Any], typed: Any
) -> None:
    assert type(typed).from_data(old) == typed
    assert type(typed).from_data(old).to_data() == old


def test_entries_from_data_keeps_a_missing_or_foreign_value_as_logged() -> None:
    read = CreatedData.from_data({"pipeline": 3, "approvers": "1,2"})

    assert (read.pipeline, read.approvers, read.step, read.requested_by) == (3, "1,2", None, None)
    assert DispatchAckData.from_data({}) == DispatchAckData(None, None)  # type: ignore[arg-type]
