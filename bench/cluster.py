"""The ``cluster`` bench section: decisions/s, p99 and CPU-seconds per decision of each gate
setup at c=64, with ratios against one SQLite gate measured directly in the same run.

A *setup* is a way to run gates: how many, on which storage, with or without the balancer in
front (``tests/balancer.py``: haproxy, round-robin, health checks on ``/healthz``). Each
setup is started fresh, given ``cluster_decisions`` approvals (created through its API, not
measured; every dispatch acked), then loaded with as many signed approve decisions at the
target concurrency by ``bench.loadgen``, while its processes' CPU is read from /proc
(``bench.cpu``: every process tree the setup names as the gate's, the daemons' writer
processes included; the balancer apart; the load generator apart) and each gate's
``/metrics`` is scraped before and after (the mean batch size and write-lock hold time
when the gate exports ``hitl_gate_batch_jobs`` and ``hitl_gate_write_lock_seconds``; null
when it does not). ``cluster_rounds`` rounds run every setup in turn, the order reversed
every other round (interleaved pairs); each round's ratios are against that round's direct
SQLite gate and the section reports their median.

``SETUPS`` (``setups()``): ``sqlite-1`` (one SQLite gate reached directly: the baseline of
every ratio), ``sqlite-1-lb`` (the same behind the balancer: what its hop costs), and on
PostgreSQL (``bench.pgsetup``: a throwaway server the section starts itself, whose every
process's CPU is counted apart from the gates' and summed with it) ``pg-1`` (one gate
direct), ``pg-2-lb`` and ``pg-3-lb`` (two and three gates behind the balancer). A setup that
cannot run here (no haproxy, no PostgreSQL binaries, no psycopg) is listed under
``skipped``. Then the fail-over figures (``bench.failover``) on three PostgreSQL gates.
"""

from __future__ import annotations

import http.client
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench import cpu
from bench.common import API_TOKEN, Daemon, median, write_decisions
from bench.pgsetup import PgGates, Postgres, balancer_for, hostport
from tests.balancer import Balancer, haproxy

if TYPE_CHECKING:
    from bench.run import Bench

BASELINE = "sqlite-1"  # the setup every ratio is taken against
HISTOGRAMS = {  # what the section reads from each gate's /metrics, when it is exported
    "batch_jobs": "hitl_gate_batch_jobs",
    "write_lock_s": "hitl_gate_write_lock_seconds",
}


@dataclass
class Running:
    """A started setup: where decisions and creates go, whose CPU is the gate's, how to tell
    every dispatch was acked, and how to stop it (returns the gates' exit codes)."""

    decisions_url: str
    api_urls: list[str]  # each gate's API (creates go to the first; /metrics of each)
    gate_pids: list[int]  # roots of the process trees counted as the gate's CPU
    undelivered: Callable[[], int]  # outbox rows not acked yet, over the whole setup
    stop: Callable[[], list[int]]
    balancer_pid: int | None = None  # its CPU is reported apart
    db_pids: list[int] = field(default_factory=list)  # the database server's process trees
    daemons: list[Daemon] = field(default_factory=list)  # the gates (kill9 for fail-over)
    balancer: Balancer | None = None


class Setup(Protocol):
    """One way to run gates for this section."""

    name: str  # a row's key in the results, e.g. "sqlite-1", "sqlite-1-lb", "pg-3-lb"
    backend: str  # "sqlite" or "postgresql"
    gates: int
    balanced: bool

    def unavailable(self) -> str | None:
        """Why this setup cannot run here (a missing tool), or None."""
        ...

    def start(self, bench: Bench, directory: Path, relay_url: str) -> Running:
        """Start the gates (and the balancer) under ``directory``, dispatching to
        ``relay_url``; returns once they listen."""
        ...


@dataclass
class SqliteGate:
    """One gate on its own SQLite file, reached directly or through the balancer (a
    balancer in front of one gate: what the balancer's hop costs)."""

    balanced: bool = False
    backend: str = "sqlite"
    gates: int = 1
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = "sqlite-1-lb" if self.balanced else "sqlite-1"

    def unavailable(self) -> str | None:
        if self.balanced and haproxy() is None:
            return "haproxy is not installed (apt-get install haproxy)"
        return None

    def start(self, bench: Bench, directory: Path, relay_url: str) -> Running:
        from bench.run import _scalar

        db = directory / "gate.db"
        gate = bench.gate(directory, relay_url, db)
        balancer: Balancer | None = None
        if self.balanced:
            try:
                balancer = balancer_for([gate])
            except BaseException:
                gate.stop()
                raise

        def stop() -> list[int]:
            if balancer is not None:
                balancer.remove()
            return [gate.stop()]

        return Running(
            decisions_url=(
                balancer.url() + urllib.parse.urlsplit(gate.callback_url).path
                if balancer
                else gate.callback_url
            ),
            api_urls=[gate.api_url],
            gate_pids=[gate.pid],
            undelivered=lambda: int(
                _scalar(db, "SELECT count(*) FROM outbox WHERE delivered_at IS NULL")
            ),
            stop=stop,
            balancer_pid=balancer.pid if balancer else None,
            daemons=[gate],
            balancer=balancer,
        )


