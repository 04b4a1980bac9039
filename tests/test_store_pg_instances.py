"""The gates' own rows (gate/store/pg_instances.py) on a real throwaway PostgreSQL server: a
heartbeat keeps the start time, a gate that stopped beating is no longer live, a clock off
the database's is measured and reported for that gate only, and live gates with different
config hashes are ``config_divergent``."""

from __future__ import annotations

import dataclasses
import time

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


def test_pg_instances_assess_names_divergent_configs_and_the_askers_skew() -> None:
    same = [gate("A"), gate("B")]
    assert assess("A", same).problems == ()

    divergent = assess("A", [gate("A"), gate("B", config_hash="beef")])
    assert divergent.problems == (CONFIG_DIVERGENT,)
    assert divergent.details == (
        "live gates run different configs: config beef on B; config c0ffee on A",
    )

    skewed = [gate("A"), gate("B", offset_ms=-90_000)]
    assert assess("A", skewed).problems == ()  # B's clock is B's problem
    on_b = assess("B", skewed)
    assert on_b.problems == (CLOCK_SKEW,)
    assert on_b.details == ("clock off the database's by more than 5 s: B (host-1) -90.0 s",)
    assert assess(None, skewed).problems == (CLOCK_SKEW,)  # doctor: any live gate
