"""A gate whose PostgreSQL stops answering for a while without any connection breaking (its
traffic held in a TCP proxy, tests/pg_proxy.py, as behind a stalled network): a write sent
meanwhile waits and is answered when the traffic flows again, and the gate answers
``/healthz`` 200 at once then. It never takes the stall for a clock off the database's: a
reading of the database's clock that waited out the stall measured the gate half the stall
off, so after 15 s it answered 503 ``clock_skew`` until its next heartbeat."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.pg_proxy import CutProxy
from tests.pg_server import PgServer, pg_fixtures, psycopg_or_skip
from tests.support import CaptureRelay, GateProcess, wait_until
from tests.test_gate_on_postgres import gate_fixtures, start_gate

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]

psycopg_or_skip()

server, url = pg_fixtures()
relay, gates = gate_fixtures()

HELD_S = 15.0  # a heartbeat starts within 3 s of it: its clock reading is 6-7.5 s off
PAYLOAD = {"pipeline": "p", "step": "q1", "draft": {"content_type": "text/plain", "body": "x"}}


def status(gate: GateProcess) -> int:
    return gate.api().call("GET", "/healthz", timeout=5)[0]


def test_cluster_stall_a_gate_serves_again_at_once_and_reports_no_clock_skew(
    tmp_path: Path, server: PgServer, url: str, relay: CaptureRelay, gates: list[GateProcess]
) -> None:
    proxy = CutProxy(("127.0.0.1", server.port)).start()
    try:
        gates.append(start_gate(tmp_path / "a", relay, proxy.url(url)))
        (gate,) = gates
        api = gate.api()
        api.create()
        wait_until(  # its first heartbeat measured the offset before the stall
            lambda: api.call("GET", "/healthz")[1]["cluster"]["clock_offset_ms"] is not None,
            what="the gate's first heartbeat",
        )
        answer: dict[str, int] = {}
        write = threading.Thread(
            target=lambda: answer.update(created=api.call("POST", "/v1/approvals", PAYLOAD)[0]),
            daemon=True,
        )
        proxy.hold()
        write.start()
        time.sleep(HELD_S)  # the stall under test, not a wait for something to happen
        assert "created" not in answer  # it waits for the database
        proxy.release()
        released = time.monotonic()
        wait_until(lambda: status(gate) == 200, timeout=10, what="/healthz 200")
        back_s = time.monotonic() - released
        write.join(30)
    finally:
        proxy.stop()

    assert answer == {"created": 201}
    assert back_s < 2.0
    assert "event=clock_skew" not in gate.log()
