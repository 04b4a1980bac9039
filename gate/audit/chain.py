"""The hash chain: seal, receipt and sign audit entries; verify a whole log (SPEC §7)."""

from __future__ import annotations

import hashlib
import hmac
import json
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gate.audit import spans as audit_spans
from gate.protocol.canonical import canonical_json, reject_json_constant
from gate.protocol.times import rfc3339
from gate.trust import keys

GENESIS_HASH = "0" * 64
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

    @property
    def data(self) -> dict[str, Any]:
        """The entry's ``data`` object, as logged; {} when it has none (or ``entry`` is not a
        JSON object)."""
        try:
            data = json.loads(self.entry).get("data")
        except (ValueError, AttributeError):
            return {}
        return data if isinstance(data, dict) else {}


# an AuditRow's first seven fields as a tuple row holds them (``entry_problem``'s order)
_ROW_FIELDS = operator.attrgetter(
    "seq", "approval_id", "kind", "entry", "prev_hash", "entry_hash", "receipt"
)


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
    (``gate.audit.receipts.check_receipt``).

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
        reason, wrong_key, digest = entry_problem(spans, prev, expected_seq, *_ROW_FIELDS(row))
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


PREV_BROKEN = "prev_hash does not match the previous entry (entry deleted, inserted or reordered)"


def entry_problem(
    spans: audit_spans.Spans,
    prev: str,
    expected_seq: int,
    seq: int,
    approval_id: str | None,
    kind: str,
    entry_text: str,
    prev_hash: str,
    entry_hash: str,
    receipt_hex: str,
) -> tuple[str | None, bool, str]:
    """Return ``(why the entry is bad or None, wrong_key, its recomputed hash)``: the checks
    of one entry following ``prev`` at ``expected_seq``, then of its receipt with the key of
    its span (``spans.check``, ``wrong_key`` as there), for ``verify`` and
    ``gate.audit.segments.verify_segment`` alike; the entry's fields in the order of a row."""
    if seq != expected_seq:
        return f"expected entry {expected_seq}, found {seq} (deleted or inserted entry)", False, ""
    if prev_hash != prev:
        return PREV_BROKEN, False, ""
    try:  # canonical JSON has no surrounding whitespace: raw_decode, end must be the end
        entry, end = _RAW_DECODE(entry_text)
    except ValueError:
        return "entry is not valid JSON", False, ""
    if end != len(entry_text):
        return "entry is not valid JSON", False, ""
    if type(entry) is not dict or entry.get("seq") != seq:
        return "entry seq does not match its position (reordered)", False, ""
    if entry.get("kind") != kind or entry.get("approval_id") != approval_id:
        return "entry kind/approval_id columns differ from the hashed entry", False, ""
    if _CANONICAL.encode(entry) != entry_text:
        return "entry is not in canonical form (changed)", False, ""
    digest = hashlib.sha256(prev.encode("ascii") + entry_text.encode("utf-8")).hexdigest()
    if not entry_hash.isascii() or not hmac.compare_digest(digest, entry_hash):
        return "entry hash does not match its content (changed)", False, digest
    found = spans.check(seq, kind, digest, receipt_hex)
    return (None, False, digest) if found is None else (*found, digest)
