"""Two inbox replicas behind a balancer, one of them killed: a real gate whose relay URL is
the balancer (tests/balancer.py, Debian's haproxy), two real ``hitl-gate inbox serve`` on one
SQLite file behind it, the approvers' public URL the balancer's. An approver signed in at the
first replica stays signed in when it is killed with -9: the second serves their session,
decides what was dispatched before the kill, and receives and decides what is dispatched after
it; on one SQLite file and on one PostgreSQL database (tests/pg_server.py). Skips where
haproxy is missing, and fails instead under HITL_CI=1 (``.ci/run`` installs
it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.balancer import SERVED_BY, Balancer, haproxy
from tests.inbox_harness import InboxClient, InboxProcess, InboxWorld
from tests.pg_server import inbox_fixtures
from tests.support import free_port
from tests.test_inbox_replicas import pending_ids, request

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]

inbox_server, inbox_url = inbox_fixtures()


def _installed() -> None:
    if haproxy() is None:
        if os.environ.get("HITL_CI"):
            pytest.fail("no haproxy here (.ci/run installs it)")
        pytest.skip("no haproxy here (apt-get install haproxy)")


@dataclass
class Cluster:
    """The gate (``world``), the ``balancer`` in front of inbox replicas ``a`` (g0) and
    ``b`` (g1), and the approvers' public origin (the balancer's)."""

    world: InboxWorld
    balancer: Balancer
    a: InboxProcess
    b: InboxProcess

    def client(self, base: str) -> InboxClient:
        """A client of ``base`` (a replica's or the balancer's URL) at the public origin."""
        return InboxClient(base, self.world.inbox_origin)


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory, inbox_url: str | None) -> Iterator[Cluster]:
    _installed()
    ports = free_port(), free_port()
    balancer = Balancer([("127.0.0.1", port) for port in ports]).start()
    folder = tmp_path_factory.mktemp("failover")
    world = InboxWorld(folder, free_port(), balancer.port)  # relay.url: the balancer's
    replicas: list[InboxProcess] = []
    shared = folder / "shared" / "inbox.db"
    where: dict[str, Any] = {"database": str(shared)}
    if inbox_url is not None:
        where = {"storage": {"url": inbox_url}}
    try:
        world.start_gate()
        world.enrol(101)
        for name, port in zip(("a", "b"), ports, strict=True):
            callback = f"http://127.0.0.1:{world.gate_port}/"
            replica = InboxProcess(
                folder / name, port, callback, public_url=world.inbox_origin, **where
            )
            replica.db = shared
            replicas.append(replica.start())
        balancer.wait_all_up()
        yield Cluster(world, balancer, *replicas)
    finally:
        for replica in replicas:
            replica.stop()
        world.stop()
        balancer.remove()


def test_inbox_replicas_a_session_outlives_the_kill9_of_the_replica_it_began_at(
    cluster: Cluster,
) -> None:
    world, passkey = cluster.world, cluster.world.passkeys[101]
    before = request(world, "dispatched before the kill")
    early = pending_ids(cluster.a, {"dispatched before the kill"})["dispatched before the kill"]
    at_a = cluster.client(cluster.a.base)
    assert at_a.signin(passkey).status == 200

    cluster.a.kill9()
    through = cluster.client(cluster.balancer.url())
    through.cookies = dict(at_a.cookies)  # the same browser, now sent to the other replica
    home = through.get("/")
    decided = through.decide(early, passkey)
    after = request(world, "dispatched after the kill")  # the gate's relay: the balancer
    late = pending_ids(cluster.b, {"dispatched after the kill"})["dispatched after the kill"]
    decided_late = through.decide(late, passkey)

    assert home.status == 200 and "alice@example.com" in home.text, home.text
    assert home.header(SERVED_BY) == "g1", cluster.balancer.log()
    assert decided.status == 200 and decided_late.status == 200, (decided.text, decided_late.text)
    for proc, draft in (
        (before, "dispatched before the kill"),
        (after, "dispatched after the kill"),
    ):
        code, out, err = proc.finish()
        assert (code, out.decode()) == (0, draft), err
    assert [r["identity"] for r in cluster.b.rows("SELECT identity FROM sessions")] == [
        "alice@example.com"
    ]
