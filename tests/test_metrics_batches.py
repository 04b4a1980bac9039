"""The write batches on ``/metrics`` of a real daemon, on both backends: every committed batch
observed once in ``hitl_gate_batch_jobs`` (its jobs) and once in
``hitl_gate_write_lock_seconds`` (how long it held the write lock: SQLite's ``BEGIN
IMMEDIATE``, PostgreSQL's ``audit_head`` row), although the batches run in the writer
process and the scrape is answered by the web process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.pg_server import PgServer, running_server
from tests.support import (
    CaptureRelay,
    GateProcess,
    decision_body,
    post_decision,
    wait_until,
    write_config,
)
from tests.test_metrics import Samples, scrape, value

pytestmark = pytest.mark.e2e
WRITES = 4  # approvals created, then decided: at least 2 * WRITES jobs


def batches(samples: Samples) -> dict[str, float]:
    return {
        name: value(samples, f"hitl_gate_{name}")
        for name in (
            "batch_jobs_count",
            "batch_jobs_sum",
            "write_lock_seconds_count",
            "write_lock_seconds_sum",
        )
    }


def assert_batches_observed(gate: GateProcess, relay: CaptureRelay) -> None:
    families, samples = scrape(gate)
    assert families["hitl_gate_batch_jobs"].type == "histogram"
    assert families["hitl_gate_write_lock_seconds"].type == "histogram"
    before = batches(samples)
    started = time.monotonic()
    api = gate.api()
    ids = [api.create("q1", body=f"batch {n}")["approval_id"] for n in range(WRITES)]
    for approval_id in ids:
        body = decision_body(relay.wait_dispatch(approval_id))
        status, answer, _ = post_decision(gate.callback_url, body)
        assert status == 200, answer
    after_samples = scrape(gate)[1]
    elapsed = time.monotonic() - started
    after = batches(after_samples)
    delta = {key: after[key] - before[key] for key in after}

    assert delta["batch_jobs_sum"] >= 2 * WRITES  # every create and every decision is a job
    assert 1 <= delta["batch_jobs_count"] <= delta["batch_jobs_sum"]  # a batch: 1 job or more
    assert delta["write_lock_seconds_count"] == delta["batch_jobs_count"]  # each batch in both
    assert 0 < delta["write_lock_seconds_sum"] < elapsed  # held, and only while we waited
    assert (
        value(after_samples, "hitl_gate_batch_jobs_bucket", le="256.0") == after["batch_jobs_count"]
    )  # no batch is larger than MAX_BATCH


def test_sqlite_gate_exports_its_write_batches(gate: GateProcess, relay: CaptureRelay) -> None:
    assert_batches_observed(gate, relay)


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


@pytest.mark.postgres
def test_postgres_gate_exports_its_write_batches(
    tmp_path: Path, relay: CaptureRelay, server: PgServer
) -> None:
    path = write_config(tmp_path, relay.url)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["storage"] = {"url": server.database("batches")}
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    gate = GateProcess(path).start()
    try:
        wait_until(lambda: gate.api().call("GET", "/healthz")[0] == 200, what="healthy")
        assert_batches_observed(gate, relay)
    finally:
        assert gate.stop() == 0
