"""Prometheus metrics of one gate: counters and histograms observed where things happen,
gauges of the stored state computed at scrape time (``GET /metrics``).

Every gate (one ``GateService``) has its own ``CollectorRegistry``, never the process-global
one, so several gates in one process (tests, ``hitl-gate verify``) do not collide. The API
app, the callback app, the dispatcher and the expiry scheduler are each handed the same
``Metrics`` (``gate.daemon.app.build_gate``: no global lookup). Labels only take values from
the configuration or from closed sets (outcomes, decision verbs, refusal reasons): never an
identity, an id or a body.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from gate import __version__
from gate.errors import GateError
from gate.followup_metrics import FollowUpMetrics
from gate.question_metrics import QuestionMetrics

if TYPE_CHECKING:
    from gate.config import PipelineConfig
    from gate.core.service import GateService, Resolution

log = logging.getLogger(__name__)

# A counter's ``<name>_created`` series (its creation time) would read as a second counter
# next to ``hitl_gate_approvals_created_total``; this process exposes only hitl-gate's own
# registries, so the process-wide switch is ours to turn.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

OUTCOMES = ("approved", "adjusted", "skipped", "timeout", "cancelled")
VERBS = ("approve", "skip", "adjust")
DISPATCH_FAILURES = ("http_status", "timeout", "connection")
# a relay answers within relay.dispatch_timeout (default 10 s)
ACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# a human answers in seconds to hours (step timeouts default to 4 h)
DECISION_BUCKETS = (
    5.0,
    15.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    28800.0,
    86400.0,
)
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_REASON = re.compile(r"[a-z0-9_.:]{1,64}")


class Metrics:
    """The metrics of one gate, in their own registry (see the module docstring).

    ``pipelines`` (a config's ``pipelines``) pre-creates ``approvals_created_total`` for every
    configured step, so each series exists at 0 before its first approval.
    """

    def __init__(self, pipelines: Iterable[PipelineConfig] = ()) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.approvals_created = Counter(
            "hitl_gate_approvals_created",
            "Approvals created (an idempotent replay is not).",
            ["pipeline", "step"],
            registry=r,
        )
        self.approvals_resolved = Counter(
            "hitl_gate_approvals_resolved",
            "Approvals resolved, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.decisions_accepted = Counter(
            "hitl_gate_decisions_accepted",
            "Relay decisions recorded (SPEC §2: 200).",
            ["decision"],
            registry=r,
        )
        self.decisions_refused = Counter(
            "hitl_gate_decisions_refused",
            "Relay decisions refused, by the answer's reason (SPEC §2 checks 1-14).",
            ["reason"],
            registry=r,
        )
        self.delegated_decisions = Counter(
            "hitl_gate_delegated_decisions",
            "Decisions recorded from a delegate on behalf of an operator in scope (delegations).",
            ["pipeline", "step"],
            registry=r,
        )
        self.dispatch_attempts = Counter(
            "hitl_gate_dispatch_attempts", "Dispatch POSTs sent to the relay.", registry=r
        )
        self.dispatch_failures = Counter(
            "hitl_gate_dispatch_failures",
            "Dispatch POSTs not acked: http_status (non-2xx, 3xx included), timeout, "
            "connection (refused, reset, TLS, DNS).",
            ["reason"],
            registry=r,
        )
        self.dispatch_ack_seconds = Histogram(
            "hitl_gate_dispatch_ack_seconds",
            "Time from sending a dispatch to its 2xx ack.",
            buckets=ACK_BUCKETS,
            registry=r,
        )
        self.time_to_decision_seconds = Histogram(
            "hitl_gate_time_to_decision_seconds",
            "Time from creation to resolution by a human decision (approved, adjusted, "
            "skipped); timeouts and cancels are not decisions.",
            ["pipeline", "step"],
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        Gauge(
            "hitl_gate_build_info",
            "The running hitl-gate version (always 1).",
            ["version"],
            registry=r,
        ).labels(__version__).set(1)
        for pipe in pipelines:
            for step in pipe.steps:
                self.approvals_created.labels(pipe.name, step.name)
        # children of the closed label sets, looked up once (``labels()`` takes a lock and
        # builds a key on every call: measurable on the decision path)
        self._resolved = {outcome: self.approvals_resolved.labels(outcome) for outcome in OUTCOMES}
        self._accepted = {verb: self.decisions_accepted.labels(verb) for verb in VERBS}
        self._refused: dict[str, Any] = {}
        self._time_to_decision: dict[tuple[str, str], Any] = {}
        for reason in DISPATCH_FAILURES:
            self.dispatch_failures.labels(reason)
        self.followups = FollowUpMetrics(r)  # notices, reminders, escalations
        self.questions = QuestionMetrics(r)
        self._state = _StateCollector()
        r.register(self._state)

    # ---- observations ----------------------------------------------------------

    def accepted(self, verb: str) -> None:
        """Count a recorded decision by its verb (``approve``, ``skip``, ``adjust``)."""
        child = self._accepted.get(verb)
        (child if child is not None else self.decisions_accepted.labels(verb)).inc()

    def delegated(self, pipeline: str, step: str) -> None:
        """Count a decision a delegate made on behalf of an operator in scope;
        ``pipeline`` and ``step`` come from the config (bounded label values)."""
        self.delegated_decisions.labels(pipeline, step).inc()

    def resolved(self, outcome: str) -> None:
        """Count a resolution by its outcome (``OUTCOMES``)."""
        child = self._resolved.get(outcome)
        (child if child is not None else self.approvals_resolved.labels(outcome)).inc()

    def question_created(self, pipeline: str, step: str) -> None:
        """Count a created question."""
        self.questions.created.labels(pipeline, step).inc()

    def question_resolved(self, outcome: str) -> None:
        """Count a resolved question by outcome."""
        self.questions.resolved.labels(outcome).inc()

    def question_resolved_many(self, outcome: str, count: int) -> None:
        """Count ``count`` questions resolved with ``outcome`` (the expiry batch)."""
        self.questions.resolved.labels(outcome).inc(count)

    def answer(self, result: str) -> None:
        """Count an answer: ``accepted`` or its refusal reason."""
        self.questions.answer(result)

    def refused(self, reason: str) -> None:
        """Count a refused decision; a reason outside ``[a-z0-9_.:]{1,64}`` counts as ``other``."""
        child = self._refused.get(reason)
        if child is None:
            child = self.decisions_refused.labels(reason if _REASON.fullmatch(reason) else "other")
            if len(self._refused) < 256:  # reasons are a closed set; bound it anyway
                self._refused[reason] = child
        child.inc()

    def dispatch_result(
        self,
        acked: bool,
        elapsed_s: float,
        failure: str | None,
        now_ms: int,
        *,
        question: bool = False,
    ) -> None:
        """Count one dispatch POST: its ack latency, or its failure reason. A question's
        dispatch (``question``) counts in the same counters and histogram; it sets
        ``hitl_gate_question_relay_up``, not ``hitl_gate_relay_up`` (the approvals' relay)."""
        self.dispatch_attempts.inc()
        if question:
            self._state.question_attempt_acked = acked
        else:
            self._state.last_attempt_acked = acked
        if acked:
            self.dispatch_ack_seconds.observe(max(0.0, elapsed_s))
            if not question:
                self._state.last_ack_ms = now_ms
        else:
            self.dispatch_failures.labels(
                failure if failure in DISPATCH_FAILURES else "connection"
            ).inc()

    def resolved_by_decision(self, resolution: Resolution) -> None:
        """Count a resolution by a decision and observe its time to decision.

        ``resolution`` is a ``gate.core.service.Resolution`` (pipeline, step, outcome,
        created_at_ms, resolved_at_ms: unix ms); the histogram is in seconds.
        """
        self.resolved(resolution.outcome)
        key = (resolution.pipeline, resolution.step)
        child = self._time_to_decision.get(key)
        if child is None:
            child = self.time_to_decision_seconds.labels(*key)
            if len(self._time_to_decision) < 4096:  # steps come from the config
                self._time_to_decision[key] = child
        child.observe(max(0, resolution.resolved_at_ms - resolution.created_at_ms) / 1000)

    # ---- scrape ------------------------------------------------------------------

    async def render(self, service: GateService, accept: str | None) -> tuple[bytes, str]:
        """Read the pending approvals, then return ``(body, content type)`` in the format the
        ``Accept`` header asks for (Prometheus text by default, or OpenMetrics).

        A failed read leaves the pending gauges out of this scrape (counters still answer).
        """
        now_ms = service.clock.now_ms()
        try:
            count, oldest_ms = await service.pending_summary()
            by_step = await service.oldest_pending_by_step()
            self.questions.pending.set(await service.questions.pending())
        except GateError as exc:
            log.warning("event=metrics_read_failed reason=%s", exc.code)
            self._state.pending = None
            self._state.pending_by_step = []
        else:
            self._state.pending = (
                count,
                None if oldest_ms is None else max(0, now_ms - oldest_ms) / 1000,
            )
            self._state.pending_by_step = [
                (pipeline, step, max(0, now_ms - oldest) / 1000)
                for pipeline, step, oldest in by_step
            ]
        self._state.now_ms = now_ms
        self._state.writer_unanswered_s = service.writer_unanswered_s
        if wants_openmetrics(accept):
            return openmetrics.generate_latest(self.registry), OPENMETRICS_CONTENT_TYPE  # type: ignore[no-untyped-call]
        return generate_latest(self.registry), TEXT_CONTENT_TYPE


def wants_openmetrics(accept: str | None) -> bool:
    """True when ``Accept`` lists ``application/openmetrics-text`` (any version, q > 0).

    Deliberately simpler than prometheus_client's ``choose_encoder``, which fails on a
    malformed version parameter: any Accept header gets an answer, never a 500.
    """
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() != "application/openmetrics-text":
            continue
        q = next((p.partition("=")[2] for p in params if p.lower().startswith("q=")), "1")
        try:
            if float(q) > 0:
                return True
        except ValueError:
            return True
    return False


class _StateCollector(Collector):
    """Gauges computed at scrape time: pending approvals and their oldest age (also per
    step), the writer's
    oldest unanswered write (read by ``Metrics.render`` just before), relay up and last ack
    age (from dispatch results)."""

    def __init__(self) -> None:
        self.pending: tuple[int, float | None] | None = None
        self.pending_by_step: list[tuple[str, str, float]] = []
        self.last_attempt_acked: bool | None = None
        self.question_attempt_acked: bool | None = None
        self.last_ack_ms: int | None = None
        self.writer_unanswered_s: float | None = None
        self.now_ms = 0

    def describe(self) -> list[Any]:
        return []  # families vary (gauges appear once known): collect() only at scrape time

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.pending is not None:
            count, oldest_age_s = self.pending
            yield GaugeMetricFamily(
                "hitl_gate_approvals_pending", "Approvals waiting for a decision.", value=count
            )
            yield GaugeMetricFamily(
                "hitl_gate_oldest_pending_age_seconds",
                "Age of the oldest pending approval (0 when none is pending).",
                value=oldest_age_s or 0.0,
            )
        if self.pending_by_step:
            family = GaugeMetricFamily(
                "hitl_gate_step_oldest_pending_age_seconds",
                "Age of the oldest pending approval of each step (no series for a step with "
                "none pending).",
                labels=["pipeline", "step"],
            )
            for pipeline, step, age_s in self.pending_by_step:
                family.add_metric([pipeline, step], age_s)
            yield family
        if self.writer_unanswered_s is not None:
            yield GaugeMetricFamily(
                "hitl_gate_writer_unanswered_seconds",
                "Seconds the oldest write sent to the database writer process has waited for "
                "its answer (0 when none waits); /healthz answers 503 above 30.",
                value=self.writer_unanswered_s,
            )
        if self.last_attempt_acked is not None:
            yield GaugeMetricFamily(
                "hitl_gate_relay_up",
                "1 if the latest approval dispatch POST was acked, 0 if it failed (absent "
                "before the first attempt since start).",
                value=1 if self.last_attempt_acked else 0,
            )
        if self.question_attempt_acked is not None:
            yield GaugeMetricFamily(
                "hitl_gate_question_relay_up",
                "1 if the latest question dispatch POST was acked, 0 if it failed ("
                "absent before the first question attempt since start).",
                value=1 if self.question_attempt_acked else 0,
            )
        if self.last_ack_ms is not None:
            yield GaugeMetricFamily(
                "hitl_gate_relay_last_ack_timestamp_seconds",
                "Unix time of the relay's latest ack (absent before the first since start).",
                value=self.last_ack_ms / 1000,
            )
            yield GaugeMetricFamily(
                "hitl_gate_relay_last_ack_age_seconds",
                "Seconds since the relay's latest ack (absent before the first since start).",
                value=max(0, self.now_ms - self.last_ack_ms) / 1000,
            )
