"""The change feed (gate/store/pg_feed.py) on a real throwaway PostgreSQL server: entries
another session appends, moving the chain's head (whose trigger notifies), reach the feed at
once (not by its fallback read); a head moved in a transaction rolled back notifies nobody;
entries appended while its listener session is terminated (``pg_terminate_backend``) are
read after it reconnects, none lost, none twice; a long log is read in pages, in order."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from gate.postgres.connection import PgConnection
from gate.store.pg_feed import PAGE, Change, Feed
from tests.pg_server import pg_fixtures, psycopg_or_skip

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg: Any = psycopg_or_skip()

DEADLINE_S = 10.0


server, url = pg_fixtures()


def append(
    url: str,
    kinds: list[tuple[str, str | None]] | list[tuple[str, str | None, str]],
    *,
    notified: bool = True,
) -> int:
    """Append entries of ``kinds`` (kind, request id and, optionally, the entry's JSON, else
    ``{}``) to the audit log in one transaction, as a writer's batch does (not hashed: the
    feed reads seq, kind, id and a decision's effect only), and move
    the chain's head to the last as the batch does (its trigger notifies), unless not
    ``notified``; return the last seq."""
    with psycopg.connect(url, autocommit=True) as raw:
        conn = PgConnection(raw)
        conn.execute("BEGIN")
        (last,) = conn.execute("SELECT coalesce(max(seq), 0) FROM audit_log").fetchone() or (0,)
        for kind, request_id, *entry in kinds:
            last += 1
            conn.execute(
                "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, entry_hash,"
                " receipt) VALUES (?, ?, ?, ?, '', '', '')",
                (last, request_id, kind, entry[0] if entry else "{}"),
            )
        if notified:
            conn.execute("UPDATE audit_head SET seq = ?, entry_hash = 'h' WHERE id = 1", (last,))
        conn.execute("COMMIT")
    return int(last)


class Seen:
    """What a feed reported, and an event per new report."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.changed = asyncio.Event()

    def __call__(self, changes: list[Change]) -> None:
        self.changes += changes
        self.changed.set()

    async def until(self, count: int) -> float:
        """Wait until ``count`` changes were seen; return the seconds it took."""
        started = time.monotonic()
        while len(self.changes) < count:
            self.changed.clear()
            async with asyncio.timeout(DEADLINE_S):
                await self.changed.wait()
        return time.monotonic() - started


async def running(feed: Feed) -> asyncio.Task[None]:
    task = asyncio.create_task(feed.run())
    async with asyncio.timeout(DEADLINE_S):
        await feed.connected.wait()
    return task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_pg_feed_reports_a_notified_append_at_once_and_not_what_was_there(
    url: str,
) -> None:
    append(url, [("created", "OLD")])
    seen = Seen()
    feed = Feed(url, "gate-a", seen, poll_s=60.0)  # only a notification can wake it soon
    task = await running(feed)
    try:
        await asyncio.to_thread(
            append, url, [("created", "A1"), ("decision", "A1"), ("resolved", "A1")]
        )
        waited = await seen.until(3)
    finally:
        await stopped(task)
    assert waited < 1.0
    assert seen.changes == [
        Change(2, "created", "A1"),
        Change(3, "decision", "A1"),
        Change(4, "resolved", "A1"),
    ]
    assert feed.notified >= 1


async def test_pg_feed_hears_nothing_of_a_rolled_back_batch_or_an_unmoved_head(
    url: str,
) -> None:
    seen = Seen()
    feed = Feed(url, "gate-r", seen, poll_s=60.0)
    task = await running(feed)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("BEGIN")
            conn.execute("UPDATE audit_head SET seq = 5 WHERE id = 1")
            conn.execute("ROLLBACK")
            conn.execute("UPDATE audit_head SET last_at_ms = last_at_ms WHERE id = 1")  # probe
        await asyncio.sleep(0.5)
        assert feed.notified == 0
        await asyncio.to_thread(append, url, [("created", "R1")])
        await seen.until(1)
    finally:
        await stopped(task)
    assert feed.notified == 1


async def test_pg_feed_catches_up_after_its_listener_was_terminated(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gate.store.pg_feed")
    seen = Seen()
    feed = Feed(url, "gate-b", seen, poll_s=0.5)
    task = await running(feed)
    try:
        with psycopg.connect(url, autocommit=True) as admin:
            (ended,) = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'hitl-gate/listener/gate-b'"
            ).fetchone()
        assert ended == 1
        # appended while the listener is gone, without a notification: only the read after
        # the reconnection and the polling can find them
        await asyncio.to_thread(append, url, [("resolved", "B1")], notified=False)
        await asyncio.to_thread(append, url, [("question_revised", "Q1")], notified=False)
        waited = await seen.until(2)
    finally:
        await stopped(task)
    assert seen.changes == [Change(1, "resolved", "B1"), Change(2, "question_revised", "Q1")]
    assert waited < 0.5 + 1.0 + 1.0  # a poll, the reconnection's pause, a margin
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("event=listen_lost") for m in messages)
    assert "event=listen_reconnected cursor=0" in messages


async def test_pg_feed_reads_a_long_log_in_pages_in_order(url: str) -> None:
    seen = Seen()
    feed = Feed(url, "gate-c", seen, poll_s=0.2)
    task = await running(feed)
    try:
        count = PAGE * 2 + 5
        await asyncio.to_thread(append, url, [("created", f"R{n}") for n in range(count)])
        await seen.until(count)
    finally:
        await stopped(task)
    assert [c.seq for c in seen.changes] == list(range(1, count + 1))
    assert feed.cursor == count
