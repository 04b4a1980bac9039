"""The inbox's change counter with several replicas on one PostgreSQL database receiving at
once: three real ``hitl-gate inbox serve`` processes on one database (a throwaway server:
tests/pg_server.py), signed dispatches, re-sends of the same dispatch to two replicas at the
same moment, new revisions and resolution notices (what a decision does to an item) posted
to all three concurrently. Every item is stored once, every ``updated_seq`` is unique, and
the inbox's own reader (``InboxDb.changes_since``, what ``/live`` answers from), polling
the database all the while, sees each change once, in strictly increasing ``updated_seq``
order, and misses none: a write that committed after the reader had passed its seq would
be lost to every open page. Then approvers decide at three replicas at once, a real gate
behind them, with the same checks."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gate.inbox.db import InboxDb
from gate.inbox.model import Change
from gate.postgres.target import PgTarget
from gate.protocol.canonical import payload_hash, wire_json
from gate.protocol.envelope import build_dispatch
from gate.protocol.followup import build_notice
from tests.inbox_harness import InboxClient, InboxProcess, InboxWorld, start_world
from tests.pg_server import PgServer, psycopg_or_skip, running_server
from tests.support import free_port, http_request, sign_headers
from tests.test_inbox_replicas import second_replica
from tests.test_protocol import dispatch_kwargs

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()

REPLICAS = 3
GROUPS = 3  # each group's items are posted by two threads, each to another replica
ITEMS = 30  # per group
POLL_S = 0.005
DECIDED = 12  # approvals decided by three approvers at three replicas at once


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory, server: PgServer) -> Iterator[list[Any]]:
    """Three inbox replicas on one new database (the first one migrates it)."""
    url = server.empty_database("inbox")
    folder = tmp_path_factory.mktemp("pg-changes")
    gate = f"http://127.0.0.1:{free_port()}/"  # no gate: nothing here is decided through it
    started: list[InboxProcess] = []
    try:
        for index in range(REPLICAS):
            replica = InboxProcess(folder / f"r{index}", free_port(), gate, storage={"url": url})
            started.append(replica.start())
        yield started
    finally:
        for replica in started:
            replica.stop()


def dispatch(approval_id: str, revision: int, expires_at_ms: int) -> bytes:
    """A dispatch of ``approval_id`` at ``revision`` as the gate signs it (a fresh nonce)."""
    body = f"Pay {revision} EUR ({approval_id})"
    return wire_json(
        build_dispatch(
            **dispatch_kwargs(
                approval_id=approval_id,
                run_id=f"run-{approval_id}",
                expires_at_ms=expires_at_ms,
                payload_hash=payload_hash(body),
                body=body,
                nonce=secrets.token_hex(16),
                revision=revision,
            )
        )
    )


def notice(approval_id: str, revision: int) -> bytes:
    """The resolution notice the gate sends when a decision approves ``approval_id``."""
    body = f"Pay {revision} EUR ({approval_id})"
    return wire_json(
        build_notice(
            approval_id=approval_id,
            run_id=f"run-{approval_id}",
            pipeline="p",
            step="q1",
            outcome="approved",
            resolved_at_ms=int(time.time() * 1000),
            revision=revision,
            payload_hash=payload_hash(body),
            decided_by=[
                {"identity": "alice@example.com", "decision": "approve", "on_behalf_of": None}
            ],
            reason=None,
        )
    )


class Reader:
    """The inbox's own reader polling ``changes_since`` from a thread of its own until
    ``stop``, then once more; ``polls`` keeps every answer, ``errors`` what went wrong."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.polls: list[list[Change]] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True, name="changes-reader")

    def _run(self) -> None:
        try:
            asyncio.run(self._poll())
        except BaseException as exc:  # the test fails on it
            self.errors.append(exc)

    async def _poll(self) -> None:
        db = await InboxDb.open(PgTarget(self.url, instance="reader"))
        try:
            cursor = 0
            while True:
                last = self.stop.is_set()
                changes = await db.changes_since(cursor)
                self.polls.append(changes)
                cursor = max((c.updated_seq for c in changes), default=cursor)
                if last:
                    return
                await asyncio.sleep(POLL_S)
        finally:
            await db.close()


