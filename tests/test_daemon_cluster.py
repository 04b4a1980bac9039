"""A gate's part in a cluster (gate/daemon/cluster.py) on a real throwaway PostgreSQL server,
with gates built by the daemon's own ``build_gate``: the leader work (the timers and the
senders) runs on one gate at a time and moves to the other when its holder stops; a clock
off the database's makes ``/healthz``'s cluster status 503 ``clock_skew``; live gates with
different configs show ``config_divergent``; an entry another gate appended wakes a
long-poll here."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gate.clock import SystemClock
from gate.config import load
from gate.config.fingerprint import config_hash
from gate.core.approvals.create import CreateRequest
from gate.daemon.app import Gate, build_gate
from gate.daemon.cluster import Cluster, Work
from gate.errors import Unavailable
from gate.store.pg_instances import CONFIG_DIVERGENT
from tests.pg_server import PgServer, running_server
from tests.support import ENV, write_config
from tests.test_store_pg_feed import append

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

if not os.environ.get("HITL_CI"):
    pytest.importorskip("psycopg")

DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


@pytest.fixture
def url(server: PgServer) -> str:
    return server.migrated_database()


class AheadClock(SystemClock):
    """The system clock ``ahead_ms`` ahead (a replica whose clock is wrong)."""

    def __init__(self, ahead_ms: int) -> None:
        self.ahead_ms = ahead_ms

    def now_ms(self) -> int:
        return super().now_ms() + self.ahead_ms


def built(tmp_path: Path, name: str, clock: SystemClock | None = None, **config: object) -> Gate:
    folder = tmp_path / name
    folder.mkdir()
    loaded, secrets = load(write_config(folder, "http://127.0.0.1:9/relay", **config), ENV)  # type: ignore[arg-type]
    return build_gate(loaded, secrets, writer_process=False, clock=clock)


@contextlib.asynccontextmanager
async def member(cluster: Cluster, work: list[Work]) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(cluster.run(work))
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def until(condition: object, what: str) -> float:
    started = time.monotonic()
    while not callable(condition) or not condition():
        if time.monotonic() - started > DEADLINE_S:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_cluster_runs_the_leader_work_on_one_gate_and_hands_it_over(
    url: str, tmp_path: Path
) -> None:
    running: list[str] = []
    overlaps: list[list[str]] = []

    def leader_work(name: str) -> Work:
        async def work() -> None:
            running.append(name)
            if len(running) > 1:
                overlaps.append(list(running))
            try:
                await asyncio.Event().wait()
            finally:
                running.remove(name)

        return work

    gates = [built(tmp_path, "a"), built(tmp_path, "b")]
    a, b = (Cluster(url, None, g.service, ttl_s=2.0, renew_s=0.3) for g in gates)
    async with member(a, [leader_work("a")]) as task_a, member(b, [leader_work("b")]) as task_b:
        await until(lambda: len(running) == 1, "one gate runs the leader work")
        first = running[0]
        await asyncio.sleep(1.0)  # several renewals: it stays, alone
        assert running == [first]
        holder, other = (a, b) if first == "a" else (b, a)
        assert holder.status()["lease_holder"] is True
        assert other.status()["lease_holder"] is False
        # a clean stop of the holder releases the lease: the other takes it at its next try
        stopping = task_a if holder is a else task_b
        stopping.cancel()
        await asyncio.gather(stopping, return_exceptions=True)
        second = "b" if first == "a" else "a"
        waited = await until(lambda: running == [second], f"{second} takes the work over")
        assert other.status()["lease_holder"] is True
    assert overlaps == []
    assert waited < 0.3 + 0.5  # its next attempt, and a margin


async def test_cluster_status_is_clock_skew_when_the_gates_clock_is_off(
    url: str, tmp_path: Path
) -> None:
    fine = built(tmp_path, "fine")
    skewed = built(tmp_path, "skewed", AheadClock(90_000))
    here = Cluster(url, None, fine.service, renew_s=0.2)
    off = Cluster(url, None, skewed.service, renew_s=0.2)
    async with member(here, []), member(off, []):
        await until(
            lambda: (
                off.health is not None and here.health is not None and len(here.health.live) == 2
            ),
            "both gates beat and here sees both",
        )
        with pytest.raises(Unavailable) as raised:
            off.status()
        status = here.status()
    assert raised.value.code == "clock_skew"
    assert "+90." in raised.value.message
    assert status["problems"] == []
    assert status["live_gates"] == 2


async def test_cluster_status_names_config_divergent_until_a_reload_ends_it(
    url: str, tmp_path: Path
) -> None:
    one = built(tmp_path, "one")
    two = built(tmp_path, "two", security={"rate_limit": 5})
    assert config_hash(one.config) != config_hash(two.config)
    a = Cluster(url, None, one.service, renew_s=0.2)
    b = Cluster(url, None, two.service, renew_s=0.2)
    async with member(a, []), member(b, []), two.storage():
        await until(lambda: a.health is not None and len(a.health.live) == 2, "a sees both gates")
        divergent = a.status()
        two.service.reconfigure(one.config)  # a SIGHUP reload to the same rules as one
        await until(lambda: a.status()["problems"] == [], "the next beats end it")
    assert divergent["problems"] == [CONFIG_DIVERGENT]


def test_config_hash_ignores_what_differs_per_replica(tmp_path: Path) -> None:
    one = built(tmp_path, "one", api={"listen": "127.0.0.1:8101"}, db="one.db")
    two = built(tmp_path, "two", api={"listen": "127.0.0.1:8102"}, db="two.db")
    assert config_hash(one.config) == config_hash(two.config)


async def test_cluster_wakes_a_long_poll_when_another_gate_resolved(
    url: str, tmp_path: Path
) -> None:
    here = built(tmp_path, "here")
    cluster = Cluster(url, None, here.service, poll_s=60.0)  # a notification only
    async with here.storage(), member(cluster, []):
        await until(cluster.feed.connected.is_set, "the feed listens")
        request = CreateRequest("p", "q1", None, "text/plain", "deploy?", None)
        created, _ = await here.service.approvals.create(request, None)
        approval_id = created["approval_id"]
        poll = asyncio.create_task(here.service.approvals.wait(approval_id, 30))
        await asyncio.sleep(0.2)
        assert not poll.done()
        started = time.monotonic()
        await asyncio.to_thread(append, url, [("resolved", approval_id)])
        async with asyncio.timeout(DEADLINE_S):
            await poll
        woken_s = time.monotonic() - started
    assert woken_s < 1.0
