"""Receipts: the object handed to pipelines, and receipts and chain heads held outside the
database checked against a verified log (SPEC §7)."""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gate.audit import spans as audit_spans
from gate.audit.chain import (
    AuditRow,
    ReceiptKeyArg,
    VerifyResult,
    receipt_keys,
    signature_problem,
)
from gate.trust import keys

RECEIPT_ALG = "hmac-sha256"
SIGNATURE_ALG = "ed25519"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def receipt_object(row: AuditRow) -> dict[str, Any]:
    """Return the receipt handed to pipelines: ``{seq, entry_hash, receipt, alg}``, plus
    ``key_id``, ``signature`` and ``signature_alg`` (``ed25519``) when the entry is signed."""
    out: dict[str, Any] = {
        "seq": row.seq,
        "entry_hash": row.entry_hash,
        "receipt": row.receipt,
        "alg": RECEIPT_ALG,
    }
    if row.signature is not None:
        out.update(key_id=row.key_id, signature=row.signature, signature_alg=SIGNATURE_ALG)
    return out


def span_keys(result: VerifyResult, key: ReceiptKeyArg, seq: object) -> tuple[bytes, ...] | None:
    """The receipt keys a receipt for entry ``seq`` of the log ``result`` verified may be
    made with (``gate.audit.spans.keys_for``), for ``check_receipt``; None: not checkable."""
    return audit_spans.keys_for(result.spans, receipt_keys(key), result.checked, seq)


def receipt_problem(
    rows: Iterable[AuditRow],
    held: Mapping[str, Any],
    key: ReceiptKeyArg,
    public_keys: keys.PublicKeys | None,
) -> tuple[int, str] | None:
    """``check_receipt``, with a ``held`` object that is no receipt reported as a problem at
    its ``seq`` (0 when it has none) instead of raised: ``(seq, reason)`` or None."""
    try:
        return check_receipt(rows, held, key, public_keys)
    except ValueError as exc:
        seq = held.get("seq")
        return (
            seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
            f"not a receipt ({exc})",
        )


def check_receipt(
    rows: Iterable[AuditRow],
    held: Mapping[str, Any],
    key: ReceiptKeyArg = None,
    public_keys: keys.PublicKeys | None = None,
) -> tuple[int, str] | None:
    """Check that a verified log ``rows`` holds the receipt ``held`` (``audit verify --expect``).

    ``held`` is a receipt object (``{seq, entry_hash, ...}``). Returns ``(seq, reason)`` for
    the first problem, or None when the log holds it: an entry at ``seq`` whose hash equals
    the receipt's. With ``key`` (one key, or the keys it may be made with: ``span_keys``)
    the receipt's HMAC, with ``public_keys`` its signature (if it has one) must verify too,
    so a made-up receipt is not mistaken for a deleted tail; with neither, a receipt beyond
    the log's end is reported as unauthenticated, not as a deleted tail.
    Raises ValueError when ``held`` is not a receipt object.
    """
    seq, entry_hash = held.get("seq"), held.get("entry_hash")
    if (
        isinstance(seq, bool)
        or not isinstance(seq, int)
        or seq < 1
        or not isinstance(entry_hash, str)
        or not _HEX64.fullmatch(entry_hash)
    ):
        raise ValueError("not a receipt (needs an integer seq and a 64-hex entry_hash)")
    candidates = receipt_keys(key)
    if candidates and not any(
        audit_spans.matches(k, entry_hash, str(held.get("receipt"))) for k in candidates
    ):
        return seq, "the receipt's HMAC does not match the receipt key (not a genuine receipt)"
    signed = public_keys is not None and held.get("signature") is not None
    if signed:
        assert public_keys is not None
        problem = signature_problem(
            public_keys, entry_hash, held.get("key_id"), str(held["signature"])
        )
        if problem is not None:
            return seq, f"the receipt's {problem} (not a genuine receipt)"
    found, end = None, 0
    for row in rows:  # one pass: ``rows`` may be streamed from the database
        end = row.seq
        if row.seq == seq:
            found = row
            break
    if found is None:
        if not candidates and not signed:  # nothing says the receipt is the gate's
            return seq, (
                f"missing: the log ends at entry {end}, but the receipt names entry {seq}; "
                "the receipt was not authenticated (no receipt key, and no signature checked"
                " with a public key): either entries were deleted from the tail or the"
                " receipt is not this gate's; give --key-env or --public-key to tell which"
            )
        return seq, (
            f"missing: the log ends at entry {end}, but a receipt for entry {seq} "
            "exists (entries deleted from the tail)"
        )
    if not hmac.compare_digest(found.entry_hash, entry_hash):
        return seq, "entry hash differs from the receipt's (the entry was replaced)"
    return None


def head_problem(
    rows: Iterable[AuditRow], heads: Iterable[tuple[int, str]]
) -> tuple[tuple[int, str], str] | None:
    """Check that a verified log ``rows`` (ascending seq) holds every chain head in
    ``heads``: ``(seq, entry_hash)`` pairs as the gate logs them after each commit that
    appended entries (``event=audit_head``; ``audit verify --expect-head``), in one pass.

    The entry hash at ``seq`` commits to every entry before it, so a head held outside the
    database anchors the whole log up to ``seq``: a log cut below ``seq`` (a deleted tail)
    or changed at or before it (rewritten and chained again) no longer holds it. Returns
    ``(the head, reason)`` for the lowest head the log does not hold, or None.
    """
    wanted = sorted(set(heads))
    index, end = 0, 0
    for row in rows:
        end = row.seq
        while index < len(wanted) and wanted[index][0] <= row.seq:
            head = wanted[index]
            if head[0] < row.seq:  # a verified log has no gap: only an entry before seq 1
                return head, f"missing: the log holds no entry {head[0]}"
            if not hmac.compare_digest(row.entry_hash, head[1]):
                return head, (
                    "entry hash differs from the logged head's (the log was rewritten up to"
                    " here, or restored from a backup without this entry and written again"
                    " since)"
                )
            index += 1
        if index == len(wanted):
            return None
    if index < len(wanted):
        head = wanted[index]
        return head, (
            f"missing: the log ends at entry {end}, but the gate logged entry "
            f"{head[0]} as its head (entries deleted from the tail)"
        )
    return None
