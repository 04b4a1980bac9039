"""The approval kind of the records check (``gate.audit.records``): its record, its
``RecordKind`` table (``APPROVALS``) and what only approvals have. Besides what every kind
is checked for, each approval must have:

- its created entry's pipeline, step, quorum and expires_at the row's, and the mode of
  approver signatures frozen at creation the row's;
- exactly the revisions the log names (revision 1 in ``created``, each later one in the
  ``decision`` entry that made it), each body hashing to the payload hash the log holds;
- exactly the decisions the log holds (revision, operator, decision, payload hash, the
  principal of a delegate's decision, the credential of a signed one) with their reasons;
- a log that keeps the gate's own rules: decisions and counted approvers within the
  approvers frozen in ``created``, widened by each ``escalated`` entry before them (each
  adds operators not yet in scope; a delegate's decision: its principal within them),
  and the row's scope the same operators, each decision on a payload the log holds for its
  revision, the resolution with the frozen quorum (a row loosened while the gate ran, then
  put back, leaves this trace); a policy's decision only as the gate writes one;
- a ``dispatch_ack`` entry for every acked dispatch, with the attempts counted then (a
  deleted newest ack entry shows here while its outbox row still says delivered).

In that order: revisions, decisions, reasons, resolution, rules, dispatches. Pure: takes
``ApprovalRecord``s (read by ``gate.store.audit_records.records_of``), reads nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gate.audit import chain as audit
from gate.audit import record_checks as checks
from gate.audit.entries import (
    DECISION,
    ESCALATED,
    POLICY_OPERATOR,
    RESOLVED,
    CreatedData,
    DecisionData,
    DispatchAckData,
    EscalatedData,
    ResolvedData,
)
from gate.audit.record_checks import Logged, scope_problem
from gate.audit.records import Entries, Payloads, RecordKind, Versions
from gate.protocol.canonical import payload_hash


def _compare(
    record: ApprovalRecord,
    row: dict[str, Any],
    entries: Entries,
    entry: audit.AuditRow,
    data: CreatedData,
) -> str | None:
    """The approval's comparisons after its created entry's columns (module docstring)."""
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
    logged: Logged = {1: (entry.seq, data.payload_hash)}
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
    stored = {r[0]: r for r in record.revisions}
    return (  # the first that disagrees (a reason is never empty)
        checks.versions_problem(APPROVALS, row, stored, logged, _body_problem)
        or decisions_problem(record.decisions, decisions)
        or reasons_problem(record.reasons, reasons)
        or checks.resolution_problem(APPROVALS, row, entries, logged)
        or rules_problem(row, data, entry.seq, entries, logged)
        or checks.dispatches_problem(APPROVALS, record.dispatches, entries, logged)
    )


APPROVALS = RecordKind(
    noun="approval",
    orphan="rows in the revisions, decisions or outbox table for an approval",
    columns=("pipeline", "step", ("quorum_required", "quorum"), "expires_at"),
    versions=Versions("revision", "revisions", "payload_hash"),
    payloads=Payloads(CreatedData, ResolvedData, DispatchAckData),
    compare=_compare,
)


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """One approval as the tables hold it, with its audit rows, for ``audit verify``'s
    cross-check (read by ``gate.store.audit_records.records_of``). ``approval``
    is the approvals row as a dict (approval_id, pipeline, step, quorum_required, revision,
    state, outcome, expires_at, receipt: JSON text, scope: JSON text, approver_signature)
    or None when only the log names the approval;
    ``revisions`` are ``(revision, body, payload_hash)``; ``decisions`` are ``(revision,
    operator_id, decision, payload_hash)`` with ``on_behalf_of`` appended when not null
    (a delegate's decision), then ``("credential_id", id)`` when not null (a
    signed decision), all as stored (an edited row may hold any type);
    ``entries`` its audit rows in ascending seq; ``dispatches`` its outbox rows
    ``(revision, attempts, delivered_at)`` as stored; ``reasons`` its decisions'
    ``(revision, operator_id, reason)`` as stored."""

    KIND: ClassVar[RecordKind] = APPROVALS

    approval_id: str
    approval: dict[str, Any] | None
    revisions: list[tuple[Any, Any, Any]]
    decisions: list[tuple[Any, ...]]
    entries: list[audit.AuditRow]
    dispatches: list[tuple[Any, Any, Any]] = field(default_factory=list)
    reasons: list[tuple[Any, Any, Any]] = field(default_factory=list)

    @property
    def subject(self) -> tuple[str, dict[str, Any] | None]:
        """The approval's id and row."""
        return self.approval_id, self.approval


def _body_problem(revision: Any, stored: tuple[Any, ...], seq: int, expected: Any) -> str | None:
    """A revision's body (``stored``: ``(revision, body, payload_hash)``) hashes to the
    payload hash ``expected`` that audit entry ``seq`` holds for it
    (``gate.protocol.canonical.payload_hash``)."""
    try:
        actual = payload_hash(stored[1])
    except UnicodeEncodeError:
        actual = "(not UTF-8 text)"
    if actual != expected:
        return (
            f"revision {revision}'s body hashes to {actual}, audit entry {seq} "
            f"holds {expected} (the draft was changed)"
        )
    return None


