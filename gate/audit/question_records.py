"""Cross-check of the question records against the audit log, for ``audit verify -c``,
as ``gate.audit.records`` does for approvals.

Someone who can write the database file but holds no receipt or signing key can change a
row, not the log: a question's text, its answer, its outcome. Each question must have:

- one ``question_created`` entry whose pipeline, step, expires_at, approvers (the scope's
  operator ids, in order), response_type (of version 1) and requested_by are the row's;
- exactly the versions the log names (version 1 in ``question_created``, each later one in
  a ``question_revised`` entry), each stored question hashing (``gate.protocol.question.
  request_hash``) to the request_hash the log holds, and stored exactly as the gate writes
  it; the row's current version the last of them;
- an answer if and only if the log holds a ``question_answered`` entry: the same operator
  (within the frozen scope, the row's answer_identity that operator's), version,
  request_hash and nonce of that version, and the stored answer hashing to the entry's
  ``value_hash`` (``gate.protocol.question.value_hash``);
- a ``question_resolved`` entry if and only if the row is resolved, with the row's outcome
  and version, that version's request_hash, the answer's value_hash (answered only), and the
  row's stored receipt being that entry's receipt;
- a ``question_dispatch_ack`` entry for every dispatch its outbox rows say the relay acked
  (the gate writes both in one transaction), at most one per version, each of a version the
  log holds, none for a dispatch never acked.

No message quotes a question's text, reason, options or an answer's value (treated like a
draft): they name the question, the version, the table and the audit entry.

Pure: takes ``QuestionRecord``s (read by ``gate.store.question_audit.question_records``),
finds each question's entries and runs the comparisons of ``gate.audit.question_record_checks``
in that order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gate.audit import chain as audit
from gate.audit import question_record_checks as checks
from gate.audit.question_entries import (
    QUESTION_CREATED,
    QUESTION_REVISED,
    QuestionCreatedData,
    QuestionRevisedData,
)
from gate.audit.records import RecordsResult

_CREATED_FIELDS = (
    ("pipeline", "pipeline"),
    ("step", "step"),
    ("expires_at", "expires_at"),
    ("requested_by_id", "requested_by"),
)
# what ``problem`` turns into a disagreement (a row or entry edited to another type)
_EDITED = (TypeError, ValueError, KeyError, AttributeError, IndexError)


@dataclass(frozen=True, slots=True)
class QuestionRecord:
    """One question as the tables hold it, with its audit rows. ``question`` is
    the questions row as a dict (question_id, pipeline, step, version, state, outcome,
    expires_at, scope: JSON text, requested_by_id, answer: canonical JSON text or None,
    answered_by, answer_version, receipt: JSON text, answer_identity, answer_salt: hex) or
    None when only the log names the question; ``versions`` its question_versions rows
    ``(version, question JSON text, request_hash, nonce)``; ``dispatches`` its
    question_outbox rows ``(version, attempts, delivered_at)``; ``entries`` its audit rows in
    ascending seq; all as stored."""

    question_id: str
    question: dict[str, Any] | None
    versions: list[tuple[Any, Any, Any, Any]]
    entries: list[audit.AuditRow]
    dispatches: list[tuple[Any, Any, Any]] = field(default_factory=list)


def check(records: Iterable[QuestionRecord], up_to_seq: int) -> RecordsResult:
    """Compare each question's rows with its audit entries (module docstring); stop at the
    first question that disagrees (``problem``: ``(question_id, reason)``). Questions with an
    entry after ``up_to_seq`` (the last verified seq) are counted in ``newer``, not checked."""
    checked = newer = 0
    for record in records:
        if record.entries and record.entries[-1].seq > up_to_seq:
            newer += 1
            continue
        reason = problem(record)
        if reason is not None:
            return RecordsResult(checked, (record.question_id, reason), newer)
        checked += 1
    return RecordsResult(checked, None, newer)


def problem(record: QuestionRecord) -> str | None:
    """Why ``record``'s rows disagree with its audit entries, or None when they agree. A
    value of a type the gate never writes (an edited row) is a disagreement too; only the
    exception's type is named (its text could quote a stored question or answer)."""
    try:
        return _problem(record)
    except _EDITED as exc:
        return f"a row or entry holds a value the gate never writes ({type(exc).__name__})"


def _data(row: audit.AuditRow) -> dict[str, Any]:
    """The ``data`` object of a (verified) entry; {} when it has none."""
    try:
        data = json.loads(row.entry).get("data")
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}


def _problem(record: QuestionRecord) -> str | None:
    row = record.question
    entries = [(e, _data(e)) for e in record.entries]
    created = [
        (e, QuestionCreatedData.from_data(d)) for e, d in entries if e.kind == QUESTION_CREATED
    ]
    if row is None and not record.entries:
        return (
            "rows in the question_versions or question_outbox table for a question that "
            "neither the questions table nor the audit log has"
        )
    if row is None:
        first = record.entries[0].seq
        return f"named by audit entry {first} but missing from the questions table (deleted?)"
    if len(created) != 1:
        return (
            f"{len(created)} question_created entries in the audit log (expected 1)"
            if created
            else "no question_created entry in the audit log (row inserted outside the gate?)"
        )
    entry, data = created[0]
    for column, name in _CREATED_FIELDS:
        if row[column] != getattr(data, name):
            return (
                f"{column} is {row[column]!r} in the questions table but "
                f"{getattr(data, name)!r} in audit entry {entry.seq}"
            )
    scope = [pair[0] for pair in json.loads(row["scope"])]
    if scope != list(data.approvers):
        return (
            f"scope holds operators {scope} in the questions table but audit entry "
            f"{entry.seq} froze {list(data.approvers)}"
        )
    logged: dict[Any, tuple[int, Any]] = {data.version: (entry.seq, data.request_hash)}
    for e, d in entries:
        if e.kind == QUESTION_REVISED:
            revised = QuestionRevisedData.from_data(d)
            if revised.version in logged:
                return f"audit entry {e.seq} revises to version {revised.version} a second time"
            logged[revised.version] = (e.seq, revised.request_hash)
    qid, versions = record.question_id, record.versions
    reason = checks.versions_problem(qid, versions, row, entry.seq, data, logged)
    if reason is None:
        reason = checks.answer_problem(qid, versions, row, entries, data, logged)
    if reason is None:
        reason = checks.resolution_problem(row, entries, logged)
    if reason is None:
        reason = checks.dispatches_problem(record.dispatches, entries, logged)
    return reason
