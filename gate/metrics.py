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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from gate import __version__
from gate.errors import GateError

if TYPE_CHECKING:
    from gate.config import PipelineConfig
    from gate.core.service import GateService, Resolution

log = logging.getLogger(__name__)

# A counter's ``<name>_created`` series (its creation time) would read as a second counter
# next to ``hitl_gate_approvals_created_total``; this process exposes only hitl-gate's own
# registries, so the process-wide switch is ours to turn.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

OUTCOMES = ("approved", "adjusted", "skipped", "timeout", "cancelled")
QUESTION_OUTCOMES = ("answered", "timeout", "cancelled")
VERBS = ("approve", "skip", "adjust")
DISPATCH_FAILURES = ("http_status", "timeout", "connection")
NOTICE_RESULTS = ("delivered", "failed")
FOLLOWUP_KINDS = ("reminder", "escalation")
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
# jobs per write batch: 1 on an idle gate, up to gate.store.batch.MAX_BATCH (256) under load
BATCH_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
# a batch holds the write lock for about 0.2 ms per job on SQLite (plus the COMMIT's fsync)
LOCK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_REASON = re.compile(r"[a-z0-9_.:]{1,64}")


# every family's help text, by its name after ``hitl_gate_`` (a counter's without ``_total``)
HELP = {
    "approvals_created": "Approvals created (an idempotent replay is not).",
    "approvals_resolved": "Approvals resolved, by outcome.",
    "questions_created": "Questions created, by pipeline and step.",
    "questions_resolved": "Questions resolved, by outcome (answered, timeout, cancelled).",
    "decisions_accepted": "Relay decisions recorded (SPEC §2: 200).",
    "decisions_refused": "Relay decisions refused, by the answer's reason (SPEC §2 checks 1-14).",
    "delegated_decisions": (
        "Decisions recorded from a delegate on behalf of an operator in scope (delegations)."
    ),
    "dispatch_attempts": "Dispatch POSTs sent to the relay.",
    "dispatch_failures": "Dispatch POSTs not acked: http_status (non-2xx, 3xx included), "
    "timeout, connection (refused, reset, TLS, DNS).",
    "dispatch_ack_seconds": "Time from sending a dispatch to its 2xx ack.",
    "time_to_decision_seconds": "Time from creation to resolution by a human decision "
    "(approved, adjusted, skipped); timeouts and cancels are not decisions.",
    "build_info": "The running hitl-gate version (always 1).",
    "answers": "Answers received: accepted, or refused by reason.",
    "questions_pending": "Questions pending (read at scrape time).",
    "notices": "Resolution notices: delivered (acked 2xx), failed (given up, unsent or unacked).",
    "reminders_sent": "Reminders of pending approvals acked by the relay.",
    "escalations": "Escalation dispatches (the widened scope) acked by the relay, by level.",
    "followups_failed": (
        "Reminders and escalation dispatches given up unacked (at the approval's expiry)."
    ),
    "batch_jobs": "Jobs (write transactions) per committed write batch of this gate's "
    "writer: one COMMIT each.",
    "write_lock_seconds": "Seconds each committed write batch of this gate held the "
    "database's write lock (SQLite: BEGIN IMMEDIATE; PostgreSQL: the audit_head row), from "
    "taking it to its COMMIT.",
    # gauges computed at scrape time (_StateCollector)
    "approvals_pending": "Approvals waiting for a decision.",
    "oldest_pending_age_seconds": "Age of the oldest pending approval (0 when none is pending).",
    "step_oldest_pending_age_seconds": "Age of the oldest pending approval of each step (no "
    "series for a step with none pending).",
    "writer_unanswered_seconds": "Seconds the oldest write sent to the database writer "
    "process has waited for its answer (0 when none waits); /healthz answers 503 above 30.",
    "relay_up": "1 if the latest approval dispatch POST was acked, 0 if it failed (absent "
    "before the first attempt since start).",
    "question_relay_up": "1 if the latest question dispatch POST was acked, 0 if it failed "
    "(absent before the first question attempt since start).",
    "relay_last_ack_timestamp_seconds": (
        "Unix time of the relay's latest ack (absent before the first since start)."
    ),
    "relay_last_ack_age_seconds": (
        "Seconds since the relay's latest ack (absent before the first since start)."
    ),
    # several gates on one PostgreSQL database (absent on SQLite): gate.daemon.cluster
    "cluster_lease_held": "1 while this gate holds the timers' lease (it runs the timers and "
    "the senders), else 0 (PostgreSQL only).",
    "cluster_live_gates": "Gates on the database with a recent heartbeat, this one included "
    "(PostgreSQL only).",
    "cluster_clock_offset_seconds": "This gate's clock minus the database's at its last "
    "heartbeat (PostgreSQL only); /healthz answers 503 clock_skew beyond 5 s either way.",
    "cluster_config_divergent": "1 while live gates run configs of different hashes, else 0 "
    "(PostgreSQL only).",
}


