"""Three gates started at the same moment on an empty PostgreSQL database: one of them applies
every migration step, each once, and all three serve (each creates and records a decision).
(Two gates: tests/test_gate_on_postgres.py; a receipt-key rotation on three at once:
tests/test_receipt_key_cluster.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from gate.store.pg_schema import PG_MIGRATIONS
from tests.cluster_gates import Gates
from tests.pg_server import PgServer, pg_fixtures, psycopg_or_skip
from tests.support import CaptureRelay, decision_body, post_decision
from tests.test_gate_on_postgres import rows

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()

server, _url = pg_fixtures()


def serve_each(gates: Gates, relay: CaptureRelay) -> None:
    """Every gate creates an approval and records a decision on it."""
    for gate in gates.live():
        created = gate.api().create("q1")
        dispatch = relay.wait_dispatch(created["approval_id"])
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
        assert status == 200, answer
        assert gate.api().call("GET", "/healthz")[0] == 200


def test_cluster_start_three_gates_at_once_migrate_once_and_all_serve(
    server: PgServer, relay: CaptureRelay, tmp_path: Path
) -> None:
    gates = Gates(tmp_path, relay.url, server.database("start"), 3)
    try:
        gates.start()
        logs = gates.logs()
        migrated = [text for text in logs if "event=migrated" in text]
        assert len(migrated) == 1, logs  # one gate applied the schema, the others found it
        steps = sorted(PG_MIGRATIONS)
        assert migrated[0].count("event=migrated") == 1  # one line for its steps
        assert rows(gates.url, "SELECT version, step FROM schema_migrations ORDER BY 1, 2") == steps
        serve_each(gates, relay)
    finally:
        gates.remove()
