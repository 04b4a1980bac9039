"""The ``cluster`` bench section's reading of a gate's /metrics (bench/cluster.py): the mean
of a histogram over a load is (sum after - sum before) / (count after - count before),
summed over every gate and every series; a gate that does not export it gives None. A
setup's row: the medians of its rounds and of its per-round ratios."""

from __future__ import annotations

from typing import Any

import pytest

from bench.cluster import MEDIANS, SqliteGate, _row, histogram, histogram_means
from bench.pgsetup import PgGates, Postgres

BEFORE = """\
# HELP hitl_gate_batch_jobs Jobs per write batch.
# TYPE hitl_gate_batch_jobs histogram
hitl_gate_batch_jobs_bucket{le="1.0"} 3.0
hitl_gate_batch_jobs_bucket{le="+Inf"} 4.0
hitl_gate_batch_jobs_sum 10.0
hitl_gate_batch_jobs_count 4.0
"""
AFTER = BEFORE.replace("_sum 10.0", "_sum 130.0").replace("_count 4.0", "_count 24.0")
LABELLED = """\
hitl_gate_write_lock_seconds_sum{writer="a"} 0.5
hitl_gate_write_lock_seconds_count{writer="a"} 10.0
hitl_gate_write_lock_seconds_sum{writer="b"} 1.5
hitl_gate_write_lock_seconds_count{writer="b"} 30.0
"""


def test_histogram_sums_every_series() -> None:
    assert histogram(BEFORE, "hitl_gate_batch_jobs") == (10.0, 4.0)
    assert histogram(LABELLED, "hitl_gate_write_lock_seconds") == (2.0, 40.0)


def test_histogram_is_none_when_not_exported() -> None:
    assert histogram("hitl_gate_approvals_pending 3.0\n", "hitl_gate_batch_jobs") is None


def test_means_over_a_load_across_gates() -> None:
    means = histogram_means([BEFORE, BEFORE], [AFTER, BEFORE])

    assert means["batch_jobs"] == 120.0 / 20.0  # one gate saw 20 batches, the other none
    assert means["write_lock_s"] is None  # not exported


def test_means_none_when_nothing_was_observed() -> None:
    assert histogram_means([BEFORE], [BEFORE])["batch_jobs"] is None


def _round(rps: float, p99: float) -> dict[str, Any]:
    figures: dict[str, Any] = dict.fromkeys(MEDIANS)
    return {**figures, "rps": rps, "p99_ms": p99, "cpu_ms_per_decision": 1.0, "all_ok": True}


def test_a_rows_ratios_are_medians_of_the_ratios_of_each_round() -> None:
    pg3 = PgGates(Postgres(), 3, balanced=True)
    rounds = [
        {"sqlite-1": _round(1000, 10), "pg-1": _round(500, 20),
         "pg-3-lb": _round(450, 40)},
        {"sqlite-1": _round(100, 100), "pg-1": _round(80, 100),
         "pg-3-lb": _round(40, 100)},
        {"sqlite-1": _round(500, 50), "pg-1": _round(400, 50),
         "pg-3-lb": _round(360, 100)},
    ]  # fmt: skip

    row = _row(pg3, rounds)

    assert row["setup"] == "pg-3-lb" and row["gates"] == 3 and row["balanced"]
    assert row["rps"] == 360  # the median of the rounds' own figures
    assert row["ratio_rps"] == pytest.approx(0.45)  # of 0.45, 0.4, 0.72
    assert row["ratio_rps_to_pg1"] == pytest.approx(0.9)  # of 0.9, 0.5, 0.9
    assert row["ratio_p99"] == pytest.approx(2.0)  # of 4, 1, 2
    assert _row(SqliteGate(), rounds)["ratio_rps_to_pg1"] is None  # PostgreSQL rows only
