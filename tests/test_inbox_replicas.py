"""Two inbox replicas on one database: a real gate, two real ``hitl-gate inbox serve``
processes on one SQLite file (one public URL, as behind a balancer), the gate dispatching to
the first. What an approver's next request depends on is in the file, so it may reach either
replica: a sign-in page served by one is completed at the other, a challenge is used once
whichever replica sees it, sign-in tries are counted for both, a bulk batch challenged at one
is decided at the other, and items the first received are decided at the second. Each test
on one SQLite file and on one PostgreSQL database (a throwaway server: tests/pg_server.py)."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gate.inbox.pgschema import WRITE_LOCK
from gate.postgres.connection import PgConnection
from tests.inbox_harness import (
    ENV,
    RP_ID,
    Answer,
    InboxClient,
    InboxProcess,
    InboxWorld,
    field_value,
    start_world,
)
from tests.pg_server import inbox_fixtures
from tests.support import CliProcess, free_port, logged, wait_until
from tests.webauthn_soft import SoftAuthenticator

pytestmark = pytest.mark.e2e

inbox_server, inbox_url = inbox_fixtures(scope="module")


@dataclass
class Replicas:
    """The gate and its first inbox (``world``, ``a``: the relay the gate dispatches to)
    and a second inbox ``b`` on the same database and public URL."""

    world: InboxWorld
    a: InboxProcess
    b: InboxProcess

    def client(self, replica: InboxProcess, source: str) -> InboxClient:
        """A client of ``replica`` from loopback address ``source``, at the public origin."""
        return InboxClient(replica.base, self.world.inbox_origin, source)


def second_replica(world: InboxWorld, name: str) -> InboxProcess:
    """Another ``inbox serve`` on a free port with the first's database and public URL."""
    assert world.inbox is not None
    callback = f"http://127.0.0.1:{world.gate_port}/"
    shared = world.inbox.db
    where: dict[str, Any] = {"database": str(shared)}
    if world.inbox.pg_url is not None:
        where = {"storage": {"url": world.inbox.pg_url}}
    replica = InboxProcess(
        world.folder / name, free_port(), callback, public_url=world.inbox_origin, **where
    )
    replica.db = shared
    return replica.start()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, inbox_url: str | None) -> Iterator[Replicas]:
    storage = {} if inbox_url is None else {"storage": {"url": inbox_url}}
    world = start_world(
        tmp_path_factory.mktemp("replicas"), enrol=(101, 102, 103), inbox_config=storage
    )
    try:
        b = second_replica(world, "inbox-b")
    except BaseException:
        world.stop()
        raise
    assert world.inbox is not None
    yield Replicas(world, world.inbox, b)
    b.stop()
    world.stop()


def signin_page(client: InboxClient) -> tuple[str, str]:
    """GET /signin: the page's challenge and its pre-session CSRF token."""
    page = client.get("/signin?next=/recent")
    found = re.search(r'data-challenge="([^"]+)"', page.text)
    assert page.status == 200 and found, page.text
    return found.group(1), field_value(page.text, "csrf")


def post_signin(
    client: InboxClient, csrf: str, passkey: SoftAuthenticator, challenge: str
) -> Answer:
    signed = passkey.assert_(challenge, RP_ID, client.origin)
    return client.post_json("/signin", {"csrf": csrf, "assertion": signed})


def test_inbox_replicas_a_signin_page_of_one_replica_signs_in_at_the_other(pair: Replicas) -> None:
    at_a, at_b = pair.client(pair.a, "127.0.0.11"), pair.client(pair.b, "127.0.0.11")
    challenge, csrf = signin_page(at_a)
    at_b.cookies = dict(at_a.cookies)  # one browser: the pre-session cookie goes along

    answer = post_signin(at_b, csrf, pair.world.passkeys[101], challenge)

    assert (answer.status, answer.json()) == (200, {"location": "/recent"}), answer.text
    at_a.cookies = dict(at_b.cookies)
    for client in (at_a, at_b):  # the session is one row of the file: both know it
        home = client.get("/")
        assert home.status == 200 and "alice@example.com" in home.text, home.text
    assert pair.a.rows("SELECT * FROM challenges WHERE challenge = ?", challenge) == []


def test_inbox_replicas_a_passkey_enrolled_now_is_served_at_the_replica_that_did_not_see_it(
    pair: Replicas,
) -> None:
    """A passkey enrolled after both replicas fetched the credentials signs in at A (which
    asks the gate for the unknown id); B, whose copy is up to a minute old, serves the
    session's first request: an unknown credential makes it ask the gate before it ends the
    session as revoked."""
    kept = pair.world.passkeys[103]
    passkey = pair.world.enrol(103)  # carol's second passkey, unknown to both replicas
    pair.world.passkeys[103] = kept
    at_a, at_b = pair.client(pair.a, "127.0.0.13"), pair.client(pair.b, "127.0.0.13")
    assert at_a.signin(passkey).status == 200
    at_b.cookies = dict(at_a.cookies)

    home = at_b.get("/")

    assert home.status == 200 and "carol@example.com" in home.text, (home.status, home.text)
    assert "event=inbox_session_ended" not in pair.b.log()
    ended = pair.a.rows("SELECT ended FROM sessions WHERE identity = 'carol@example.com'")
    assert [r["ended"] for r in ended] == [None]
    assert at_a.get("/").status == 200


