"""Hash-chained audit entries with HMAC receipts; verify and export (SPEC §7)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gate.protocol.canonical import canonical_json
from gate.protocol.envelope import rfc3339

GENESIS_HASH = "0" * 64
RECEIPT_ALG = "hmac-sha256"


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One stored audit entry: ``entry`` is its canonical JSON text."""

    seq: int
    approval_id: str | None
    kind: str
    entry: str
    prev_hash: str
    entry_hash: str
    receipt: str


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of ``verify``: ``ok``; entries checked; the first bad seq and why, if any."""

    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str = ""


def make_entry(seq: int, kind: str, approval_id: str | None, at_ms: int,
               data: dict[str, Any]) -> dict[str, Any]:
    """Return the entry object that is canonicalized and chained (``seq`` is part of it)."""
    return {"seq": seq, "kind": kind, "approval_id": approval_id, "at": rfc3339(at_ms),
            "data": data}


def chain_hash(prev_hash: str, entry_json: bytes) -> str:
    """Return hex SHA-256 over the previous entry's hash (ASCII hex) + the canonical entry JSON."""
    return hashlib.sha256(prev_hash.encode("ascii") + entry_json).hexdigest()


def receipt(key: bytes, entry_hash: str) -> str:
    """Return hex HMAC-SHA256(receipt key, entry hash as ASCII hex)."""
    return hmac.new(key, entry_hash.encode("ascii"), hashlib.sha256).hexdigest()


def seal(prev_hash: str, entry: dict[str, Any], key: bytes) -> tuple[str, str, str]:
    """Return ``(entry_json, entry_hash, receipt)`` for an entry following ``prev_hash``."""
    entry_json = canonical_json(entry)
    digest = chain_hash(prev_hash, entry_json)
    return entry_json.decode("utf-8"), digest, receipt(key, digest)


def receipt_object(row: AuditRow) -> dict[str, Any]:
    """Return the receipt handed to pipelines: ``{seq, entry_hash, receipt, alg}``."""
    return {"seq": row.seq, "entry_hash": row.entry_hash, "receipt": row.receipt,
            "alg": RECEIPT_ALG}


def verify(rows: Iterable[AuditRow], key: bytes | None) -> VerifyResult:
    """Recompute the chain over ``rows`` (ascending seq) and, with ``key``, every receipt.

    Detects a changed entry (hash mismatch), a deleted or inserted entry (seq gap or
    prev_hash break) and reordering (seq inside the entry differs from its place).
    Returns the first bad entry. A deleted tail is only caught by a later receipt.
    """
    prev = GENESIS_HASH
    expected_seq = 1
    checked = 0
    for row in rows:
        def bad(reason: str, row: AuditRow = row) -> VerifyResult:
            return VerifyResult(False, checked, row.seq, reason)

        if row.seq != expected_seq:
            return bad(f"expected entry {expected_seq}, found {row.seq} (deleted or inserted entry)")
        if row.prev_hash != prev:
            return bad("prev_hash does not match the previous entry (entry deleted, inserted "
                       "or reordered)")
        try:
            entry = json.loads(row.entry)
        except ValueError:
            return bad("entry is not valid JSON")
        if not isinstance(entry, dict) or entry.get("seq") != row.seq:
            return bad("entry seq does not match its position (reordered)")
        if entry.get("kind") != row.kind or entry.get("approval_id") != row.approval_id:
            return bad("entry kind/approval_id columns differ from the hashed entry")
        if canonical_json(entry).decode("utf-8") != row.entry:
            return bad("entry is not in canonical form (changed)")
        digest = chain_hash(prev, row.entry.encode("utf-8"))
        if not hmac.compare_digest(digest, row.entry_hash):
            return bad("entry hash does not match its content (changed)")
        if key is not None and not hmac.compare_digest(receipt(key, digest), row.receipt):
            return bad("receipt does not match (changed, or a different receipt key)")
        prev = digest
        expected_seq += 1
        checked += 1
    return VerifyResult(True, checked)


def export_line(row: AuditRow) -> str:
    """Return one JSON Lines record for ``audit export`` (no trailing newline)."""
    return json.dumps(
        {"seq": row.seq, "approval_id": row.approval_id, "kind": row.kind, "entry": row.entry,
         "prev_hash": row.prev_hash, "entry_hash": row.entry_hash, "receipt": row.receipt},
        ensure_ascii=False, separators=(",", ":"),
    )


def parse_export_line(line: str) -> AuditRow:
    """Parse one ``audit export`` line back into an AuditRow; raises ValueError/KeyError/TypeError."""
    obj = json.loads(line)
    return AuditRow(int(obj["seq"]), obj["approval_id"], str(obj["kind"]), str(obj["entry"]),
                    str(obj["prev_hash"]), str(obj["entry_hash"]), str(obj["receipt"]))
