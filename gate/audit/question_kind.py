"""The question kind of the records check (``gate.audit.records``): its record, its
``RecordKind`` table (``QUESTIONS``) and what only questions have. Besides what every kind
is checked for, each question must have:

- its ``question_created`` entry's pipeline, step, expires_at and requested_by the row's,
  and its approvers the scope's operator ids, in order;
- exactly the versions the log names (version 1 in ``question_created``, each later one in
  one ``question_revised`` entry), each stored question hashing (``gate.protocol.question.
  request_hash``) to the request_hash the log holds and stored exactly as the gate writes
  it, version 1 of the logged response_type;
- an answer if and only if the log holds a ``question_answered`` entry: the same operator
  (within the frozen scope, the row's answer_identity that operator's), version,
  request_hash and nonce of that version, and the stored answer hashing to the entry's
  ``value_hash`` (``gate.protocol.question.value_hash``);
- its ``question_resolved`` entry on the version's logged request_hash, with the answer's
  value_hash (answered only).

In that order: scope, versions, answer, resolution, dispatches. No message quotes a
question's text, reason, options or an answer's value (treated like a draft): they name the
question, the version, the table and the audit entry. Pure: takes ``QuestionRecord``s (read
by ``gate.store.audit_records.records_of``), reads nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gate.audit import chain as audit
from gate.audit import record_checks as checks
from gate.audit.question_entries import (
    QUESTION_ANSWERED,
    QUESTION_REVISED,
    QuestionAnsweredData,
    QuestionCreatedData,
    QuestionDispatchAckData,
    QuestionResolvedData,
    QuestionRevisedData,
)
from gate.audit.record_checks import Logged
from gate.audit.records import Entries, Payloads, RecordKind, Versions
from gate.protocol.question import QuestionSpec, request_hash, value_hash
from gate.protocol.whitespace import identity_key


def _compare(
    record: QuestionRecord,
    row: dict[str, Any],
    entries: Entries,
    entry: audit.AuditRow,
    data: QuestionCreatedData,
) -> str | None:
    """The question's comparisons after its created entry's columns (module docstring)."""
    frozen = list(data.approvers)
    reason = checks.scope_problem(QUESTIONS, row, frozen, entry.seq, f"{frozen}")
    if reason is not None:
        return reason
    logged: Logged = {data.version: (entry.seq, data.request_hash)}
    for e, d in entries:
        if e.kind == QUESTION_REVISED:
            revised = QuestionRevisedData.from_data(d)
            if revised.version in logged:
                return f"audit entry {e.seq} revises to version {revised.version} a second time"
            logged[revised.version] = (e.seq, revised.request_hash)
    qid, versions = record.question_id, record.versions

    def content(version: Any, stored: tuple[Any, ...], seq: int, expected: Any) -> str | None:
        return _question_problem(qid, version, stored[1], seq, expected)

    answered = [
        QuestionAnsweredData.from_data(d) for e, d in entries if e.kind == QUESTION_ANSWERED
    ]

    def outcome(resolved: audit.AuditRow, said: QuestionResolvedData) -> str | None:
        """The resolution's value_hash is the answer's, and answered only with an answer."""
        expected = answered[0].value_hash if answered else None
        if (said.outcome == "answered") != bool(answered) or said.value_hash != expected:
            return (
                f"audit entry {resolved.seq} resolves the question {said.outcome!r} with a "
                "value_hash that is not its question_answered entry's"
            )
        return None

    stored = {v[0]: v for v in versions}
    return (  # the first that disagrees (a reason is never empty)
        checks.versions_problem(QUESTIONS, row, stored, logged, content, data.version)
        or _response_type_problem(stored[1][1], entry.seq, data)
        or answer_problem(qid, versions, row, entries, data, logged)
        or checks.resolution_problem(
            QUESTIONS, row, entries, logged, settled=bool(answered), outcome=outcome
        )
        or checks.dispatches_problem(QUESTIONS, record.dispatches, entries, logged)
    )


QUESTIONS = RecordKind(
    noun="question",
    orphan="rows in the question_versions or question_outbox table for a question",
    columns=("pipeline", "step", "expires_at", ("requested_by_id", "requested_by")),
    versions=Versions("version", "question_versions", "request_hash"),
    payloads=Payloads(QuestionCreatedData, QuestionResolvedData, QuestionDispatchAckData),
    compare=_compare,
    resolved_hash="request_hash",
    quiet=True,
)


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

    KIND: ClassVar[RecordKind] = QUESTIONS

    question_id: str
    question: dict[str, Any] | None
    versions: list[tuple[Any, Any, Any, Any]]
    entries: list[audit.AuditRow]
    dispatches: list[tuple[Any, Any, Any]] = field(default_factory=list)

    @property
    def subject(self) -> tuple[str, dict[str, Any] | None]:
        """The question's id and row."""
        return self.question_id, self.question


