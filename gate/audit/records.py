"""Cross-check of the approval records against the audit log, for ``audit verify -c``.

The chain, receipts and signatures (``gate.audit.chain``) prove the log; this proves that the
tables the API answers from (approvals, revisions, decisions) say what the log says. Someone
who can write the database file but holds no receipt or signing key can change a row, not
the log: an approved draft's body, an outcome, a decision. Each approval must have:

- one ``created`` entry whose pipeline, step, quorum and expires_at are the row's;
- exactly the revisions the log names (revision 1 in ``created``, each later one in the
  ``decision`` entry that made it), each body hashing to the payload hash the log holds;
  the row's current revision is the last of them;
- exactly the decisions the log holds (revision, operator, decision, payload hash);
- a ``resolved`` entry if and only if the row is resolved, with the row's outcome and
  revision, and the row's stored receipt being that entry's receipt;
- a log that keeps the gate's own rules: decisions and counted approvers within the
  approvers frozen in ``created`` (and the row's scope the same operators), each decision
  on a payload the log holds for its revision, the resolution with the frozen quorum (a
  row loosened while the gate ran, then put back, leaves this trace);
- a ``dispatch_ack`` entry for every dispatch its outbox rows say the relay acked (the
  gate writes both in one transaction), with the attempts counted then; at most one per
  revision, only for revisions the log holds, none for a dispatch the outbox says was never
  acked. A deleted newest ack entry shows here while its outbox row still says delivered.

Pure: takes ``ApprovalRecord``s (defined here, read by
``gate.store.auditlog.approval_records``), reads nothing.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gate.audit import chain as audit
from gate.audit.entries import (
    CREATED,
    DECISION,
    DISPATCH_ACK,
    RESOLVED,
    CreatedData,
    DecisionData,
    DispatchAckData,
    ResolvedData,
)
from gate.protocol.canonical import payload_hash

_CREATED_FIELDS = (
    ("pipeline", "pipeline"),
    ("step", "step"),
    ("quorum_required", "quorum"),
    ("expires_at", "expires_at"),
)


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval as the tables hold it, with its audit rows, for ``audit verify``'s
    cross-check (``check``; read by ``gate.store.auditlog.approval_records``). ``approval``
    is the approvals row as a dict (approval_id, pipeline, step, quorum_required, revision,
    state, outcome, expires_at, receipt: JSON text, scope: JSON text) or None when only the
    log names the approval;
    ``revisions`` are ``(revision, body, payload_hash)``; ``decisions`` are ``(revision,
    operator_id, decision, payload_hash)``, all as stored (an edited row may hold any type);
    ``entries`` its audit rows in ascending seq; ``dispatches`` its outbox rows
    ``(revision, attempts, delivered_at)`` as stored."""

    approval_id: str
    approval: dict[str, Any] | None
    revisions: list[tuple[Any, Any, Any]]
    decisions: list[tuple[Any, Any, Any, Any]]
    entries: list[audit.AuditRow]
    dispatches: list[tuple[Any, Any, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class RecordsResult:
    """``checked`` approvals matched the log; ``problem`` is ``(approval_id, reason)`` of the
    first (in approval_id order) that did not, else None. ``newer`` approvals had entries
    after ``up_to_seq`` (written after the chain was verified) and were not checked."""

    checked: int
    problem: tuple[str, str] | None
    newer: int = 0


def check(records: Iterable[ApprovalRecord], up_to_seq: int) -> RecordsResult:
    """Compare each approval's rows with its audit entries (module docstring); stop at the
    first approval that disagrees. Approvals with an entry after ``up_to_seq`` (the last
    verified seq) are counted in ``newer`` and skipped: their entries are not verified."""
    checked = newer = 0
    for record in records:
        if record.entries and record.entries[-1].seq > up_to_seq:
            newer += 1
            continue
        reason = problem(record)
        if reason is not None:
            return RecordsResult(checked, (record.approval_id, reason), newer)
        checked += 1
    return RecordsResult(checked, None, newer)


def problem(record: ApprovalRecord) -> str | None:
    """Why ``record``'s rows disagree with its audit entries, or None when they agree. A
    value of a type the gate never writes (an edited row) is a disagreement too."""
    try:
        return _problem(record)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        return f"a row or entry holds a value of a type the gate never writes ({exc})"


def _problem(record: ApprovalRecord) -> str | None:
    row = record.approval
    entries = [(e, _data(e)) for e in record.entries]
    created = [(e, CreatedData.from_data(d)) for e, d in entries if e.kind == CREATED]
    if row is None and not record.entries:
        return (
            "rows in the revisions, decisions or outbox table for an approval that "
            "neither the approvals table nor the audit log has"
        )
    if row is None:
        first = record.entries[0].seq
        return f"named by audit entry {first} but missing from the approvals table (deleted?)"
    if len(created) != 1:
        return (
            f"{len(created)} created entries in the audit log (expected 1)"
            if created
            else "no created entry in the audit log (row inserted outside the gate?)"
        )
    entry, data = created[0]
    for column, name in _CREATED_FIELDS:
        if row[column] != getattr(data, name):
            return (
                f"{column} is {row[column]!r} in the approvals table but "
                f"{getattr(data, name)!r} in audit entry {entry.seq}"
            )
    logged: dict[Any, tuple[int, Any]] = {1: (entry.seq, data.payload_hash)}
    decisions = []
    for e, d in entries:
        if e.kind != DECISION:
            continue
        made = DecisionData.from_data(d)
        decisions.append((made.revision, made.operator_id, made.decision, made.payload_hash))
        if made.new_revision is not None:
            logged[made.new_revision] = (e.seq, made.new_payload_hash)
    reason = _revisions_problem(row, record.revisions, logged)
    if reason is None:
        reason = _decisions_problem(record.decisions, decisions)
    if reason is None:
        reason = _resolution_problem(row, entries)
    if reason is None:
        reason = _rules_problem(row, data, entry.seq, entries, logged)
    if reason is None:
        reason = _dispatches_problem(record.dispatches, entries, logged)
    return reason


def _dispatches_problem(
    dispatches: list[tuple[Any, Any, Any]],
    entries: list[tuple[audit.AuditRow, dict[str, Any]]],
    logged: dict[Any, tuple[int, Any]],
) -> str | None:
    """The outbox rows ``(revision, attempts, delivered_at)`` against the ``dispatch_ack``
    entries: an acked dispatch has its entry (same attempts), an entry its acked dispatch
    (when the outbox holds the revision's row); one ack per revision, each of a logged one.
    An outbox row missing altogether is not named (the gate would not send it again)."""
    acks: dict[Any, list[tuple[audit.AuditRow, DispatchAckData]]] = {}
    for e, d in entries:
        if e.kind == DISPATCH_ACK:
            logged_ack = DispatchAckData.from_data(d)
            acks.setdefault(logged_ack.revision, []).append((e, logged_ack))
    for revision, found in acks.items():
        if len(found) > 1:
            return (
                f"{len(found)} dispatch_ack entries for revision {revision} in the audit "
                "log (expected at most 1)"
            )
        if revision not in logged:
            return (
                f"audit entry {found[0][0].seq} records the relay's ack of revision "
                f"{revision}, which the audit log does not hold"
            )
    for revision, attempts, delivered_at in dispatches:
        if revision not in logged:
            return (
                f"its outbox row dispatches revision {revision}, which the audit log does not hold"
            )
        ack = acks.get(revision)
        if delivered_at is None:
            if ack is not None:
                return (
                    f"its outbox row says the dispatch of revision {revision} was never "
                    f"acked, but audit entry {ack[0][0].seq} records the relay's ack"
                )
            continue
        if ack is None:
            plural = "" if attempts == 1 else "s"
            return (
                f"its outbox row says the relay acked the dispatch of revision {revision} "
                f"(after {attempts} attempt{plural}), but the audit log holds no "
                "dispatch_ack entry for it (deleted?)"
            )
        entry, data = ack[0]
        if data.attempts != attempts:
            return (
                f"its outbox row counts {attempts!r} attempts for the acked dispatch of "
                f"revision {revision}, audit entry {entry.seq} {data.attempts!r}"
            )
    return None


def _rules_problem(
    row: dict[str, Any],
    created: CreatedData,
    created_seq: int,
    entries: list[tuple[audit.AuditRow, dict[str, Any]]],
    logged: dict[Any, tuple[int, Any]],
) -> str | None:
    """The log against itself and the frozen scope: what the gate never writes, whatever the
    rows said while it ran (rows loosened, the approval resolved, the rows put back)."""
    approvers = created.approvers
    scope = [pair[0] for pair in json.loads(row["scope"])]
    if scope != approvers:
        return (
            f"scope holds operators {scope} in the approvals table but audit entry "
            f"{created_seq} froze {approvers}"
        )
    for e, d in entries:
        if e.kind == DECISION:
            made = DecisionData.from_data(d)
            if made.operator_id not in approvers:
                return (
                    f"audit entry {e.seq} records a decision by operator "
                    f"{made.operator_id}, outside the approvers {approvers} of "
                    f"entry {created_seq}"
                )
            revision = made.revision
            if revision not in logged or made.payload_hash != logged[revision][1]:
                return (
                    f"audit entry {e.seq} decided payload {made.payload_hash} of "
                    f"revision {revision}, which the log does not hold for it"
                )
        elif e.kind == RESOLVED:
            resolved = ResolvedData.from_data(d)
            if resolved.quorum != created.quorum:
                return (
                    f"audit entry {e.seq} resolved with quorum {resolved.quorum}, entry "
                    f"{created_seq} froze quorum {created.quorum}"
                )
            outside = [op for op in resolved.approved_by or [] if op not in approvers]
            if outside:
                return (
                    f"audit entry {e.seq} counts operators {outside} outside the "
                    f"approvers {approvers} of entry {created_seq}"
                )
    return None


def _revisions_problem(
    row: dict[str, Any], revisions: list[tuple[Any, Any, Any]], logged: dict[Any, tuple[int, Any]]
) -> str | None:
    stored = {revision: (body, digest) for revision, body, digest in revisions}
    if sorted(stored) != sorted(logged):
        return (
            f"revisions {sorted(stored)} in the revisions table but {sorted(logged)} "
            "in the audit log"
        )
    for revision, (body, digest) in sorted(stored.items()):
        seq, expected = logged[revision]
        try:
            actual = payload_hash(body)
        except UnicodeEncodeError:
            actual = "(not UTF-8 text)"
        if actual != expected:
            return (
                f"revision {revision}'s body hashes to {actual}, audit entry {seq} "
                f"holds {expected} (the draft was changed)"
            )
        if digest != expected:
            return (
                f"revision {revision}'s payload_hash is {digest} in the revisions "
                f"table but {expected} in audit entry {seq}"
            )
    if row["revision"] != max(logged):
        return (
            f"current revision is {row['revision']} in the approvals table but "
            f"{max(logged)} in the audit log"
        )
    return None


def _decisions_problem(
    stored: list[tuple[Any, Any, Any, Any]], logged: list[tuple[Any, ...]]
) -> str | None:
    in_table, in_log = Counter(map(repr, stored)), Counter(map(repr, logged))
    if in_table == in_log:
        return None
    extra = [d for d in stored if in_table[repr(d)] > in_log[repr(d)]]
    if extra:
        return (
            f"decision {_decision_text(extra[0])} is in the decisions table but not in "
            "the audit log"
        )
    missing = [d for d in logged if in_log[repr(d)] > in_table[repr(d)]]
    return (
        f"decision {_decision_text(missing[0])} of the audit log is missing from the "
        "decisions table"
    )


def _decision_text(decision: tuple[Any, ...]) -> str:
    revision, operator_id, verdict, _ = decision
    return f"{verdict!r} by operator {operator_id} on revision {revision}"


def _resolution_problem(
    row: dict[str, Any], entries: list[tuple[audit.AuditRow, dict[str, Any]]]
) -> str | None:
    resolved = [(e, ResolvedData.from_data(d)) for e, d in entries if e.kind == RESOLVED]
    if len(resolved) > 1:
        return f"{len(resolved)} resolved entries in the audit log (expected at most 1)"
    if not resolved:
        if row["state"] != "pending":
            return (
                f"state is {row['state']!r} ({row['outcome']}) in the approvals table "
                "but the audit log holds no resolution"
            )
        return None
    entry, data = resolved[0]
    if row["state"] != "resolved":
        return (
            f"state is {row['state']!r} in the approvals table but audit entry "
            f"{entry.seq} resolved it {data.outcome!r}"
        )
    if row["outcome"] != data.outcome:
        return (
            f"outcome is {row['outcome']!r} in the approvals table but "
            f"{data.outcome!r} in audit entry {entry.seq}"
        )
    if row["revision"] != data.revision:
        return (
            f"resolved at revision {data.revision} in audit entry {entry.seq} "
            f"but the approvals table's current revision is {row['revision']}"
        )
    try:
        receipt = json.loads(row["receipt"]) if row["receipt"] is not None else None
    except ValueError:
        receipt = None
    if receipt != audit.receipt_object(entry):
        return f"its stored receipt is not the receipt of audit entry {entry.seq}"
    return None


def _data(row: audit.AuditRow) -> dict[str, Any]:
    """The ``data`` object of a (verified) entry; {} when it has none."""
    try:
        data = json.loads(row.entry).get("data")
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}
