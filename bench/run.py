"""Run the hitl-gate benchmarks, print a table, write the figures as JSON.

    python -m bench.run                      # full run -> bench/results.json
    python -m bench.run --quick              # tiny sizes (a harness check) -> a temp file
    python -m bench.run --only decisions,idle --out /tmp/r.json
    python -m bench.run --only decisions --profile /tmp/prof   # py-spy on the c=64 gate run

Sections: decisions, roundtrip, scale, audit, idle, followups, cluster (see bench/README.md).
Only a full run (no --quick, no --only) in which every section ran writes bench/results.json;
any other run writes to --out or to a file in the temp directory. Exit 0 when every section
ran (targets met or not), 1 when a section failed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import hashlib
import importlib.metadata
import json
import math
import os
import platform
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import dbgen, signed
from bench.common import (
    API_TOKEN,
    CLK_TCK,
    IDENTITIES,
    PIPELINE,
    PYTHON,
    RECEIPT_ENV,
    RECEIPT_KEY,
    ROOT,
    SECRET_ENV,
    SIGNED_STEP,
    STEP,
    TOKEN_ENV,
    Daemon,
    Helper,
    HttpClient,
    bench_env,
    context_switches,
    cpu_seconds,
    decision_bytes,
    draft_body,
    hwm_mb,
    median,
    rss_mb,
    run_json,
    threads,
    write_config,
    write_decisions,
)
from gate.daemon.cluster import LEASE_TTL_S

SECTIONS = ("decisions", "roundtrip", "scale", "audit", "idle", "followups", "cluster")
RESULTS_PATH = ROOT / "bench" / "results.json"
HOUR_MS = 3_600_000


@dataclass
class Params:
    """Sizes of one run."""

    levels: list[tuple[int, int]]  # (concurrency, decisions) for the decisions section
    create_concurrency: int = 32
    roundtrip_count: int = 3000
    roundtrip_concurrency: int = 64
    scale_pending: int = 100_000
    scale_expiring: int = 10_000
    scale_page_ref: int = 50  # the "one page" reference database for first-page latency
    scale_starts: int = 3
    page_repeats: int = 30
    settle_s: float = 1.0
    audit_entries: int = 1_000_000
    idle_s: float = 60.0
    idle_approvals: int = 5
    target_concurrency: int = 64
    cluster_decisions: int = 3000  # per setup and round (bench.cluster)
    cluster_rounds: int = 3


FULL = Params(levels=[(1, 300), (16, 1500), (64, 3000), (256, 3000)], roundtrip_count=2000)
QUICK = Params(
    levels=[(1, 20), (16, 64), (64, 128), (256, 256)],
    create_concurrency=16,
    roundtrip_count=128,
    scale_pending=2000,
    scale_expiring=200,
    scale_starts=1,
    page_repeats=5,
    settle_s=0.3,
    audit_entries=4000,
    idle_s=3.0,
    idle_approvals=3,
    cluster_decisions=128,
    cluster_rounds=1,
)


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _progress(message: str) -> None:
    sys.stderr.write(f"[bench {time.strftime('%H:%M:%S')}] {message}\n")
    sys.stderr.flush()


def _per_answer(cpu_s: float, load: dict[str, Any]) -> float | None:
    """CPU milliseconds the server (and its children) spent per answered request during a
    load (``cpu_s`` from /proc, 10 ms ticks: a rough figure), or None when none was
    answered."""
    return cpu_s * 1000 / load["ok"] if load.get("ok") else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _ro(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)


def _scalar(db: Path, sql: str, args: tuple[Any, ...] = ()) -> Any:
    conn = _ro(db)
    try:
        return conn.execute(sql, args).fetchone()[0]
    finally:
        conn.close()


@dataclass
class Bench:
    """One benchmark run: parameters, a scratch directory, shared helper processes."""

    params: Params
    tmp: Path
    quick: bool
    profile_dir: Path | None = None
    baselines: dict[int, dict[str, Any]] = field(default_factory=dict)
    baseline_proc: Helper | None = None

    # ---- shared pieces -------------------------------------------------------------------

    def baseline(self) -> Helper:
        """The bare aiohttp HMAC endpoint, started once per run."""
        if self.baseline_proc is None:
            self.baseline_proc = Helper(
                ["-m", "bench.baseline", "--secret-env", SECRET_ENV], self.tmp / "baseline.log"
            ).start()
        return self.baseline_proc

    def loadgen_decisions(
        self, url: str, bodies: Path, concurrency: int, on_start: Callable[[], None] | None = None
    ) -> dict[str, Any]:
        """Run ``bench.loadgen decisions`` as its own process and return its figures."""
        args = [
            "-m",
            "bench.loadgen",
            "decisions",
            "--url",
            url,
            "--bodies",
            str(bodies),
            "--concurrency",
            str(concurrency),
            "--secret-env",
            SECRET_ENV,
        ]
        if on_start is None:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = run_json(args, timeout=1800, log_path=self.tmp / "loadgen.log")
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            # the load generator's own CPU per answer (with its start-up and signing: high)
            out["client_cpu_ms"] = _per_answer(
                after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, out
            )
            return out
        proc = subprocess.Popen(
            [PYTHON, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=bench_env(),
            cwd=ROOT,
        )
        on_start()
        out, err = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"loadgen exited {proc.returncode}: {err.decode()[-3000:]}")
        return json.loads(out)

    def baseline_for(self, concurrency: int, count: int) -> dict[str, Any]:
        """The baseline's figures at ``concurrency`` (measured now with synthetic bodies unless
        this run measured it already)."""
        if concurrency not in self.baselines:
            path = self.tmp / f"baseline-bodies-c{concurrency}.txt"
            lines = [
                decision_bytes(
                    f"01BENCH{i:019d}",
                    f"{i:032x}",
                    "sha256:" + "0" * 64,
                    IDENTITIES[i % len(IDENTITIES)],
                )
                for i in range(count)
            ]
            path.write_bytes(b"\n".join(lines) + b"\n")
            self.baselines[concurrency] = self.loadgen_decisions(
                self.baseline().url, path, concurrency
            )
        return self.baselines[concurrency]

    def gate(
        self, directory: Path, relay_url: str, db: Path, wrapper: list[str] | None = None
    ) -> Daemon:
        """A started daemon with a fresh config in ``directory``."""
        directory.mkdir(parents=True, exist_ok=True)
        daemon = Daemon(
            write_config(directory, relay_url, db), directory / "gate.log", wrapper=wrapper
        )
        daemon.start()
        return daemon

    def relay(self, directory: Path, mode: str) -> Helper:
        """A started ``bench.relay`` (capture or auto)."""
        directory.mkdir(parents=True, exist_ok=True)
        args = ["-m", "bench.relay", mode]
        if mode == "auto":
            args += ["--secret-env", SECRET_ENV]
        return Helper(args, directory / f"relay-{mode}.log").start()

    @staticmethod
    def relay_get(relay: Helper, path: str) -> Any:
        """GET a control path of a ``bench.relay``."""
        base = relay.url.rsplit("/", 1)[0]
        client = HttpClient(base)
        try:
            status, body, _ = client.request("GET", path)
        finally:
            client.close()
        if status != 200:
            raise RuntimeError(f"relay {path} answered {status}")
        return body

    def wait_captured(self, relay: Helper, count: int, timeout: float = 900) -> list[dict]:
        """Wait until the capture relay holds ``count`` dispatches; return them (dispatch order)."""
        deadline = time.monotonic() + timeout
        while self.relay_get(relay, "/stats")["captured"] < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"relay captured fewer than {count} dispatches in {timeout} s")
            time.sleep(0.1)
        return list(self.relay_get(relay, "/captured"))

    @staticmethod
    def wait_delivered(db: Path, timeout: float = 300) -> None:
        """Wait until every outbox row is acked (the gate's dispatch writes are done)."""
        deadline = time.monotonic() + timeout
        while _scalar(db, "SELECT count(*) FROM outbox WHERE delivered_at IS NULL"):
            if time.monotonic() > deadline:
                raise RuntimeError("dispatches still un-acked")
            time.sleep(0.05)

    @staticmethod
    def create_approvals(
        api_url: str, count: int, concurrency: int, step: str = STEP
    ) -> dict[str, Any]:
        """Create ``count`` approvals through the API (not a measured figure, reported as info)."""

        async def go() -> float:
            headers = {"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"}
            next_i = 0
            failures: list[str] = []
            async with aiohttp.ClientSession(trust_env=False) as session:

                async def worker() -> None:
                    nonlocal next_i
                    while next_i < count and not failures:
                        i = next_i
                        next_i += 1
                        body = json.dumps(
                            {
                                "pipeline": PIPELINE,
                                "step": step,
                                "run_id": f"bench-{step}-{i}",
                                "draft": {"content_type": "text/plain", "body": draft_body(i)},
                            },
                            ensure_ascii=False,
                        ).encode("utf-8")
                        async with session.post(
                            api_url + "/v1/approvals", data=body, headers=headers
                        ) as resp:
                            answer = await resp.read()
                            if resp.status != 201:
                                failures.append(f"{resp.status} {answer[:300]!r}")

                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
                elapsed = time.perf_counter() - t0
            if failures:
                raise RuntimeError(f"create failed: {failures[0]}")
            return elapsed

        elapsed = asyncio.run(go())
        return {
            "count": count,
            "concurrency": concurrency,
            "seconds": elapsed,
            "per_s": count / elapsed if elapsed else 0.0,
        }

    # ---- sections ------------------------------------------------------------------------

    def decisions(self) -> dict[str, Any]:
        """Pre-create approvals, then post signed decisions at each concurrency level, against
        the gate and against the baseline endpoint with the same bodies and the same client."""
        p = self.params
        d = self.tmp / "decisions"
        relay = self.relay(d, "capture")
        baseline = self.baseline()
        db = d / "gate.db"
        gate = self.gate(d, relay.url, db)
        out: dict[str, Any] = {"levels": []}
        try:
            total = sum(n for _, n in p.levels)
            _progress(f"decisions: creating {total} approvals")
            out["create"] = self.create_approvals(gate.api_url, total, p.create_concurrency)
            captured = self.wait_captured(relay, total)
            # the signed rows' approvals on the step that requires signatures,
            # created after the others so they are the last dispatches captured
            keys = signed.Keys()
            signed.enrol(gate.api_url, keys)
            signed_total = sum(n for c, n in p.levels if c in signed.SIGNED_LEVELS)
            self.create_approvals(gate.api_url, signed_total, p.create_concurrency, SIGNED_STEP)
            signed_pool = iter(self.wait_captured(relay, total + signed_total)[total:])
            self.wait_delivered(db)
            time.sleep(0.5)
            pool = iter(captured)
            for concurrency, count in p.levels:
                envs = [next(pool) for _ in range(count)]
                bodies = d / f"bodies-c{concurrency}.txt"
                write_decisions(bodies, envs)
                _progress(f"decisions: c={concurrency} n={count} baseline")
                cpu0 = cpu_seconds(baseline.pid)
                base = self.loadgen_decisions(baseline.url, bodies, concurrency)
                base["server_cpu_ms"] = _per_answer(cpu_seconds(baseline.pid) - cpu0, base)
                self.baselines[concurrency] = base
                _progress(f"decisions: c={concurrency} n={count} gate")
                profiled = self.profile_dir is not None and concurrency == p.target_concurrency
                cpu0 = cpu_seconds(gate.pid)
                if profiled:
                    res, out["profile"] = self.profiled_load(gate, bodies, concurrency)
                else:
                    res = self.loadgen_decisions(gate.callback_url, bodies, concurrency)
                res["server_cpu_ms"] = _per_answer(cpu_seconds(gate.pid) - cpu0, res)
                if concurrency in signed.SIGNED_LEVELS:
                    out.setdefault("signed", []).append(
                        self.signed_level(gate, d, keys, signed_pool, concurrency, count, res)
                    )
                out["levels"].append(
                    {
                        "concurrency": concurrency,
                        "decisions": count,
                        "profiled": profiled,
                        "gate": res,
                        "baseline": base,
                        "ratio_rps": _ratio(res["rps"], base["rps"]),
                        "ratio_p99": _ratio(
                            res["latency_ms"].get("p99"), base["latency_ms"].get("p99")
                        ),
                    }
                )
        finally:
            out["gate_exit_code"] = gate.stop()
            relay.stop()
        out["approved_in_db"] = _scalar(
            db, "SELECT count(*) FROM approvals WHERE outcome = 'approved'"
        )
        out["all_ok"] = all(
            lv["gate"]["ok"] == lv["decisions"] and lv["baseline"]["ok"] == lv["decisions"]
            for lv in out["levels"]
        ) and all(lv["gate"]["ok"] == lv["decisions"] for lv in out.get("signed", []))
        return out

    def signed_level(
        self,
        gate: Daemon,
        d: Path,
        keys: signed.Keys,
        pool: Iterator[dict[str, Any]],
        concurrency: int,
        count: int,
        unsigned: dict[str, Any],
    ) -> dict[str, Any]:
        """One ``decisions signed`` row: ``count`` approves, each with an Ed25519
        ``approver_assertion``, on the step that requires them, at ``concurrency``; with its
        ratio to the ``unsigned`` row measured just before on the same daemon."""
        envs = [next(pool) for _ in range(count)]
        bodies = d / f"bodies-signed-c{concurrency}.txt"
        bodies.write_bytes(
            b"\n".join(
                keys.decision(e, IDENTITIES[i % len(IDENTITIES)]) for i, e in enumerate(envs)
            )
            + b"\n"
        )
        _progress(f"decisions: c={concurrency} n={count} gate, signed")
        cpu0 = cpu_seconds(gate.pid)
        res = self.loadgen_decisions(gate.callback_url, bodies, concurrency)
        res["server_cpu_ms"] = _per_answer(cpu_seconds(gate.pid) - cpu0, res)
        return {
            "concurrency": concurrency,
            "decisions": count,
            "gate": res,
            "ratio_rps_to_unsigned": _ratio(res["rps"], unsigned["rps"]),
            "ratio_p99_to_unsigned": _ratio(
                res["latency_ms"].get("p99"), unsigned["latency_ms"].get("p99")
            ),
        }

    def profiled_load(
        self, gate: Daemon, bodies: Path, concurrency: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run one decisions load against ``gate`` while py-spy records it (folded stacks)."""
        from bench.hotspots import summarise

        assert self.profile_dir is not None
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        folded = self.profile_dir / f"decisions-c{concurrency}.folded"
        spy_log = self.profile_dir / "py-spy.log"
        spy: list[subprocess.Popen[bytes]] = []

        def start() -> None:
            with open(spy_log, "ab") as log:
                spy.append(
                    subprocess.Popen(
                        [
                            py_spy(),
                            "record",
                            "--pid",
                            str(gate.pid),
                            "--rate",
                            "250",
                            "--threads",
                            *SPY_MODE,
                            "--format",
                            "raw",
                            "--output",
                            str(folded),
                        ],
                        stdout=log,
                        stderr=log,
                    )
                )
            time.sleep(0.5)  # attached before the load starts (the loadgen warms up first)

        try:
            res = self.loadgen_decisions(gate.callback_url, bodies, concurrency, on_start=start)
        finally:
            for proc in spy:
                proc.send_signal(signal.SIGINT)
                proc.wait(60)
        if not folded.exists():
            return res, {"tool": "py-spy", "error": spy_log.read_text(errors="replace")[-2000:]}
        return res, {"tool": "py-spy --native", "file": str(folded), **summarise(folded)}

    def roundtrip(self) -> dict[str, Any]:
        """create → dispatch to a relay that approves at once → decision → long-poll woken."""
        p = self.params
        d = self.tmp / "roundtrip"
        relay = self.relay(d, "auto")
        gate = self.gate(d, relay.url, d / "gate.db")
        try:
            _progress(f"roundtrip: n={p.roundtrip_count} c={p.roundtrip_concurrency}")
            res = run_json(
                [
                    "-m",
                    "bench.loadgen",
                    "roundtrip",
                    "--api",
                    gate.api_url,
                    "--token-env",
                    TOKEN_ENV,
                    "--count",
                    str(p.roundtrip_count),
                    "--concurrency",
                    str(p.roundtrip_concurrency),
                    "--pipeline",
                    PIPELINE,
                    "--step",
                    STEP,
                ],
                timeout=1800,
                log_path=self.tmp / "loadgen.log",
            )
            relay_stats = self.relay_get(relay, "/stats")
        finally:
            rc = gate.stop()
            relay.stop()
        count = dict(p.levels).get(p.roundtrip_concurrency, p.roundtrip_count)
        base = self.baseline_for(p.roundtrip_concurrency, count)
        return {
            "concurrency": p.roundtrip_concurrency,
            "gate": res,
            "relay": relay_stats,
            "baseline": base,
            "ratio_rps_vs_baseline": _ratio(res["rps"], base["rps"]),
            "all_ok": res["ok"] == p.roundtrip_count,
            "gate_exit_code": rc,
        }

    def _starts(self, label: str, db: Path, relay: Helper, expect_items: int) -> dict[str, Any]:
        p = self.params
        runs = []
        for n in range(p.scale_starts):
            d = self.tmp / "scale" / f"{label}-{n}"
            gate = self.gate(d, relay.url, db)
            client = HttpClient(gate.api_url, API_TOKEN)
            try:
                status, page, cold = client.request("GET", "/v1/approvals?state=pending")
                if status != 200:
                    raise RuntimeError(f"first page answered {status}: {page}")
                time.sleep(p.settle_s)
                rss = rss_mb(gate.pid)
                warm = []
                for _ in range(p.page_repeats):
                    status, _, seconds = client.request("GET", "/v1/approvals?state=pending")
                    warm.append(seconds)
            finally:
                client.close()
                rc = gate.stop()
            runs.append(
                {
                    "start_s": gate.start_s,
                    "rss_mb": rss,
                    "page_cold_ms": cold * 1000,
                    "page_warm_ms": median(warm) * 1000,
                    "page_warm_max_ms": max(warm) * 1000,
                    "items": len(page["items"]),
                    "exit_code": rc,
                }
            )
        return {
            "start_s": median([r["start_s"] for r in runs]),
            "rss_mb": median([r["rss_mb"] for r in runs]),
            "page_cold_ms": median([r["page_cold_ms"] for r in runs]),
            "page_warm_ms": median([r["page_warm_ms"] for r in runs]),
            "items": runs[0]["items"],
            "items_expected": expect_items,
            "runs": runs,
        }

    def scale(self) -> dict[str, Any]:
        """Start time, RSS and first-page latency on an empty, a one-page and a large database;
        then the time to resolve ``scale_expiring`` approvals that expire in the same second."""
        p = self.params
        d = self.tmp / "scale"
        d.mkdir(parents=True, exist_ok=True)
        key = RECEIPT_KEY.encode("utf-8")
        relay = self.relay(d, "capture")
        out: dict[str, Any] = {"pending": p.scale_pending, "expiring": p.scale_expiring}
        try:
            now = int(time.time() * 1000)

            def recent(span_ms: int, n: int) -> Callable[[int], int]:
                return lambda i: now - span_ms + (i * span_ms) // max(1, n)

            empty = d / "empty.db"
            dbgen.create_schema(empty)
            _progress("scale: empty database")
            out["empty"] = self._starts("empty", empty, relay, 0)

            page = d / "page.db"
            created = recent(HOUR_MS, p.scale_page_ref)
            dbgen.add_pending(
                page, p.scale_page_ref, created, lambda i: created(i) + 4 * HOUR_MS, key
            )
            _progress(f"scale: {p.scale_page_ref} pending (one page)")
            out["one_page"] = self._starts("one_page", page, relay, min(50, p.scale_page_ref))

            n_base = p.scale_pending - p.scale_expiring
            base = d / "base.db"
            _progress(f"scale: building {p.scale_pending} pending")
            t0 = time.perf_counter()
            created = recent(int(3.5 * HOUR_MS), n_base)
            dbgen.add_pending(base, n_base, created, lambda i: created(i) + 4 * HOUR_MS, key)
            large = d / "large.db"
            shutil.copyfile(base, large)
            late = recent(5 * 60_000, p.scale_expiring)
            dbgen.add_pending(
                large,
                p.scale_expiring,
                late,
                lambda i: late(i) + 4 * HOUR_MS,
                key,
                first_index=n_base,
            )
            out["build_s"] = time.perf_counter() - t0
            out["db_mb"] = large.stat().st_size / 2**20
            _progress("scale: large database")
            out["large"] = self._starts("large", large, relay, 50)
            per_approval_s = out["build_s"] / max(1, p.scale_pending)
            out["expiry"] = self._expiry(base, relay, out["large"]["start_s"], per_approval_s)
            out["dispatches_received"] = self.relay_get(relay, "/stats").get("dispatches", 0)
        finally:
            relay.stop()
        return out

    def _expiry(
        self, base: Path, relay: Helper, start_s: float, per_approval_s: float
    ) -> dict[str, Any]:
        p = self.params
        d = self.tmp / "scale"
        db = d / "expiry.db"
        shutil.copyfile(base, db)
        # the deadline second must come after the build and the daemon's start
        lead_s = 2.0 + 2 * start_s + 2 * per_approval_s * p.scale_expiring
        second_ms = (int(time.time() + lead_s) + 1) * 1000
        n_base = p.scale_pending - p.scale_expiring
        # created 4 h (the step timeout) before it expires; deadlines spread over one second
        dbgen.add_pending(
            db,
            p.scale_expiring,
            lambda i: second_ms + (i % 1000) - 4 * HOUR_MS,
            lambda i: second_ms + (i % 1000),
            RECEIPT_KEY.encode("utf-8"),
            first_index=n_base,
        )
        last_deadline_ms = second_ms + 999
        if time.time() * 1000 > second_ms - 500:
            raise RuntimeError("building the expiry database took longer than the lead time")
        _progress(
            f"scale: {p.scale_expiring} approvals expire at "
            f"{dt.datetime.fromtimestamp(second_ms / 1000, dt.UTC):%H:%M:%S}"
        )
        gate = self.gate(d / "expiry", relay.url, db)
        first = done = None
        try:
            delay = second_ms / 1000 - time.time() - 0.05
            if delay < 0:
                raise RuntimeError("the gate started after the approvals' expiry second")
            time.sleep(delay)
            conn = _ro(db)
            try:
                deadline = time.monotonic() + 600
                while True:
                    left = conn.execute(
                        "SELECT count(*) FROM approvals WHERE state = 'pending' AND"
                        " expires_at <= ?",
                        (last_deadline_ms,),
                    ).fetchone()[0]
                    now = time.time()
                    if first is None and left < p.scale_expiring:
                        first = now
                    if left == 0:
                        done = now
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{left} expiries still pending after 600 s")
                    time.sleep(0.005)
            finally:
                conn.close()
        finally:
            rc = gate.stop()
        assert first is not None and done is not None
        timeouts = _scalar(db, "SELECT count(*) FROM approvals WHERE outcome = 'timeout'")
        verify = subprocess.run(
            [PYTHON, "-m", "gate", "audit", "verify", "-c", str(gate.config)],
            capture_output=True,
            env=bench_env(),
            cwd=ROOT,
            timeout=600,
            check=False,
        )
        resolved_within = done - second_ms / 1000
        return {
            "count": p.scale_expiring,
            "timeouts_in_db": timeouts,
            "first_resolved_after_s": first - second_ms / 1000,
            "resolved_within_s": resolved_within,
            "after_last_deadline_s": done - last_deadline_ms / 1000,
            "per_s": p.scale_expiring / resolved_within if resolved_within > 0 else None,
            "gate_start_s": gate.start_s,
            "gate_exit_code": rc,
            "audit_verify_ok": verify.returncode == 0,
            "audit_verify_output": verify.stdout.decode("utf-8", "replace").strip()[-300:],
        }

    def audit(self) -> dict[str, Any]:
        """``hitl-gate audit verify`` over N entries vs a bare hashlib/hmac loop over them."""
        p = self.params
        d = self.tmp / "audit"
        d.mkdir(parents=True, exist_ok=True)
        db = d / "audit.db"
        _progress(f"audit: generating {p.audit_entries} entries")
        t0 = time.perf_counter()
        dbgen.audit_only(
            db,
            p.audit_entries,
            RECEIPT_KEY.encode("utf-8"),
            int(time.time() * 1000) - p.audit_entries * 7,
        )
        gen_s = time.perf_counter() - t0
        config = write_config(d, "http://127.0.0.1:9/relay", db)
        empty = d / "empty"
        empty.mkdir()
        dbgen.create_schema(empty / "audit.db")
        empty_config = write_config(empty, "http://127.0.0.1:9/relay", empty / "audit.db")
        _progress("audit: hitl-gate audit verify")
        # the target compares the chain (--no-records, on the log alone, as in earlier
        # runs) with the baseline's work over the same entries; then the rows the log
        # describes are added and the default run (chain + records check) is timed too
        fixed = self._timed_cli(["audit", "verify", "-c", str(empty_config), "--no-records"])
        run = self._timed_cli(["audit", "verify", "-c", str(config), "--no-records"])
        _progress("audit: baseline loop")
        base = run_json(["-m", "bench.auditbase", str(db), "--key-env", RECEIPT_ENV], timeout=3600)
        _progress("audit: adding the approval rows; hitl-gate audit verify with records")
        dbgen.add_audit_records(db)
        full = self._timed_cli(["audit", "verify", "-c", str(config)])
        eps = p.audit_entries / run["wall_s"] if run["wall_s"] else None
        return {
            "entries": p.audit_entries,
            "generate_s": gen_s,
            "db_mb": db.stat().st_size / 2**20,
            "verify": {**run, "entries_per_s": eps},
            "verify_empty_db": fixed,
            "verify_with_records": {
                **full,
                "entries_per_s": p.audit_entries / full["wall_s"] if full["wall_s"] else None,
            },
            "baseline": base,
            "ratio": _ratio(eps, base["entries_per_s"]),
            "all_ok": run["exit_code"] == 0
            and full["exit_code"] == 0
            and base["ok"]
            and f"ok: {p.audit_entries} entries" in run["stdout"]
            and "approvals match the audit log" in full["stdout"],
        }

    @staticmethod
    def _timed_cli(args: list[str]) -> dict[str, Any]:
        """Run ``python -m gate ARGS``; wall time, exit code, stdout and the child's rusage."""
        with tempfile.TemporaryFile() as err_file:
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                [PYTHON, "-m", "gate", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err_file,
                env=bench_env(),
                cwd=ROOT,
            )
            assert proc.stdout is not None
            out = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)  # rusage of this child alone
            wall = time.perf_counter() - t0
            proc.returncode = os.waitstatus_to_exitcode(status)
            proc.stdout.close()
            err_file.seek(0)
            err = err_file.read()
        return {
            "wall_s": wall,
            "exit_code": proc.returncode,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024,
            "stdout": out.decode("utf-8", "replace").strip()[-500:],
            "stderr": err.decode("utf-8", "replace").strip()[-500:],
        }

    def idle(self) -> dict[str, Any]:
        """CPU, context switches and RSS of a daemon with a few pending approvals and nothing
        to do, sampled from /proc over ``idle_s`` seconds."""
        p = self.params
        d = self.tmp / "idle"
        relay = self.relay(d, "capture")
        db = d / "gate.db"
        gate = self.gate(d, relay.url, db)
        try:
            self.create_approvals(gate.api_url, p.idle_approvals, 1)
            self.wait_captured(relay, p.idle_approvals)
            self.wait_delivered(db)
            time.sleep(p.settle_s)
            _progress(f"idle: sampling for {p.idle_s:g} s")
            pid = gate.pid
            cpu0, ctx0, t0 = cpu_seconds(pid), context_switches(pid), time.monotonic()
            rss0 = rss_mb(pid)
            samples = [rss0]
            while time.monotonic() - t0 < p.idle_s:
                time.sleep(min(1.0, max(0.0, p.idle_s - (time.monotonic() - t0))))
                samples.append(rss_mb(pid))
            elapsed = time.monotonic() - t0
            cpu1, ctx1 = cpu_seconds(pid), context_switches(pid)
            n_threads = threads(pid)
            peak = hwm_mb(pid)
        finally:
            rc = gate.stop()
            relay.stop()
        cpu = cpu1 - cpu0
        return {
            "duration_s": elapsed,
            "cpu_s": cpu,
            "cpu_percent": cpu / elapsed * 100,
            "clock_tick_s": 1 / CLK_TCK,
            "context_switches": ctx1 - ctx0,
            "wakeups_per_s": (ctx1 - ctx0) / elapsed,
            "rss_mb_start": rss0,
            "rss_mb_end": samples[-1],
            "rss_mb_max": max(samples),
            "vm_hwm_mb": peak,
            "threads": n_threads,
            "gate_exit_code": rc,
        }

    def followups(self) -> dict[str, Any]:
        """Start time and idle CPU with ``scale_pending`` approvals with reminders and
        escalation levels against the same without (``bench.followups``)."""
        from bench import followups

        return followups.run(self)

    def cluster(self) -> dict[str, Any]:
        """Decisions/s, p99 and CPU per decision of each gate setup at the target concurrency,
        against one SQLite gate measured directly in the same run (``bench.cluster``)."""
        from bench import cluster

        return cluster.run(self)

    def close(self) -> None:
        """Stop the shared helper processes."""
        if self.baseline_proc is not None:
            self.baseline_proc.stop()


# ---- targets, table, machine ----------------------------------------------------------------

SPY_MODE = os.environ.get("HITL_BENCH_SPY", "--native").split()


def py_spy() -> str:
    """The py-spy executable: beside this Python (the venv), else on PATH, else ""."""
    local = Path(PYTHON).parent / "py-spy"
    return str(local) if local.exists() else (shutil.which("py-spy") or "")


def _get(obj: Any, *path: Any) -> Any:
    for key in path:
        if obj is None:
            return None
        if isinstance(key, int) and isinstance(obj, list):
            obj = obj[key] if -len(obj) <= key < len(obj) else None
        elif isinstance(obj, dict):
            obj = obj.get(key)
        else:
            return None
    return obj


def _level(sections: dict[str, Any], concurrency: int) -> dict[str, Any] | None:
    for level in _get(sections, "decisions", "levels") or []:
        if level["concurrency"] == concurrency:
            return level
    return None


def evaluate_targets(sections: dict[str, Any], params: Params) -> list[dict[str, Any]]:
    """The issue's targets, each with its value, threshold and whether it is met (None: not
    measured in this run)."""
    c = params.target_concurrency
    lvl = _level(sections, c)
    idle = sections.get("idle")
    scale = sections.get("scale")
    dec_rps = _get(lvl, "gate", "rps")
    idle_cpu_ok = None
    if idle:
        idle_cpu_ok = idle["cpu_s"] <= max(0.001 * idle["duration_s"], idle["clock_tick_s"])

    def t(name: str, value: Any, op: str, threshold: float, note: str = "") -> dict[str, Any]:
        met = None
        if value is not None:
            met = value >= threshold if op == ">=" else value <= threshold
        return {
            "name": name,
            "value": value,
            "op": op,
            "threshold": threshold,
            "met": met,
            "note": note,
        }

    targets = [
        t(f"decisions/s gate ÷ baseline at c={c}", _get(lvl, "ratio_rps"), ">=", 0.5),
        t(f"p99 gate ÷ baseline at c={c}", _get(lvl, "ratio_p99"), "<=", 3.0),
        t(
            "round trips/s ÷ baseline req/s (c=64)",
            _get(sections, "roundtrip", "ratio_rps_vs_baseline"),
            ">=",
            0.2,
        ),
        t(
            "start time large ÷ empty db",
            _ratio(_get(scale, "large", "start_s"), _get(scale, "empty", "start_s")),
            "<=",
            1.5,
        ),
        t(
            "first page large ÷ one-page db",
            _ratio(_get(scale, "large", "page_warm_ms"), _get(scale, "one_page", "page_warm_ms")),
            "<=",
            1.5,
            "warm median; cold in the table",
        ),
        t("RSS after start, large db (MB)", _get(scale, "large", "rss_mb"), "<=", 150.0),
        t(
            f"expiries/s ÷ decisions/s (c={c})",
            _ratio(_get(scale, "expiry", "per_s"), dec_rps),
            ">=",
            1.0,
        ),
        t("audit verify ÷ bare hashlib/hmac", _get(sections, "audit", "ratio"), ">=", 0.3),
        {
            "name": "idle CPU ≈ 0 (%)",
            "value": _get(idle, "cpu_percent"),
            "op": "≈",
            "threshold": 0.0,
            "met": idle_cpu_ok,
            "note": "met when CPU ≤ max(0.1 %, one clock tick)",
        },
    ]
    return targets + _cluster_targets(sections.get("cluster"), t)


def _cluster_targets(
    cluster: dict[str, Any] | None, t: Callable[[str, Any, str, float], dict[str, Any]]
) -> list[dict[str, Any]]:
    """The ``cluster`` section's targets (``t`` makes one): PostgreSQL against the SQLite
    gate of the same run, three gates against one, p99, and the two fail-over times."""
    rows = {row["setup"]: row for row in (cluster or {}).get("setups", [])}
    fail = (cluster or {}).get("failover") or {}
    pg_p99 = [row["ratio_p99"] for row in rows.values() if row["backend"] == "postgresql"]
    pg_p99 = [x for x in pg_p99 if x is not None]
    return [
        t("cluster: 1 PostgreSQL gate ÷ SQLite gate, dec/s", _get(rows, "pg-1", "ratio_rps"),
          ">=", 0.4),
        t("cluster: 3 PostgreSQL gates ÷ 1, dec/s", _get(rows, "pg-3-lb", "ratio_rps_to_pg1"),
          ">=", 0.8),
        t("cluster: worst PostgreSQL p99 ÷ SQLite gate's", max(pg_p99) if pg_p99 else None,
          "<=", 3.0),
        t("cluster: kill -9 → next request 200 (s)", _get(fail, "requests", "first_ok_s"),
          "<=", 1.0),
        t("cluster: kill holder → next reminder (s)", _get(fail, "timers", "next_reminder_s"),
          "<=", LEASE_TTL_S + 1.0),
    ]  # fmt: skip


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def _table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)
    ]
    lines = [
        title,
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
        "  ".join("-" * w for w in widths),
    ]
    for row in cells:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(lines) + "\n"