def setups(postgres: Postgres) -> list[Setup]:
    """Every setup of the section, the PostgreSQL ones on ``postgres``'s server."""
    return [
        SqliteGate(balanced=False),
        SqliteGate(balanced=True),
        PgGates(postgres, 1, balanced=False),
        PgGates(postgres, 2, balanced=True),
        PgGates(postgres, 3, balanced=True),
    ]


def scrape(api_url: str) -> str:
    """A gate's ``/metrics`` (Prometheus text)."""
    host, port = hostport(api_url)
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {API_TOKEN}"})
        resp = conn.getresponse()
        body = resp.read().decode("utf-8", "replace")
        if resp.status != 200:
            raise RuntimeError(f"/metrics answered {resp.status}: {body[:200]}")
        return body
    finally:
        conn.close()


def histogram(text: str, name: str) -> tuple[float, float] | None:
    """``(sum, count)`` of histogram ``name`` over all its series in a scrape; None when the
    gate does not export it."""
    totals = {"_sum": 0.0, "_count": 0.0}
    found = False
    for match in re.finditer(
        rf"^{re.escape(name)}(_sum|_count)(?:\{{[^}}]*\}})? (\S+)$", text, re.M
    ):
        totals[match.group(1)] += float(match.group(2))
        found = True
    return (totals["_sum"], totals["_count"]) if found else None


def histogram_means(before: list[str], after: list[str]) -> dict[str, float | None]:
    """Each of ``HISTOGRAMS``' mean over the load (after - before, summed over the gates);
    None when not exported or nothing was observed."""
    out: dict[str, float | None] = {}
    for key, name in HISTOGRAMS.items():
        pairs = [
            (histogram(a, name), histogram(b, name)) for a, b in zip(after, before, strict=True)
        ]
        if any(a is None or b is None for a, b in pairs):
            out[key] = None
            continue
        total = sum(a[0] - b[0] for a, b in pairs if a and b)
        count = sum(a[1] - b[1] for a, b in pairs if a and b)
        out[key] = total / count if count else None
    return out


