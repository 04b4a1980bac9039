"""The write batch's approval loader on PostgreSQL (``gate.store.pg_approvals``): one
statement reads the row, the revisions and the decisions; every approval the gate's own
transactions leave in a database (adjusted, skipped, quorum 2, resolved, pending, expired:
the scenario of ``tests.test_store_pg_connection``) loads as the three-statement loader
loads it, with each ``outbox``/``created`` choice. A decision's load also reads the
decider's rate-limit window, which the check then takes without a statement of its own,
exactly as a separate read finds it. A real throwaway server."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from gate.config import Config
from gate.core.approvals.create import CreateRequest
from gate.core.approvals.decide_tx import Decide
from gate.core.approvals.kind import APPROVALS as APPROVAL_KIND
from gate.core.requests.lifecycle_tx import Create
from gate.core.transactions import Policy
from gate.postgres.connection import Cursor, PgConnection
from gate.protocol.canonical import payload_hash, wire_json
from gate.protocol.envelope import build_decision, parse_decision
from gate.store import approvals, pg_approvals
from gate.store.pg_approvals import PgApprovalStatements
from gate.store.pg_rate import PgRateEvents
from tests.pg_server import psycopg_or_skip
from tests.test_store_pg_connection import (  # noqa: F401 - fixtures, by name
    ALICE,
    NOW_MS,
    SCOPE,
    Backend,
    config,
    migrated,
    pg,
    pg_url,
    repeatable,
    scenario,
    server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg: Any = psycopg_or_skip()


@pytest.fixture
def played(
    pg: PgConnection,  # noqa: F811 - the fixture imported above
    config: Config,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    repeatable: Any,  # noqa: F811 - the fixture imported above
) -> PgConnection:
    """``pg`` after the scenario of ``tests.test_store_pg_connection``: approvals of every
    shape the gate's own transactions leave."""
    scenario(Backend(pg, config, tmp_path))
    return pg


def test_one_statement_loads_every_approval_as_three_do(played: PgConnection) -> None:
    conn = cast(sqlite3.Connection, played)  # what the store's statements take
    ids = [row[0] for row in played.execute("SELECT approval_id FROM approvals ORDER BY 1")]
    shapes = played.execute(
        "SELECT count(*) FILTER (WHERE state = 'resolved'), max(revision),"
        " (SELECT max(n) FROM (SELECT count(*) AS n FROM decisions GROUP BY approval_id) c)"
        " FROM approvals"
    ).fetchone()
    assert len(ids) >= 5 and shapes is not None
    resolved, most_revisions, most_decisions = shapes
    assert resolved >= 2 and most_revisions >= 2 and most_decisions >= 2  # lists of several
    for approval_id in ids:
        for outbox in (True, False):
            for created in (True, False):
                want = approvals.load(conn, approval_id, outbox, created)
                got = pg_approvals.load(conn, approval_id, outbox, created)
                assert want is not None and got == want, approval_id
    assert pg_approvals.load(conn, "01NOSUCHAPPROVAL0000000000") is None


class Recording(PgConnection):
    """A PgConnection that keeps the text of every statement it is given (``sent``)."""

    def __init__(self, url: str) -> None:
        super().__init__(psycopg.connect(url, autocommit=True))
        self.sent: list[str] = []

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Cursor:
        self.sent.append(sql)
        return super().execute(sql, params)


def test_a_decisions_load_reads_its_deciders_rate_window(
    pg_url: str,  # noqa: F811 - the fixture imported above
    config: Config,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """The decision's load carries the decider's rate-limit window (one statement reads the
    approval and the window), the check takes it from there, and the attempt is written
    with the batch."""
    conn = Recording(pg_url)
    backend = Backend(conn, config, tmp_path)
    body = "deploy?\n"
    req = CreateRequest("p", "q1", None, "text/plain", body, None)
    policy = Policy(1, SCOPE, 3600, "low")
    created = backend.run(
        Create(APPROVAL_KIND, req, None, None, policy, req.request_hash(), payload_hash(body))
    )
    revision = created[0].revisions[-1]
    decision = build_decision(
        approval_id=created[0].approval_id,
        nonce=revision.nonce,
        decision="approve",
        payload_hash=revision.payload_hash,
        approver_id=ALICE,
        decided_at_ms=NOW_MS,
        channel="test",
    )
    conn.sent.clear()
    decided = backend.run(Decide(parse_decision(wire_json(decision)), None))
    reading = [sql for sql in conn.sent if "rate_events" in sql and "INSERT" not in sql]
    attempts = conn.execute("SELECT operator_id FROM rate_events").fetchall()
    conn.close()

    assert decided[2] == "approved"
    assert reading == [pg_approvals.LOAD_WITH_WINDOW_SQL]
    assert [tuple(row) for row in attempts] == [(101,)]


def test_a_window_read_ahead_is_the_window_read_alone(played: PgConnection) -> None:
    """A window read with a load is the one a statement of its own reads, with the batch's
    unwritten attempts counted on top; a window not expected (another approver, another
    time) is read alone; a load that finds no approval reads none ahead. (Approvers 150 and
    151: the scenario's decisions leave no attempts of theirs.)"""
    played.execute(
        "INSERT INTO rate_events VALUES (150, 1000), (150, 60000), (150, 61000), (151, 5000)"
    )
    approval_id = played.execute("SELECT min(approval_id) FROM approvals").fetchone()[0]
    conn = cast(sqlite3.Connection, played)
    played.execute("BEGIN")
    try:
        alone = PgRateEvents(conn)
        rate = PgRateEvents(conn)
        statements = PgApprovalStatements(conn, rate)
        rate.expect(150, 1000)
        loaded = statements.load(approval_id, outbox=False, created_receipt=False)
        assert loaded == pg_approvals.load(conn, approval_id, False, False)
        assert rate.ahead() is None  # read once: nothing left to read ahead
        assert rate.window(150, 1000) == alone.window(150, 1000) == (2, 60000)
        rate.job_started()
        rate.add(150, 61500, 1000)
        rate.job_ended()
        assert rate.window(150, 1000) == (3, 60000)
        assert rate.window(150, 60000) == (2, 61000)  # not read ahead: read alone
        rate.expect(151, 0)
        assert statements.load("01NOSUCHAPPROVAL0000000000") is None
        assert rate.window(151, 0) == alone.window(151, 0) == (1, 5000)
    finally:
        played.execute("ROLLBACK")