def _signed_table(decisions: dict[str, Any]) -> str:
    """The ``decisions signed`` rows next to the unsigned rows of the same run."""
    unsigned = {lv["concurrency"]: lv["gate"] for lv in decisions["levels"]}
    rows = []
    for lv in decisions["signed"]:
        g, u = lv["gate"], unsigned.get(lv["concurrency"], {})
        rows.append(
            [
                lv["concurrency"],
                lv["decisions"],
                g["rps"],
                u.get("rps"),
                lv["ratio_rps_to_unsigned"],
                g["latency_ms"].get("p50"),
                g["latency_ms"].get("p99"),
                (u.get("latency_ms") or {}).get("p99"),
                lv["ratio_p99_to_unsigned"],
                g.get("server_cpu_ms"),
                u.get("server_cpu_ms"),
                f"{g['ok']}/{lv['decisions']}",
            ]
        )
    return _table(
        "decisions signed (each with an Ed25519 approver_assertion on a required step, "
        "ratio = signed ÷ unsigned, same run and daemon)",
        [
            "c",
            "n",
            "signed/s",
            "unsigned/s",
            "ratio",
            "s p50 ms",
            "s p99 ms",
            "u p99 ms",
            "p99 ratio",
            "s cpu ms",
            "u cpu ms",
            "ok",
        ],
        rows,
    )


