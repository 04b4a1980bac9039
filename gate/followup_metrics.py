"""Counters of the follow-up sends: resolution notices, reminders, escalations.

Part of a gate's ``Metrics`` (``Metrics.followups``), in its registry; labels only from the
config (pipeline, step, level) or closed sets.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

NOTICE_RESULTS = ("delivered", "failed")


class FollowUpMetrics:
    """``hitl_gate_notices_total{result}``, ``hitl_gate_reminders_sent_total{pipeline,step}``
    and ``hitl_gate_escalations_total{pipeline,step,level}``, counted when the relay acks
    (a notice also when it is given up: ``failed``), and
    ``hitl_gate_followups_failed_total{kind}`` (reminders, escalations given up)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.notices = Counter(
            "hitl_gate_notices",
            "Resolution notices: delivered (acked 2xx), failed (given up, unsent or unacked).",
            ["result"],
            registry=registry,
        )
        self.reminders_sent = Counter(
            "hitl_gate_reminders_sent",
            "Reminders of pending approvals acked by the relay.",
            ["pipeline", "step"],
            registry=registry,
        )
        self.escalations = Counter(
            "hitl_gate_escalations",
            "Escalation dispatches (the widened scope) acked by the relay, by level.",
            ["pipeline", "step", "level"],
            registry=registry,
        )
        self.failed_sends = Counter(
            "hitl_gate_followups_failed",
            "Reminders and escalation dispatches given up unacked (at the approval's expiry).",
            ["kind"],
            registry=registry,
        )
        for result in NOTICE_RESULTS:
            self.notices.labels(result)
        for kind in ("reminder", "escalation"):
            self.failed_sends.labels(kind)

    def notice(self, result: str) -> None:
        """Count a notice that ended: ``delivered`` or ``failed``."""
        self.notices.labels(result if result in NOTICE_RESULTS else "failed").inc()

    def delivered(self, kind: str, pipeline: str, step: str, n: int) -> None:
        """Count an acked reminder (``kind`` ``reminder``) or escalation level ``n``
        (``escalation``) of an approval of ``pipeline``/``step``; other kinds count nothing."""
        if kind == "reminder":
            self.reminders_sent.labels(pipeline, step).inc()
        elif kind == "escalation":
            self.escalations.labels(pipeline, step, str(n)).inc()

    def failed(self, kind: str) -> None:
        """Count a reminder or escalation dispatch given up unacked."""
        if kind in ("reminder", "escalation"):
            self.failed_sends.labels(kind).inc()
