"""``audit verify`` in parallel (gate.auditops.verify_database): the log is cut into runs,
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

from gate import audit
from gate.auditops import verify_database
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
        [(r.seq, r.approval_id, r.kind, r.entry, r.prev_hash, r.entry_hash, r.receipt)
         for r in chain(n)])
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
        conn.execute("UPDATE audit_log SET entry = ? WHERE seq = ?",
                     (entry.replace("Zoë", "Zoe"), seq))
    return run


def swap_entries(a: int, b: int) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        rows = {seq: rest for seq, *rest in conn.execute(
            "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt FROM audit_log"
            " WHERE seq IN (?, ?)", (a, b))}
        for seq, other in ((a, b), (b, a)):
            conn.execute("UPDATE audit_log SET approval_id = ?, kind = ?, entry = ?, "
                         "prev_hash = ?, entry_hash = ?, receipt = ? WHERE seq = ?",
                         (*rows[other], seq))
    return run


def insert_forged(seq: int) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        row = forge(audit.GENESIS_HASH, seq)
        conn.execute("INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, "
                     "entry_hash, receipt) VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (row.seq, row.approval_id, row.kind, row.entry, row.prev_hash,
                      row.entry_hash, row.receipt))
    return run


def set_column(seq: int, column: str) -> Callable[[sqlite3.Connection], None]:
    def run(conn: sqlite3.Connection) -> None:
        (value,) = conn.execute(f"SELECT {column} FROM audit_log WHERE seq = ?",
                                (seq,)).fetchone()
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
    assert "receipt does not match" in result.reason
    assert verify_database(db, None, workers=2, segment_rows=SEGMENT) == audit.VerifyResult(
        True, ENTRIES)  # no key: only the chain


def test_parallel_verify_empty_and_missing_database(tmp_path: Path) -> None:
    db = make_db(tmp_path / "gate.db", 0)
    assert verify_database(db, KEY, workers=2, segment_rows=SEGMENT) == audit.VerifyResult(
        True, 0)
    from gate.errors import GateError
    with pytest.raises(GateError) as info:
        verify_database(tmp_path / "nope.db", KEY)
    assert info.value.code == "no_database"
