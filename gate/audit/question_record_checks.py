"""The comparisons of one question's rows with its audit entries, one per table
(question_versions, the answer, the resolution, question_outbox); ``gate.audit.
question_records`` runs them in order and says what each checks.

Pure. Each takes values already read (rows as stored, entries with their decoded ``data``
objects, ``logged``: version -> ``(seq, request_hash)`` of the entry that made it) and returns
why they disagree, or None; never quoting a question's text, options or an answer's value. A
value of a type the gate never writes may raise TypeError, ValueError, KeyError,
AttributeError or IndexError; ``question_records.problem`` turns that into a disagreement.
"""

from __future__ import annotations

import json
from typing import Any

from gate.audit import chain as audit
from gate.audit.question_entries import (
    QUESTION_ANSWERED,
    QUESTION_DISPATCH_ACK,
    QUESTION_RESOLVED,
    QuestionAnsweredData,
    QuestionCreatedData,
    QuestionDispatchAckData,
    QuestionResolvedData,
)
from gate.audit.receipts import receipt_object
from gate.protocol.question import QuestionSpec, request_hash, value_hash
from gate.protocol.whitespace import identity_key


def versions_problem(
    question_id: str,
    versions: list[tuple[Any, Any, Any, Any]],
    row: dict[str, Any],
    created_seq: int,
    created: QuestionCreatedData,
    logged: dict[Any, tuple[int, Any]],
) -> str | None:
    """The question_versions rows against ``logged`` (version -> ``(seq, request_hash)``):
    the same versions, each stored question (JSON in the order given, holding exactly what
    ``QuestionSpec.to_json`` holds: compared as parsed values) hashing to the logged
    request_hash, version 1 of the logged response_type, and the
    row's current version the last logged one."""
    stored = {v[0]: v for v in versions}
    if created.version != 1 or sorted(stored) != sorted(logged):
        return (
            f"versions {sorted(stored)} in the question_versions table but "
            f"{sorted(logged)} in the audit log"
        )
    for version, (_, text, digest, _nonce) in sorted(stored.items()):
        seq, expected = logged[version]
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
        if digest != expected:
            return (
                f"version {version}'s request_hash is {digest} in the question_versions "
                f"table but {expected} in audit entry {seq}"
            )
        if version == 1 and spec.response_type != created.response_type:
            return (
                f"version 1's response_type is {spec.response_type!r} in the "
                f"question_versions table but {created.response_type!r} in audit entry "
                f"{created_seq}"
            )
    if row["version"] != max(logged):
        return (
            f"current version is {row['version']} in the questions table but "
            f"{max(logged)} in the audit log"
        )
    return None


def answer_problem(
    question_id: str,
    versions: list[tuple[Any, Any, Any, Any]],
    row: dict[str, Any],
    entries: list[tuple[audit.AuditRow, dict[str, Any]]],
    created: QuestionCreatedData,
    logged: dict[Any, tuple[int, Any]],
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


def resolution_problem(
    row: dict[str, Any],
    entries: list[tuple[audit.AuditRow, dict[str, Any]]],
    logged: dict[Any, tuple[int, Any]],
) -> str | None:
    """The row's state, outcome, version and stored receipt against its ``question_resolved``
    entry: at most one, present if and only if the row is resolved, on the version's logged
    request_hash, with the ``question_answered`` entry's value_hash when answered (and
    none otherwise), the row's receipt that entry's receipt."""
    resolved = [
        (e, QuestionResolvedData.from_data(d)) for e, d in entries if e.kind == QUESTION_RESOLVED
    ]
    answered = [
        QuestionAnsweredData.from_data(d) for e, d in entries if e.kind == QUESTION_ANSWERED
    ]
    if len(resolved) > 1:
        return f"{len(resolved)} question_resolved entries in the audit log (expected at most 1)"
    if not resolved:
        if row["state"] != "pending" or answered:
            return (
                f"state is {row['state']!r} ({row['outcome']}) in the questions table "
                "but the audit log holds no resolution"
            )
        return None
    entry, data = resolved[0]
    if row["state"] != "resolved":
        return (
            f"state is {row['state']!r} in the questions table but audit entry "
            f"{entry.seq} resolved it {data.outcome!r}"
        )
    if row["outcome"] != data.outcome:
        return (
            f"outcome is {row['outcome']!r} in the questions table but "
            f"{data.outcome!r} in audit entry {entry.seq}"
        )
    if row["version"] != data.version or data.request_hash != logged[data.version][1]:
        return (
            f"resolved at version {data.version} in audit entry {entry.seq} but the "
            f"questions table's current version is {row['version']}"
        )
    expected = answered[0].value_hash if answered else None
    if (data.outcome == "answered") != bool(answered) or data.value_hash != expected:
        return (
            f"audit entry {entry.seq} resolves the question {data.outcome!r} with a "
            "value_hash that is not its question_answered entry's"
        )
    try:
        receipt = json.loads(row["receipt"]) if row["receipt"] is not None else None
    except ValueError:
        receipt = None
    if receipt != receipt_object(entry):
        return f"its stored receipt is not the receipt of audit entry {entry.seq}"
    return None


def dispatches_problem(
    dispatches: list[tuple[Any, Any, Any]],
    entries: list[tuple[audit.AuditRow, dict[str, Any]]],
    logged: dict[Any, tuple[int, Any]],
) -> str | None:
    """The question_outbox rows ``(version, attempts, delivered_at)`` against the
    ``question_dispatch_ack`` entries: at most one ack per version, each of a logged version;
    an acked dispatch has its entry, a dispatch never acked has none."""
    acks: dict[Any, list[int]] = {}
    for e, d in entries:
        if e.kind == QUESTION_DISPATCH_ACK:
            acks.setdefault(QuestionDispatchAckData.from_data(d).version, []).append(e.seq)
    for version, seqs in acks.items():
        if len(seqs) > 1:
            return (
                f"{len(seqs)} question_dispatch_ack entries for version {version} in the "
                "audit log (expected at most 1)"
            )
        if version not in logged:
            return (
                f"audit entry {seqs[0]} records the relay's ack of version {version}, which "
                "the audit log does not hold"
            )
    for version, attempts, delivered_at in dispatches:
        if version not in logged:
            return f"its outbox row dispatches version {version}, which the audit log does not hold"
        ack = acks.get(version)
        if delivered_at is None and ack is not None:
            return (
                f"its outbox row says the dispatch of version {version} was never acked, "
                f"but audit entry {ack[0]} records the relay's ack"
            )
        if delivered_at is not None and ack is None:
            plural = "" if attempts == 1 else "s"
            return (
                f"its outbox row says the relay acked the dispatch of version {version} "
                f"(after {attempts} attempt{plural}), but the audit log holds no "
                "question_dispatch_ack entry for it (deleted?)"
            )
    return None