@dataclass(frozen=True, slots=True)
class KindNames:
    """How one kind of request is counted: ``hitl_gate_<plural>_created_total{pipeline,step}``
    (``steps_at_zero``: a series at 0 for every configured step from the start),
    ``hitl_gate_<plural>_resolved_total{outcome}`` (each of ``outcomes`` at 0 from the start)
    and ``relay_up``, the gauge its latest dispatch POST sets (``hitl_gate_<relay_up>``)."""

    plural: str
    outcomes: tuple[str, ...]
    steps_at_zero: bool
    relay_up: str


# the one table of what differs between the kinds; every event below takes the kind's key
KINDS = {
    "approval": KindNames("approvals", OUTCOMES, True, "relay_up"),
    "question": KindNames("questions", QUESTION_OUTCOMES, False, "question_relay_up"),
}


def _reason(reason: str) -> str:
    """A refusal reason as a label value: itself when in ``[a-z0-9_.:]{1,64}``, else ``other``."""
    return reason if _REASON.fullmatch(reason) else "other"


class _Children:
    """A labelled counter or histogram with its children looked up once per label values
    (``labels()`` takes a lock and builds a key on every call: measurable on the decision
    path). ``initial`` are created at 0 at once; at most ``bound`` are kept (label values
    come from the config or closed sets; bound them anyway)."""

    def __init__(self, metric: Any, initial: Iterable[tuple[str, ...]] = (), bound: int = 4096):
        self.metric, self.bound = metric, bound
        self.cache = {values: metric.labels(*values) for values in initial}

    def __call__(self, *values: str) -> Any:
        """The child of ``values`` (created on first use)."""
        child = self.cache.get(values)
        if child is None:
            child = self.metric.labels(*values)
            if len(self.cache) < self.bound:
                self.cache[values] = child
        return child