def rules_problem(
    row: dict[str, Any],
    created: CreatedData,
    created_seq: int,
    entries: Entries,
    logged: Logged,
) -> str | None:
    """The log against itself and the frozen scope: what the gate never writes, whatever the
    rows said while it ran (rows loosened, the approval resolved, the rows put back). The
    scope is the one frozen in ``created`` widened by each ``escalated`` entry in order
    (levels 1, 2, ... each adding operators not yet in it); a decision is checked
    against the scope as it stood at its entry, the row's scope and the counted approvers
    against the last. A delegate's decision (``on_behalf_of`` set) is within the scope when
    its principal is; the delegate then counts as an approver."""
    approvers = list(created.approvers)
    delegates: set[Any] = set()  # deciders let in by a delegation
    for e, d in entries:
        if e.kind == ESCALATED:
            reason = _escalation_problem(e.seq, EscalatedData.from_data(d), approvers)
            if reason is not None:
                return reason
            approvers = list(EscalatedData.from_data(d).approvers)
        elif e.kind == DECISION:
            made = DecisionData.from_data(d)
            principal = made.on_behalf_of
            reason = _policy_problem(e.seq, made)
            if reason is not None:
                return reason
            if made.by is not None:  # a policy decided; it counts as its approver
                delegates.add(POLICY_OPERATOR)
            elif principal is not None and principal not in approvers:
                return (
                    f"audit entry {e.seq} records a decision on behalf of operator "
                    f"{principal}, outside the approvers {approvers} of entry {created_seq}"
                )
            if principal is not None:
                delegates.add(made.operator_id)
            elif made.by is None and made.operator_id not in approvers:
                return (
                    f"audit entry {e.seq} records a decision by operator "
                    f"{made.operator_id}, outside the approvers {approvers} of "
                    f"entry {created_seq}{_widened(approvers, created)}"
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
            outside = [
                op for op in resolved.approved_by or [] if op not in approvers + list(delegates)
            ]
            if outside:
                return (
                    f"audit entry {e.seq} counts operators {outside} outside the "
                    f"approvers {approvers} of entry {created_seq}{_widened(approvers, created)}"
                )
    frozen = f"{list(created.approvers)}{_widened(approvers, created)}"
    return scope_problem(APPROVALS, row, approvers, created_seq, frozen)


def _policy_problem(seq: int, made: DecisionData) -> str | None:
    """A decision entry the gate writes for a policy only as operator
    ``POLICY_OPERATOR`` ``by`` ``policy:<its rule>``, on revision 1, approve or skip; and no
    operator's decision as operator ``POLICY_OPERATOR``."""
    if made.by is None and made.operator_id != POLICY_OPERATOR:
        return None
    if (
        made.operator_id != POLICY_OPERATOR
        or made.by != f"policy:{made.rule}"
        or made.revision != 1
        or made.decision not in ("approve", "skip")
    ):
        return (
            f"audit entry {seq} records a policy decision the gate never writes (operator "
            f"{made.operator_id!r}, by {made.by!r}, revision {made.revision!r})"
        )
    return None


def _widened(approvers: list[Any], created: CreatedData) -> str:
    """`` (widened to [...] by escalation)`` when ``approvers`` is no longer the frozen scope."""
    return (
        "" if approvers == list(created.approvers) else f" (widened to {approvers} by escalation)"
    )


def _escalation_problem(seq: int, data: EscalatedData, before: list[Any]) -> str | None:
    """An ``escalated`` entry the gate would not write after scope ``before``: the whole new
    scope must be ``before`` plus the operators ``added``, none of them already in it."""
    added = list(data.added)
    if any(op in before for op in added) or list(data.approvers) != before + added:
        return (
            f"audit entry {seq} widens the approvers {before} by {added} to "
            f"{list(data.approvers)} (escalation level {data.level!r}), which the gate never writes"
        )
    return None


def decisions_problem(stored: list[tuple[Any, ...]], logged: list[tuple[Any, ...]]) -> str | None:
    """The decisions table's ``(revision, operator_id, decision, payload_hash)`` rows (with
    ``on_behalf_of`` appended for a delegate's decision) against the ``decision`` entries'
    (as a multiset, compared by ``repr``): names the first extra row, else the first logged
    decision missing from the table."""
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


def reasons_problem(
    stored: list[tuple[Any, Any, Any]], logged: list[tuple[Any, Any, Any, Any]]
) -> str | None:
    """The decisions table's ``(revision, operator_id, reason)`` against the ``decision``
    entries' ``(seq, revision, operator_id, reason)`` (an entry without ``reason``
    reads None): for each logged decision, the row of the same revision and operator holds
    the same reason. Run after ``decisions_problem`` (the same decisions on both sides). The
    message never quotes a reason (treated like a draft)."""
    table = {(revision, operator_id): reason for revision, operator_id, reason in stored}
    for seq, revision, operator_id, reason in logged:
        key = (revision, operator_id)
        if key in table and table[key] != reason:
            return (
                f"the reason of the decision by operator {operator_id} on revision "
                f"{revision} differs between the decisions table and audit entry {seq}"
            )
    return None


def _decision_text(decision: tuple[Any, ...]) -> str:
    revision, operator_id, verdict = decision[:3]
    extras = decision[4:]
    principal = next((x for x in extras if not isinstance(x, tuple)), None)
    credential = next((x[1] for x in extras if isinstance(x, tuple)), None)
    behalf = "" if principal is None else f" on behalf of operator {principal}"
    signed = "" if credential is None else f" signed with credential {credential}"
    return f"{verdict!r} by operator {operator_id}{behalf}{signed} on revision {revision}"
