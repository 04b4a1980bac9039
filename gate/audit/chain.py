"""Hash-chained audit entries, HMAC receipts, Ed25519 signatures; verify and export (SPEC §7)."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gate.audit import spans as audit_spans
from gate.protocol.canonical import canonical_json
from gate.protocol.envelope import reject_json_constant, rfc3339
from gate.trust import keys

GENESIS_HASH = "0" * 64
RECEIPT_ALG = "hmac-sha256"
SIGNATURE_ALG = "ed25519"
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
# verify's decoder and canonical encoder (as ``canonical_json``, to text), built once
# NaN/Infinity are no JSON: an entry holding one is "not valid JSON", not a crash later
_DECODER = json.JSONDecoder(parse_constant=reject_json_constant)
_RAW_DECODE = _DECODER.raw_decode
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)

Signer = keys.Signer  # what ``WriteTx.append_audit`` signs with
# HMAC receipt keys for ``verify``: one key, several (each checks its own span of the log,
# ``gate.audit.spans``), or None (receipts not checked)
ReceiptKeyArg = bytes | Sequence[bytes] | None


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
    ``signed``: how many entries carried a signature that verified (0 when not checked);
    ``wrong_key``: not ok because no receipt key given fits the first entry of a span
    (entry 1 or a rotation: far likelier a wrong key than tampering); ``spans``: when ok
    with receipt keys, ``(first seq, index into the keys given)`` of each receipt-key span
    (``gate.audit.spans``), else ``()`` (not compared: two results of the same check agree)."""

    ok: bool
    checked: int
    first_bad_seq: int | None = None
    reason: str = ""
    signed: int = 0
    wrong_key: bool = False
    spans: tuple[tuple[int, int], ...] = field(default=(), compare=False)


def make_entry(
    seq: int, kind: str, approval_id: str | None, at_ms: int, data: dict[str, Any]
) -> dict[str, Any]:
    """Return the entry object that is canonicalized and chained (``seq`` is part of it)."""
    return {
        "seq": seq,
        "kind": kind,
        "approval_id": approval_id,
        "at": rfc3339(at_ms),
        "data": data,
    }


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


def signature_problem(
    public_keys: keys.PublicKeys, entry_hash: str, key_id: str | None, signature: str | None
) -> str | None:
    """Return why a signature over ``entry_hash`` does not verify, or None when it does."""
    if key_id is None or signature is None:
        return "not signed"
    key = public_keys.get(key_id)
    if key is None:
        return f"signed by key {key_id}, which is not a trusted public key"
    if not _HEX128.fullmatch(signature) or not keys.verify_signature(
        key, bytes.fromhex(signature), entry_hash.encode("ascii")
    ):
        return f"signature does not verify with key {key_id} (changed or forged)"
    return None


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


def receipt_keys(key: ReceiptKeyArg) -> tuple[bytes, ...]:
    """``key`` as a tuple of HMAC receipt keys (``()`` for None)."""
    if key is None:
        return ()
    if isinstance(key, bytes | bytearray):
        return (bytes(key),)
    return tuple(key)


