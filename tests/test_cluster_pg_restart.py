"""PostgreSQL crashed and restarted (``pg_ctl -m immediate``) under three gates and a stream
of creates and decisions through haproxy (tests/cluster_gates.py, tests/cluster_load.py):
while it is down a write answers 503 ``storage_unavailable`` (never 500) and ``/healthz``
503; every gate answers ``/healthz`` 200 and takes a write again within 5 s of the server
accepting connections, by itself; every long-poll waiting through it is answered by its
deadline; nothing answered 200/201 is lost, nothing counted twice, the chain whole."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.cluster_gates import Gates
from tests.cluster_load import Stream
from tests.pg_server import PgServer, psycopg_or_skip
from tests.support import CaptureRelay, GateProcess, wait_until
from tests.test_cluster_failover import cluster, progress, server  # noqa: F401 (fixtures)
from tests.test_gate_on_postgres import UNAVAILABLE, assert_log_whole, rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres, pytest.mark.cluster]

psycopg_or_skip()

RECOVER_S = 5.0
WAIT_S = 12


class LongPoll:
    """``GET /v1/approvals/{id}?wait=WAIT_S`` on one gate, in a thread: its status, answer
    and how long it took."""

    def __init__(self, gate: GateProcess, approval_id: str) -> None:
        self.gate, self.approval_id = gate, approval_id
        self.result: tuple[int, Any, float] | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        status, answer = self.gate.api().call(
            "GET", f"/v1/approvals/{self.approval_id}?wait={WAIT_S}", timeout=WAIT_S + 30
        )
        self.result = (status, answer, time.monotonic() - started)


def back_within(gate: GateProcess, since: float) -> float:
    """Seconds from ``since`` (monotonic) until ``gate`` answers /healthz 200 and takes a
    create; a 503 ``storage_unavailable`` meanwhile is all it may answer."""

    def serving() -> bool:
        status, answer = gate.api().call("GET", "/healthz", timeout=10)
        if status != 200:
            assert (status, answer) == (503, UNAVAILABLE), answer
            return False
        status, answer = gate.api().call("POST", "/v1/approvals", PAYLOAD, timeout=10)
        assert status == 201 or (status, answer) == (503, UNAVAILABLE), answer
        return status == 201

    wait_until(serving, what="the gate to serve again by itself")
    return time.monotonic() - since


PAYLOAD = {"pipeline": "p", "step": "q1", "draft": {"content_type": "text/plain", "body": "y"}}


def test_cluster_postgres_restarted_under_load_every_gate_recovers_and_loses_nothing(
    cluster: Gates,  # noqa: F811
    relay: CaptureRelay,
    server: PgServer,  # noqa: F811
) -> None:
    stream = Stream(cluster, relay).start()
    try:
        progress(stream, 5)
        polls = [LongPoll(g, g.api().create("q1")["approval_id"]) for g in cluster.live()]
        for poll in polls:
            poll.thread.start()
        for gate in cluster.live():  # each gate has read its long-poll: it answers later ones
            assert gate.api().call("GET", "/healthz")[0] == 200

        server.stop("immediate")
        try:
            for gate in cluster.live():
                answer = gate.api().call("POST", "/v1/approvals", PAYLOAD, timeout=30)
                assert answer == (503, UNAVAILABLE)
                assert gate.api().call("GET", "/healthz", timeout=30) == (503, UNAVAILABLE)
        finally:
            server.start()
        back = time.monotonic()
        recovered = [back_within(gate, back) for gate in cluster.live()]
        assert max(recovered) < RECOVER_S, recovered
        progress(stream, 5)
    finally:
        stream.stop()

    for poll in polls:
        poll.thread.join(WAIT_S + 30)
        assert poll.result is not None
        status, answer, took = poll.result
        assert status == 200, answer
        assert answer["approval_id"] == poll.approval_id
        assert took < WAIT_S + 1.5, took  # by its deadline (and a margin)

    def query(sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return rows(cluster.url, sql, *args)

    assert stream.check(query) == []
    assert_log_whole(cluster.url)
    for text in cluster.logs():
        assert "Traceback" not in text and "internal_error" not in text
        assert "event=storage_unavailable" in text
