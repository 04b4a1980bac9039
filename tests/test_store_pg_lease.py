"""Leases among gates (gate/store/pg_lease.py) on a real throwaway PostgreSQL server: one
holder among contenders claiming at once, renewal keeps the term, a release hands over at
once, and a holder killed with -9 (a real process) is replaced once its lease lapses on the
database's clock, in a new term."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from gate.store.pg_lease import TIMERS, claim, current, release
from gate.store.pg_session import close_quietly, connect
from tests.pg_server import pg_fixtures, psycopg_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()

TTL_MS = 2000


server, url = pg_fixtures()


async def test_pg_lease_has_one_holder_among_contenders_claiming_at_once(url: str) -> None:
    conns = [await connect(url, "lease", f"gate-{n}") for n in range(6)]
    try:
        terms = await asyncio.gather(
            *(claim(conn, TIMERS, f"gate-{n}", TTL_MS) for n, conn in enumerate(conns))
        )
        held = [term for term in terms if term is not None]
        assert len(held) == 1
        assert held[0].term == 1
        assert held[0].expires_at == held[0].elected_at + TTL_MS
        assert await current(conns[0], TIMERS) is not None
    finally:
        for conn in conns:
            await close_quietly(conn)


async def test_pg_lease_renewed_by_its_holder_keeps_its_term(url: str) -> None:
    conn = await connect(url, "lease", "a")
    try:
        first = await claim(conn, TIMERS, "a", TTL_MS)
        assert first is not None
        again = await claim(conn, TIMERS, "a", TTL_MS)
        assert again is not None
        assert (again.term, again.elected_at) == (first.term, first.elected_at)
        assert again.expires_at >= first.expires_at
        assert await claim(conn, TIMERS, "b", TTL_MS) is None
    finally:
        await close_quietly(conn)


async def test_pg_lease_released_is_claimed_by_the_next_gate_in_a_new_term(url: str) -> None:
    conn = await connect(url, "lease", "a")
    try:
        first = await claim(conn, TIMERS, "a", 60_000)
        assert first is not None
        assert await release(conn, TIMERS, "b") is False  # not b's to give up
        assert await release(conn, TIMERS, "a") is True
        taken = await claim(conn, TIMERS, "b", 60_000)
        assert taken is not None
        # a released lease has lapsed: the next holder counts on from its term
        assert (taken.holder, taken.term) == ("b", first.term + 1)
    finally:
        await close_quietly(conn)


async def test_pg_lease_term_only_grows_through_lapses_and_releases_by_one_holder(
    url: str,
) -> None:
    conn = await connect(url, "lease", "solo")
    try:
        await release(conn, TIMERS, "a")  # whatever an earlier test left
        await release(conn, TIMERS, "b")
        terms = []
        for step in range(3):
            held = await claim(conn, TIMERS, "solo", 50)
            assert held is not None
            terms.append(held.term)
            if step == 0:  # let it lapse (database clock), then reclaim it
                deadline = time.monotonic() + 5
                while (now := await current(conn, TIMERS)) and now.expires_at > now.now:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.01)
            else:
                assert await release(conn, TIMERS, "solo") is True
                assert await release(conn, TIMERS, "solo") is False  # no longer held
        assert terms == [terms[0], terms[0] + 1, terms[0] + 2]
        after = await current(conn, TIMERS)
        assert after is not None and after.expires_at <= after.now  # released: lapsed, kept
    finally:
        await close_quietly(conn)


HOLDER = """
import asyncio, sys
from gate.store.pg_lease import claim
from gate.store.pg_session import connect

async def main(url):
    conn = await connect(url, "lease", "killed")
    while True:
        term = await claim(conn, "timers", "killed", {ttl})
        print("held" if term else "not held", flush=True)
        await asyncio.sleep(0.3)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.slow
async def test_pg_lease_of_a_killed_holder_is_taken_over_within_its_ttl(url: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(ttl=TTL_MS), url],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    conn = await connect(url, "lease", "survivor")
    try:
        assert holder.stdout is not None
        assert await asyncio.to_thread(holder.stdout.readline) == "held\n"
        assert await claim(conn, TIMERS, "survivor", TTL_MS) is None
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        left = await current(conn, TIMERS)  # as the killed holder last renewed it
        killed_at = time.monotonic()
        taken = None
        while taken is None and time.monotonic() - killed_at < 10:
            taken = await claim(conn, TIMERS, "survivor", TTL_MS)
            await asyncio.sleep(0.05)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
        await close_quietly(conn)
    assert left is not None and taken is not None
    assert left.holder == "killed"
    assert left.expires_at - left.now <= TTL_MS  # it lapses within the TTL of the kill
    assert (taken.holder, taken.term) == ("survivor", 2)
    # taken as soon as it lapsed, on the database's clock (the next try: 50 ms apart)
    assert left.expires_at <= taken.elected_at < left.expires_at + 1000
