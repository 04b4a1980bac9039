"""The follow-up write transaction: due escalation levels and reminders of
pending approvals, run on the writer inside ``Transactions.followups``. No SQL of its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gate.audit.chain import AuditRow
from gate.audit.entries import EscalatedData
from gate.core.followups import Plan, due
from gate.store import WriteTx
from gate.store.outbox import FOLLOWUPS


def handle_due(
    tx: WriteTx, now: int, limit: int, audit: Callable[..., AuditRow]
) -> list[tuple[str, tuple[int, ...], int]]:
    """For up to ``limit`` pending approvals whose ``next_followup_at`` is at or before
    ``now`` (unix ms): every due escalation level in order (scope widened by the level's
    operators not yet in it, ``escalation_level`` + 1, an ``escalated`` audit entry written
    with ``audit``, an ``escalation`` row in ``followup_outbox``), then at most one reminder
    (``reminders_sent`` becomes the count reached; its ``reminder`` row only when the current
    revision's dispatch was acked: the retrying dispatch is the reminder), then the next due
    time. State and rows change in the caller's transaction, so a restart never queues a
    level or reminder twice nor skips a level (their primary keys would refuse a second).
    Returns ``(approval_id, levels applied, reminder queued or 0)`` per approval handled."""
    done = []
    for approval_id in tx.approvals.due_followups(now, limit):
        state = tx.approvals.followup_state(approval_id)
        if state is None:
            continue
        plan = Plan.from_json(state.followups)
        sent, level = state.reminders_sent, state.escalation_level
        expires_at = state.expires_at
        found = due(plan, state.created_at, expires_at, sent, level, now)
        scope: list[list[Any]] = [list(pair) for pair in json.loads(state.scope)]
        revision = state.revision
        for n in found.levels:
            assert plan is not None  # levels come only from a plan
            in_scope = {int(pair[0]) for pair in scope}
            added = [op for op in plan.levels[n - 1][1] if op[0] not in in_scope]
            scope.extend(list(op) for op in added)
            entry = EscalatedData(n, [op[0] for op in added], [int(op[0]) for op in scope])
            audit(tx, entry.kind, approval_id, now, entry.to_data())
            tx.outbox.queue(FOLLOWUPS, (approval_id, "escalation", n, revision), now, expires_at)
        queued = 0
        if found.reminder and state.delivered:
            reminder = (approval_id, "reminder", found.reminder, revision)
            tx.outbox.queue(FOLLOWUPS, reminder, now, expires_at)
            queued = found.reminder
        tx.approvals.set_followup_state(
            approval_id,
            scope,
            max(sent, found.reminder),
            level + len(found.levels),
            found.next_at,
        )
        done.append((approval_id, found.levels, queued))
    return done
