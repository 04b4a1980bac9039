"""Tests for gate.audit.chain (SPEC §7): seal/verify a hash chain, tamper detection; and for
the receipt object (gate.audit.receipts) and the export round trip (gate.audit.export)."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from typing import Any

import pytest

from gate.audit import chain as audit
from gate.audit.chain import GENESIS_HASH, AuditRow, VerifyResult
from gate.audit.export import export_line, parse_export_line
from gate.audit.receipts import receipt_object

KEY = b"test-receipt-key-91c2"
AID = "01KDWZ8B00J3Q9V5X7Z2M4N6PR"
T0 = 1767225600000


def chain(n: int = 5, key: bytes = KEY) -> list[AuditRow]:
    """Build ``n`` sealed rows the way the store does (seq from 1, prev_hash from genesis)."""
    kinds = ["created", "dispatch_ack", "decision", "decision", "resolved"]
    rows: list[AuditRow] = []
    prev = GENESIS_HASH
    for seq in range(1, n + 1):
        kind = kinds[(seq - 1) % len(kinds)]
        entry = audit.make_entry(
            seq,
            kind,
            AID,
            T0 + seq * 1000,
            {"n": seq, "note": "Zoë 👍 é", "operator_id": 100 + seq},
        )
        entry_json, digest, receipt = audit.seal(prev, entry, key)
        rows.append(AuditRow(seq, AID, kind, entry_json, prev, digest, receipt))
        prev = digest
    return rows


def forge(
    prev_hash: str,
    seq: int,
    kind: str = "decision",
    key: bytes = b"attacker-key",
    data: dict[str, Any] | None = None,
) -> AuditRow:
    """A well-formed row an attacker without the receipt key can produce."""
    entry = audit.make_entry(seq, kind, AID, T0, data or {"operator_id": 666})
    entry_json, digest, receipt = audit.seal(prev_hash, entry, key)
    return AuditRow(seq, AID, kind, entry_json, prev_hash, digest, receipt)


def test_audit_chain_of_five_verifies() -> None:
    rows = chain()

    assert audit.verify(rows, KEY) == VerifyResult(True, 5)
    assert audit.verify(rows, None) == VerifyResult(True, 5)
    assert rows[0].prev_hash == "0" * 64
    assert all(rows[i].prev_hash == rows[i - 1].entry_hash for i in range(1, 5))


def test_audit_empty_chain_verifies() -> None:
    assert audit.verify([], KEY) == VerifyResult(True, 0)


def test_audit_seal_matches_spec_formula() -> None:
    entry = audit.make_entry(1, "created", AID, T0, {"b": 2, "a": "é"})
    entry_json, digest, receipt = audit.seal(GENESIS_HASH, entry, KEY)

    assert entry_json == (
        '{"approval_id":"' + AID + '","at":"2026-01-01T00:00:00Z",'
        '"data":{"a":"é","b":2},"kind":"created","seq":1}'
    )
    expected = hashlib.sha256(("0" * 64).encode() + entry_json.encode("utf-8")).hexdigest()
    assert digest == expected
    assert receipt == hmac.new(KEY, expected.encode(), hashlib.sha256).hexdigest()


def flip(text: str, index: int) -> str:
    """Change one character of ``text`` at ``index`` (a different hex digit / letter)."""
    ch = text[index]
    new = "0" if ch != "0" else "1"
    return text[:index] + new + text[index + 1 :]


def replace_entry_byte(row: AuditRow) -> AuditRow:
    """Change one digit inside the entry's data, keeping the JSON canonical."""
    assert '"n":3' in row.entry
    return dataclasses.replace(row, entry=row.entry.replace('"n":3', '"n":4'))


