"""Counters and the pending gauge of questions, part of a gate's ``Metrics``
(``Metrics.questions``), in its registry. Labels only from the config (pipeline, step) or
closed sets (outcomes, refusal reasons); never an id, an identity or an answer."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge

QUESTION_OUTCOMES = ("answered", "timeout", "cancelled")
_REASON = re.compile(r"[a-z0-9_.:]{1,64}")


class QuestionMetrics:
    """``hitl_gate_questions_created_total{pipeline,step}``, ``hitl_gate_questions_resolved_total
    {outcome}``, ``hitl_gate_answers_total{result}`` (``accepted`` or the refusal reason) and the
    gauge ``hitl_gate_questions_pending`` (read at scrape time)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.created = Counter(
            "hitl_gate_questions_created",
            "Questions created, by pipeline and step.",
            ["pipeline", "step"],
            registry=registry,
        )
        self.resolved = Counter(
            "hitl_gate_questions_resolved",
            "Questions resolved, by outcome (answered, timeout, cancelled).",
            ["outcome"],
            registry=registry,
        )
        self.answers = Counter(
            "hitl_gate_answers",
            "Answers received: accepted, or refused by reason.",
            ["result"],
            registry=registry,
        )
        self.pending = Gauge(
            "hitl_gate_questions_pending",
            "Questions pending (read at scrape time).",
            registry=registry,
        )
        for outcome in QUESTION_OUTCOMES:
            self.resolved.labels(outcome)
        self.answers.labels("accepted")

    def answer(self, result: str) -> None:
        """Count an answer: ``accepted`` or a refusal reason (others count as ``other``)."""
        self.answers.labels(result if _REASON.fullmatch(result) else "other").inc()