def _cluster_table(cluster: dict[str, Any]) -> str:
    """The ``cluster`` rows: each setup's medians and its ratios to the direct SQLite gate,
    then the fail-over figures."""
    rows = [
        [
            row["setup"],
            row["gates"],
            row["rps"],
            row["p50_ms"],
            row["p99_ms"],
            row["gate_cpu_ms_per_decision"],
            row.get("db_cpu_ms_per_decision"),
            row.get("cpu_ms_per_decision"),
            row["balancer_cpu_ms_per_decision"],
            row["loadgen_cpu_ms_per_decision"],
            row["batch_jobs_mean"],
            row["write_lock_ms_mean"],
            row["ratio_rps"],
            row["ratio_p99"],
            row["ratio_cpu_per_decision"],
            row["all_ok"],
        ]
        for row in cluster["setups"]
    ]
    notes = "".join(f"skipped {name}: {why}\n" for name, why in cluster["skipped"].items())
    return (
        _table(
            f"cluster (c={cluster['concurrency']}, {cluster['decisions']:,} decisions per setup"
            f" and round, median of {cluster['rounds']} interleaved round(s); ratios against"
            f" {cluster['baseline']} of the same round; cpu ms per decision: gate processes,"
            " database server, their sum; balancer, load generator apart)",
            [
                "setup",
                "gates",
                "dec/s",
                "p50 ms",
                "p99 ms",
                "gate cpu",
                "db cpu",
                "sum cpu",
                "lb cpu",
                "client cpu",
                "batch",
                "lock ms",
                "rps ratio",
                "p99 ratio",
                "cpu ratio",
                "ok",
            ],
            rows,
        )
        + notes
        + _failover_lines(cluster.get("failover") or {})
    )