@pytest.mark.parametrize(
    ("tamper", "first_bad"),
    [
        (lambda rows: rows[:2] + [replace_entry_byte(rows[2])] + rows[3:], 3),
        (
            lambda rows: (
                rows[:2]
                + [dataclasses.replace(rows[2], entry_hash=flip(rows[2].entry_hash, 10))]
                + rows[3:]
            ),
            3,
        ),
        (
            lambda rows: (
                rows[:2]
                + [dataclasses.replace(rows[2], receipt=flip(rows[2].receipt, 0))]
                + rows[3:]
            ),
            3,
        ),
        (lambda rows: rows[:2] + [dataclasses.replace(rows[2], kind="resolved")] + rows[3:], 3),
        (
            lambda rows: (
                rows[:2]
                + [
                    dataclasses.replace(
                        rows[2],
                        entry=rows[2].entry.replace('"operator_id":103', '"operator_id": 103'),
                    )
                ]
                + rows[3:]
            ),
            3,
        ),
    ],
    ids=[
        "entry_one_byte",
        "entry_hash_one_byte",
        "receipt_one_byte",
        "kind_column",
        "non_canonical_spacing",
    ],
)
def test_audit_verify_detects_changed_row(tamper: Any, first_bad: int) -> None:
    result = audit.verify(tamper(chain()), KEY)

    assert not result.ok
    assert result.first_bad_seq == first_bad
    assert result.checked == first_bad - 1
    assert result.reason


def test_audit_verify_detects_deleted_middle_row() -> None:
    rows = chain()
    del rows[2]  # seq 3

    result = audit.verify(rows, KEY)
    assert (result.ok, result.first_bad_seq) == (False, 4)
    assert "deleted" in result.reason


def test_audit_verify_detects_swapped_rows_in_place() -> None:
    # what a database edit looks like: seq 3 and 4 swap their contents, rows read ORDER BY seq
    rows = chain()
    r3, r4 = rows[2], rows[3]
    rows[2] = dataclasses.replace(r4, seq=3)
    rows[3] = dataclasses.replace(r3, seq=4)

    result = audit.verify(rows, KEY)
    assert (result.ok, result.first_bad_seq) == (False, 3)


def test_audit_verify_detects_swapped_rows_in_order() -> None:
    # an export file with two lines swapped: the row found at position 3 is seq 4
    rows = chain()
    rows[2], rows[3] = rows[3], rows[2]

    result = audit.verify(rows, KEY)
    assert (result.ok, result.first_bad_seq) == (False, 4)


def test_audit_verify_detects_swapped_rows_rechained() -> None:
    # an attacker re-links the swapped rows (prev_hash/entry_hash recomputed, no key):
    # the seq inside the hashed entry still gives the reordering away
    rows = chain()
    entry3, entry4 = rows[2].entry, rows[3].entry
    prev = rows[1].entry_hash
    forged = []
    for seq, entry_json in ((3, entry4), (4, entry3)):
        digest = audit.chain_hash(prev, entry_json.encode())
        kind = json.loads(entry_json)["kind"]
        forged.append(
            AuditRow(
                seq, AID, kind, entry_json, prev, digest, audit.receipt(b"attacker-key", digest)
            )
        )
        prev = digest

    result = audit.verify(rows[:2] + forged + rows[4:], None)
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert "reordered" in result.reason


def test_audit_verify_detects_inserted_forged_row() -> None:
    rows = chain()
    fake = forge(rows[1].entry_hash, 3)  # validly chained after seq 2, sealed with a wrong key
    renumbered = [dataclasses.replace(r, seq=r.seq + 1) for r in rows[2:]]
    tampered = rows[:2] + [fake] + renumbered

    with_key = audit.verify(tampered, KEY)
    assert (with_key.ok, with_key.first_bad_seq) == (False, 3)
    assert "receipt" in with_key.reason
    without_key = audit.verify(tampered, None)  # the chain alone breaks at the next row
    assert (without_key.ok, without_key.first_bad_seq) == (False, 4)


def test_audit_verify_detects_inserted_duplicate_seq() -> None:
    rows = chain()
    tampered = rows[:3] + [forge(rows[2].entry_hash, 3)] + rows[3:]

    result = audit.verify(tampered, KEY)
    assert (result.ok, result.first_bad_seq) == (False, 3)


def test_audit_verify_wrong_key_fails_first_row() -> None:
    result = audit.verify(chain(), b"another-key")

    assert (result.ok, result.first_bad_seq, result.checked) == (False, 1, 0)
    assert "receipt" in result.reason


