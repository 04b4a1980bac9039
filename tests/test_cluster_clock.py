"""Gates whose clocks are wrong, on one PostgreSQL: three real ``hitl-gate serve`` processes,
one 90 s ahead and one 90 s behind under libfaketime (Debian's ``faketime``: ``LD_PRELOAD``
on the gate process; its monotonic clock left true). Approvals created and decided on every
gate are stamped with the database's clock: the audit log's times never go backwards in
``seq`` order and stay near the real time whichever gate wrote them, an approval's
``expires_at`` is its creation plus its timeout; correctly signed decisions sent to the
skewed gates at the real time are recorded. The skewed gates' ``/healthz`` answers 503
``clock_skew`` (the balancer drains them), the true one 200, and ``doctor`` names both
skewed gates with their offsets. Skips where libfaketime is missing, and fails instead under
HITL_CI=1 (``.ci/run`` installs it)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gate.audit.chain import AuditRow
from tests.cluster_gates import DB_PASSWORD, Gates, faketime_lib, skewed_env
from tests.pg_server import PgServer, pg_fixtures, psycopg_or_skip
from tests.soak.soak import rfc3339_ms
from tests.support import CaptureRelay, decision_body, gate_env, post_decision, run_cli, wait_until
from tests.test_gate_on_postgres import assert_log_whole, rows

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()

server, _url = pg_fixtures()
AHEAD, BEHIND = 90, -90
NEAR_MS = 5_000  # a time the database stamped is this close to the test's real clock


@pytest.fixture
def skewed(server: PgServer, relay: CaptureRelay, tmp_path: Path) -> Iterator[Gates]:
    """Gate 0 on the true clock, gate 1 ``AHEAD`` s ahead, gate 2 ``BEHIND`` s behind."""
    if faketime_lib() is None:
        if os.environ.get("HITL_CI"):
            pytest.fail("no libfaketime here (.ci/run installs faketime)")
        pytest.skip("no libfaketime here (apt-get install faketime)")
    envs = {1: skewed_env(AHEAD), 2: skewed_env(BEHIND)}
    gates = Gates(tmp_path, relay.url, server.database("clock"), 3, envs=envs)
    try:
        yield gates.start()
    finally:
        gates.remove()


def offsets(gates: Gates) -> dict[int, int]:
    """Each running gate's clock offset to the database's (ms) as its row says, by pid."""
    found = rows(gates.url, "SELECT pid, clock_offset_ms FROM gate_instances")
    return {pid: offset for pid, offset in found}


def test_cluster_clock_skewed_gates_stamp_the_database_time_and_say_clock_skew(
    skewed: Gates, relay: CaptureRelay
) -> None:
    pids = [g.proc.pid for g in skewed.live() if g.proc is not None]

    def all_rows() -> dict[int, int] | None:
        found = offsets(skewed)
        return found if set(pids) <= set(found) else None

    seen = wait_until(all_rows, what="every gate's row with its clock offset")
    for pid, expected_s in zip(pids, (0, AHEAD, BEHIND), strict=True):
        assert abs(seen[pid] - expected_s * 1000) < 2_000, seen  # faketime took effect

    started_ms = int(time.time() * 1000)
    made = []
    for index, gate in enumerate(skewed.live()):  # created on each gate, decided on the next
        created = gate.api().create("short")
        made.append(created["approval_id"])
        assert abs(rfc3339_ms(created["created_at"]) - started_ms) < NEAR_MS, created
        span = rfc3339_ms(created["expires_at"]) - rfc3339_ms(created["created_at"])
        assert span == 3_000, created  # the step's timeout, on one clock
        dispatch = relay.wait_dispatch(created["approval_id"])
        deciding = skewed[(index + 1) % len(skewed)]
        status, answer, _ = post_decision(deciding.callback_url, decision_body(dispatch))
        assert (status, answer["status"]) == (200, "recorded"), answer
    ended_ms = int(time.time() * 1000)

    log: list[AuditRow] = assert_log_whole(skewed.url)
    times = [rfc3339_ms(json.loads(row.entry)["at"]) for row in log]
    assert times == sorted(times)  # never backwards in seq order
    assert all(started_ms - NEAR_MS < t < ended_ms + NEAR_MS for t in times), times
    stamped = rows(skewed.url, "SELECT approval_id, resolved_at FROM approvals")
    assert sorted(a for a, _ in stamped) == sorted(made)
    assert all(started_ms - NEAR_MS < at < ended_ms + NEAR_MS for _, at in stamped), stamped

    health = [g.api().call("GET", "/healthz", timeout=30) for g in skewed.live()]
    assert health[0][0] == 200, health[0]
    for status, answer in health[1:]:
        assert (status, answer["reason"]) == (503, "clock_skew"), answer

    done = run_cli(
        "doctor", "-c", str(skewed.configs[0]), env=gate_env(HITL_DB_PASSWORD=DB_PASSWORD)
    )
    out = done.stdout.decode()
    (line,) = [ln for ln in out.splitlines() if " cluster: " in ln]
    assert line.startswith("FAIL cluster: clock off the database's by more than 5 s: "), line
    shown = sorted(float(s) for s in re.findall(r" ([+-][0-9.]+) s", line))
    assert len(shown) == 2 and shown[0] < -85 and shown[1] > 85, line
    assert done.returncode == 1, out
    assert DB_PASSWORD not in out + done.stderr.decode()


def test_cluster_clock_a_gate_behind_the_database_sends_what_is_due_at_once(
    server: PgServer, relay: CaptureRelay, tmp_path: Path
) -> None:
    """Its dispatcher compares the outbox's times (the database's) with the database's time,
    not with its own clock: 90 s behind, its dispatches would wait 90 s."""
    if faketime_lib() is None:
        pytest.skip("no libfaketime here (apt-get install faketime)")
    gates = Gates(tmp_path, relay.url, server.database("behind"), 1, envs={0: skewed_env(BEHIND)})
    try:
        gates.start()
        gates[0].wait_for_line("event=lease_acquired")
        sent = time.monotonic()
        approval_id = gates[0].api().create("q1")["approval_id"]
        relay.wait_dispatch(approval_id)
        assert time.monotonic() - sent < 10.0
    finally:
        gates.remove()
