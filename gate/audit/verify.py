"""Verify an audit log: ``verify_database`` is the one check of a database (chain, receipts,
signatures, the receipts held outside the log and stored with the approvals, logged heads, and
the approval records), which ``hitl-gate audit verify -c`` and ``doctor`` only format;
``verify_rows`` the same over an export's rows (read by ``gate.audit.inputs``)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any

from gate.audit import chain as audit
from gate.audit import records as audit_records
from gate.audit import signature_checks
from gate.audit.receipts import head_problem, receipt_problem, span_keys
from gate.audit.report import KeysUsed, verdict
from gate.audit.segments import Segment, stitch, verify_segment
from gate.errors import GateError, Unavailable
from gate.store import auditlog, inspection
from gate.store.audit_records import (
    APPROVAL_TABLES,
    QUESTION_TABLES,
    latest_stored_receipt,
    records_of,
)
from gate.store.auditlog import DatabaseRows
from gate.trust.keys import PublicKeys

if TYPE_CHECKING:
    from gate.store.readonly import Database

# entries per ``audit verify`` work unit; a log of one unit or less is verified in-process
SEGMENT_ROWS = 50_000
MAX_WORKERS = 8


def read_database(path: Database) -> Iterable[audit.AuditRow]:
    """Return the audit rows of the database ``path`` (a SQLite file, or a PostgreSQL
    database), streamed (``DatabaseRows``).

    Raises GateError ``no_database`` if it does not exist, Unavailable when it cannot be read.
    """
    return DatabaseRows(_existing(path))


@dataclass(frozen=True, slots=True)
class AnchorProblem:
    """A receipt or logged head held outside the chain that the verified log does not hold:
    entry ``seq`` and why; ``source`` names the anchor (``receipt FILE``, ``the receipt
    stored with approval ID``, ``--expect-head SEQ:HASH``)."""

    seq: int
    reason: str
    source: str


@dataclass(frozen=True, slots=True)
class AuditReport:
    """What ``verify_database``/``verify_rows`` found, stopping at the first failure:
    ``chain`` (entries, receipts, signatures; not ok or ``wrong_key``: nothing after it was
    checked), then ``anchor`` (the first anchor the log does not hold, else None), then
    ``records`` (the approval records against the log; None when not checked), then
    ``questions`` (the question records; None when not checked, or when the
    approvals' already failed); ``signatures`` every approver signature the log holds,
    re-verified (None when the chain or an anchor failed); ``credentials`` why
    the approver_credentials table disagrees with the log (None: it agrees, or not
    checked)."""

    chain: audit.VerifyResult
    anchor: AnchorProblem | None = None
    records: audit_records.RecordsResult | None = None
    questions: audit_records.RecordsResult | None = None
    signatures: signature_checks.SignatureReport | None = None
    credentials: str | None = None  # the approver_credentials table vs the log

    @property
    def kinds(self) -> tuple[tuple[str, audit_records.RecordsResult | None], ...]:
        """Each kind's records against the log, by the noun of its requests: ``records``
        (approvals), then ``questions``."""
        return (("approval", self.records), ("question", self.questions))

    @property
    def ok(self) -> bool:
        """Every check that ran passed."""
        return (
            self.chain.ok
            and self.anchor is None
            and all(found is None or found.problem is None for _, found in self.kinds)
            and (self.signatures is None or not self.signatures.findings)
            and self.credentials is None
        )


def verify_database(
    path: Database,
    keys: audit.ReceiptKeyArg,
    *,
    public_keys: PublicKeys | None = None,
    expect: Sequence[tuple[str, dict[str, Any]]] = (),
    expect_heads: Sequence[tuple[int, str]] = (),
    records: bool = True,
    leading_unknown: bool = False,
) -> AuditReport:
    """The one audit check of the database ``path`` (``audit verify -c``, ``doctor``): a
    SQLite file, or a PostgreSQL database (``gate.postgres.target.PgTarget``).

    In order, stopping at the first failure: the chain with every receipt (``keys``: each
    entry with the key of its span; ``leading_unknown`` as ``gate.audit.spans``) and, with
    ``public_keys``, every signature (in parallel, ``verify_chain``, when there are no
    public keys and no leading unknown span); then every receipt in ``expect`` (``(source,
    receipt)`` pairs, in order), the newest resolution receipt the approvals table stores
    (its source ``the receipt stored with approval ID``), the questions table's (``... with
    question ID``) and the chain heads ``expect_heads`` (``(seq, entry_hash)``);
    then, with ``records``, every approval's rows against the verified log, then every
    question's (``gate.audit.records``).
    Reads only; a running gate may keep writing (entries appended meanwhile are not
    checked). Raises GateError ``no_database`` when there is no file at ``path``,
    Unavailable when it cannot be read.
    """
    path = _existing(path)
    rows = DatabaseRows(path)
    if public_keys or leading_unknown:
        chain = audit.verify(rows, keys, public_keys or None, leading_unknown=leading_unknown)
    else:  # entries checked in parallel, same answer
        chain = verify_chain(path, keys)
    if not chain.ok or chain.wrong_key:
        return AuditReport(chain)
    anchors = list(expect)
    for tables in (APPROVAL_TABLES, QUESTION_TABLES):
        stored = latest_stored_receipt(path, tables)
        if stored is not None:  # the database keeps each resolution's receipt with its request
            anchors.append((f"the receipt stored with {tables.noun} {stored[0]}", stored[1]))
    anchor = _anchor_problem(rows, chain, keys, public_keys, anchors, expect_heads)
    if anchor is not None:
        return AuditReport(chain, anchor)
    # the rows the chain check verified (a running gate may have appended more since)
    signed = signature_checks.check(itertools.islice(rows, chain.checked))
    if not records:
        return AuditReport(chain, signatures=signed)
    matched = audit_records.check(records_of(path, APPROVAL_TABLES), chain.checked)
    if matched.problem is not None:
        return AuditReport(chain, None, matched, signatures=signed)
    asked_ok = audit_records.check(records_of(path, QUESTION_TABLES), chain.checked)
    enrolled, newer = inspection.credential_rows(path, chain.checked)
    credentials = signature_checks.credentials_problem(enrolled, signed.credentials, newer)
    return AuditReport(chain, None, matched, asked_ok, signed, credentials)


def verify_rows(
    rows: Iterable[audit.AuditRow],
    keys: audit.ReceiptKeyArg,
    *,
    public_keys: PublicKeys | None = None,
    expect: Sequence[tuple[str, dict[str, Any]]] = (),
    expect_heads: Sequence[tuple[int, str]] = (),
) -> AuditReport:
    """``verify_database`` over the rows of an export (re-iterable, ascending seq): the
    chain, receipts and signatures, then the anchors ``expect`` and ``expect_heads``; an
    export holds no approval records. Raises GateError only as ``audit.verify`` does."""
    rows = list(rows) if not isinstance(rows, Sequence) else rows
    chain = audit.verify(rows, keys, public_keys or None)
    if not chain.ok or chain.wrong_key:
        return AuditReport(chain)
    anchor = _anchor_problem(rows, chain, keys, public_keys, list(expect), expect_heads)
    if anchor is not None:
        return AuditReport(chain, anchor)
    return AuditReport(chain, signatures=signature_checks.check(rows[: chain.checked]))


def copy_problem(path: Database, head: tuple[int, str] | None) -> str | None:
    """Why the database ``path``, a copy of a log whose newest entry is ``head`` (``(seq,
    entry_hash)``; None: an empty log), is not that log, in ``audit verify``'s words; None
    when it is: ``verify_database`` without keys (the chain, the receipts stored with the
    requests, every request's rows and approver signature) with ``head`` as a logged head,
    and no entry past it. For ``hitl-gate storage migrate``; raises as ``verify_database``."""
    heads = [head] if head is not None else []
    report = verify_database(path, None, expect_heads=heads)
    said = verdict(report, KeysUsed("", (), False, False), head_seqs=[s for s, _ in heads])
    if said.exit_code != 0:
        return " ".join(said.out + said.err)
    if report.chain.checked != (head[0] if head else 0):
        return f"it holds {report.chain.checked} audit entries, the source {head[0] if head else 0}"
    return None


def _existing(path: Database) -> Database:
    """``path`` (a Path, or a PostgreSQL database: there when it can be connected to);
    GateError ``no_database`` when there is no file there."""
    if not isinstance(path, str | PurePath):
        return path
    if not Path(path).exists():
        raise GateError("no_database", f"no database at {path}")
    return Path(path)


def _anchor_problem(
    rows: Iterable[audit.AuditRow],
    chain: audit.VerifyResult,
    keys: audit.ReceiptKeyArg,
    public_keys: PublicKeys | None,
    anchors: Sequence[tuple[str, dict[str, Any]]],
    heads: Sequence[tuple[int, str]],
) -> AnchorProblem | None:
    """The first receipt of ``anchors`` (then head of ``heads``) the verified ``rows`` do
    not hold, else None. ``rows`` is read once for all the receipts (each pass over a
    database's rows is a query from its first entry): the rows they name, and the last."""
    near = _rows_named(rows, anchors) if anchors else {}
    for source, held in anchors:
        seq = held.get("seq")
        found = receipt_problem(
            near.get(seq, near.get(None, [])) if isinstance(seq, int) else [],
            held,
            span_keys(chain, keys, seq),
            public_keys or None,
        )
        if found is not None:
            return AnchorProblem(found[0], found[1], source)
    head = head_problem(rows, heads) if heads else None
    if head is not None:
        (seq, entry_hash), reason = head
        return AnchorProblem(seq, reason, f"--expect-head {seq}:{entry_hash}")
    return None


def _rows_named(
    rows: Iterable[audit.AuditRow], anchors: Sequence[tuple[str, dict[str, Any]]]
) -> dict[int | None, list[audit.AuditRow]]:
    """In one pass over ``rows``: the row at each seq a receipt of ``anchors`` names (as a
    one-row list, what ``check_receipt`` reads of it), and under None the last row (where
    the log ends, for a receipt beyond it)."""
    wanted = {s for _, held in anchors if isinstance(s := held.get("seq"), int)}
    found: dict[int | None, list[audit.AuditRow]] = {}
    for row in rows:
        found[None] = [row]
        if row.seq in wanted:
            found[row.seq] = [row]
    return found


def verify_chain(
    path: Database,
    key: audit.ReceiptKeyArg,
    *,
    workers: int | None = None,
    segment_rows: int = SEGMENT_ROWS,
) -> audit.VerifyResult:
    """The chain of a database without public keys: the chain and (with ``key``: one
    receipt key, or several, each for its own span) every HMAC receipt, with the same answer
    as ``audit.verify`` over ``DatabaseRows``.

    The entries up to the highest seq present at the start are cut into runs of
    ``segment_rows``; each run is verified on its own (``gate.audit.segments.
    verify_segment``) in ``workers`` processes (default: the CPUs this process may use, at
    most 8; 1 = all in this process), and the runs are joined in order (``stitch``), so the first
    bad entry and its reason do not depend on the split. Entries appended while it runs
    are not checked. Raises GateError ``no_database``, Unavailable on a read error.
    """
    bounds = auditlog.seq_bounds(_existing(path))
    if bounds is None:
        return audit.VerifyResult(True, 0)
    low, high = min(bounds[0], 1), bounds[1]
    key = audit.receipt_keys(key)
    ranges = [
        (start, min(start + segment_rows - 1, high)) for start in range(low, high + 1, segment_rows)
    ]
    count = workers if workers is not None else min(MAX_WORKERS, _usable_cpus())
    if count <= 1 or len(ranges) == 1:
        return stitch(_segment(_verify_range(path, lo, hi, key)) for lo, hi in ranges)
    # fork is cheapest; only safe while this process runs one thread
    method = "fork" if threading.active_count() == 1 else "spawn"
    with ProcessPoolExecutor(
        min(count, len(ranges)), mp_context=multiprocessing.get_context(method)
    ) as pool:
        futures = [pool.submit(_verify_range, path, lo, hi, key) for lo, hi in ranges]
        try:
            return stitch(_segment(future.result()) for future in futures)
        finally:
            for future in futures:  # after the first bad run the rest is not needed
                future.cancel()


def _segment(outcome: Segment | str) -> Segment:
    if isinstance(outcome, str):  # a worker's read error, passed back as text
        raise Unavailable("storage_unavailable", outcome)
    return outcome


def _verify_range(path: Database, low: int, high: int, key: tuple[bytes, ...]) -> Segment | str:
    """Worker: verify entries ``low..high`` (its own connection); their Segment, or the read
    error's text."""
    try:
        return verify_segment(auditlog.read_range(path, low, high), key)
    except GateError as exc:
        return exc.message


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