class Metrics:
    """The metrics of one gate, in their own registry (see the module docstring).

    ``pipelines`` (a config's ``pipelines``) pre-creates ``approvals_created_total`` for every
    configured step, so each series exists at 0 before its first approval.
    """

    def __init__(self, pipelines: Iterable[PipelineConfig] = ()) -> None:
        self.registry = CollectorRegistry()
        steps = [(pipe.name, step.name) for pipe in pipelines for step in pipe.steps]
        self._created = {
            kind: self._counter(
                f"{n.plural}_created", "pipeline", "step", initial=steps if n.steps_at_zero else ()
            )
            for kind, n in KINDS.items()
        }
        self._resolved = {
            kind: self._counter(f"{n.plural}_resolved", "outcome", initial=n.outcomes)
            for kind, n in KINDS.items()
        }
        self._accepted = self._counter("decisions_accepted", "decision", initial=VERBS)
        self._refused = self._counter("decisions_refused", "reason", bound=256)
        self._delegated = self._counter("delegated_decisions", "pipeline", "step")
        self._dispatch_attempts = self._metric(Counter, "dispatch_attempts")
        self._dispatch_failures = self._counter(
            "dispatch_failures", "reason", initial=DISPATCH_FAILURES
        )
        self._dispatch_ack_seconds = self._metric(
            Histogram, "dispatch_ack_seconds", buckets=ACK_BUCKETS
        )
        self._time_to_decision = _Children(
            self._metric(
                Histogram, "time_to_decision_seconds", "pipeline", "step", buckets=DECISION_BUCKETS
            )
        )
        self._metric(Gauge, "build_info", "version").labels(__version__).set(1)
        self._answers = self._counter("answers", "result", initial=["accepted"])
        self._questions_pending = self._metric(Gauge, "questions_pending")
        # the follow-up sends: resolution notices (of both kinds), reminders, escalations
        self._notices = self._counter("notices", "result", initial=NOTICE_RESULTS)
        self._reminders = self._counter("reminders_sent", "pipeline", "step")
        self._escalations = self._counter("escalations", "pipeline", "step", "level")
        self._followups_failed = self._counter("followups_failed", "kind", initial=FOLLOWUP_KINDS)
        self._batch_jobs = self._metric(Histogram, "batch_jobs", buckets=BATCH_BUCKETS)
        self._write_lock = self._metric(Histogram, "write_lock_seconds", buckets=LOCK_BUCKETS)
        self._state = _StateCollector()
        self.registry.register(self._state)

    def _metric(self, cls: Any, name: str, *labels: str, **options: Any) -> Any:
        """A ``cls`` (Counter, Gauge, Histogram) family ``hitl_gate_<name>`` (a counter's
        exposed with ``_total``) with help text ``HELP[name]``, labelled ``labels``, in this
        registry; ``options`` go to its constructor (a histogram's ``buckets``)."""
        return cls(f"hitl_gate_{name}", HELP[name], labels, registry=self.registry, **options)

    def _counter(
        self, name: str, *labels: str, initial: Iterable[Any] = (), bound: int = 4096
    ) -> _Children:
        """``hitl_gate_<name>_total{labels}`` (``_metric``) with a series at 0 for each of
        ``initial`` (label values: a tuple, or a lone string for a one-label counter)."""
        counter = self._metric(Counter, name, *labels)
        return _Children(counter, [v if isinstance(v, tuple) else (v,) for v in initial], bound)

    # ---- observations ----------------------------------------------------------

    def created(self, kind: str, pipeline: str, step: str) -> None:
        """Count a created approval or question (``kind``: a key of ``KINDS``; an idempotent
        replay is not a creation); ``pipeline`` and ``step`` come from the config."""
        self._created[kind](pipeline, step).inc()

    def resolved(self, kind: str, outcome: str, count: int = 1) -> None:
        """Count ``count`` resolutions of ``kind`` by their outcome (``KINDS[kind].outcomes``;
        a count above 1: the expiry batch)."""
        self._resolved[kind](outcome).inc(count)

    def accepted(self, verb: str) -> None:
        """Count a recorded decision by its verb (``approve``, ``skip``, ``adjust``)."""
        self._accepted(verb).inc()

    def delegated(self, pipeline: str, step: str) -> None:
        """Count a decision a delegate made on behalf of an operator in scope;
        ``pipeline`` and ``step`` come from the config (bounded label values)."""
        self._delegated(pipeline, step).inc()

    def refused(self, reason: str) -> None:
        """Count a refused decision; a reason outside ``[a-z0-9_.:]{1,64}`` counts as ``other``."""
        self._refused(_reason(reason)).inc()

    def answer(self, result: str) -> None:
        """Count an answer: ``accepted`` or a refusal reason (others count as ``other``)."""
        self._answers(_reason(result)).inc()

    def dispatch_result(
        self,
        acked: bool,
        elapsed_s: float,
        failure: str | None,
        now_ms: int,
        *,
        kind: str = "approval",
    ) -> None:
        """Count one dispatch POST of ``kind`` (a key of ``KINDS``): its ack latency, or its
        failure reason, in the counters and histogram every kind shares; it sets that kind's
        ``relay_up`` gauge. Only an approval's ack is the relay's last ack."""
        self._dispatch_attempts.inc()
        self._state.relay_up[kind] = int(acked)
        if acked:
            self._dispatch_ack_seconds.observe(max(0.0, elapsed_s))
            if kind == "approval":
                self._state.last_ack_ms = now_ms
        else:
            self._dispatch_failures(failure if failure in DISPATCH_FAILURES else "connection").inc()

    def resolved_by_decision(self, resolution: Resolution) -> None:
        """Count a resolution by a decision and observe its time to decision.

        ``resolution`` is a ``gate.core.service.Resolution`` (pipeline, step, outcome,
        created_at_ms, resolved_at_ms: unix ms); the histogram is in seconds.
        """
        self.resolved("approval", resolution.outcome)
        child = self._time_to_decision(resolution.pipeline, resolution.step)
        child.observe(max(0, resolution.resolved_at_ms - resolution.created_at_ms) / 1000)

    def notice(self, result: str) -> None:
        """Count a resolution notice (an approval's or a question's) that ended:
        ``delivered`` or ``failed``."""
        self._notices(result if result in NOTICE_RESULTS else "failed").inc()

    def followup_ended(self, kind: str, state: str, pipeline: str, step: str, n: int) -> None:
        """Count a follow-up send of an approval of ``pipeline``/``step`` that ended in
        ``state`` (``delivered``, ``failed``): a ``notice`` as a resolution notice
        (``notice``); a ``reminder`` or an ``escalation`` (level ``n``) acked, or given up
        unacked. Other kinds count nothing."""
        if kind == "notice":
            self.notice(state)
        elif state == "failed" and kind in FOLLOWUP_KINDS:
            self._followups_failed(kind).inc()
        elif state == "delivered" and kind == "reminder":
            self._reminders(pipeline, step).inc()
        elif state == "delivered" and kind == "escalation":
            self._escalations(pipeline, step, str(n)).inc()

    def batch(self, jobs: int, lock_s: float) -> None:
        """Observe one committed write batch: its ``jobs`` and the seconds it held the
        write lock (``gate.store.batch.BatchResult``; the store's ``on_batch``)."""
        self._batch_jobs.observe(jobs)
        self._write_lock.observe(lock_s)

    # ---- scrape ------------------------------------------------------------------

    async def render(self, service: GateService, openmetrics_text: bool) -> bytes:
        """Read the pending approvals and questions, then return the exposition: Prometheus
        text 0.0.4, or OpenMetrics 1.0.0 with ``openmetrics_text``.

        A failed read leaves the pending gauges out of this scrape (counters still answer).
        """
        now_ms = service.clock.now_ms()
        state = self._state
        try:
            count, oldest_ms = await service.pending_summary()
            by_step = await service.oldest_pending_by_step()
            self._questions_pending.set(await service.questions.pending())
        except GateError as exc:
            log.warning("event=metrics_read_failed reason=%s", exc.code)
            state.pending, state.oldest_age_s, state.pending_by_step = None, None, []
        else:
            state.pending = count
            state.oldest_age_s = 0.0 if oldest_ms is None else max(0, now_ms - oldest_ms) / 1000
            state.pending_by_step = [
                (pipeline, step, max(0, now_ms - oldest) / 1000)
                for pipeline, step, oldest in by_step
            ]
        state.now_ms = now_ms
        state.writer_unanswered_s = service.writer_unanswered_s
        state.cluster = None if service.cluster_status is None else service.cluster_status()
        if openmetrics_text:
            return openmetrics.generate_latest(self.registry)  # type: ignore[no-untyped-call,no-any-return]
        return generate_latest(self.registry)