def measure(bench: Bench, setup: Setup, directory: Path) -> dict[str, Any]:
    """Start ``setup``, give it its approvals, load it with decisions; its figures."""
    from bench.run import _progress

    p = bench.params
    count, concurrency = p.cluster_decisions, p.target_concurrency
    relay = bench.relay(directory, "capture")
    try:
        running = setup.start(bench, directory, relay.url)
        try:
            bench.create_approvals(running.api_urls[0], count, p.create_concurrency)
            envs = bench.wait_captured(relay, count)
            deadline = time.monotonic() + 300
            while running.undelivered():
                if time.monotonic() > deadline:
                    raise RuntimeError("dispatches still un-acked after 300 s")
                time.sleep(0.05)
            bodies = directory / "bodies.txt"
            write_decisions(bodies, envs)
            _progress(f"cluster: {setup.name} c={concurrency} n={count}")
            scrapes0 = [scrape(u) for u in running.api_urls]
            gate0 = cpu.snapshot(running.gate_pids)
            lb_pids = [running.balancer_pid] if running.balancer_pid else []
            lb0 = cpu.snapshot(lb_pids)
            db0 = cpu.snapshot(running.db_pids)
            load = bench.loadgen_decisions(running.decisions_url, bodies, concurrency)
            gate_used = cpu.used(gate0, cpu.snapshot(running.gate_pids))
            lb_used = cpu.used(lb0, cpu.snapshot(lb_pids))
            db_used = cpu.used(db0, cpu.snapshot(running.db_pids))
            means = histogram_means(scrapes0, [scrape(u) for u in running.api_urls])
        finally:
            exit_codes = running.stop()
    finally:
        relay.stop()
    ok = load["ok"]

    def per_decision(seconds: float) -> float | None:
        return seconds * 1000 / ok if ok else None

    lock_ms = None if means["write_lock_s"] is None else means["write_lock_s"] * 1000
    batch = means["batch_jobs"]
    return {
        "setup": setup.name,
        "backend": setup.backend,
        "gates": setup.gates,
        "balanced": setup.balanced,
        "decisions": count,
        "concurrency": concurrency,
        "load": load,
        "rps": load["rps"],
        "p50_ms": load["latency_ms"].get("p50"),
        "p99_ms": load["latency_ms"].get("p99"),
        "gate_cpu_s": gate_used.seconds,
        "gate_cpu_ms_per_decision": per_decision(gate_used.seconds),
        "gate_processes": gate_used.processes,
        "gate_processes_gone": list(gate_used.gone),
        # the database server's processes (PostgreSQL: every backend; None on SQLite)
        "db_cpu_ms_per_decision": per_decision(db_used.seconds) if running.db_pids else None,
        "db_processes": db_used.processes,
        # gates + database server: what the issue sums (the balancer and client apart)
        "cpu_ms_per_decision": per_decision(gate_used.seconds + db_used.seconds),
        "balancer_cpu_ms_per_decision": per_decision(lb_used.seconds) if lb_pids else None,
        "loadgen_cpu_ms_per_decision": load.get("client_cpu_ms"),
        "batch_jobs_mean": batch,
        "write_lock_ms_mean": lock_ms,
        # jobs/s if batches of the mean size held the lock back to back: the serial ceiling
        "lock_ceiling_per_s": batch / lock_ms * 1000 if batch and lock_ms else None,
        "exit_codes": exit_codes,
        "all_ok": ok == count and all(code == 0 for code in exit_codes),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


PG_BASE = "pg-1"  # the setup N gates on PostgreSQL are also compared with


def run(bench: Bench, chosen: list[Setup] | None = None) -> dict[str, Any]:
    """Every setup (``chosen``, default ``setups()``), ``cluster_rounds`` times interleaved,
    then the fail-over figures; the PostgreSQL server is removed at the end."""
    postgres = Postgres()
    try:
        return _run(bench, setups(postgres) if chosen is None else chosen, postgres)
    finally:
        postgres.remove()


def _run(bench: Bench, chosen: list[Setup], postgres: Postgres) -> dict[str, Any]:
    """Per setup its rounds, the medians, the median of its per-round ratios to the direct
    SQLite gate (and to one PostgreSQL gate), then ``bench.failover``'s figures."""
    from bench import failover

    skipped = {s.name: why for s in chosen if (why := s.unavailable()) is not None}
    ready = [s for s in chosen if s.name not in skipped]
    if BASELINE not in [s.name for s in ready]:
        raise RuntimeError(f"the {BASELINE} setup (every ratio's baseline) cannot run")
    rounds: list[dict[str, dict[str, Any]]] = []
    for n in range(bench.params.cluster_rounds):
        order = ready if n % 2 == 0 else ready[::-1]
        rounds.append(
            {s.name: measure(bench, s, bench.tmp / "cluster" / f"r{n}-{s.name}") for s in order}
        )
    rows = [_row(s, rounds) for s in ready]
    why_not = postgres.unavailable() or (None if haproxy() else "haproxy is not installed")
    fail_over: dict[str, Any] = {"skipped": why_not} if why_not else {}
    if not why_not:
        try:
            fail_over = failover.run(bench, postgres)
        except Exception as exc:  # noqa: BLE001 - the rows above stand; the error is shown
            fail_over = {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "baseline": BASELINE,
        "concurrency": bench.params.target_concurrency,
        "decisions": bench.params.cluster_decisions,
        "rounds": bench.params.cluster_rounds,
        "setups": rows,
        "skipped": skipped,
        "failover": fail_over,
        "all_ok": all(row["all_ok"] for row in rows) and "error" not in fail_over,
    }


MEDIANS = (
    "rps",
    "p50_ms",
    "p99_ms",
    "gate_cpu_ms_per_decision",
    "db_cpu_ms_per_decision",
    "cpu_ms_per_decision",
    "balancer_cpu_ms_per_decision",
    "loadgen_cpu_ms_per_decision",
    "batch_jobs_mean",
    "write_lock_ms_mean",
    "lock_ceiling_per_s",
)


def _row(s: Setup, rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """One setup's line: the medians over its rounds (``MEDIANS``) and of its per-round
    ratios to ``BASELINE`` (and, for PostgreSQL, decisions/s to ``PG_BASE``)."""
    runs = [r[s.name] for r in rounds]

    def mid(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return median(values) if values else None

    def paired(key: str, base: str = BASELINE) -> float | None:
        values = [x for r in rounds if base in r and (x := _ratio(r[s.name][key], r[base][key]))]
        return median(values) if values else None

    return {
        "setup": s.name,
        "backend": s.backend,
        "gates": s.gates,
        "balanced": s.balanced,
        **{key: mid(key) for key in MEDIANS},
        "ratio_rps": paired("rps"),
        "ratio_p99": paired("p99_ms"),
        "ratio_cpu_per_decision": paired("cpu_ms_per_decision"),
        "ratio_rps_to_pg1": paired("rps", PG_BASE) if s.backend == "postgresql" else None,
        "all_ok": all(r["all_ok"] for r in runs),
        "rounds": runs,
    }
