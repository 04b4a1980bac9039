"""The inbox's short-lived state in its database (gate/inbox/shortlived.py): two
``InboxDb`` connections on one file stand for two inbox replicas on one host. A challenge
issued by one is taken by the other once; tries counted by either limit both; a batch kept
by one is taken by the other once; what is past its time is refused and pruned; two inboxes
opening a fresh file at once migrate it once. Real files, no process; each test on SQLite and
on PostgreSQL (a throwaway server: tests/pg_server.py), where two connections stand for two
replicas on any hosts."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gate.inbox.db import DatabaseUnavailable, InboxDb
from gate.inbox.pgschema import VERSIONS
from gate.inbox.schema import MIGRATIONS
from gate.inbox.shortlived import (
    CHALLENGE_TTL_MS,
    TRY_LIMIT,
    TRY_WINDOW_MS,
    Pending,
    ShortLived,
)
from gate.postgres.target import PgTarget
from tests.inbox_harness import rows
from tests.pg_server import PgServer, inbox_fixtures, psycopg_or_skip

inbox_server, inbox_url = inbox_fixtures()

ITEMS = [("a1", 2, "n1", "sha256:01"), ("a2", 1, "n2", "sha256:02")]


@pytest.fixture
def where(tmp_path: Path, inbox_url: str | None) -> Path | PgTarget:
    """The inbox's database: a file, or an empty PostgreSQL database."""
    return tmp_path / "inbox.db" if inbox_url is None else PgTarget(inbox_url)


@pytest.fixture
async def replicas(where: Path | PgTarget) -> AsyncIterator[tuple[ShortLived, ShortLived]]:
    """Two replicas' views of one inbox database, each on its own connection and thread."""
    first, second = await InboxDb.open(where), await InboxDb.open(where)
    yield ShortLived(first), ShortLived(second)
    await first.close()
    await second.close()


def count(where: Path | PgTarget, table: str) -> int:
    found = rows(
        where.url if isinstance(where, PgTarget) else where, f"SELECT COUNT(*) FROM {table}"
    )
    return int(found[0][0])


async def test_shortlived_a_challenge_issued_by_one_replica_is_taken_by_the_other_once(
    replicas: tuple[ShortLived, ShortLived],
) -> None:
    a, b = replicas
    challenge = await a.issue_challenge("pre-hash", "/recent", 1_000, "10.0.0.1")
    assert challenge is not None

    taken = await b.take_challenge(challenge, 2_000)
    again = [await a.take_challenge(challenge, 2_000), await b.take_challenge(challenge, 2_000)]

    assert taken == Pending("pre-hash", "/recent", 1_000, "10.0.0.1")
    assert again == [None, None]


async def test_shortlived_a_challenge_taken_by_both_replicas_at_once_goes_to_one(
    replicas: tuple[ShortLived, ShortLived],
) -> None:
    a, b = replicas
    issued = [await a.issue_challenge(f"pre-{n}", "/", 1_000, "10.0.0.1") for n in range(40)]

    for challenge in issued:
        assert challenge is not None
        got = await asyncio.gather(
            a.take_challenge(challenge, 2_000), b.take_challenge(challenge, 2_000)
        )
        assert sorted(g is not None for g in got) == [False, True], challenge


async def test_shortlived_what_is_past_its_time_is_refused_and_pruned(
    where: Path | PgTarget, replicas: tuple[ShortLived, ShortLived]
) -> None:
    a, b = replicas
    late = await a.issue_challenge("pre-late", "/", 1_000)
    assert late is not None and await a.issue_challenge("pre-kept", "/", 1_000) is not None
    await a.keep_batch("k1", ITEMS, 5_000, 1_000, 10)
    await a.keep_batch("k2", ITEMS, 5_000, 1_000, 10)
    await a.count_try("address", "10.0.0.1", 1_000)
    end = 1_000 + max(CHALLENGE_TTL_MS, TRY_WINDOW_MS)

    refused = [await b.take_challenge(late, end), await b.take_batch("k1", end)]
    await b.prune(end)

    assert refused == [None, None]
    for table in ("challenges", "bulk_batches", "signin_tries"):
        assert count(where, table) == 0, table


async def test_shortlived_a_new_page_replaces_only_its_own_challenge(
    replicas: tuple[ShortLived, ShortLived],
) -> None:
    a, b = replicas
    mine = await a.issue_challenge("pre-mine", "/", 1_000, "10.0.0.1")
    other = await a.issue_challenge("pre-other", "/", 1_000, "10.0.0.2")

    fresh = await b.issue_challenge("pre-new", "/", 1_100, "10.0.0.1", replaces="pre-other")
    newer = await b.issue_challenge("pre-newer", "/", 1_200, "10.0.0.1", replaces="pre-mine")

    assert mine is not None and other is not None and fresh is not None and newer is not None
    assert await a.take_challenge(mine, 1_300) is None  # replaced by its own page
    assert await a.take_challenge(other, 1_300) is not None  # another address's: kept


