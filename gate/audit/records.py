"""Cross-check of the approval records against the audit log, for ``audit verify -c``.

The chain, receipts and signatures (``gate.audit.chain``) prove the log; this proves that the
tables the API answers from (approvals, revisions, decisions) say what the log says. Someone
who can write the database file but holds no receipt or signing key can change a row, not
the log: an approved draft's body, an outcome, a decision. Each approval must have:

- one ``created`` entry whose pipeline, step, quorum and expires_at are the row's;
- exactly the revisions the log names (revision 1 in ``created``, each later one in the
  ``decision`` entry that made it), each body hashing to the payload hash the log holds;
  the row's current revision is the last of them;
- exactly the decisions the log holds (revision, operator, decision, payload hash, and the
  principal of a delegate's decision);
- a ``resolved`` entry if and only if the row is resolved, with the row's outcome and
  revision, and the row's stored receipt being that entry's receipt;
- a log that keeps the gate's own rules: decisions and counted approvers within the
  approvers frozen in ``created``, widened by each ``escalated`` entry before them (each
  adds operators not yet in scope; a delegate's decision: its principal within them),
  and the row's scope the same operators, each decision on a payload the log holds for its
  revision, the resolution with the frozen quorum (a row loosened while the gate ran, then
  put back, leaves this trace);
- a ``dispatch_ack`` entry for every dispatch its outbox rows say the relay acked (the
  gate writes both in one transaction), with the attempts counted then; at most one per
  revision, only for revisions the log holds, none for a dispatch the outbox says was never
  acked. A deleted newest ack entry shows here while its outbox row still says delivered.

Pure: takes ``ApprovalRecord``s (defined here, read by
``gate.store.auditlog.approval_records``), reads nothing. This module finds each approval's
``created`` entry and runs the comparisons in that order; each lives in
``gate.audit.record_checks``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gate.audit import chain as audit
from gate.audit import record_checks as checks
from gate.audit.entries import (
    CREATED,
    DECISION,
    CreatedData,
    DecisionData,
)

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
    state, outcome, expires_at, receipt: JSON text, scope: JSON text, approver_signature)
    or None when only the
    log names the approval;
    ``revisions`` are ``(revision, body, payload_hash)``; ``decisions`` are ``(revision,
    operator_id, decision, payload_hash)`` with ``on_behalf_of`` appended when not null
    (a delegate's decision), then ``("credential_id", id)`` when not null (a
    signed decision), all as stored (an edited row may hold any type);
    ``entries`` its audit rows in ascending seq; ``dispatches`` its outbox rows
    ``(revision, attempts, delivered_at)`` as stored; ``reasons`` its decisions'
    ``(revision, operator_id, reason)`` as stored."""

    approval_id: str
    approval: dict[str, Any] | None
    revisions: list[tuple[Any, Any, Any]]
    decisions: list[tuple[Any, ...]]
    entries: list[audit.AuditRow]
    dispatches: list[tuple[Any, Any, Any]] = field(default_factory=list)
    reasons: list[tuple[Any, Any, Any]] = field(default_factory=list)


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
    # the mode frozen at creation is the logged one (NULL: created before
    # migration 7, when the entry names none)
    mode = row.get("approver_signature")
    if (mode, data.approver_signature) != (None, None) and mode != (
        data.approver_signature or "off"
    ):
        return (
            f"approver_signature is {mode!r} in the approvals table but "
            f"{data.approver_signature or 'off'!r} in audit entry {entry.seq}"
        )
    logged: dict[Any, tuple[int, Any]] = {1: (entry.seq, data.payload_hash)}
    decisions = []
    reasons = []
    for e, d in entries:
        if e.kind != DECISION:
            continue
        made = DecisionData.from_data(d)
        made_row = (made.revision, made.operator_id, made.decision, made.payload_hash)
        behalf = () if made.on_behalf_of is None else (made.on_behalf_of,)
        # the credential that signed it, tagged (on_behalf_of is optional too)
        signed = () if made.credential_id is None else (("credential_id", made.credential_id),)
        decisions.append(made_row + behalf + signed)
        reasons.append((e.seq, made.revision, made.operator_id, made.reason))
        if made.new_revision is not None:
            logged[made.new_revision] = (e.seq, made.new_payload_hash)
    reason = checks.revisions_problem(row, record.revisions, logged)
    if reason is None:
        reason = checks.decisions_problem(record.decisions, decisions)
    if reason is None:
        reason = checks.reasons_problem(record.reasons, reasons)
    if reason is None:
        reason = checks.resolution_problem(row, entries)
    if reason is None:
        reason = checks.rules_problem(row, data, entry.seq, entries, logged)
    if reason is None:
        reason = checks.dispatches_problem(record.dispatches, entries, logged)
    return reason


def _data(row: audit.AuditRow) -> dict[str, Any]:
    """The ``data`` object of a (verified) entry; {} when it has none."""
    try:
        data = json.loads(row.entry).get("data")
    except (ValueError, AttributeError):
        return {}
    return data if isinstance(data, dict) else {}