def _failover_lines(fail: dict[str, Any]) -> str:
    """The fail-over figures of the ``cluster`` section, one line each."""
    if "skipped" in fail or "error" in fail:
        return f"fail-over: {fail.get('skipped') or 'FAILED: ' + fail['error']}\n"
    if not fail:
        return ""
    req, tim = fail["requests"], fail["timers"]
    first = req["first_answer"] or {}
    return (
        f"fail-over, kill -9 of {req['killed']} of 3 behind the balancer: first 200 after"
        f" {_fmt(req['first_ok_s'], 3)} s (from {req['first_ok_gate']}); first request after"
        f" the kill answered {first.get('status')} by {first.get('gate')};"
        f" {req['not_ok_after_kill']} of {len(req['answers_after_kill'])} not 200;"
        f" marked down after {_fmt(req['marked_down_s'], 3)} s\n"
        f"fail-over, kill -9 of the lease holder {tim['killed']}: next reminder after"
        f" {_fmt(tim['next_reminder_s'], 3)} s (lease TTL {tim['lease_ttl_s']:g} s, reminders"
        " every 1 s)\n"
    )


def render(results: dict[str, Any]) -> str:
    """The human table of one results object."""
    s = results["sections"]
    out = [
        f"hitl-gate bench ({'quick' if results['quick'] else 'full'}) "
        f"{results['started_at']}  cpus={results['machine']['cpu_count']} "
        f"python={results['machine']['python']} commit={results['machine']['git_commit']}"
        f"{' (gate/ modified)' if results['machine']['git_dirty_gate'] else ''} "
        f"gate tree {results['machine']['gate_tree_sha256']}"
        f"{'  note: ' + results['note'] if results.get('note') else ''}\n"
    ]
    if "decisions" in s:
        rows = []
        for lv in s["decisions"]["levels"]:
            g, b = lv["gate"], lv["baseline"]
            rows.append(
                [
                    lv["concurrency"],
                    lv["decisions"],
                    g["rps"],
                    b["rps"],
                    lv["ratio_rps"],
                    g["latency_ms"].get("p50"),
                    b["latency_ms"].get("p50"),
                    g["latency_ms"].get("p99"),
                    b["latency_ms"].get("p99"),
                    lv["ratio_p99"],
                    g.get("server_cpu_ms"),
                    b.get("server_cpu_ms"),
                    f"{g['ok']}/{b['ok']}",
                ]
            )
        create = s["decisions"]["create"]
        out.append(
            _table(
                f"decisions (pre-created with {create['count']} creates at "
                f"{create['per_s']:.0f}/s, c={create['concurrency']})",
                [
                    "c",
                    "n",
                    "gate/s",
                    "base/s",
                    "ratio",
                    "g p50 ms",
                    "b p50 ms",
                    "g p99 ms",
                    "b p99 ms",
                    "p99 ratio",
                    "g cpu ms",
                    "b cpu ms",
                    "ok g/b",
                ],
                rows,
            )
        )
        if s["decisions"].get("signed"):
            out.append(_signed_table(s["decisions"]))
        if "profile" in s["decisions"]:
            prof = s["decisions"]["profile"]
            if "error" in prof:
                out.append(f"profile failed: {prof['error'][-300:]}\n")
            else:
                from bench.hotspots import render as render_profile

                out.append(
                    f"profile of the gate at c=64 ({prof['file']}):\n"
                    + render_profile(
                        {**prof, "self": prof["self"][:15], "inclusive": prof["inclusive"][:15]}
                    )
                )
    if "roundtrip" in s:
        r = s["roundtrip"]
        out.append(
            _table(
                "round trip (create → relay → decision → long-poll woken)",
                ["c", "n", "rt/s", "p50 ms", "p99 ms", "base req/s", "ratio", "ok"],
                [
                    [
                        r["concurrency"],
                        r["gate"]["requests"],
                        r["gate"]["rps"],
                        r["gate"]["latency_ms"].get("p50"),
                        r["gate"]["latency_ms"].get("p99"),
                        r["baseline"]["rps"],
                        r["ratio_rps_vs_baseline"],
                        r["gate"]["ok"],
                    ]
                ],
            )
        )
    if "scale" in s:
        sc = s["scale"]
        rows = [
            [
                name,
                sc[key]["items"],
                sc[key]["start_s"],
                sc[key]["rss_mb"],
                sc[key]["page_cold_ms"],
                sc[key]["page_warm_ms"],
            ]
            for name, key in (
                ("empty", "empty"),
                ("one page", "one_page"),
                (f"{sc['pending']:,} pending", "large"),
            )
        ]
        out.append(
            _table(
                f"scale (db {sc['db_mb']:.0f} MB, built in {sc['build_s']:.1f} s)",
                ["database", "page items", "start s", "RSS MB", "page cold ms", "page warm ms"],
                rows,
            )
        )
        e = sc["expiry"]
        out.append(
            _table(
                f"{e['count']:,} approvals expiring in the same second",
                [
                    "first after s",
                    "all within s",
                    "after last deadline s",
                    "per s",
                    "timeouts in db",
                    "audit ok",
                ],
                [
                    [
                        e["first_resolved_after_s"],
                        e["resolved_within_s"],
                        e["after_last_deadline_s"],
                        e["per_s"],
                        e["timeouts_in_db"],
                        e["audit_verify_ok"],
                    ]
                ],
            )
        )
    if "audit" in s:
        a = s["audit"]
        out.append(
            _table(
                f"audit verify over {a['entries']:,} entries (db {a['db_mb']:.0f} MB)",
                ["", "wall s", "entries/s", "max RSS MB", "ratio"],
                [
                    [
                        "audit verify --no-records (chain)",
                        a["verify"]["wall_s"],
                        a["verify"]["entries_per_s"],
                        a["verify"]["max_rss_mb"],
                        a["ratio"],
                    ],
                    [
                        "  same, empty db",
                        a["verify_empty_db"]["wall_s"],
                        None,
                        a["verify_empty_db"]["max_rss_mb"],
                        None,
                    ],
                    *[
                        [
                            "audit verify (chain + records)",
                            r["wall_s"],
                            r["entries_per_s"],
                            r["max_rss_mb"],
                            None,
                        ]
                        for r in [a.get("verify_with_records")]
                        if r
                    ],
                    [
                        "bare hashlib/hmac loop",
                        a["baseline"]["loop_s"],
                        a["baseline"]["entries_per_s"],
                        None,
                        None,
                    ],
                ],
            )
        )
    if "idle" in s:
        i = s["idle"]
        out.append(
            _table(
                f"idle daemon over {i['duration_s']:.0f} s",
                ["cpu s", "cpu %", "wakeups/s", "RSS MB", "threads"],
                [[i["cpu_s"], i["cpu_percent"], i["wakeups_per_s"], i["rss_mb_end"], i["threads"]]],
            )
        )
    if "cluster" in s:
        out.append(_cluster_table(s["cluster"]))
    loads = results.get("section_load", {})
    if loads:
        out.append(
            _table(
                "machine load while each section ran (others' processes included)",
                ["section", "seconds", "load 1m start", "load 1m end", "busy %"],
                [
                    [
                        name,
                        results["section_seconds"].get(name),
                        v["loadavg_1m_start"],
                        v["loadavg_1m_end"],
                        v["machine_busy_percent"],
                    ]
                    for name, v in loads.items()
                ],
            )
        )
    for name, message in results["errors"].items():
        out.append(f"SECTION FAILED: {name}: {message.splitlines()[-1]}\n")
    out.append(
        _table(
            "targets (all ratios from this run)",
            ["target", "value", "need", "met"],
            [
                [t["name"], t["value"], f"{t['op']} {t['threshold']:g}", t["met"]]
                for t in results["targets"]
            ],
        )
    )
    return "\n".join(out)