async def test_shortlived_tries_counted_by_either_replica_limit_both(
    replicas: tuple[ShortLived, ShortLived],
) -> None:
    a, b = replicas
    for n in range(TRY_LIMIT):
        assert await (a if n % 2 else b).count_try("address", "10.0.0.1", 10_000 + n) == 0

    refused = await b.count_try("address", "10.0.0.1", 20_000)
    blocked = await a.blocked_for("address", "10.0.0.1", 20_000)
    other = await a.count_try("address", "10.0.0.2", 20_000)
    credential = await a.blocked_for("credential", "10.0.0.1", 20_000)
    later = await b.count_try("address", "10.0.0.1", 10_000 + TRY_WINDOW_MS)

    assert refused == blocked == (TRY_WINDOW_MS - 10_000) // 1000 + 1  # until the first leaves
    assert (other, credential, later) == (0, 0, 0)


async def test_shortlived_a_refused_try_is_not_counted(
    replicas: tuple[ShortLived, ShortLived],
) -> None:
    a, b = replicas
    for n in range(TRY_LIMIT):
        await a.count_try("credential", "c1", n)
    for _ in range(5):
        assert await b.count_try("credential", "c1", TRY_WINDOW_MS - 1) > 0

    assert await b.count_try("credential", "c1", TRY_WINDOW_MS) == 0  # the first left the window


async def test_shortlived_a_batch_kept_by_one_replica_is_taken_by_the_other_once(
    replicas: tuple[ShortLived, ShortLived],
) -> None:
    a, b = replicas
    await a.keep_batch("k1", ITEMS, 5_000, 1_000, 10)

    taken = await b.take_batch("k1", 2_000)
    again = await a.take_batch("k1", 2_000)

    assert taken == ITEMS
    assert again is None


async def test_shortlived_a_full_batch_store_drops_the_one_expiring_first(
    replicas: tuple[ShortLived, ShortLived],
) -> None:
    a, b = replicas
    await a.keep_batch("k1", ITEMS[:1], 5_000, 1_000, 2)
    await b.keep_batch("k2", ITEMS[1:], 6_000, 1_100, 2)
    await b.keep_batch("k1", ITEMS, 7_000, 1_200, 2)  # the same key again: replaced, no drop
    await a.keep_batch("k3", ITEMS, 8_000, 1_300, 2)

    kept = {key: await b.take_batch(key, 1_400) for key in ("k1", "k2", "k3")}

    assert kept == {"k1": ITEMS, "k2": None, "k3": ITEMS}


async def test_shortlived_two_inboxes_opening_a_fresh_database_at_once_migrate_it_once(
    tmp_path: Path, inbox_url: str | None
) -> None:
    path = tmp_path / "fresh" / "inbox.db"
    fresh: Path | PgTarget = path if inbox_url is None else PgTarget(inbox_url)

    opened = await asyncio.gather(*(InboxDb.open(fresh) for _ in range(4)))

    for db in opened:
        await db.close()
    if inbox_url is not None:
        assert [tuple(r) for r in rows(inbox_url, f"SELECT version, step FROM {VERSIONS}")] == [
            (len(MIGRATIONS), 0)
        ]
        return
    conn = sqlite3.connect(path)
    try:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()
    assert version == len(MIGRATIONS)


@pytest.mark.postgres
@pytest.mark.e2e
async def test_shortlived_a_database_holding_the_gate_s_tables_is_refused(
    inbox_server: PgServer,
) -> None:
    psycopg_or_skip()
    url = inbox_server.migrated_database()  # the gate's schema

    with pytest.raises(OSError) as refused:
        await InboxDb.open(PgTarget(url))

    assert str(refused.value) == (
        f"{url} holds the gate's tables; give the inbox a database (or a schema,"
        " options=-csearch_path=...) of its own"
    )
    assert rows(url, "SELECT to_regclass('inbox_migrations')")[0][0] is None  # untouched


@pytest.mark.postgres
@pytest.mark.e2e
async def test_shortlived_an_inbox_on_postgresql_connects_again_after_the_server_restarts(
    inbox_server: PgServer,
) -> None:
    psycopg_or_skip()
    db = await InboxDb.open(PgTarget(inbox_server.empty_database("inbox")))
    short = ShortLived(db)
    try:
        challenge = await short.issue_challenge("pre-restart", "/", 1_000)
        assert challenge is not None
        inbox_server.restart()  # a crash: every session ends

        with pytest.raises(DatabaseUnavailable):  # the call that finds the session gone
            await short.take_challenge(challenge, 2_000)
        taken = await short.take_challenge(challenge, 2_000)  # on a new connection
    finally:
        await db.close()

    assert taken == Pending("pre-restart", "/", 1_000)
