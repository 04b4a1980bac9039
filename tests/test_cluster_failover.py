"""Any gate of three on one PostgreSQL killed (-9) mid-stream loses nothing: real ``hitl-gate
serve`` processes behind haproxy (tests/cluster_gates.py), a stream of creates and signed
decisions through it from clients that re-send what they got no answer to
(tests/cluster_load.py). Five rounds: a gate killed while decisions flow, the others keep
answering, it restarts on its ports. Then every decision answered 200 is in the database
once, every approval both approvers approved resolved once, the audit log contiguous and
its chain valid, and no gate answered a 5xx but 503."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster_gates import Gates, server_and_balancer
from tests.cluster_load import Stream
from tests.pg_server import PgServer, psycopg_or_skip
from tests.support import CaptureRelay, wait_until
from tests.test_gate_on_postgres import assert_log_whole, rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres, pytest.mark.cluster]

psycopg_or_skip()

ROUNDS = 3  # kill -9 of a gate mid-stream, repeated (the cluster soak kills more)


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from server_and_balancer()


@pytest.fixture
def cluster(server: PgServer, relay: CaptureRelay, tmp_path: Path) -> Iterator[Gates]:
    """Three gates on a new, empty database, behind the balancers."""
    gates = Gates(tmp_path, relay.url, server.database("failover"), 3)
    try:
        yield gates.start(balanced=True)
    finally:
        gates.remove()


def progress(stream: Stream, more: int) -> None:
    """Wait until the stream has ``more`` decisions answered than now."""
    target = stream.decided() + more
    wait_until(lambda: stream.decided() >= target, what=f"{more} more decisions answered")


def test_cluster_failover_kill9_of_any_gate_mid_stream_loses_nothing(
    cluster: Gates, relay: CaptureRelay
) -> None:
    stream = Stream(cluster, relay).start()
    try:
        for round_ in range(ROUNDS):
            progress(stream, 5)
            victim = round_ % len(cluster)
            cluster.kill9(victim)
            progress(stream, 5)  # the other two answer meanwhile
            cluster.restart(victim)
            assert cluster.decisions_lb is not None and cluster.api_lb is not None
            cluster.decisions_lb.wait_all_up()
            cluster.api_lb.wait_all_up()
        progress(stream, 5)
    finally:
        stream.stop()

    def query(sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return rows(cluster.url, sql, *args)

    assert stream.check(query) == []
    assert stream.decided() >= 6 * 5
    log = assert_log_whole(cluster.url)
    assert sum(row.kind == "resolved" for row in log) >= 5
    for text in cluster.logs():
        assert "Traceback" not in text and "internal_error" not in text
