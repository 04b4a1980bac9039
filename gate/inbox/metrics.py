"""Prometheus metrics of one inbox (``GET /metrics``): counters observed where things happen
(sign-ins, decisions the gate took, failed calls to the gate, mails), the items waiting read
at scrape time. Its own ``CollectorRegistry``, as the gate's ``gate.metrics``; labels take
values from closed sets only, never an identity, an id or a body."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

VERBS = ("approve", "skip", "adjust", "answer")
CALLS = ("decision", "credentials")
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"  # what generate_latest writes
# each counter: its name (hitl_inbox_<name>_total), help text, label and the label's values
COUNTERS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "decisions": (
        "Decisions and answers posted through the inbox that the gate took (2xx), by verb.",
        "verb",
        VERBS,
    ),
    "signins": (
        "Passkey sign-ins: ok, or failed (refused, rate limited).",
        "result",
        ("ok", "failed"),
    ),
    "gate_errors": (
        "Calls to the gate that failed: no answer, a 5xx, or (credentials) a wrong answer.",
        "call",
        CALLS,
    ),
    "mails": (
        "Notification mails: sent, or failed (given up after the retries).",
        "result",
        ("sent", "failed"),
    ),
}


class InboxMetrics:
    """The inbox's counters and its waiting gauge, each series created at 0."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.waiting = Gauge(
            "hitl_inbox_items_waiting",
            "Approvals and questions pending at the inbox (read at each scrape).",
            registry=self.registry,
        )
        self.counters = {name: self._counter(name, *spec) for name, spec in COUNTERS.items()}

    def _counter(self, name: str, doc: str, label: str, values: tuple[str, ...]) -> Counter:
        """``hitl_inbox_<name>_total{<label>}`` with a series at 0 for each of ``values``."""
        counter = Counter(f"hitl_inbox_{name}", doc, [label], registry=self.registry)
        for value in values:
            counter.labels(value)
        return counter

    def gate_answered(self, verb: str, status: int) -> None:
        """Count the gate's answer to a decision or answer: a 2xx by ``verb``, a 5xx as a
        ``decision`` gate error (a 4xx is a refusal the approver is told, not an error)."""
        if 200 <= status < 300 and verb in VERBS:
            self.counters["decisions"].labels(verb).inc()
        elif status >= 500:
            self.counters["gate_errors"].labels("decision").inc()

    def gate_failed(self, call: str) -> None:
        """Count a call to the gate (``CALLS``) that got no usable answer."""
        self.counters["gate_errors"].labels(call if call in CALLS else "decision").inc()

    def signed_in(self, ok: bool) -> None:
        """Count a sign-in attempt that passed the Origin and CSRF checks."""
        self.counters["signins"].labels("ok" if ok else "failed").inc()

    def mailed(self, sent: bool) -> None:
        """Count a mail sent, or given up."""
        self.counters["mails"].labels("sent" if sent else "failed").inc()

    def render(self, waiting: float) -> tuple[bytes, str]:
        """The scrape (Prometheus text) with ``waiting`` items pending (NaN: unknown)."""
        self.waiting.set(waiting)
        return generate_latest(self.registry), TEXT_FORMAT
