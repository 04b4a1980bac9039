"""The comparisons of one approval's rows with its audit entries, one per table (revisions,
decisions, resolution, outbox) plus the log against the gate's own rules; ``gate.audit.records``
runs them in order and says what each checks.

Pure. Each takes values already read (rows as stored, entries with their decoded ``data``
objects) and returns why they disagree, or None. A value of a type the gate never writes may
raise TypeError, ValueError, KeyError, AttributeError or IndexError; ``records.problem``
turns that into a disagreement.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from gate.audit import chain as audit
from gate.audit.entries import (
    DECISION,
    DISPATCH_ACK,
    ESCALATED,
    POLICY_OPERATOR,
    RESOLVED,
    CreatedData,
    DecisionData,
    DispatchAckData,
    EscalatedData,
    ResolvedData,
)
from gate.audit.receipts import receipt_object
from gate.protocol.canonical import payload_hash


def dispatches_problem(
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


def rules_problem(
    row: dict[str, Any],
    created: CreatedData,
    created_seq: int,
    entries: list[tuple[audit.AuditRow, dict[str, Any]]],
    logged: dict[Any, tuple[int, Any]],
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
    scope = [pair[0] for pair in json.loads(row["scope"])]
    if scope != approvers:
        return (
            f"scope holds operators {scope} in the approvals table but audit entry "
            f"{created_seq} froze {list(created.approvers)}{_widened(approvers, created)}"
        )
    return None


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


def revisions_problem(
    row: dict[str, Any], revisions: list[tuple[Any, Any, Any]], logged: dict[Any, tuple[int, Any]]
) -> str | None:
    """The revisions table's ``(revision, body, payload_hash)`` rows against ``logged``
    (revision -> ``(seq, payload_hash)`` of the entry that made it): the same revisions, each
    body hashing to the logged hash (``gate.protocol.canonical.payload_hash``), and the row's
    current revision the last logged one."""
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


def resolution_problem(
    row: dict[str, Any], entries: list[tuple[audit.AuditRow, dict[str, Any]]]
) -> str | None:
    """The row's state, outcome, revision and stored receipt against its ``resolved`` entry:
    at most one, present if and only if the row is resolved, with the row's receipt that
    entry's receipt (``gate.audit.receipts.receipt_object``)."""
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
    if receipt != receipt_object(entry):
        return f"its stored receipt is not the receipt of audit entry {entry.seq}"
    return None
