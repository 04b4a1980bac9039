"""Reminders and escalations once per level while the timers' holder is killed: three real
gates on one PostgreSQL, ten approvals on a step that reminds every 2 s and escalates at 5 s
and at 8 s. The gate holding the ``timers`` lease is killed (-9) after every approval's first
reminder, and again after every approval's first level; each time it restarts once another
gate has taken the lease over. Then: per approval one ``escalated`` entry per level, levels
in order, none skipped, one ``followup_outbox`` row per (kind, n), ``reminders_sent`` the
highest reminder queued; the relay got follow-ups only of queued rows (a POST repeated only
for the same (approval, kind, n)); after each kill the next follow-up POST came within the
lease's TTL + 1 s. (tests/test_daemon_cluster.py covers two gates and one kill.)"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from gate.daemon.cluster import LEASE_TTL_S
from tests.cluster_gates import Gates
from tests.pg_server import PgServer, pg_fixtures, psycopg_or_skip
from tests.support import CaptureRelay, wait_until
from tests.test_gate_on_postgres import assert_log_whole, rows

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.postgres]

psycopg_or_skip()

server, _url = pg_fixtures()
STEP = {
    "name": "esc",
    "quorum": 1,
    "approvers": [101],
    "timeout": "120s",
    "remind_after": "2s",
    "remind_every": "2s",
    "escalate": [{"after": "5s", "to": [102]}, {"after": "8s", "to": [103]}],
}
APPROVALS = 10


def followups(relay: CaptureRelay) -> list[tuple[str, str, int, float]]:
    """``(approval_id, kind, n, arrival)`` of every reminder and escalation POST so far."""
    with relay._cond:
        records = list(relay.received)
    found = []
    for record in records:
        envelope = json.loads(record["raw"])
        for kind in ("reminder", "escalation"):
            if kind in envelope:
                found.append((envelope["approval_id"], kind, int(envelope[kind]), record["at"]))
    return found


def holder(gates: Gates) -> int:
    """The index of the gate holding the timers' lease now."""

    def find() -> tuple[int] | None:  # a tuple: index 0 is a holder too
        pids = {
            pid
            for (pid,) in rows(
                gates.url,
                "SELECT i.pid FROM gate_lease l JOIN gate_instances i"
                " ON i.instance_id = l.holder WHERE l.name = 'timers'"
                " AND l.expires_at > (extract(epoch from clock_timestamp()) * 1000)::bigint",
            )
        }
        running = [(i, g.proc.pid) for i, g in enumerate(gates.procs) if g and g.proc]
        return next(((i,) for i, pid in running if pid in pids), None)

    found: tuple[int] = wait_until(find, what="a gate to hold the timers' lease")
    return found[0]


def escalated(url: str) -> dict[str, list[int]]:
    """The levels of each approval's ``escalated`` entries, in seq order."""
    levels: dict[str, list[int]] = defaultdict(list)
    for approval_id, entry in rows(
        url, "SELECT approval_id, entry FROM audit_log WHERE kind = 'escalated' ORDER BY seq"
    ):
        levels[approval_id].append(json.loads(entry)["data"]["level"])
    return levels


def kill_holder(gates: Gates, relay: CaptureRelay) -> float:
    """Kill the holder; once another gate holds the lease, restart it. Seconds from the kill
    to the next follow-up POST the relay got."""
    index = holder(gates)
    before = len(followups(relay))
    gates.kill9(index)
    killed_at = time.time()
    wait_until(lambda: len(followups(relay)) > before, what="a follow-up after the kill")
    next_at = min(at for *_, at in followups(relay)[before:])
    wait_until(lambda: holder(gates) != index, what="another gate to take the lease")
    assert "event=lease_acquired" in "".join(g.log() for g in gates.live())
    gates.restart(index)
    return next_at - killed_at


def test_cluster_followups_once_per_level_while_the_timers_holder_is_killed(
    server: PgServer, relay: CaptureRelay, tmp_path: Path
) -> None:
    gates = Gates(tmp_path, relay.url, server.database("followups"), 3, steps=[STEP])
    try:
        gates.start()
        ids = [gates[i % 3].api().create("esc")["approval_id"] for i in range(APPROVALS)]

        def every(kind: str, n: int) -> bool:
            got = {(a, k, m) for a, k, m, _ in followups(relay)}
            return all((a, kind, n) in got for a in ids)

        wait_until(lambda: every("reminder", 1), what="every approval's first reminder")
        gaps = [kill_holder(gates, relay)]
        wait_until(lambda: every("escalation", 1), what="every approval's first level")
        gaps.append(kill_holder(gates, relay))
        wait_until(lambda: every("escalation", 2), what="every approval's second level")
        for approval_id in ids:
            status, answer = gates[0].api().call("POST", f"/v1/approvals/{approval_id}/cancel")
            assert status == 200, answer
    finally:
        gates.remove()

    assert all(gap <= LEASE_TTL_S + 1.0 for gap in gaps), gaps
    assert escalated(gates.url) == {a: [1, 2] for a in ids}
    queued: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for approval_id, kind, n in rows(gates.url, "SELECT approval_id, kind, n FROM followup_outbox"):
        assert (kind, n) not in queued[approval_id]
        queued[approval_id].add((kind, n))
    posted: dict[str, set[tuple[str, int]]] = defaultdict(set)
    for approval_id, kind, n, _ in followups(relay):
        posted[approval_id].add((kind, n))
    for approval_id in ids:
        assert posted[approval_id] <= queued[approval_id]  # repeats only of a queued row
        assert {("escalation", 1), ("escalation", 2)} <= queued[approval_id]
        reminders = sorted(n for kind, n in queued[approval_id] if kind == "reminder")
        [(sent,)] = rows(
            gates.url, "SELECT reminders_sent FROM approvals WHERE approval_id = %s", approval_id
        )
        assert sent == reminders[-1], (sent, reminders)
    for text in gates.logs():
        assert "Traceback" not in text
    log: Any = assert_log_whole(gates.url)
    assert sum(row.kind == "resolved" for row in log) == APPROVALS