def verify(
    rows: Iterable[AuditRow],
    key: ReceiptKeyArg,
    public_keys: keys.PublicKeys | None = None,
    *,
    leading_unknown: bool = False,
) -> VerifyResult:
    """Recompute the chain over ``rows`` (ascending seq); with ``key`` (one HMAC receipt key,
    or several distinct ones in any order) check every receipt with the key of its span
    (``gate.audit.spans.Spans``; ``leading_unknown`` as there); with ``public_keys``
    ({key id: Ed25519 public key}) check every signature.

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
    spans = audit_spans.Spans(receipt_keys(key), leading_unknown=leading_unknown)
    for row in rows:
        reason, digest = _row_problem(row, prev, expected_seq)
        wrong_key = False
        if reason is None:
            found = spans.check(row.seq, row.kind, digest, row.receipt)
            if found is not None:
                reason, wrong_key = found
        if reason is None and public_keys is not None:
            problem = signature_problem(public_keys, digest, row.key_id, row.signature)
            if problem is None:
                signed += 1
            elif problem != "not signed" or signed:
                reason = (
                    problem
                    if problem != "not signed"
                    else "not signed, after signed entries (signature stripped, or "
                    "entry added without the signing key)"
                )
        if reason is not None:
            return VerifyResult(False, checked, row.seq, reason, signed, wrong_key)
        prev = digest
        expected_seq += 1
        checked += 1
        last = row
    unmatched = spans.finish(None if last is None else last.seq)
    if unmatched is not None:
        return VerifyResult(False, checked, unmatched[0], unmatched[1], signed, True)
    if public_keys is not None and last is not None and not signed:
        return VerifyResult(
            False,
            checked,
            last.seq,
            "not signed: no entry of this log is signed, so nothing proves who wrote it",
            signed,
        )
    return VerifyResult(True, checked, signed=signed, spans=tuple(spans.starts))


_PREV_BROKEN = "prev_hash does not match the previous entry (entry deleted, inserted or reordered)"


def _row_problem(row: AuditRow, prev: str, expected_seq: int) -> tuple[str | None, str]:
    """Return ``(why row is bad or None, its recomputed hash)``: ``verify``'s per-entry
    checks before the receipt's."""
    return _entry_problem(
        row.seq,
        row.approval_id,
        row.kind,
        row.entry,
        row.prev_hash,
        row.entry_hash,
        prev,
        expected_seq,
    )


def _entry_problem(
    seq: int,
    approval_id: str | None,
    kind: str,
    entry_text: str,
    prev_hash: str,
    entry_hash: str,
    prev: str,
    expected_seq: int,
) -> tuple[str | None, str]:
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
    if not entry_hash.isascii() or not hmac.compare_digest(digest, entry_hash):
        return "entry hash does not match its content (changed)", digest
    return None, digest


@dataclass(frozen=True, slots=True)
class Segment:
    """What ``verify_segment`` saw in one run of consecutive entries, for ``stitch``.

    ``first_seq``/``first_prev``: seq and prev_hash of its first row, taken as given (None
    when the run had no rows); ``last_seq``/``last_hash``: of the last row that verified;
    ``checked``: rows that verified; ``problem``: ``(seq, reason)`` of the first bad row,
    ``wrong_key`` as in VerifyResult. Receipt-key spans (index into the keys given, None
    without keys): ``initial_key`` of its first row, ``starts`` ``(seq, key)`` of the spans
    begun in it, ``end_key`` of the span open at its end.
    """

    first_seq: int | None
    first_prev: str | None
    last_seq: int | None
    last_hash: str | None
    checked: int
    problem: tuple[int, str] | None = None
    wrong_key: bool = False
    initial_key: int | None = None
    starts: tuple[tuple[int, int], ...] = ()
    end_key: int | None = None


def verify_segment(rows: Iterable[Sequence[Any]], key: ReceiptKeyArg) -> Segment:
    """Verify a run of consecutive entries on its own, as ``verify`` does for the whole log.

    ``rows``: ascending tuples ``(seq, approval_id, kind, entry, prev_hash, entry_hash,
    receipt, ...)``. The first row's seq and prev_hash are taken as given: ``stitch``
    checks them against the run before, and the receipt key of its first row (found by
    trying each key given) against the span the run before ended in. Runs are
    independent, so they can be verified in parallel (``gate.audit.verify.verify_database``).
    Signatures are not checked here.
    """
    prev = ""
    expected = 0
    first: tuple[int, str] | None = None
    checked = 0
    spans = audit_spans.Spans(receipt_keys(key))
    for row in rows:
        seq, approval_id, kind, entry_text, prev_hash, entry_hash, receipt_hex = row[:7]
        if first is None:
            first, prev, expected = (seq, prev_hash), prev_hash, seq
        reason, digest = _entry_problem(
            seq, approval_id, kind, entry_text, prev_hash, entry_hash, prev, expected
        )
        wrong_key = False
        if reason is None:
            found = spans.check(seq, kind, digest, receipt_hex)
            if found is not None:
                reason, wrong_key = found
        if reason is not None:
            return Segment(
                first[0],
                first[1],
                expected - 1 if checked else None,
                prev if checked else None,
                checked,
                (seq, reason),
                wrong_key,
                spans.initial,
                tuple(spans.starts),
                spans.current,
            )
        prev = digest
        expected += 1
        checked += 1
    if first is None:
        return Segment(None, None, None, None, 0)
    return Segment(
        first[0],
        first[1],
        expected - 1,
        prev,
        checked,
        None,
        False,
        spans.initial,
        tuple(spans.starts),
        spans.current,
    )


