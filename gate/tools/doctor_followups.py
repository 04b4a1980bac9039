"""``hitl-gate doctor``'s view of follow-ups: what the config plans (reminders, escalation
levels, delegations in force, where notices go) and the follow-up sends given up lately."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gate.config import Config
from gate.store import inspection

DAY_MS = 24 * 3600 * 1000


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def followups_summary(config: Config, now_ms: int, safe_url: Callable[[str], str]) -> str:
    """One line of what the config plans: steps that remind, steps that escalate (and their
    levels), delegations in force at ``now_ms`` (unix ms; ended ones are the config check's
    warning), and where notices go (``safe_url`` redacts the URL)."""
    steps = [step for pipeline in config.pipelines for step in pipeline.steps]
    remind = sum(step.first_reminder_s is not None for step in steps)
    escalating = [step for step in steps if step.escalate]
    levels = sum(len(step.escalate) for step in escalating)
    in_force = sum(item.until_ms > now_ms for item in config.delegations)
    target = config.relay.notice_target
    parts = [
        _n(remind, "step reminds", "steps remind"),
        _n(len(escalating), "step escalates", "steps escalate")
        + (f" ({_n(levels, 'level', 'levels')})" if levels else ""),
        _n(in_force, "delegation in force", "delegations in force"),
        f"notices to {safe_url(target)}" if target is not None else "no notices",
    ]
    return ", ".join(parts)


def followup_failures(path: Path, now_ms: int) -> str | None:
    """What was given up in the last 24 h before ``now_ms`` (unix ms) among the follow-up
    sends of the database at ``path`` (``3 follow-up sends given up in the last 24 h (2
    notices, 1 reminder); latest error: ...``), or None when nothing was. Raises GateError
    when the database cannot be read."""
    counts, error = inspection.failed_followups(path, now_ms - DAY_MS)
    total = sum(counts.values())
    if total == 0:
        return None
    names = {"notice": ("notice", "notices"), "reminder": ("reminder", "reminders")}
    kinds = ", ".join(
        _n(counts[kind], *names.get(kind, ("escalation", "escalations"))) for kind in sorted(counts)
    )
    return (
        f"{_n(total, 'follow-up send', 'follow-up sends')} given up in the last 24 h "
        f"({kinds}); latest error: {error}"
    )
