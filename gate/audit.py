"""Hash-chained audit entries, HMAC receipts, Ed25519 signatures; verify and export (SPEC §7)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate import keys
from gate.protocol.canonical import canonical_json
from gate.protocol.envelope import reject_json_constant, rfc3339

GENESIS_HASH = "0" * 64
RECEIPT_ALG = "hmac-sha256"
SIGNATURE_ALG = "ed25519"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
# verify's decoder and canonical encoder (as ``canonical_json``, to text), built once
# NaN/Infinity are no JSON: an entry holding one is "not valid JSON", not a crash later
_DECODER = json.JSONDecoder(parse_constant=reject_json_constant)
_RAW_DECODE = _DECODER.raw_decode
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)

Signer = keys.Signer  # what ``WriteTx.append_audit`` signs with


@dataclass(frozen=True, slots=True)
class AuditRow:
    """One stored audit entry: ``entry`` is its canonical JSON text.

    ``key_id``/``signature`` (lowercase hex Ed25519 signature of ``entry_hash`` as ASCII)
    are set when the gate had a signing key, else None.
    """

    seq: int
    approval_id: str | None
    kind: str
    entry: str
    prev_hash: str
    entry_hash: str
    receipt: str
    key_id: str | None = None
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """Outcome of ``verify``: ``ok``; entries checked; the first bad seq and why, if any;
    ``signed``: how many entries carried a signature that verified (0 when not checked)."""

    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str = ""
    signed: int = 0


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
    return hmac.digest(key, entry_hash.encode("ascii"), "sha256").hex()


def seal(prev_hash: str, entry: dict[str, Any], key: bytes) -> tuple[str, str, str]:
    """Return ``(entry_json, entry_hash, receipt)`` for an entry following ``prev_hash``."""
    entry_json = canonical_json(entry)
    digest = chain_hash(prev_hash, entry_json)
    return entry_json.decode("utf-8"), digest, receipt(key, digest)


def sign(signer: Signer, entry_hash: str) -> tuple[str, str]:
    """Return ``(key_id, signature)``: hex Ed25519 signature of the entry hash as ASCII hex."""
    return signer.key_id, signer.sign(entry_hash.encode("ascii")).hex()


def signature_problem(public_keys: keys.PublicKeys, entry_hash: str, key_id: str | None,
                      signature: str | None) -> str | None:
    """Return why a signature over ``entry_hash`` does not verify, or None when it does."""
    if key_id is None or signature is None:
        return "not signed"
    key = public_keys.get(key_id)
    if key is None:
        return f"signed by key {key_id}, which is not a trusted public key"
    if not _HEX128.fullmatch(signature) or not keys.verify_signature(
            key, bytes.fromhex(signature), entry_hash.encode("ascii")):
        return f"signature does not verify with key {key_id} (changed or forged)"
    return None


def receipt_object(row: AuditRow) -> dict[str, Any]:
    """Return the receipt handed to pipelines: ``{seq, entry_hash, receipt, alg}``, plus
    ``key_id``, ``signature`` and ``signature_alg`` (``ed25519``) when the entry is signed."""
    out: dict[str, Any] = {"seq": row.seq, "entry_hash": row.entry_hash,
                           "receipt": row.receipt, "alg": RECEIPT_ALG}
    if row.signature is not None:
        out.update(key_id=row.key_id, signature=row.signature, signature_alg=SIGNATURE_ALG)
    return out


def verify(rows: Iterable[AuditRow], key: bytes | None,
           public_keys: keys.PublicKeys | None = None) -> VerifyResult:
    """Recompute the chain over ``rows`` (ascending seq); with ``key`` check every HMAC
    receipt; with ``public_keys`` ({key id: Ed25519 public key}) check every signature.

    Detects a changed entry (hash mismatch), a deleted or inserted entry (seq gap or
    prev_hash break) and reordering (seq inside the entry differs from its place).
    Returns the first bad entry. A deleted tail is only caught by a later receipt
    (``check_receipt``).

    With ``public_keys`` nothing secret is needed, and since anyone can recompute a hash
    chain, signatures are what make the log authentic: every signed entry must verify
    with a trusted key; unsigned entries are accepted only before the first signed one
    (a log that began before signing was enabled: the first signature's hash chains over
    them), and at least the last entry must be signed.
    """
    prev = GENESIS_HASH
    expected_seq = 1
    checked = 0
    signed = 0
    last: AuditRow | None = None
    for row in rows:
        reason, digest = _row_problem(row, prev, expected_seq, key)
        if reason is None and public_keys is not None:
            problem = signature_problem(public_keys, digest, row.key_id, row.signature)
            if problem is None:
                signed += 1
            elif problem != "not signed" or signed:
                reason = (problem if problem != "not signed" else
                          "not signed, after signed entries (signature stripped, or "
                          "entry added without the signing key)")
        if reason is not None:
            return VerifyResult(False, checked, row.seq, reason, signed)
        prev = digest
        expected_seq += 1
        checked += 1
        last = row
    if public_keys is not None and last is not None and not signed:
        return VerifyResult(False, checked, last.seq, "not signed: no entry of this log is "
                            "signed, so nothing proves who wrote it", signed)
    return VerifyResult(True, checked, signed=signed)


_PREV_BROKEN = ("prev_hash does not match the previous entry (entry deleted, inserted or "
                "reordered)")


def _row_problem(row: AuditRow, prev: str, expected_seq: int,
                 key: bytes | None) -> tuple[str | None, str]:
    """Return ``(why row is bad or None, its recomputed hash)`` (``verify``'s per-entry checks)."""
    return _entry_problem(row.seq, row.approval_id, row.kind, row.entry, row.prev_hash,
                          row.entry_hash, row.receipt, prev, expected_seq, key)


def _entry_problem(seq: int, approval_id: str | None, kind: str, entry_text: str,
                   prev_hash: str, entry_hash: str, receipt_hex: str, prev: str,
                   expected_seq: int, key: bytes | None) -> tuple[str | None, str]:
    if seq != expected_seq:
        return f"expected entry {expected_seq}, found {seq} (deleted or inserted entry)", ""
    if prev_hash != prev:
        return _PREV_BROKEN, ""
    try:  # canonical JSON has no surrounding whitespace: raw_decode, end must be the end
        entry, end = _RAW_DECODE(entry_text)
    except ValueError:
        return "entry is not valid JSON", ""
    if end != len(entry_text):
        return "entry is not valid JSON", ""
    if type(entry) is not dict or entry.get("seq") != seq:
        return "entry seq does not match its position (reordered)", ""
    if entry.get("kind") != kind or entry.get("approval_id") != approval_id:
        return "entry kind/approval_id columns differ from the hashed entry", ""
    if _CANONICAL.encode(entry) != entry_text:
        return "entry is not in canonical form (changed)", ""
    digest = hashlib.sha256(prev.encode("ascii") + entry_text.encode("utf-8")).hexdigest()
    if not hmac.compare_digest(digest, entry_hash):
        return "entry hash does not match its content (changed)", digest
    if key is not None and not hmac.compare_digest(
            hmac.digest(key, digest.encode("ascii"), "sha256").hex(), receipt_hex):
        return "receipt does not match (changed, or a different receipt key)", digest
    return None, digest


@dataclass(frozen=True, slots=True)
class Segment:
    """What ``verify_segment`` saw in one run of consecutive entries, for ``stitch``.

    ``first_seq``/``first_prev``: seq and prev_hash of its first row, taken as given (None
    when the run had no rows); ``last_seq``/``last_hash``: of the last row that verified;
    ``checked``: rows that verified; ``problem``: ``(seq, reason)`` of the first bad row.
    """

    first_seq: int | None
    first_prev: str | None
    last_seq: int | None
    last_hash: str | None
    checked: int
    problem: tuple[int, str] | None = None


def verify_segment(rows: Iterable[Sequence[Any]], key: bytes | None) -> Segment:
    """Verify a run of consecutive entries on its own, as ``verify`` does for the whole log.

    ``rows``: ascending tuples ``(seq, approval_id, kind, entry, prev_hash, entry_hash,
    receipt, ...)``. The first row's seq and prev_hash are taken as given: ``stitch``
    checks them against the run before. Runs are independent, so they can be verified in
    parallel (``gate.auditops.verify_database``). Signatures are not checked here.
    """
    prev = ""
    expected = 0
    first: tuple[int, str] | None = None
    checked = 0
    for row in rows:
        seq, approval_id, kind, entry_text, prev_hash, entry_hash, receipt_hex = row[:7]
        if first is None:
            first, prev, expected = (seq, prev_hash), prev_hash, seq
        reason, digest = _entry_problem(seq, approval_id, kind, entry_text, prev_hash,
                                        entry_hash, receipt_hex, prev, expected, key)
        if reason is not None:
            return Segment(first[0], first[1], expected - 1 if checked else None,
                           prev if checked else None, checked, (seq, reason))
        prev = digest
        expected += 1
        checked += 1
    if first is None:
        return Segment(None, None, None, None, 0)
    return Segment(first[0], first[1], expected - 1, prev, checked)


def stitch(segments: Iterable[Segment]) -> VerifyResult:
    """Join consecutive ``verify_segment`` results (ascending, covering seq 1 upwards) into
    what ``verify`` returns for the same rows without public keys: the same first bad
    entry and reason, the same count. Stops reading ``segments`` at the first problem."""
    prev, expected, checked = GENESIS_HASH, 1, 0
    for segment in segments:
        if segment.first_seq is None:
            continue
        if segment.first_seq != expected:
            return VerifyResult(False, checked, segment.first_seq,
                                f"expected entry {expected}, found {segment.first_seq} "
                                "(deleted or inserted entry)")
        if segment.first_prev != prev:
            return VerifyResult(False, checked, segment.first_seq, _PREV_BROKEN)
        if segment.problem is not None:
            return VerifyResult(False, checked + segment.checked, segment.problem[0],
                                segment.problem[1])
        checked += segment.checked
        assert segment.last_seq is not None and segment.last_hash is not None
        expected, prev = segment.last_seq + 1, segment.last_hash
    return VerifyResult(True, checked)


def receipt_problem(rows: Iterable[AuditRow], held: Mapping[str, Any], key: bytes | None,
                    public_keys: keys.PublicKeys | None) -> tuple[int, str] | None:
    """``check_receipt``, with a ``held`` object that is no receipt reported as a problem at
    its ``seq`` (0 when it has none) instead of raised: ``(seq, reason)`` or None."""
    try:
        return check_receipt(rows, held, key, public_keys)
    except ValueError as exc:
        seq = held.get("seq")
        return (seq if isinstance(seq, int) and not isinstance(seq, bool) else 0,
                f"not a receipt ({exc})")


def check_receipt(rows: Iterable[AuditRow], held: Mapping[str, Any], key: bytes | None = None,
                  public_keys: keys.PublicKeys | None = None) -> tuple[int, str] | None:
    """Check that a verified log ``rows`` holds the receipt ``held`` (``audit verify --expect``).

    ``held`` is a receipt object (``{seq, entry_hash, ...}``). Returns ``(seq, reason)`` for
    the first problem, or None when the log holds it: an entry at ``seq`` whose hash equals
    the receipt's. With ``key`` the receipt's HMAC, with ``public_keys`` its signature (if it
    has one) must verify too, so a made-up receipt is not mistaken for a deleted tail.
    Raises ValueError when ``held`` is not a receipt object.
    """
    seq, entry_hash = held.get("seq"), held.get("entry_hash")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 or not isinstance(
            entry_hash, str) or not _HEX64.fullmatch(entry_hash):
        raise ValueError("not a receipt (needs an integer seq and a 64-hex entry_hash)")
    if key is not None and not hmac.compare_digest(receipt(key, entry_hash),
                                                   str(held.get("receipt"))):
        return seq, "the receipt's HMAC does not match the receipt key (not a genuine receipt)"
    if public_keys is not None and held.get("signature") is not None:
        problem = signature_problem(public_keys, entry_hash, held.get("key_id"),
                                    str(held["signature"]))
        if problem is not None:
            return seq, f"the receipt's {problem} (not a genuine receipt)"
    found, end = None, 0
    for row in rows:  # one pass: ``rows`` may be streamed from the database
        end = row.seq
        if row.seq == seq:
            found = row
            break
    if found is None:
        return seq, (f"missing: the log ends at entry {end}, but a receipt for entry {seq} "
                     "exists (entries deleted from the tail)")
    if not hmac.compare_digest(found.entry_hash, entry_hash):
        return seq, "entry hash differs from the receipt's (the entry was replaced)"
    return None


def head_problem(rows: Iterable[AuditRow], heads: Iterable[tuple[int, str]]
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
                return head, ("entry hash differs from the logged head's (the log was "
                              "rewritten up to here)")
            index += 1
        if index == len(wanted):
            return None
    if index < len(wanted):
        head = wanted[index]
        return head, (f"missing: the log ends at entry {end}, but the gate logged entry "
                      f"{head[0]} as its head (entries deleted from the tail)")
    return None


def export_line(row: AuditRow) -> str:
    """Return one JSON Lines record for ``audit export`` (no trailing newline).

    Fields: seq, approval_id, kind, entry (canonical JSON text), prev_hash, entry_hash,
    receipt, key_id and signature (null when the entry is not signed).
    """
    return json.dumps(
        {"seq": row.seq, "approval_id": row.approval_id, "kind": row.kind, "entry": row.entry,
         "prev_hash": row.prev_hash, "entry_hash": row.entry_hash, "receipt": row.receipt,
         "key_id": row.key_id, "signature": row.signature},
        ensure_ascii=False, separators=(",", ":"),
    )


def _optional_text(obj: Mapping[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string or null")
    return value


def parse_export_line(line: str) -> AuditRow:
    """Parse one ``audit export`` line back into an AuditRow; raises ValueError/KeyError/TypeError.

    Exports written before signing existed (no key_id/signature fields) parse as unsigned.
    """
    obj = json.loads(line, parse_constant=reject_json_constant)
    if not isinstance(obj, dict):
        raise TypeError("an export line is a JSON object")
    seq = obj["seq"]
    if type(seq) is not int:  # as written: no "1", 1.9 or true (the Node verifier agrees)
        raise TypeError("seq must be an integer")
    texts = [obj[name] for name in ("kind", "entry", "prev_hash", "entry_hash", "receipt")]
    if not all(isinstance(text, str) for text in texts):
        raise TypeError("kind, entry, prev_hash, entry_hash and receipt must be strings")
    return AuditRow(seq, _optional_text(obj, "approval_id"), *texts,
                    _optional_text(obj, "key_id"), _optional_text(obj, "signature"))
