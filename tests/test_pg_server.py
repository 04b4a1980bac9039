"""The throwaway PostgreSQL server the storage tests start (tests/pg_server.py): it starts
from Debian's binaries, accepts a psycopg connection, survives a crash-restart with its data,
and leaves no process behind. Skips where the binaries or psycopg are missing, and fails
instead under HITL_CI=1 (``.ci/run`` installs both)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pg_server import PgServer, psycopg_or_skip, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg = psycopg_or_skip()


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


def test_pg_server_accepts_a_connection_on_loopback(server: PgServer) -> None:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        row = conn.execute("SELECT current_user, inet_server_addr()::text, 1 + 1").fetchone()

    assert row == ("gate", "127.0.0.1/32", 2)


def test_pg_server_keeps_committed_rows_across_an_immediate_restart(server: PgServer) -> None:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (1), (2)")

    server.restart("immediate")

    with psycopg.connect(server.url()) as conn:
        rows = conn.execute("SELECT n FROM kept ORDER BY n").fetchall()
    assert rows == [(1,), (2,)]


def test_pg_server_refuses_connections_once_stopped(server: PgServer) -> None:
    server.stop()
    try:
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(server.url(), connect_timeout=5)
    finally:
        server.start()