def test_audit_verify_fully_resealed_chain_needs_key() -> None:
    # rewriting every row with a guessed key keeps the chain consistent; only the key tells
    rows = chain(key=b"attacker-key")

    assert audit.verify(rows, None).ok
    assert audit.verify(rows, KEY).first_bad_seq == 1


def test_audit_verify_rejects_entry_not_json() -> None:
    rows = chain()
    rows[0] = dataclasses.replace(rows[0], entry="{not json")

    assert audit.verify(rows, KEY).first_bad_seq == 1


def test_audit_export_parse_round_trip() -> None:
    rows = chain()
    lines = [export_line(r) for r in rows]

    assert all("\n" not in line for line in lines)
    assert "Zoë 👍" in lines[0]  # non-ASCII kept readable
    parsed = [parse_export_line(line) for line in lines]
    assert parsed == rows
    assert audit.verify(parsed, KEY) == VerifyResult(True, 5)


def test_audit_export_round_trip_null_approval_id() -> None:
    entry = audit.make_entry(1, "note", None, T0, {})
    entry_json, digest, receipt = audit.seal(GENESIS_HASH, entry, KEY)
    row = AuditRow(1, None, "note", entry_json, GENESIS_HASH, digest, receipt)

    assert parse_export_line(export_line(row)) == row
    assert audit.verify([row], KEY).ok


@pytest.mark.parametrize(
    "line",
    [
        '{"seq": 1}',
        "[]",
        "not json",
        '{"seq":"x","approval_id":null,'
        '"kind":"k","entry":"{}","prev_hash":"","entry_hash":"",'
        '"receipt":""}',
    ],
    ids=["missing_keys", "array", "not_json", "seq_not_int"],
)
def test_audit_parse_export_line_bad_input_raises_documented_errors(line: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        parse_export_line(line)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", "1"),
        ("seq", 1.9),
        ("seq", True),
        ("kind", 5),
        ("entry", {"seq": 1}),
        ("prev_hash", None),
        ("approval_id", 7),
    ],
)
def test_audit_parse_export_line_takes_each_field_as_written_only(field: str, value: Any) -> None:
    """Security review: ``"seq": "1"`` or ``1.9`` was coerced with int() (the Node verifier of
    docs/auditing.md refuses them, so the two verifiers disagreed); other fields with str()."""
    row = chain(1)[0]
    obj = json.loads(export_line(row))
    obj[field] = value
    with pytest.raises((ValueError, KeyError, TypeError)):
        parse_export_line(json.dumps(obj))


def test_audit_verify_names_an_entry_holding_nan_instead_of_crashing() -> None:
    """Security review: ``NaN`` inside an entry crashed ``audit verify`` with a bare
    ValueError instead of naming the entry."""
    rows = chain(2)
    bad = dataclasses.replace(
        rows[1], entry=rows[1].entry.replace('"data":{', '"data":{"x":NaN,', 1)
    )
    result = audit.verify([rows[0], bad], KEY)
    assert (result.ok, result.first_bad_seq) == (False, 2), result
    assert result.reason == "entry is not valid JSON", result


def test_audit_receipt_object_shape() -> None:
    row = chain(1)[0]

    assert receipt_object(row) == {
        "seq": 1,
        "entry_hash": row.entry_hash,
        "receipt": row.receipt,
        "alg": "hmac-sha256",
    }


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"], ids=["LS", "PS", "NEL"])
def test_audit_read_export_splits_lines_on_newline_only(tmp_path: Any, separator: str) -> None:
    """An export is JSON Lines: records end at ``\\n``. A reason holding U+2028 (which JSON
    keeps raw) made the reader split one record in two: every later export was
    "TAMPERED" offline although nothing had changed."""
    from gate.audit.inputs import read_export

    entry = audit.make_entry(1, "note", None, T0, {"reason": f"first{separator}second"})
    entry_json, digest, receipt = audit.seal(GENESIS_HASH, entry, KEY)
    row = AuditRow(1, None, "note", entry_json, GENESIS_HASH, digest, receipt)
    line = export_line(row)
    assert separator in line  # kept raw by the writer, as JSON allows
    path = tmp_path / "export.jsonl"
    path.write_text(f"{line}\n{line}\r\n", encoding="utf-8")  # a CRLF line is one too

    assert read_export(path) == [row, row]