def assert_seen_once_in_order(reader: Reader, items: list[Any]) -> None:
    """``items`` (rows of ``items`` after the writes) each have an ``updated_seq`` of their
    own, and ``reader`` saw every change once, in increasing order, and the last change of
    every item."""
    seqs = sorted(row["updated_seq"] for row in items)
    assert len(set(seqs)) == len(seqs), "an updated_seq given twice"
    assert not reader.errors, reader.errors
    seen = [c for changes in reader.polls for c in changes]
    order = [c.updated_seq for c in seen]
    assert order == sorted(set(order)), "the reader saw a change twice, or out of order"
    assert len(reader.polls) > 10, "the reader polled during the writes"
    assert any(reader.polls[:-1]), "the reader saw changes while the replicas wrote"
    final = {(row["approval_id"], row["updated_seq"], row["state"]) for row in items}
    missed = final - {(c.approval_id, c.updated_seq, c.state) for c in seen}
    assert missed == set(), f"changes the reader never saw: {sorted(missed)[:5]}"


def post(replica: InboxProcess, raw: bytes) -> tuple[int, bytes]:
    status, _, answer = http_request(replica.relay_url, "POST", raw, sign_headers(raw))
    return status, answer


def test_inbox_pg_changes_replicas_receiving_at_once_store_once_in_order_and_miss_nothing(
    replicas: list[InboxProcess],
) -> None:
    url = replicas[0].pg_url
    assert url is not None
    expires = int(time.time() * 1000) + 3_600_000
    ids = [[f"01PGCHANGES{group}{k:04d}" for k in range(ITEMS)] for group in range(GROUPS)]
    answers: list[tuple[str, int, bytes]] = []
    lock = threading.Lock()
    start = threading.Barrier(GROUPS * 2)

    def send(group: int, which: int) -> None:
        start.wait(30)
        for k, approval_id in enumerate(ids[group]):
            replica = replicas[(group + which + k) % REPLICAS]  # the other thread: another one
            got = [(approval_id, *post(replica, first[approval_id]))]
            if which == 0 and k % 3 == 0:  # an adjust: a new revision, a new nonce
                got.append((approval_id, *post(replicas[(k + 2) % REPLICAS], second[approval_id])))
            if which == 1 and k % 2 == 0:  # decided: the notice closes it
                got.append((approval_id, *post(replicas[k % REPLICAS], notice(approval_id, 1))))
            with lock:
                answers.extend(got)

    first = {aid: dispatch(aid, 1, expires) for group in ids for aid in group}
    second = {aid: dispatch(aid, 2, expires) for group in ids for aid in group}
    reader = Reader(url)
    reader.thread.start()
    threads = [
        threading.Thread(target=send, args=(group, which), daemon=True)
        for group in range(GROUPS)
        for which in (0, 1)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    reader.stop.set()
    reader.thread.join(30)

    refused = [(aid, status, body) for aid, status, body in answers if status != 200]
    assert refused == [], refused[:5]
    items = replicas[0].rows("SELECT approval_id, state, revision, updated_seq FROM items")
    stored = [row["approval_id"] for row in items]
    assert sorted(stored) == sorted(first), "every item stored once"
    revised = {aid for group in ids for k, aid in enumerate(group) if k % 3 == 0}
    assert {row["approval_id"] for row in items if row["revision"] == 2} == revised

    assert_seen_once_in_order(reader, items)
    states = {row["approval_id"]: row["state"] for row in items}
    closed = {aid for group in ids for k, aid in enumerate(group) if k % 2 == 0}
    assert {aid for aid, state in states.items() if state != "pending"} == closed
    for replica in replicas:  # each took its share, and none failed
        log = replica.log()
        assert "event=dispatch_kept" in log and "event=notice_kept" in log
        assert "Traceback" not in log, log[-2000:]


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, server: PgServer
) -> Iterator[tuple[InboxWorld, list[InboxProcess]]]:
    """A real gate dispatching to the first of three inbox replicas on one new database;
    alice, bob and carol enrolled."""
    storage = {"storage": {"url": server.empty_database("inbox")}}
    started = start_world(
        tmp_path_factory.mktemp("pg-decided"), enrol=(101, 102, 103), inbox_config=storage
    )
    others: list[InboxProcess] = []
    try:
        others += [second_replica(started, name) for name in ("inbox-b", "inbox-c")]
        assert started.inbox is not None
        yield started, [started.inbox, *others]
    finally:
        for replica in others:
            replica.stop()
        started.stop()


