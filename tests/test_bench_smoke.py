"""The benchmark harness works (bench/): structure and correctness only, never a time.

1. ``python -m bench.run --quick`` runs every section end to end with tiny sizes and writes a
   results file of the documented shape, without touching bench/results.json.
2. The rows bench/dbgen.py writes straight into SQLite (the 100k-pending scale database) are
   the rows the gate itself writes for the same request, so the scale figures measure a
   database the gate could have produced.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench import dbgen
from bench.common import (
    API_TOKEN,
    CONTENT_TYPE,
    PIPELINE,
    RECEIPT_KEY,
    STEP,
    Daemon,
    Helper,
    HttpClient,
    draft_body,
    write_config,
)

pytestmark = pytest.mark.toolchain

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ["decisions", "roundtrip", "scale", "audit", "idle", "followups", "cluster"]


def _latency(stats: dict[str, Any]) -> None:
    for key in ("p50", "p90", "p99", "mean", "min", "max"):
        assert isinstance(stats[key], float), key


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_run_measures_every_section(tmp_path: Path) -> None:
    official = ROOT / "bench" / "results.json"
    before = official.stat().st_mtime_ns if official.exists() else None
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        timeout=850,
        check=False,
    )
    report = proc.stdout.decode("utf-8", "replace")
    assert proc.returncode == 0, report[-3000:] + proc.stderr.decode("utf-8", "replace")[-6000:]
    assert "targets" in report and str(out) in report
    assert (official.stat().st_mtime_ns if official.exists() else None) == before

    r = json.loads(out.read_text(encoding="utf-8"))
    assert r["quick"] is True and r["complete"] is False and r["errors"] == {}
    assert r["sections_run"] == SECTIONS and sorted(r["sections"]) == sorted(SECTIONS)
    assert r["machine"]["cpu_count"] >= 1 and r["machine"]["python"]
    assert r["started_at"] < r["finished_at"]
    assert set(r["section_seconds"]) == set(SECTIONS) == set(r["section_load"])
    s = r["sections"]

    dec = s["decisions"]
    assert [lv["concurrency"] for lv in dec["levels"]] == [1, 16, 64, 256]
    for lv in dec["levels"]:
        for side in ("gate", "baseline"):
            assert lv[side]["ok"] == lv["decisions"] == lv[side]["requests"], lv[side]
            assert lv[side]["rps"] > 0
            _latency(lv[side]["latency_ms"])
        assert lv["ratio_rps"] > 0 and lv["ratio_p99"] > 0
    # signed rows at c=16 and c=64, every decision recorded, a ratio to unsigned
    assert [lv["concurrency"] for lv in dec["signed"]] == [16, 64]
    for lv in dec["signed"]:
        assert lv["gate"]["ok"] == lv["decisions"] == lv["gate"]["requests"], lv["gate"]
        _latency(lv["gate"]["latency_ms"])
        assert lv["ratio_rps_to_unsigned"] > 0 and lv["ratio_p99_to_unsigned"] > 0
    assert "decisions signed" in report
    signed_n = sum(lv["decisions"] for lv in dec["signed"])
    assert dec["all_ok"] and dec["gate_exit_code"] == 0
    assert dec["approved_in_db"] == sum(lv["decisions"] for lv in dec["levels"]) + signed_n
    assert dec["create"]["count"] + signed_n == dec["approved_in_db"]

    rt = s["roundtrip"]
    # structure only: a failed round trip is counted under "error" and shown, not asserted
    assert rt["gate"]["ok"] > 0 and isinstance(rt["all_ok"], bool), rt
    assert sum(rt["gate"]["outcomes"].values()) == rt["gate"]["requests"], rt
    assert rt["ratio_rps_vs_baseline"] > 0 and rt["gate_exit_code"] == 0
    _latency(rt["gate"]["latency_ms"])

    sc = s["scale"]
    for key, items in (("empty", 0), ("one_page", 50), ("large", 50)):
        assert sc[key]["items"] == items
        assert sc[key]["start_s"] > 0 and sc[key]["rss_mb"] > 0
        assert sc[key]["page_cold_ms"] > 0 and sc[key]["page_warm_ms"] > 0
        assert all(run["exit_code"] == 0 for run in sc[key]["runs"])
    exp = sc["expiry"]
    assert exp["timeouts_in_db"] == exp["count"] == sc["expiring"]
    assert exp["audit_verify_ok"], exp["audit_verify_output"]
    assert exp["per_s"] > 0 and exp["resolved_within_s"] >= exp["first_resolved_after_s"]
    assert exp["gate_exit_code"] == 0 and sc["dispatches_received"] == 0

    aud = s["audit"]
    assert aud["all_ok"] and aud["ratio"] > 0
    assert aud["verify"]["exit_code"] == 0 and aud["baseline"]["entries"] == aud["entries"]

    idle = s["idle"]
    assert idle["duration_s"] >= r["params"]["idle_s"]
    for key in ("cpu_s", "cpu_percent", "wakeups_per_s", "rss_mb_end", "threads"):
        assert idle[key] >= 0, key
    assert idle["gate_exit_code"] == 0

    cl = s["cluster"]
    assert cl["baseline"] == "sqlite-1" and cl["all_ok"], cl
    rows = {row["setup"]: row for row in cl["setups"]}
    setups = {"sqlite-1", "sqlite-1-lb", "pg-1", "pg-2-lb", "pg-3-lb"}
    assert set(rows) | set(cl["skipped"]) == setups
    for row in rows.values():
        sqlite = row["backend"] == "sqlite"
        assert row["backend"] in ("sqlite", "postgresql")
        assert row["rps"] > 0 and row["p99_ms"] > 0 and row["gate_cpu_ms_per_decision"] > 0
        assert row["ratio_rps"] > 0 and row["ratio_p99"] > 0 and row["cpu_ms_per_decision"] > 0
        assert row["batch_jobs_mean"] >= 1 and row["write_lock_ms_mean"] > 0  # from /metrics
        assert (row["db_cpu_ms_per_decision"] is None) == sqlite
        for run in row["rounds"]:
            assert run["load"]["ok"] == run["decisions"] == cl["decisions"], run["load"]
            assert run["exit_codes"] == [0] * row["gates"]
            if sqlite:
                assert run["gate_processes"] == 2  # daemon + writer
    if "sqlite-1-lb" in rows:
        assert rows["sqlite-1-lb"]["balancer_cpu_ms_per_decision"] is not None
    assert "cluster (c=64" in report
    fail = cl["failover"]
    if "pg-3-lb" in rows:
        assert fail["requests"]["first_ok_s"] > 0 and fail["requests"]["first_ok_gate"]
        assert fail["requests"]["first_ok_gate"] != fail["requests"]["killed"]
        assert fail["timers"]["next_reminder_s"] > 0
        assert "fail-over, kill -9 of the lease holder" in report
    else:
        assert "skipped" in fail

    assert len(r["targets"]) == 14
    for target in r["targets"]:
        if target["name"].startswith("cluster:") and "pg-1" in cl["skipped"]:
            continue  # no PostgreSQL here: nothing to compare
        assert target["value"] is not None and isinstance(target["met"], bool), target


def _rows(db: Path, table: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]
    finally:
        conn.close()


def _without(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in keys}


@pytest.mark.timeout(120)
def test_dbgen_writes_the_rows_the_gate_writes(tmp_path: Path) -> None:
    relay = Helper(["-m", "bench.relay", "capture"], tmp_path / "relay.log").start()
    gate_db = tmp_path / "gate" / "gate.db"
    daemon = Daemon(write_config(tmp_path / "gate", relay.url, gate_db), tmp_path / "gate.log")
    try:
        daemon.start(timeout=60)
        client = HttpClient(daemon.api_url, API_TOKEN)
        try:
            status, answer, _ = client.request(
                "POST",
                "/v1/approvals",
                {
                    "pipeline": PIPELINE,
                    "step": STEP,
                    "draft": {"content_type": CONTENT_TYPE, "body": draft_body(0)},
                },
            )
        finally:
            client.close()
        assert status == 201, answer
        deadline = time.monotonic() + 30
        while not [r for r in _rows(gate_db, "audit_log") if r["kind"] == "dispatch_ack"]:
            assert time.monotonic() < deadline, daemon.log_tail()
            time.sleep(0.05)
    finally:
        assert daemon.stop() == 0
        relay.stop()

    [approval] = _rows(gate_db, "approvals")
    [outbox] = _rows(gate_db, "outbox")
    made = tmp_path / "made.db"
    dbgen.add_pending(
        made,
        1,
        lambda i: approval["created_at"],
        lambda i: approval["expires_at"],
        RECEIPT_KEY.encode("utf-8"),
        ack_delay_ms=outbox["delivered_at"] - approval["created_at"],
    )

    ids = ("approval_id", "run_id")
    assert [_without(r, *ids) for r in _rows(made, "approvals")] == [_without(approval, *ids)]
    assert [_without(r, "approval_id", "nonce") for r in _rows(made, "revisions")] == [
        _without(r, "approval_id", "nonce") for r in _rows(gate_db, "revisions")
    ]
    assert [_without(r, "approval_id") for r in _rows(made, "outbox")] == [
        _without(outbox, "approval_id")
    ]

    def entries(db: Path) -> list[dict[str, Any]]:
        out = []
        for row in _rows(db, "audit_log"):
            entry = json.loads(row["entry"])
            entry.pop("approval_id")
            out.append(
                {
                    **_without(row, "approval_id", "entry", "prev_hash", "entry_hash", "receipt"),
                    "entry": entry,
                }
            )
        return out

    assert entries(made) == entries(gate_db)
    assert _user_version(made) == _user_version(gate_db)


def _user_version(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()
