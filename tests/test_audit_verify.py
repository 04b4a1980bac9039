"""The one audit check (gate.audit.verify.verify_database / verify_rows): its report stops at
the first failure, chain, then anchors, then records. The CLI's and the doctor's wording of
each outcome are tested end to end in test_e2e_lifecycle.py, test_doctor.py, test_audit*.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.audit import chain as audit
from gate.audit.receipts import receipt_object
from gate.audit.verify import AnchorProblem, verify_chain, verify_database, verify_rows
from gate.errors import GateError
from tests.test_audit import AID, KEY, chain
from tests.test_audit_parallel import make_db


def test_verify_database_of_an_empty_log_is_ok_with_no_approvals(tmp_path: Path) -> None:
    report = verify_database(make_db(tmp_path / "gate.db", 0), KEY)

    assert report.ok
    assert report.chain == audit.VerifyResult(True, 0)
    assert report.anchor is None
    assert report.records is not None and report.records.checked == 0


def test_verify_database_chain_is_the_parallel_answer(tmp_path: Path) -> None:
    db = make_db(tmp_path / "gate.db", 7)

    report = verify_database(db, KEY, records=False)

    assert report.chain == verify_chain(db, KEY) and report.chain.ok
    assert (report.anchor, report.records, report.ok) == (None, None, True)


def test_verify_database_names_an_approval_missing_from_its_table(tmp_path: Path) -> None:
    report = verify_database(make_db(tmp_path / "gate.db", 5), KEY)

    assert report.chain.ok and report.anchor is None and not report.ok
    assert report.records is not None
    assert report.records.problem == (
        AID,
        "named by audit entry 1 but missing from the approvals table (deleted?)",
    )


def test_verify_database_stops_at_a_head_the_log_does_not_hold(tmp_path: Path) -> None:
    db = make_db(tmp_path / "gate.db", 5)

    report = verify_database(db, KEY, expect_heads=[(3, "0" * 64)])

    assert report.anchor is not None and isinstance(report.anchor, AnchorProblem)
    assert (report.anchor.seq, report.anchor.source) == (3, f"--expect-head 3:{'0' * 64}")
    assert report.records is None and not report.ok


def test_verify_database_stops_at_a_wrong_key(tmp_path: Path) -> None:
    report = verify_database(make_db(tmp_path / "gate.db", 5), b"another-key")

    assert report.chain.wrong_key and (report.anchor, report.records) == (None, None)


def test_verify_database_without_a_file_raises_no_database(tmp_path: Path) -> None:
    with pytest.raises(GateError) as caught:
        verify_database(tmp_path / "nope.db", KEY)

    assert caught.value.code == "no_database"


def test_verify_rows_checks_an_export_and_its_receipts() -> None:
    rows = chain(5)
    held = receipt_object(rows[2])

    report = verify_rows(rows, KEY, expect=[("receipt r.json", held)])

    assert report.ok and report.chain == audit.verify(rows, KEY) and report.records is None


class Passes(list[audit.AuditRow]):
    """Rows that count how often they are read from the start (each pass over a database's
    rows is one query streamed from its first entry)."""

    passes = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.passes += 1
        return super().__iter__()


def test_verify_rows_reads_the_log_once_for_all_receipts_held() -> None:
    rows = Passes(chain(40))
    held = [(f"receipt {r.seq}.json", receipt_object(r)) for r in reversed(rows)]

    report = verify_rows(rows, KEY, expect=held, expect_heads=[(40, rows[-1].entry_hash)])

    assert report.ok
    assert rows.passes <= 3  # the chain, the receipts, the heads: not once per receipt


def test_verify_rows_names_the_first_receipt_held_the_log_does_not_hold() -> None:
    rows = chain(5)
    beyond = dict(receipt_object(rows[4]), seq=9)
    replaced = dict(receipt_object(rows[1]), entry_hash=rows[2].entry_hash)
    held = [("a.json", receipt_object(rows[3])), ("b.json", beyond), ("c.json", replaced)]

    report = verify_rows(rows, KEY, expect=held)

    assert report.anchor is not None
    assert (report.anchor.seq, report.anchor.source) == (9, "b.json")