def _machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine from /proc/stat: how busy it was while a
    section ran, including other people's processes (a shared machine makes figures noisy)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return (0, 0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle, sum(fields))


def machine_info() -> dict[str, Any]:
    """CPU, memory, Python and library versions, and the code's git revision."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_mb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_mb = int(line.split()[1]) // 1024
    except OSError:
        pass

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
            ).stdout.strip()
        except OSError:
            return ""

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    import gate

    gate_dir = Path(gate.__file__).resolve().parent
    digest = hashlib.sha256()
    for source in sorted(gate_dir.rglob("*.py")):
        digest.update(str(source.relative_to(gate_dir)).encode() + b"\0" + source.read_bytes())
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "mem_total_mb": mem_mb,
        "gate_source": str(gate_dir),
        "gate_tree_sha256": digest.hexdigest()[:16],
        "loadavg_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite3.sqlite_version,
        "aiohttp": version("aiohttp"),
        "aiosqlite": version("aiosqlite"),
        "hitl_gate": version("hitl-gate"),
        "git_commit": git("rev-parse", "--short", "HEAD") or None,
        "git_dirty_gate": bool(git("status", "--porcelain", "--", "gate")),
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the chosen sections, print the table, write the JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the harness")
    parser.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections ({','.join(SECTIONS)})",
    )
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="record the gate with py-spy during the decisions run at c=64",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--note", default="", help="free text stored in the results")
    parser.add_argument(
        "--levels",
        default=None,
        metavar="C:N,...",
        help="decisions levels instead of the defaults, e.g. 64:3000",
    )
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s): {', '.join(unknown)}")
    if args.profile and not py_spy():
        parser.error("--profile needs py-spy on PATH (pip install py-spy)")
    complete = not args.quick and set(only) == set(SECTIONS)

    params = dataclasses.replace(QUICK if args.quick else FULL)
    if args.levels:
        try:
            params.levels = [
                (int(c), int(n)) for c, n in (part.split(":") for part in args.levels.split(","))
            ]
        except ValueError:
            parser.error("--levels: use CONCURRENCY:COUNT[,...], e.g. 64:3000")
        complete = False
    tmp = Path(tempfile.mkdtemp(prefix="hitl-bench-"))
    bench = Bench(params, tmp, args.quick, Path(args.profile) if args.profile else None)
    results: dict[str, Any] = {
        "schema": 1,
        "quick": args.quick,
        "complete": complete,
        "sections_run": only,
        "note": args.note,
        "started_at": _now_iso(),
        "machine": machine_info(),
        "params": asdict(params),
        "sections": {},
        "section_seconds": {},
        "section_load": {},
        "errors": {},
    }
    _progress(f"scratch directory {tmp}")
    try:
        for name in SECTIONS:
            if name not in only:
                continue
            t0 = time.perf_counter()
            load0, busy0 = os.getloadavg()[0], _machine_cpu()
            try:
                results["sections"][name] = getattr(bench, name)()
            except Exception:  # a failed section is reported, the others still run
                results["errors"][name] = traceback.format_exc()
                _progress(f"{name} FAILED:\n{results['errors'][name]}")
            busy1 = _machine_cpu()
            results["section_seconds"][name] = time.perf_counter() - t0
            results["section_load"][name] = {
                "loadavg_1m_start": load0,
                "loadavg_1m_end": os.getloadavg()[0],
                "machine_busy_percent": _ratio((busy1[0] - busy0[0]) * 100.0, busy1[1] - busy0[1]),
            }
    finally:
        bench.close()
        if args.keep:
            _progress(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    results["finished_at"] = _now_iso()
    results["targets"] = evaluate_targets(results["sections"], params)
    if args.out:
        out_path = Path(args.out)
    elif complete and not results["errors"]:
        out_path = RESULTS_PATH
    else:
        out_path = Path(tempfile.gettempdir()) / f"hitl-bench-{os.getpid()}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(results, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    sys.stdout.write(render(results))
    sys.stdout.write(f"\nresults: {out_path}\n")
    return 1 if results["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
