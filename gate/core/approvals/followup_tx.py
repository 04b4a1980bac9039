"""The follow-up write transactions: due escalation levels and reminders of pending
approvals, and the record of one follow-up send, run on the writer with the state
``Transactions`` owns (``t``). No SQL of its own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gate.audit.entries import EscalatedData
from gate.core.approvals.followups import Plan, due
from gate.core.commands import Transaction
from gate.core.requests.lifecycle_tx import send_result
from gate.store import WriteTx
from gate.store.outbox import FOLLOWUPS

if TYPE_CHECKING:
    from gate.core.transactions import Transactions

FOLLOWUP_BATCH = 500  # approvals whose due follow-ups one transaction handles


@dataclass(frozen=True, slots=True)
class Followups(Transaction[list[tuple[str, tuple[int, ...], int]]]):
    """Handle, for up to ``FOLLOWUP_BATCH`` pending approvals whose ``next_followup_at`` is at
    or before the gate's now (unix ms): every due escalation level in order (scope widened by
    the level's operators not yet in it, ``escalation_level`` + 1, an ``escalated`` audit
    entry, an ``escalation`` row in ``followup_outbox``), then at most one reminder
    (``reminders_sent`` becomes the count reached; its ``reminder`` row only when the current
    revision's dispatch was acked: the retrying dispatch is the reminder), then the next due
    time. State and rows change in the caller's transaction, so a restart never queues a
    level or reminder twice nor skips a level (their primary keys would refuse a second).
    Returns ``(approval_id, levels applied, reminder queued or 0)`` per approval handled."""

    def run(self, t: Transactions, tx: WriteTx) -> list[tuple[str, tuple[int, ...], int]]:
        done = []
        now = t.clock.now_ms()
        for approval_id in tx.approvals.due_followups(now, FOLLOWUP_BATCH):
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
                t.audit(tx, entry.kind, approval_id, now, entry.to_data())
                tx.outbox.queue(
                    FOLLOWUPS, (approval_id, "escalation", n, revision), now, expires_at
                )
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


@dataclass(frozen=True, slots=True)
class FollowupResult(Transaction[str | None]):
    """Record one attempt of the follow-up send ``key`` = (approval_id, kind, n)
    (``send_result``). Returns ``"delivered"``/``"retry"``/``"failed"``, None when nothing
    changed."""

    key: tuple[str, str, int]
    acked: bool
    error: str | None
    retry_at_ms: int | None

    def run(self, t: Transactions, tx: WriteTx) -> str | None:
        return send_result(t, tx, FOLLOWUPS, self.key, self.acked, self.error, self.retry_at_ms)
