"""Reminders and escalation levels of one approval: the plan frozen at creation
and what is due at a given time. Pure: times are arguments (unix ms, the gate's clock).

The plan is stored as JSON in ``approvals.followups`` (migration 4):
``{"remind_after_ms", "remind_every_ms", "levels": [[after_ms, [[id, identity], ...]], ...]}``,
offsets from ``created_at``; a level lists its operators already resolved against
``relay.operators`` and ``allowed_users``. Reminder k (1, 2, ...) is due at ``created_at +
remind_after_ms + (k - 1) * remind_every_ms`` (only the first without ``remind_every_ms``);
level i (1-based) at ``created_at + after_ms``. Nothing is due at or after ``expires_at``
(expiry wins).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gate.config import Config
    from gate.config.model import StepConfig

Scope = tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """A step's follow-ups, frozen at creation: the first reminder's offset and the interval
    after it (ms, None when none), and the escalation levels as ``(after_ms, operators)``."""

    remind_after_ms: int | None
    remind_every_ms: int | None
    levels: tuple[tuple[int, Scope], ...]

    def to_json(self) -> str:
        """The ``approvals.followups`` text (schema comment of migration 4)."""
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> Plan | None:
        """Read ``approvals.followups`` back; None for NULL. Raises ValueError/TypeError/
        KeyError for text the gate never writes."""
        if text is None:
            return None
        data: dict[str, Any] = json.loads(text)
        return cls(
            data["remind_after_ms"],
            data["remind_every_ms"],
            tuple(
                (int(after), tuple((int(i), str(ident)) for i, ident in ops))
                for after, ops in data["levels"]
            ),
        )

    def without(self, operator_id: int) -> Plan:
        """The plan with ``operator_id`` left out of every level (the requester, who may not
        decide their own request: ``gate.core.approvals.service.Approvals.requester_policy``)."""
        kept = tuple(
            (after, tuple(op for op in ops if op[0] != operator_id)) for after, ops in self.levels
        )
        return replace(self, levels=kept)


def plan_for(
    first_reminder_s: float | None,
    interval_s: float | None,
    levels: tuple[tuple[float, tuple[int, ...]], ...],
    operators: dict[int, str],
    allowed: set[int],
) -> Plan | None:
    """The plan of a step (``StepConfig.first_reminder_s``, ``reminder_interval_s``, its
    ``escalate`` levels as ``(after seconds, operator ids)``), each level's ids resolved to
    ``(id, identity)`` through ``operators`` (id -> identity) and kept only when in
    ``allowed`` (``relay.security.allowed_users``). None when the step has neither
    reminders nor levels (the approval's ``followups`` stays NULL)."""
    if first_reminder_s is None and not levels:
        return None
    return Plan(
        None if first_reminder_s is None else round(first_reminder_s * 1000),
        None if interval_s is None or first_reminder_s is None else round(interval_s * 1000),
        tuple(
            (
                round(after * 1000),
                tuple((i, operators[i]) for i in ids if i in allowed and i in operators),
            )
            for after, ids in levels
        ),
    )


def followup_plan(config: Config, step: StepConfig) -> Plan | None:
    """``plan_for`` a configured ``step`` of ``config``, or None."""
    return plan_for(
        step.first_reminder_s,
        step.reminder_interval_s,
        tuple((level.after, tuple(level.to)) for level in step.escalate),
        {op.id: op.identity for op in config.relay.operators},
        set(config.relay.security.allowed_users),
    )


def reminder_at(plan: Plan, created_at: int, k: int) -> int | None:
    """When reminder ``k`` (>= 1) is due (unix ms), or None when the plan has no such one."""
    if plan.remind_after_ms is None or k < 1:
        return None
    if k == 1:
        return created_at + plan.remind_after_ms
    if plan.remind_every_ms is None:
        return None
    return created_at + plan.remind_after_ms + (k - 1) * plan.remind_every_ms


def reminders_reached(plan: Plan, created_at: int, expires_at: int, now: int) -> int:
    """How many reminder times have passed at ``now`` (before ``expires_at``): the count a
    due reminder carries, missed ones coalesced (docs/design.md)."""
    if plan.remind_after_ms is None:
        return 0
    until = min(now, expires_at - 1)
    first = created_at + plan.remind_after_ms
    if until < first:
        return 0
    if plan.remind_every_ms is None:
        return 1
    return 1 + (until - first) // plan.remind_every_ms


@dataclass(frozen=True, slots=True)
class Due:
    """What one follow-up transaction does for an approval: the escalation ``levels`` to
    apply, in order (1-based numbers), the reminder count reached (``reminder``: 0 for
    none, else the reminder to queue) and the approval's ``next_at`` (unix ms, or None)."""

    levels: tuple[int, ...]
    reminder: int
    next_at: int | None


def next_followup_at(
    plan: Plan | None, created_at: int, expires_at: int, reminders_sent: int, level: int
) -> int | None:
    """The earlier of the next reminder and the next level (unix ms) after
    ``reminders_sent`` reminders and ``level`` levels, or None when neither comes before
    ``expires_at``."""
    if plan is None:
        return None
    times = [reminder_at(plan, created_at, reminders_sent + 1)]
    if level < len(plan.levels):
        times.append(created_at + plan.levels[level][0])
    found = min((at for at in times if at is not None), default=None)
    return found if found is not None and found < expires_at else None


def due(
    plan: Plan | None,
    created_at: int,
    expires_at: int,
    reminders_sent: int,
    level: int,
    now: int,
) -> Due:
    """What is due at ``now`` for an approval with ``reminders_sent`` reminders counted and
    escalation ``level`` reached: every level whose time has passed (all of them, in
    order: none is ever skipped), at most one reminder (the count reached, when it grew),
    and the next time anything is due. Nothing is due at or after ``expires_at``."""
    if plan is None:
        return Due((), 0, None)
    limit = min(now, expires_at - 1)
    levels = tuple(
        i + 1 for i in range(level, len(plan.levels)) if created_at + plan.levels[i][0] <= limit
    )
    reached = reminders_reached(plan, created_at, expires_at, now)
    reminder = reached if reached > reminders_sent else 0
    next_at = next_followup_at(
        plan, created_at, expires_at, max(reached, reminders_sent), level + len(levels)
    )
    return Due(levels, reminder, next_at)