def test_inbox_replicas_a_challenge_used_at_one_replica_is_refused_at_the_other(
    pair: Replicas,
) -> None:
    at_a, at_b = pair.client(pair.a, "127.0.0.12"), pair.client(pair.b, "127.0.0.12")
    challenge, csrf = signin_page(at_a)
    at_b.cookies = dict(at_a.cookies)
    passkey = pair.world.passkeys[102]
    sessions = len(pair.a.rows("SELECT * FROM sessions WHERE identity = 'bob@example.com'"))

    first = post_signin(at_a, csrf, passkey, challenge)
    again = post_signin(at_b, csrf, passkey, challenge)

    assert first.status == 200, first.text
    assert (again.status, again.json()["reason"]) == (401, "challenge_unknown"), again.text
    assert "hitl_inbox" not in at_b.cookies
    after = pair.a.rows("SELECT * FROM sessions WHERE identity = 'bob@example.com'")
    assert len(after) == sessions + 1


def both_at_once(pair: Replicas, n: int) -> list[int]:
    """One sign-in page's challenge, signed by bob, POSTed to both replicas at once (from
    addresses of round ``n``); the two statuses, sorted."""
    at_a = pair.client(pair.a, f"127.0.0.{20 + n}")
    at_b = pair.client(pair.b, f"127.0.0.{30 + n}")
    challenge, csrf = signin_page(at_a)
    at_b.cookies = dict(at_a.cookies)
    bodies = {
        c.base: {
            "csrf": csrf,
            "assertion": pair.world.passkeys[102].assert_(challenge, RP_ID, c.origin),
        }
        for c in (at_a, at_b)
    }
    barrier, answers = threading.Barrier(2), {}

    def send(client: InboxClient) -> None:
        barrier.wait(10)
        answers[client.base] = client.post_json("/signin", bodies[client.base])

    threads = [threading.Thread(target=send, args=(c,)) for c in (at_a, at_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return sorted(a.status for a in answers.values())


def test_inbox_replicas_one_challenge_sent_to_both_at_once_signs_in_once(pair: Replicas) -> None:
    rounds = [both_at_once(pair, n) for n in range(4)]  # each round from its own addresses

    assert rounds == [[200, 401]] * 4


def test_inbox_replicas_signin_tries_at_one_replica_count_at_the_other(pair: Replicas) -> None:
    at_a, at_b = pair.client(pair.a, "127.0.0.40"), pair.client(pair.b, "127.0.0.40")
    for _ in range(10):
        assert at_a.signin(SoftAuthenticator()).status == 401  # unknown passkeys

    answer = at_b.signin(pair.world.passkeys[101])

    assert (answer.status, answer.json()["reason"]) == (429, "rate_limited"), answer.text
    retry = answer.header("Retry-After")
    assert retry is not None and 0 < int(retry) <= 300, retry


def test_inbox_replicas_failed_tries_of_a_passkey_at_one_replica_count_at_the_other(
    pair: Replicas,
) -> None:
    carol = pair.world.passkeys[103]
    for n in range(10):  # each from another address: only carol's passkey is counted
        wrong = pair.client(pair.a, f"127.0.0.{50 + n}")
        assert wrong.signin(carol, origin="http://evil.example").status == 401

    answer = pair.client(pair.b, "127.0.0.60").signin(carol)

    assert (answer.status, answer.json()["reason"]) == (429, "rate_limited"), answer.text


def request(world: InboxWorld, draft: str) -> CliProcess:
    assert world.gate is not None
    return CliProcess(
        "request", "-c", str(world.gate.config), "--api-url", world.gate.api_url,
        "--pipeline", "p", "--step", "q1", "--draft", draft, "--wait", env=ENV,
    )  # fmt: skip


def pending_ids(replica: InboxProcess, drafts: set[str]) -> dict[str, str]:
    """Wait until the file holds a pending item for each draft; draft -> approval id."""

    def found() -> dict[str, str] | None:
        rows = replica.rows("SELECT approval_id, dispatch FROM items WHERE state = 'pending'")
        bodies = {json.loads(r["dispatch"])["draft"]["body"]: r["approval_id"] for r in rows}
        return bodies if drafts <= set(bodies) else None

    got = wait_until(found, timeout=90, what=f"inbox items of {sorted(drafts)}")
    return {d: got[d] for d in drafts}


def test_inbox_replicas_a_batch_challenged_at_one_replica_is_decided_at_the_other(
    pair: Replicas,
) -> None:
    drafts = {f"replica batch {n}" for n in range(3)}
    pipelines = {d: request(pair.world, d) for d in drafts}
    ids = pending_ids(pair.a, drafts)
    at_a, at_b = pair.client(pair.a, "127.0.0.70"), pair.client(pair.b, "127.0.0.70")
    assert at_a.signin(pair.world.passkeys[101]).status == 200
    at_b.cookies = dict(at_a.cookies)
    page = at_b.get("/")  # the items the gate dispatched to A, listed by B
    shown = dict(re.findall(r'name="item:([^"]+)" value="(\d+)"', page.text))
    assert set(ids.values()) <= set(shown), page.text
    fields = {"csrf": field_value(page.text, "csrf")}
    fields |= {f"item:{i}": shown[i] for i in sorted(ids.values())}
    got = at_a.post_json("/bulk/challenge", fields)
    assert got.status == 200, got.text
    signed = pair.world.passkeys[101].assert_(got.json()["challenge"], RP_ID, at_a.origin)
    # bob approves one in between: decide must post the batch as signed (the gate says so),
    # which only the kept batch allows (checked again, the batch would be refused whole)
    bob = pair.client(pair.b, "127.0.0.71")
    assert bob.signin(pair.world.passkeys[102]).status == 200
    raced = ids["replica batch 1"]
    assert bob.decide(raced, pair.world.passkeys[102]).status == 200
    pair.a.wait_item(raced, lambda r: r["state"] == "resolved")
    live = at_b.get("/live?since=0").json()  # the notice reached A; B reports the change
    assert [raced, "resolved"] in live["changed"], live

    done = at_b.post_json("/bulk/decide", {**fields, "assertion": signed})

    assert done.status == 200, done.text
    results = at_a.get(done.json()["location"]).text
    assert "<h1>2 of 3 approved</h1>" in results, results
    assert "The approval was already resolved; nothing was recorded." in results
    for proc in pipelines.values():
        assert proc.finish()[0] == 0
    assert pair.a.rows("SELECT * FROM bulk_batches") == []  # taken by its decide
    recorded = pair.world.gate_rows("SELECT approval_id, operator_id FROM decisions")
    mine = {(r["approval_id"], r["operator_id"]) for r in recorded if r["approval_id"] in shown}
    assert mine == {(i, 102 if i == raced else 101) for i in ids.values()}


def write(replica: InboxProcess, sql: str, *args: object) -> None:
    """One statement on the inbox's database from the test's own connection."""
    if replica.pg_url is not None:
        import psycopg  # noqa: PLC0415 - only on PostgreSQL

        with psycopg.connect(replica.pg_url, autocommit=True) as driver:
            PgConnection(driver).execute(sql, args)
        return
    conn = sqlite3.connect(replica.db, isolation_level=None, timeout=30)
    try:
        conn.execute(sql, args)
    finally:
        conn.close()


@contextlib.contextmanager
def write_lock_held(replica: InboxProcess) -> Iterator[None]:
    """Hold the inbox's write lock from the test's own connection, as another inbox writing
    for too long would: the file's (BEGIN IMMEDIATE), or PostgreSQL's advisory lock."""
    if replica.pg_url is not None:
        import psycopg  # noqa: PLC0415 - only on PostgreSQL

        with psycopg.connect(replica.pg_url, autocommit=True) as driver:
            driver.execute("BEGIN")
            driver.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            try:
                yield
            finally:
                driver.execute("ROLLBACK")
        return
    holder = sqlite3.connect(replica.db, isolation_level=None, timeout=30)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.mark.slow
def test_inbox_replicas_a_write_lock_held_past_the_busy_timeout_is_a_503_in_words(
    pair: Replicas,
) -> None:
    client = pair.client(pair.b, "127.0.0.80")
    _, csrf = signin_page(client)
    with write_lock_held(pair.a):
        page = client.get("/signin")  # a sign-in page writes its challenge
        posted = client.post_json("/signin", {"csrf": csrf, "assertion": {}})  # counts a try
        for replica in (pair.a, pair.b):  # each one's sweep failed, and goes on
            logged(replica, "event=inbox_sweep_failed")
    expired = ("h-expired", "carol@example.com", 103, "c", "t", 1, 2)
    write(pair.a, "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, NULL)", *expired)

    assert (page.status, page.header("Retry-After")) == (503, "5"), page.text
    assert "Try again in a moment" in page.text
    assert (posted.status, posted.json()["reason"]) == (503, "database_unavailable"), posted.text
    assert "Traceback" not in pair.a.log() + pair.b.log()
    wait_until(lambda: not pair.a.rows("SELECT * FROM sessions WHERE id_hash = 'h-expired'"))
    assert client.get("/signin").status == 200
    logged(pair.b, "event=inbox_database_unavailable path=/signin")