def test_inbox_pg_changes_approvers_deciding_at_three_replicas_at_once_in_order(
    world: tuple[InboxWorld, list[InboxProcess]],
) -> None:
    """Alice, bob and carol decide at one replica each at the same time, the gate's notices
    closing the items at the first, while the other two take new dispatches. Each decision
    is kept once and posted once, every item closes, and the reader polling meanwhile sees
    every change once and in order."""
    gate_world, three = world
    assert gate_world.gate is not None and three[0].pg_url is not None
    api = gate_world.gate.api()
    ids = [api.create("q1", body=f"decided at once {n}")["approval_id"] for n in range(DECIDED)]
    for approval_id in ids:
        three[0].wait_item(approval_id)
    operators = (101, 102, 103)
    clients = [
        InboxClient(replica.base, gate_world.inbox_origin, f"127.0.0.{90 + n}")
        for n, replica in enumerate(three)
    ]
    for client, operator in zip(clients, operators, strict=True):
        assert client.signin(gate_world.passkeys[operator]).status == 200
    answers: list[tuple[str, int]] = []
    start = threading.Barrier(len(clients) + 2)
    expires = int(time.time() * 1000) + 3_600_000
    more = [[f"01PGDECIDEDMORE{n}{k:04d}" for k in range(ITEMS)] for n in (1, 2)]
    received: list[int] = []

    def decide(n: int) -> None:
        start.wait(30)
        for approval_id in ids[n :: len(clients)]:
            got = clients[n].decide(approval_id, gate_world.passkeys[operators[n]])
            answers.append((approval_id, got.status))

    def receive(n: int) -> None:  # meanwhile the other two replicas take new items
        start.wait(30)
        for approval_id in more[n - 1]:
            received.append(post(three[n], dispatch(approval_id, 1, expires))[0])

    reader = Reader(three[0].pg_url)
    reader.thread.start()
    threads = [threading.Thread(target=decide, args=(n,), daemon=True) for n in range(3)]
    threads += [threading.Thread(target=receive, args=(n,), daemon=True) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for approval_id in ids:  # the gate's notice, to the first replica
        three[0].wait_item(approval_id, lambda row: row["state"] == "resolved")
    reader.stop.set()
    reader.thread.join(30)

    assert sorted(answers) == sorted((approval_id, 200) for approval_id in ids)
    kept = three[0].rows("SELECT approval_id, http_status FROM decisions")
    assert sorted((r["approval_id"], r["http_status"]) for r in kept) == sorted(
        (approval_id, 200) for approval_id in ids
    )
    recorded = gate_world.gate_rows("SELECT approval_id, operator_id FROM decisions")
    assert sorted((r["approval_id"], r["operator_id"]) for r in recorded) == sorted(
        (approval_id, operators[n % 3]) for n, approval_id in enumerate(ids)
    )
    assert received == [200] * 2 * ITEMS
    items = three[0].rows("SELECT approval_id, state, revision, updated_seq FROM items")
    assert sorted(r["approval_id"] for r in items) == sorted(ids + more[0] + more[1])
    assert_seen_once_in_order(reader, items)
    for replica in three:
        assert "Traceback" not in replica.log()