def stitch(segments: Iterable[Segment]) -> VerifyResult:
    """Join consecutive ``verify_segment`` results (ascending, covering seq 1 upwards) into
    what ``verify`` returns for the same rows without public keys: the same first bad
    entry and reason, the same count. Stops reading ``segments`` at the first problem."""
    prev, expected, checked = GENESIS_HASH, 1, 0
    current: int | None = None  # receipt key of the span open so far
    used: set[int] = set()
    starts: list[tuple[int, int]] = []
    for segment in segments:
        if segment.first_seq is None:
            continue
        if segment.first_seq != expected:
            return VerifyResult(
                False,
                checked,
                segment.first_seq,
                f"expected entry {expected}, found {segment.first_seq} (deleted or inserted entry)",
            )
        if segment.first_prev != prev:
            return VerifyResult(False, checked, segment.first_seq, _PREV_BROKEN)
        begins = bool(segment.starts) and segment.starts[0][0] == segment.first_seq
        if segment.initial_key is not None and not begins and segment.initial_key != current:
            # its first entry verified with another key than the span it continues
            return VerifyResult(False, checked, segment.first_seq, audit_spans.RECEIPT_MISMATCH)
        for seq, index in segment.starts:  # each rotation is to a key no earlier span used
            if index in used:
                return VerifyResult(
                    False, checked + seq - segment.first_seq, seq, audit_spans.OLD_KEY
                )
            used.add(index)
            starts.append((seq, index))
        if segment.problem is not None:
            return VerifyResult(
                False,
                checked + segment.checked,
                segment.problem[0],
                segment.problem[1],
                wrong_key=segment.wrong_key,
            )
        checked += segment.checked
        current = segment.end_key
        assert segment.last_seq is not None and segment.last_hash is not None
        expected, prev = segment.last_seq + 1, segment.last_hash
    return VerifyResult(True, checked, spans=tuple(starts))


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
                    "entry hash differs from the logged head's (the log was rewritten up to here)"
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


def export_line(row: AuditRow) -> str:
    """Return one JSON Lines record for ``audit export`` (no trailing newline).

    Fields: seq, approval_id, kind, entry (canonical JSON text), prev_hash, entry_hash,
    receipt, key_id and signature (null when the entry is not signed).
    """
    return json.dumps(
        {
            "seq": row.seq,
            "approval_id": row.approval_id,
            "kind": row.kind,
            "entry": row.entry,
            "prev_hash": row.prev_hash,
            "entry_hash": row.entry_hash,
            "receipt": row.receipt,
            "key_id": row.key_id,
            "signature": row.signature,
        },
        ensure_ascii=False,
        separators=(",", ":"),
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
    kind, entry, prev_hash, entry_hash, receipt = texts
    return AuditRow(
        seq,
        _optional_text(obj, "approval_id"),
        kind,
        entry,
        prev_hash,
        entry_hash,
        receipt,
        _optional_text(obj, "key_id"),
        _optional_text(obj, "signature"),
    )
