"""``audit verify`` in parallel (gate.audit.verify.verify_chain): the log is cut into runs,
each verified in its own process, and joined in order. The answer (first bad entry, reason,
count) must equal the sequential ``audit.verify`` over the same database for every kind of
tampering, wherever it falls relative to the cut: inside a run, at its first or last entry,
a whole run gone, the tail gone, a forged entry before the first.

Real SQLite files (schema from the real Store), real worker processes; no mocks.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from gate.audit import chain as audit
from gate.audit.receipts import check_receipt, receipt_object, span_keys
from gate.audit.verify import verify_chain as verify_database
from gate.store import Store
from gate.store.auditlog import DatabaseRows
from tests.test_audit import KEY, chain, flip, forge

ENTRIES = 20
SEGMENT = 4  # runs 1-4, 5-8, 9-12, ...: seq 8 ends a run, 9 starts one


def make_db(path: Path, n: int = ENTRIES) -> Path:
    """A gate database (schema from the real Store) holding a sealed chain of ``n`` entries."""

    async def create() -> None:
        store = Store(path)
        await store.open()
        await store.close()

    asyncio.run(create())
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executemany(
        "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, entry_hash, receipt)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (r.seq, r.approval_id, r.kind, r.entry, r.prev_hash, r.entry_hash, r.receipt)
            for r in chain(n)
        ],
    )
    conn.close()
    return path


def sql(*statements: str) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)

    return run


def change_entry(seq: int) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        (entry,) = conn.execute("SELECT entry FROM audit_log WHERE seq = ?", (seq,)).fetchone()
        conn.execute(
            "UPDATE audit_log SET entry = ? WHERE seq = ?", (entry.replace("Zoë", "Zoe"), seq)
        )

    return run


def swap_entries(a: int, b: int) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        rows = {
            seq: rest
            for seq, *rest in conn.execute(
                "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt"
                " FROM audit_log WHERE seq IN (?, ?)",
                (a, b),
            )
        }
        for seq, other in ((a, b), (b, a)):
            conn.execute(
                "UPDATE audit_log SET approval_id = ?, kind = ?, entry = ?, "
                "prev_hash = ?, entry_hash = ?, receipt = ? WHERE seq = ?",
                (*rows[other], seq),
            )

    return run


def insert_forged(seq: int) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        row = forge(audit.GENESIS_HASH, seq)
        conn.execute(
            "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, "
            "entry_hash, receipt) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                row.seq,
                row.approval_id,
                row.kind,
                row.entry,
                row.prev_hash,
                row.entry_hash,
                row.receipt,
            ),
        )

    return run


def set_column(seq: int, column: str) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        (value,) = conn.execute(f"SELECT {column} FROM audit_log WHERE seq = ?", (seq,)).fetchone()
        conn.execute(f"UPDATE audit_log SET {column} = ? WHERE seq = ?", (flip(value, 5), seq))

    return run


TAMPERS: dict[str, tuple[Callable[[sqlite3.Connection], None], int | None]] = {
    # name: (what is done to the database, the first bad seq the answer must name)
    "intact": (sql(), None),
    "changed_inside_a_run": (change_entry(10), 10),
    "changed_first_of_a_run": (change_entry(9), 9),
    "changed_last_of_a_run": (change_entry(8), 8),
    "deleted_last_of_a_run": (sql("DELETE FROM audit_log WHERE seq = 8"), 9),
    "deleted_first_of_a_run": (sql("DELETE FROM audit_log WHERE seq = 9"), 10),
    "deleted_whole_run": (sql("DELETE FROM audit_log WHERE seq BETWEEN 5 AND 8"), 9),
    "deleted_first_entry": (sql("DELETE FROM audit_log WHERE seq = 1"), 2),
    "deleted_tail": (sql("DELETE FROM audit_log WHERE seq > 18"), None),
    "forged_before_the_first": (insert_forged(0), 0),
    "forged_after_the_last": (insert_forged(ENTRIES + 1), ENTRIES + 1),
    "swapped_across_a_cut": (swap_entries(8, 9), 8),
    "prev_hash_at_a_run_start": (set_column(9, "prev_hash"), 9),
    "entry_hash_at_a_run_end": (set_column(8, "entry_hash"), 8),
    "receipt_inside_a_run": (set_column(14, "receipt"), 14),
    "kind_column": (sql("UPDATE audit_log SET kind = 'resolved' WHERE seq = 13"), 13),
}


@pytest.mark.parametrize("name", sorted(TAMPERS))
def test_parallel_verify_answers_as_the_sequential_one(tmp_path: Path, name: str) -> None:
    tamper, first_bad = TAMPERS[name]
    db = make_db(tmp_path / "gate.db")
    conn = sqlite3.connect(db, isolation_level=None)
    tamper(conn)
    conn.close()
    sequential = audit.verify(DatabaseRows(db), KEY)
    assert sequential.first_bad_seq == first_bad, sequential
    assert sequential.ok is (first_bad is None)
    parallel = verify_database(db, KEY, workers=2, segment_rows=SEGMENT)
    assert parallel == sequential
    # the same split in one process, and cuts of other sizes
    assert verify_database(db, KEY, workers=1, segment_rows=SEGMENT) == sequential
    for size in (1, 3, 7, ENTRIES + 5):
        assert verify_database(db, KEY, workers=2, segment_rows=size) == sequential, size


def test_parallel_verify_wrong_key_fails_the_first_entry(tmp_path: Path) -> None:
    db = make_db(tmp_path / "gate.db")
    result = verify_database(db, b"another-key", workers=2, segment_rows=SEGMENT)
    assert (result.ok, result.first_bad_seq, result.checked) == (False, 1, 0)
    # a key that fits no entry 1 is named as such, not as tampering (b02-04)
    assert result.wrong_key and "the key given does not match this log" in result.reason
    assert result == audit.verify(DatabaseRows(db), b"another-key")
    assert verify_database(db, None, workers=2, segment_rows=SEGMENT) == audit.VerifyResult(
        True, ENTRIES
    )  # no key: only the chain


def test_parallel_verify_empty_and_missing_database(tmp_path: Path) -> None:
    db = make_db(tmp_path / "gate.db", 0)
    assert verify_database(db, KEY, workers=2, segment_rows=SEGMENT) == audit.VerifyResult(True, 0)
    from gate.errors import GateError

    with pytest.raises(GateError) as info:
        verify_database(tmp_path / "nope.db", KEY)
    assert info.value.code == "no_database"


# --------------------------------------------------------------------------- b02-04: spans

OLD_KEY, NEW_KEY = b"receipt-key-old", b"receipt-key-new"
ROTATION = 10  # entries 1-9 receipted with OLD_KEY, 10 (the rotation) onwards with NEW_KEY


def rotated_chain(n: int = ENTRIES, rotation: int = ROTATION) -> list[audit.AuditRow]:
    """A chain like the gate writes across a declared rotation of the receipt key."""
    rows: list[audit.AuditRow] = []
    prev = audit.GENESIS_HASH
    for seq in range(1, n + 1):
        kind = "receipt_key_rotated" if seq == rotation else "decision"
        approval_id = None if seq == rotation else "01KDWZ8B00J3Q9V5X7Z2M4N6PR"
        data = {"previous_key_last_seq": seq - 1} if seq == rotation else {"n": seq, "note": "Zoë"}
        entry = audit.make_entry(seq, kind, approval_id, 1767225600000 + seq, data)
        key = OLD_KEY if seq < rotation else NEW_KEY
        entry_json, digest, receipt = audit.seal(prev, entry, key)
        rows.append(audit.AuditRow(seq, approval_id, kind, entry_json, prev, digest, receipt))
        prev = digest
    return rows


def rotated_db(path: Path, rows: list[audit.AuditRow]) -> Path:
    make_db(path, 0)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executemany(
        "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, entry_hash, receipt)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            (r.seq, r.approval_id, r.kind, r.entry, r.prev_hash, r.entry_hash, r.receipt)
            for r in rows
        ],
    )
    conn.close()
    return path


def rereceipt(seq: int, key: bytes) -> Callable[[sqlite3.Connection], None]:
    """Give entry ``seq`` a receipt made with ``key`` (what the holder of that key can do)."""

    def run(conn: sqlite3.Connection) -> None:
        (digest,) = conn.execute(
            "SELECT entry_hash FROM audit_log WHERE seq = ?", (seq,)
        ).fetchone()
        conn.execute(
            "UPDATE audit_log SET receipt = ? WHERE seq = ?", (audit.receipt(key, digest), seq)
        )

    return run


SPAN_CASES: dict[str, tuple[Callable[[sqlite3.Connection], None], int | None, bool]] = {
    # name: (tampering, first bad seq, named as a wrong key rather than tampering)
    "intact": (sql(), None, False),
    "old_key_after_the_rotation": (rereceipt(14, OLD_KEY), 14, False),
    "old_key_right_after_the_rotation": (rereceipt(ROTATION + 1, OLD_KEY), ROTATION + 1, False),
    "new_key_before_the_rotation": (rereceipt(5, NEW_KEY), 5, False),
    "rotation_receipted_with_the_old_key": (rereceipt(ROTATION, OLD_KEY), ROTATION, False),
    "rotation_with_an_unknown_key": (rereceipt(ROTATION, b"third"), ROTATION, True),
    "entry_1_with_an_unknown_key": (rereceipt(1, b"third"), 1, True),
    "rotation_kind_removed": (
        sql(f"UPDATE audit_log SET kind = 'decision' WHERE seq = {ROTATION}"),
        ROTATION,
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(SPAN_CASES))
@pytest.mark.parametrize(
    "keys", [(OLD_KEY, NEW_KEY), (NEW_KEY, OLD_KEY)], ids=["old_first", "new_first"]
)
def test_each_span_verifies_with_its_own_key_in_parallel_as_sequentially(
    tmp_path: Path, name: str, keys: tuple[bytes, bytes]
) -> None:
    tamper, first_bad, wrong_key = SPAN_CASES[name]
    db = rotated_db(tmp_path / "gate.db", rotated_chain())
    conn = sqlite3.connect(db, isolation_level=None)
    tamper(conn)
    conn.close()
    sequential = audit.verify(DatabaseRows(db), keys)
    assert (sequential.first_bad_seq, sequential.wrong_key) == (first_bad, wrong_key), sequential
    assert sequential.ok is (first_bad is None)
    if sequential.ok:
        index = {key: i for i, key in enumerate(keys)}
        assert sequential.spans == ((1, index[OLD_KEY]), (ROTATION, index[NEW_KEY]))
    for size in (1, 3, SEGMENT, 9, ENTRIES + 5):  # cuts before, at and after the rotation
        parallel = verify_database(db, keys, workers=2, segment_rows=size)
        assert parallel == sequential, size
        assert parallel.spans == sequential.spans, size


def test_one_key_alone_does_not_verify_a_rotated_log(tmp_path: Path) -> None:
    db = rotated_db(tmp_path / "gate.db", rotated_chain())
    old_only = verify_database(db, OLD_KEY, workers=2, segment_rows=SEGMENT)
    assert (old_only.ok, old_only.first_bad_seq, old_only.wrong_key) == (False, ROTATION, True)
    assert f"from entry {ROTATION} on" in old_only.reason
    new_only = verify_database(db, NEW_KEY, workers=2, segment_rows=SEGMENT)
    assert (new_only.ok, new_only.first_bad_seq, new_only.wrong_key) == (False, 1, True)
    # doctor's mode: spans before the first whose key is given are not receipt-checked
    doctor = audit.verify(DatabaseRows(db), NEW_KEY, leading_unknown=True)
    assert doctor.ok and doctor.spans == ((ROTATION, 0),), doctor
    none = audit.verify(DatabaseRows(db), b"third", leading_unknown=True)
    assert (none.ok, none.first_bad_seq, none.wrong_key) == (False, ENTRIES, True)
    # ... but in that mode too, an entry after the first known span needs its span's key
    conn = sqlite3.connect(db, isolation_level=None)
    rereceipt(15, OLD_KEY)(conn)
    conn.close()
    forged = audit.verify(DatabaseRows(db), NEW_KEY, leading_unknown=True)
    assert (forged.ok, forged.first_bad_seq, forged.wrong_key) == (False, 15, False)


def test_a_held_receipt_is_checked_with_the_key_of_its_span(tmp_path: Path) -> None:
    rows = rotated_chain()
    result = audit.verify(rows, (NEW_KEY, OLD_KEY))
    assert result.ok
    for row in (rows[2], rows[ROTATION - 1], rows[-1]):
        held = receipt_object(row)
        keys = span_keys(result, (NEW_KEY, OLD_KEY), row.seq)
        assert check_receipt(rows, held, keys) is None
        # a receipt made with the other span's key is no genuine receipt for this entry
        other = OLD_KEY if row.seq >= ROTATION else NEW_KEY
        fake = dict(held, receipt=audit.receipt(other, row.entry_hash))
        problem = check_receipt(rows, fake, keys)
        assert problem is not None and "not a genuine receipt" in problem[1]
    # a receipt for an entry past the end (a deleted tail) is a deleted tail, not a fake
    tail = receipt_object(rows[-1])
    shortened = rows[:-3]
    short = audit.verify(shortened, (OLD_KEY, NEW_KEY))
    problem = check_receipt(shortened, tail, span_keys(short, (OLD_KEY, NEW_KEY), tail["seq"]))
    assert problem is not None and problem[1].startswith("missing: "), problem