def _question_problem(
    question_id: str, version: Any, text: Any, seq: int, expected: Any
) -> str | None:
    """A version's stored question (JSON in the order given, holding exactly what
    ``QuestionSpec.to_json`` holds: compared as parsed values) hashes to the request_hash
    ``expected`` that audit entry ``seq`` holds for it."""
    obj = json.loads(text)
    spec = QuestionSpec.from_json(obj)
    if spec.to_json() != obj:
        return (
            f"version {version}'s stored question is not as the gate writes it "
            f"(the question was changed; audit entry {seq} holds its request_hash)"
        )
    if request_hash(question_id, version, spec) != expected:
        return (
            f"version {version}'s question does not hash to the request_hash of audit "
            f"entry {seq} (the question was changed)"
        )
    return None


def _response_type_problem(text: Any, created_seq: int, created: QuestionCreatedData) -> str | None:
    """Version 1's stored question has the response_type its ``question_created`` logged."""
    spec = QuestionSpec.from_json(json.loads(text))
    if spec.response_type != created.response_type:
        return (
            f"version 1's response_type is {spec.response_type!r} in the "
            f"question_versions table but {created.response_type!r} in audit entry "
            f"{created_seq}"
        )
    return None


def answer_problem(
    question_id: str,
    versions: list[tuple[Any, Any, Any, Any]],
    row: dict[str, Any],
    entries: Entries,
    created: QuestionCreatedData,
    logged: Logged,
) -> str | None:
    """The row's answer against the ``question_answered`` entry: at most one entry, present
    if and only if the row holds an answer; the same operator (within the frozen approvers),
    version, request_hash, nonce of that version, and the stored answer hashing to the
    entry's value_hash; the row's ``answer_identity`` that operator's identity in the frozen
    scope. Names what differs, never the value nor an identity."""
    answered = [
        (e, QuestionAnsweredData.from_data(d)) for e, d in entries if e.kind == QUESTION_ANSWERED
    ]
    if len(answered) > 1:
        return f"{len(answered)} question_answered entries in the audit log (expected at most 1)"
    if not answered:
        if row["answer"] is not None:
            return "the questions table holds an answer but the audit log holds none"
        return None
    entry, data = answered[0]
    if row["answer"] is None:
        return f"audit entry {entry.seq} records an answer but the questions table holds none"
    if data.operator_id not in list(created.approvers):
        return (
            f"audit entry {entry.seq} records an answer by operator {data.operator_id}, "
            f"outside the approvers {list(created.approvers)} of the question_created entry"
        )
    if data.version not in logged or data.request_hash != logged[data.version][1]:
        return (
            f"audit entry {entry.seq} answered request_hash {data.request_hash} of version "
            f"{data.version}, which the log does not hold for it"
        )
    for column, name in (("answered_by", "operator_id"), ("answer_version", "version")):
        if row[column] != getattr(data, name):
            return (
                f"{column} is {row[column]!r} in the questions table but "
                f"{getattr(data, name)!r} in audit entry {entry.seq}"
            )
    if not _same_identity(row, data.operator_id):
        return (
            f"answer_identity in the questions table is not the identity of operator "
            f"{data.operator_id} (audit entry {entry.seq}) in the question's frozen scope"
        )
    nonces = {v[0]: v[3] for v in versions}
    if nonces.get(data.version) != data.nonce:
        return (
            f"audit entry {entry.seq} was answered with a nonce that is not version "
            f"{data.version}'s nonce in the question_versions table"
        )
    salt = bytes.fromhex(row["answer_salt"])
    if value_hash(json.loads(row["answer"]), salt=salt) != data.value_hash:
        return (
            f"the answer in the questions table does not hash to the value_hash of audit "
            f"entry {entry.seq} (the answer was changed)"
        )
    return None


def _same_identity(row: dict[str, Any], operator_id: int) -> bool:
    """The row's ``answer_identity`` is, after trim + casefold, the identity the frozen
    ``scope`` gives ``operator_id`` (check 11 made it so; review finding 8)."""
    scope = {int(pair[0]): pair[1] for pair in json.loads(row["scope"])}
    identity, frozen = row["answer_identity"], scope.get(operator_id)
    if not isinstance(identity, str) or not isinstance(frozen, str):
        return False
    return identity_key(identity) == identity_key(frozen)
