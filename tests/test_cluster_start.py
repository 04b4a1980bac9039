"""Three gates started at the same moment on one PostgreSQL database: on an empty database one
of them applies every migration step, each once, and all three serve (each creates and
records a decision); started together again with a new receipt key and the old one
declared (``receipts.previous_key_env``), exactly one ``receipt_key_rotated`` entry is
written and ``audit verify`` passes over both spans."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from gate.store.pg_schema import PG_MIGRATIONS
from tests.cluster_gates import DB_PASSWORD, Gates
from tests.pg_server import PgServer, pg_fixtures
from tests.support import (
    RECEIPT_KEY,
    CaptureRelay,
    decision_body,
    gate_env,
    post_decision,
    run_cli,
)
from tests.test_gate_on_postgres import rows

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

if not os.environ.get("HITL_CI"):
    pytest.importorskip("psycopg")

server, _url = pg_fixtures()
NEW_KEY = "receipt-key-new-3c8e1a0f7b2d9465"


def serve_each(gates: Gates, relay: CaptureRelay) -> None:
    """Every gate creates an approval and records a decision on it."""
    for gate in gates.live():
        created = gate.api().create("q1")
        dispatch = relay.wait_dispatch(created["approval_id"])
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch))
        assert status == 200, answer
        assert gate.api().call("GET", "/healthz")[0] == 200


def test_cluster_start_three_gates_at_once_migrate_once_and_rotate_once(
    server: PgServer, relay: CaptureRelay, tmp_path: Path
) -> None:
    gates = Gates(tmp_path, relay.url, server.database("start"), 3)
    try:
        gates.start()
        logs = gates.logs()
        migrated = [text for text in logs if "event=migrated" in text]
        assert len(migrated) == 1, logs  # one gate applied the schema, the others found it
        steps = sorted(PG_MIGRATIONS)
        assert migrated[0].count("event=migrated") == len(steps)  # each step once
        assert rows(gates.url, "SELECT version, step FROM schema_migrations ORDER BY 1, 2") == steps
        serve_each(gates, relay)

        assert gates.stop() == [0, 0, 0]
        for index, path in enumerate(gates.configs):  # the key rotated on all three
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
            config["receipts"]["previous_key_env"] = "HITL_RECEIPT_KEY_OLD"
            path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
            gates.envs[index] |= {"HITL_RECEIPT_KEY": NEW_KEY, "HITL_RECEIPT_KEY_OLD": RECEIPT_KEY}
        gates.start()
        serve_each(gates, relay)
    finally:
        gates.remove()

    kinds = [kind for (kind,) in rows(gates.url, "SELECT kind FROM audit_log ORDER BY seq")]
    assert kinds.count("receipt_key_rotated") == 1, kinds
    rotated_at = kinds.index("receipt_key_rotated")
    assert kinds[:rotated_at].count("resolved") == kinds[rotated_at:].count("resolved") == 3
    env = gate_env(
        HITL_DB_PASSWORD=DB_PASSWORD,
        HITL_RECEIPT_KEY=NEW_KEY,
        HITL_RECEIPT_KEY_OLD=RECEIPT_KEY,
    )
    done = run_cli("audit", "verify", "-c", str(gates.configs[0]), env=env, timeout=120)
    assert done.returncode == 0, (done.stdout, done.stderr)