class _StateCollector(Collector):
    """Gauges computed at scrape time: pending approvals and their oldest age (also per
    step), the writer's oldest unanswered write (read by ``Metrics.render`` just before),
    each kind's relay up and the relay's last ack (from dispatch results), and on
    PostgreSQL the cluster's (lease held, live gates, clock offset, configs divergent). A
    gauge whose value is not known (None) is left out of the scrape."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self.oldest_age_s: float | None = None
        self.pending_by_step: list[tuple[str, str, float]] = []
        self.relay_up: dict[str, int] = {}  # by kind: 1 if its latest dispatch was acked, else 0
        self.last_ack_ms: int | None = None
        self.writer_unanswered_s: float | None = None
        self.now_ms = 0
        self.cluster: dict[str, Any] | None = None  # GateService.cluster_status (PostgreSQL)

    def describe(self) -> list[Any]:
        return []  # families vary (gauges appear once known): collect() only at scrape time

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from _gauges(
            ("approvals_pending", self.pending), ("oldest_pending_age_seconds", self.oldest_age_s)
        )
        if self.pending_by_step:
            name = "step_oldest_pending_age_seconds"
            family = GaugeMetricFamily(f"hitl_gate_{name}", HELP[name], labels=["pipeline", "step"])
            for pipeline, step, age_s in self.pending_by_step:
                family.add_metric([pipeline, step], age_s)
            yield family
        ack_ms = self.last_ack_ms
        yield from _gauges(
            ("writer_unanswered_seconds", self.writer_unanswered_s),
            *((names.relay_up, self.relay_up.get(kind)) for kind, names in KINDS.items()),
            ("relay_last_ack_timestamp_seconds", None if ack_ms is None else ack_ms / 1000),
            (
                "relay_last_ack_age_seconds",
                None if ack_ms is None else max(0, self.now_ms - ack_ms) / 1000,
            ),
        )
        cluster = self.cluster
        if cluster is not None:
            offset_ms = cluster["clock_offset_ms"]
            yield from _gauges(
                ("cluster_lease_held", int(cluster["lease_holder"])),
                ("cluster_live_gates", cluster["live_gates"]),
                ("cluster_clock_offset_seconds", None if offset_ms is None else offset_ms / 1000),
                ("cluster_config_divergent", int("config_divergent" in cluster["problems"])),
            )


def _gauges(*rows: tuple[str, float | None]) -> Iterator[GaugeMetricFamily]:
    """A gauge ``hitl_gate_<name>`` (help text ``HELP[name]``) of each ``(name, value)``
    whose value is known (not None)."""
    for name, value in rows:
        if value is not None:
            yield GaugeMetricFamily(f"hitl_gate_{name}", HELP[name], value=value)
