"""The gates' own rows (gate/store/pg_instances.py) on a real throwaway PostgreSQL server: a
heartbeat keeps the start time, a gate that stopped beating is no longer live, a clock off
the database's is measured and reported for that gate only, and live gates with different
config hashes are ``config_divergent``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import pytest

from gate.store.pg_instances import (
    CLOCK_SKEW,
    CONFIG_DIVERGENT,
    LIVE_MS,
    Instance,
    assess,
    beat,
    clock_offset_ms,
    leave,
    live,
)
from gate.store.pg_session import close_quietly, connect
from tests.pg_server import pg_fixtures, psycopg_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()


server, url = pg_fixtures()


def gate(instance_id: str, config_hash: str = "c0ffee", offset_ms: int = 0) -> Instance:
    return Instance(instance_id, "0.1.0", config_hash, "host-1", 4242, offset_ms, 0, 0)


def system_ms() -> int:
    return int(time.time() * 1000)


async def test_pg_instances_heartbeat_keeps_the_start_and_moves_the_beat(url: str) -> None:
    conn = await connect(url, "cluster", "A")
    try:
        await beat(conn, gate("A"))
        (first,) = await live(conn)
        await beat(conn, dataclasses.replace(gate("A"), pid=4343))
        (again,) = await live(conn)
    finally:
        await close_quietly(conn)
    assert first.instance_id == "A"
    assert abs(first.started_at - system_ms()) < 60_000  # the database's clock, near ours
    assert again.started_at == first.started_at
    assert again.heartbeat_at >= first.heartbeat_at
    assert again.pid == 4343


async def test_pg_instances_without_a_recent_heartbeat_are_not_live(url: str) -> None:
    conn = await connect(url, "cluster", "A")
    try:
        await beat(conn, gate("A"))
        await beat(conn, gate("B"))
        await conn.execute(
            "UPDATE gate_instances SET heartbeat_at = heartbeat_at - %s WHERE instance_id = 'B'",
            (LIVE_MS + 1000,),
        )
        await beat(conn, gate("C"))
        await leave(conn, "C")
        names = [g.instance_id for g in await live(conn)]
    finally:
        await close_quietly(conn)
    assert names == ["A"]


async def test_pg_instances_clock_offset_is_measured_against_the_database(url: str) -> None:
    conn = await connect(url, "cluster", "A")
    try:
        near = await clock_offset_ms(conn, system_ms)
        ahead = await clock_offset_ms(conn, lambda: system_ms() + 90_000)
    finally:
        await close_quietly(conn)
    assert abs(near) < 1000  # the server runs on this host's clock
    assert 89_000 < ahead < 91_000


def stalled(first: int, delay_ms: int = 20_000) -> Callable[[], int]:
    """This host's clock for ``clock_offset_ms`` whose first ``first`` readings each waited
    ``delay_ms`` on their way to the server (a network stall that ends as the query goes
    through): each such reading's start lies ``delay_ms`` in the past."""
    calls = 0

    def local_ms() -> int:
        nonlocal calls
        calls += 1
        before = calls % 2 == 1  # the reading's start; its end is read after the answer
        return system_ms() - (delay_ms if before and (calls + 1) // 2 <= first else 0)

    return local_ms


async def test_pg_instances_clock_offset_reads_again_after_a_stalled_round_trip(
    url: str,
) -> None:
    """A reading whose round trip took 20 s says nothing better than "within 10 s": measured
    against its midpoint it made a gate on the database's own clock 10 s off, so /healthz
    answered 503 ``clock_skew`` after every stall between a gate and PostgreSQL (found by
    the cluster soak's cut-off gate). Such a reading is taken again; when none is prompt the
    offset is unknown (None) and the gate keeps the one it had."""
    conn = await connect(url, "cluster", "A")
    try:
        once = await clock_offset_ms(conn, stalled(first=1))
        always = await clock_offset_ms(conn, stalled(first=99))
    finally:
        await close_quietly(conn)
    assert once is not None and abs(once) < 1000
    assert always is None


def test_pg_instances_assess_names_divergent_configs_and_the_askers_skew() -> None:
    same = [gate("A"), gate("B")]
    assert assess("A", same).problems == ()

    divergent = assess("A", [gate("A"), gate("B", config_hash="beef")])
    assert divergent.problems == (CONFIG_DIVERGENT,)
    assert divergent.details == (
        "live gates run different configs: config beef on B (host-1 pid 4242);"
        " config c0ffee on A (host-1 pid 4242)",
    )

    skewed = [gate("A"), gate("B", offset_ms=-90_000)]
    assert assess("A", skewed).problems == ()  # B's clock is B's problem
    on_b = assess("B", skewed)
    assert on_b.problems == (CLOCK_SKEW,)
    assert on_b.details == (
        "clock off the database's by more than 5 s: B (host-1 pid 4242) -90.0 s",
    )
    assert assess(None, skewed).problems == (CLOCK_SKEW,)  # doctor: any live gate
