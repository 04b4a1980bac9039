"""The ``cluster`` bench section's reading of a gate's /metrics (bench/cluster.py): the mean
of a histogram over a load is (sum after - sum before) / (count after - count before),
summed over every gate and every series; a gate that does not export it gives None."""

from __future__ import annotations

from bench.cluster import histogram, histogram_means

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
