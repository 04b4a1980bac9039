"""The write batch's approval loader on PostgreSQL (``gate.store.pg_approvals``): one
statement reads the row, the revisions and the decisions; every approval the gate's own
transactions leave in a database (adjusted, skipped, quorum 2, resolved, pending, expired:
the scenario of ``tests.test_store_pg_connection``) loads as the three-statement loader
loads it, with each ``outbox``/``created`` choice. A real throwaway server."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import cast

import pytest

from gate.config import Config
from gate.postgres.connection import PgConnection
from gate.store import approvals, pg_approvals
from tests.test_store_pg_connection import (  # noqa: F401 - fixtures, by name
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


@pytest.mark.usefixtures("repeatable")
def test_one_statement_loads_every_approval_as_three_do(
    pg: PgConnection,  # noqa: F811 - the fixture imported above
    config: Config,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    scenario(Backend(pg, config, tmp_path))
    conn = cast(sqlite3.Connection, pg)  # what the store's statements take
    ids = [row[0] for row in pg.execute("SELECT approval_id FROM approvals ORDER BY 1")]
    shapes = pg.execute(
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
