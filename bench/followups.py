"""The ``followups`` bench section: 100,000 pending approvals with reminders
and escalation levels must not change the idle daemon's CPU (~0) nor its start time.

Two databases written by ``bench.dbgen`` (the same approvals), one of them then given a
follow-up plan per approval straight in the SQLite file (``approvals.followups`` and
``next_followup_at``, as the gate writes them at creation: reminders every hour from one
hour on, an escalation level at two hours, so nothing comes due while measured). Each is
started ``scale_starts`` times in turn (spawn -> ``event=listening``), then left alone a few
seconds; figures are reported with the ratio with/without, both measured in this run.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import dbgen
from bench.common import RECEIPT_KEY, context_switches, cpu_seconds, median

if TYPE_CHECKING:
    from bench.run import Bench

HOUR_MS = 3_600_000
# the plan of migration 4's comment: reminders hourly from 1 h, one level at 2 h
PLAN = json.dumps(
    {"remind_after_ms": HOUR_MS, "remind_every_ms": HOUR_MS, "levels": [[2 * HOUR_MS, []]]},
    separators=(",", ":"),
)


def _with_plans(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` and give each pending approval the follow-up plan, its next
    follow-up one hour after its creation (all in the future: created within the last
    minutes)."""
    shutil.copyfile(src, dst)
    conn = sqlite3.connect(dst)
    try:
        conn.execute(
            "UPDATE approvals SET followups = ?, next_followup_at = created_at + ?"
            " WHERE state = 'pending'",
            (PLAN, HOUR_MS),
        )
        conn.commit()
    finally:
        conn.close()


def _idle(bench: Bench, label: str, db: Path, relay_url: str, seconds: float) -> dict[str, Any]:
    """Start a daemon on ``db`` and sample its CPU and context switches for ``seconds``."""
    gate = bench.gate(bench.tmp / "followups" / f"idle-{label}", relay_url, db)
    try:
        time.sleep(bench.params.settle_s)
        pid = gate.pid
        cpu0, ctx0, t0 = cpu_seconds(pid), context_switches(pid), time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        cpu, ctx = cpu_seconds(pid) - cpu0, context_switches(pid) - ctx0
    finally:
        rc = gate.stop()
    return {
        "duration_s": elapsed,
        "cpu_s": cpu,
        "cpu_percent": cpu / elapsed * 100,
        "wakeups_per_s": ctx / elapsed,
        "exit_code": rc,
    }


def run(bench: Bench) -> dict[str, Any]:
    """The section: ``scale_pending`` approvals with and without follow-up plans."""
    p = bench.params
    d = bench.tmp / "followups"
    d.mkdir(parents=True, exist_ok=True)
    relay = bench.relay(d, "capture")
    out: dict[str, Any] = {"pending": p.scale_pending}
    try:
        now = int(time.time() * 1000)
        plain, planned = d / "plain.db", d / "planned.db"
        dbgen.add_pending(
            plain,
            p.scale_pending,
            lambda i: now - 600_000 + (i * 600_000) // p.scale_pending,
            lambda i: now + 4 * HOUR_MS,
            RECEIPT_KEY.encode("utf-8"),
        )
        _with_plans(plain, planned)
        starts: dict[str, list[float]] = {"plain": [], "planned": []}
        for n in range(p.scale_starts):
            for label, db in (("plain", plain), ("planned", planned)):
                gate = bench.gate(d / f"start-{label}-{n}", relay.url, db)
                starts[label].append(gate.start_s)
                gate.stop()
        idle_s = max(2.0, p.idle_s / 12)
        for label, db in (("plain", plain), ("planned", planned)):
            out[label] = {
                "start_s": median(starts[label]),
                "starts": starts[label],
                "idle": _idle(bench, label, db, relay.url, idle_s),
            }
        out["start_ratio"] = out["planned"]["start_s"] / out["plain"]["start_s"]
        plain_cpu = out["plain"]["idle"]["cpu_s"]
        out["idle_cpu_ratio"] = (
            out["planned"]["idle"]["cpu_s"] / plain_cpu if plain_cpu > 0 else None
        )
        out["followups_queued"] = _scalar(planned, "SELECT COUNT(*) FROM followup_outbox")
    finally:
        relay.stop()
    return out


def _scalar(db: Path, sql: str) -> Any:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()
