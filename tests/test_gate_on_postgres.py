"""The gate on PostgreSQL (``storage.url``), end to end: real ``hitl-gate serve`` processes on
a throwaway server (tests/pg_server.py), one database per test, migrated by the gates
themselves. One gate: the whole lifecycle (create, decide, resolved, long-poll), an
idempotent create, a nonce replayed, /healthz; PostgreSQL stopped under it: 503
``storage_unavailable`` (never 500), then back by itself once the server is. Two gates on
one database: the same approval decided on both at once by two approvers and by one
approver twice: counted once, resolved once, the audit log contiguous and its chain valid,
``audit_head`` equal to its newest entry."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.audit.chain import AuditRow, verify
from gate.protocol.canonical import wire_json
from gate.store.pg_schema import PG_MIGRATIONS, migrate
from gate.store.schema import SCHEMA_VERSION
from tests.pg_server import PgServer, free_port, psycopg_or_skip, running_server
from tests.support import (
    RECEIPT_KEY,
    CaptureRelay,
    GateProcess,
    decision_body,
    gate_env,
    http_request,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg = psycopg_or_skip()

_databases = iter(range(1, 1000))
UNAVAILABLE = {"status": "unavailable", "reason": "storage_unavailable"}
DB_PASSWORD = "db-password-never-logged-5c1d9e7a"


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


@pytest.fixture
def url(server: PgServer) -> str:
    """A fresh, empty database (the gates migrate it)."""
    return server.database(f"gate_{next(_databases)}")


def pg_config(directory: Path, relay: CaptureRelay, url: str, /, **config: Any) -> Path:
    """The test config (``write_config``, with ``config``) on the PostgreSQL database
    ``url``, its password in ``HITL_DB_PASSWORD`` (the test server trusts loopback: any
    password is accepted)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = write_config(directory, relay.url, **config)
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    config["storage"] = {"url": url, "password_env": "HITL_DB_PASSWORD"}
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def start_gate(directory: Path, relay: CaptureRelay, url: str, /, **config: Any) -> GateProcess:
    """A ``hitl-gate serve`` on the PostgreSQL database ``url``, dispatching to ``relay``
    (``config``: ``write_config``'s options)."""
    path = pg_config(directory, relay, url, **config)
    return GateProcess(path, env=gate_env(HITL_DB_PASSWORD=DB_PASSWORD)).start()


def gate_fixtures() -> tuple[Any, Any]:
    """Two fixtures for a test module of real gates: ``relay`` (module-scoped: a
    ``CaptureRelay``) and ``gates`` (the gates a test started, ``gates.append``, stopped
    after it unless already gone). A module takes them as ``relay, gates =
    gate_fixtures()``."""

    @pytest.fixture(scope="module", name="relay")
    def relay() -> Iterator[CaptureRelay]:
        r = CaptureRelay().start()
        yield r
        r.stop()

    @pytest.fixture(name="gates")
    def gates() -> Iterator[list[GateProcess]]:
        started: list[GateProcess] = []
        yield started
        for gate in started:
            if gate.proc is not None and gate.proc.poll() is None:
                gate.stop()

    return relay, gates


relay, gates = gate_fixtures()


def start_together(pending: list[GateProcess]) -> list[GateProcess]:
    """Start every gate of ``pending`` at the same moment, each from its own thread; returns
    them once all listen. When one does not, the others are stopped and the test fails with
    every gate's log."""
    threads = [threading.Thread(target=gate.start) for gate in pending]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if not all(gate.api_url for gate in pending):
        logs = [gate.log() for gate in pending]
        for gate in pending:
            if gate.api_url:
                gate.stop()
        pytest.fail(f"a gate did not start: {logs}")
    return pending


def rows(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        return list(conn.execute(sql, args).fetchall())


def healthz(gate: GateProcess) -> tuple[int, Any]:
    return gate.api().call("GET", "/healthz", timeout=30)


def assert_log_whole(url: str, keys: tuple[str, ...] = (RECEIPT_KEY,)) -> list[AuditRow]:
    """The audit log is contiguous from 1, its chain and receipts verify (with ``keys``: each
    span's), and ``audit_head`` holds its newest entry (both read from one snapshot)."""
    with psycopg.connect(url) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        found = conn.execute(
            "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id,"
            " signature FROM audit_log ORDER BY seq"
        ).fetchall()
        head = conn.execute("SELECT seq, entry_hash FROM audit_head WHERE id = 1").fetchall()
    log = [AuditRow(*row) for row in found]
    assert [row.seq for row in log] == list(range(1, len(log) + 1))
    result = verify(log, [key.encode() for key in keys])
    assert (result.checked, result.first_bad_seq) == (len(log), None), result
    assert head == [(log[-1].seq, log[-1].entry_hash)]
    return log


def at_once(calls: list[Callable[[], tuple[int, Any]]]) -> list[tuple[int, Any]]:
    """Make each call (a request: its status and answer) from its own thread, all behind
    one barrier; their (status, answer)."""
    barrier = threading.Barrier(len(calls))
    answers: list[tuple[int, Any]] = []

    def send(call: Callable[[], tuple[int, Any]]) -> None:
        barrier.wait(timeout=30)
        answers.append(call())

    threads = [threading.Thread(target=send, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers


def decide(gate: GateProcess, body: dict[str, Any]) -> tuple[int, Any]:
    status, answer, _ = post_decision(gate.callback_url, body)
    return status, answer


def test_gate_on_postgres_runs_the_lifecycle(
    tmp_path: Path, relay: CaptureRelay, url: str, gates: list[GateProcess]
) -> None:
    gates.append(start_gate(tmp_path / "a", relay, url))
    (gate,) = gates
    api = gate.api()
    assert healthz(gate)[0] == 200
    assert "db=postgresql://" in gate.log()

    key = {"Idempotency-Key": "pg-create-1"}
    payload = {"pipeline": "p", "step": "q2", "draft": {"content_type": "text/plain", "body": "x"}}
    status, created = api.call("POST", "/v1/approvals", payload, headers=key)
    assert status == 201, created
    status, again = api.call("POST", "/v1/approvals", payload, headers=key)
    assert (status, again["approval_id"]) == (200, created["approval_id"])
    approval_id = created["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)

    alice = decision_body(dispatch, "alice@example.com")
    status, answer, _ = post_decision(gate.callback_url, alice)
    assert (status, answer["status"]) == (200, "recorded"), answer
    status, answer, _ = post_decision(gate.callback_url, alice)  # the same nonce again
    assert (status, answer) == (409, {"status": "duplicate", "reason": "duplicate"})
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, "bob@example.com"))
    assert status == 200, answer

    resolved = api.wait_resolved(approval_id)
    assert (resolved["state"], resolved["outcome"]) == ("resolved", "approved")
    log = assert_log_whole(url)
    assert [row.kind for row in log if row.approval_id == approval_id].count("resolved") == 1
    assert DB_PASSWORD not in gate.log()
    writers = rows(
        url,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'hitl-gate/writer/%%'",
    )
    assert writers == [(1,)]


def test_gate_on_postgres_answers_503_while_the_server_is_down_and_recovers(
    tmp_path: Path, relay: CaptureRelay, server: PgServer, url: str, gates: list[GateProcess]
) -> None:
    gates.append(start_gate(tmp_path / "a", relay, url))
    (gate,) = gates
    api = gate.api()
    api.create()
    payload = {"pipeline": "p", "step": "q1", "draft": {"content_type": "text/plain", "body": "y"}}

    server.stop("fast")
    try:
        status, answer = api.call("POST", "/v1/approvals", payload, timeout=30)
        assert (status, answer) == (503, UNAVAILABLE)
        assert healthz(gate) == (503, UNAVAILABLE)
        gate.wait_for_line("event=storage_unavailable")
    finally:
        server.start()

    back = time.monotonic()

    def created() -> bool:
        status, answer = api.call("POST", "/v1/approvals", payload, timeout=30)
        assert status == 201 or (status, answer) == (503, UNAVAILABLE), answer
        return status == 201

    wait_until(created, what="the gate to take writes again by itself")
    assert time.monotonic() - back < 5.0  # within 5 s of the server accepting connections
    assert healthz(gate)[0] == 200
    assert "Traceback" not in gate.log() and " 500 " not in gate.log()
    assert_log_whole(url)


def test_two_gates_on_one_database_count_a_decision_once(
    tmp_path: Path, relay: CaptureRelay, url: str, gates: list[GateProcess]
) -> None:
    """Two gates start together on an empty database (migrated once); Alice and Bob approve
    the same approval (quorum 2) on both gates at the same moment: one of each one's two
    decisions is recorded, the other refused 409; resolved once."""
    starting = [pg_config(tmp_path / name, relay, url) for name in ("a", "b")]
    env = gate_env(HITL_DB_PASSWORD=DB_PASSWORD)
    gates.extend(start_together([GateProcess(path, env=env) for path in starting]))
    migrated = [gate for gate in gates if "event=migrated" in gate.log()]
    assert len(migrated) == 1  # one gate applied the schema, the other found it applied
    steps = sorted(PG_MIGRATIONS)
    assert migrated[0].log().count("event=migrated") == 1  # one line for its steps
    assert rows(url, "SELECT version, step FROM schema_migrations ORDER BY 1, 2") == steps
    assert steps[-1][0] == SCHEMA_VERSION
    for round_ in range(5):
        approval_id = gates[round_ % 2].api().create("q2")["approval_id"]
        dispatch = relay.wait_dispatch(approval_id)
        answers = at_once(
            [
                partial(decide, gate, decision_body(dispatch, who))
                for who in ("alice@example.com", "bob@example.com")
                for gate in gates
            ]
        )

        statuses = sorted(status for status, _ in answers)
        assert statuses == [200, 200, 409, 409], answers
        refused = {a["reason"] for s, a in answers if s == 409}
        assert refused <= {"duplicate", "already_resolved"}, answers
        for gate in gates:
            approval = gate.api().wait_resolved(approval_id)
            assert (approval["outcome"], len(approval["decisions"])) == ("approved", 2)
        decided = rows(url, "SELECT count(*) FROM decisions WHERE approval_id = %s", approval_id)
        assert decided == [(2,)]

    payload = {"pipeline": "p", "step": "q1", "draft": {"content_type": "text/plain", "body": "i"}}
    key = {"Idempotency-Key": "on-both-gates"}
    created = at_once(
        [partial(gate.api().call, "POST", "/v1/approvals", payload, key) for gate in gates]
    )
    assert sorted(status for status, _ in created) == [200, 201], created
    assert created[0][1]["approval_id"] == created[1][1]["approval_id"]

    # the same signed bytes replayed to the other gate: refused, nothing counted twice
    replayed_id = gates[0].api().create("q2")["approval_id"]
    raw = wire_json(decision_body(relay.wait_dispatch(replayed_id), "alice@example.com"))
    assert post_decision(gates[0].callback_url, raw)[0] == 200
    status, answer, _ = post_decision(gates[1].callback_url, raw)
    assert (status, answer) == (409, {"status": "duplicate", "reason": "duplicate"})
    assert rows(url, "SELECT count(*) FROM decisions WHERE approval_id = %s", replayed_id) == [(1,)]
    log = assert_log_whole(url)
    assert sum(row.kind == "resolved" for row in log) == 5
    assert sum(row.kind == "created" for row in log) == 7
    for gate in gates:
        assert http_request(gate.api_url + "/healthz", "GET", None, {}, 30)[0] == 200


def serve_refused(directory: Path, relay: CaptureRelay, url: str) -> tuple[int, list[str]]:
    """``hitl-gate serve`` on ``url`` that does not start: its exit code and its stderr's
    lines."""
    path = pg_config(directory, relay, url)
    done = run_cli("serve", "-c", str(path), env=gate_env(HITL_DB_PASSWORD=DB_PASSWORD))
    return done.returncode, done.stderr.decode().splitlines()


def test_gate_on_postgres_refuses_a_schema_newer_than_itself(
    tmp_path: Path, relay: CaptureRelay, url: str
) -> None:
    with psycopg.connect(url) as conn, conn.transaction():
        migrate(conn)
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    assert serve_refused(tmp_path, relay, url) == (
        1,
        [
            f"Error: the database's schema is version {SCHEMA_VERSION + 1};"
            f" this gate knows up to {SCHEMA_VERSION}"
        ],
    )


def test_gate_on_postgres_healthz_is_503_once_a_newer_version_migrated_under_it(
    tmp_path: Path, relay: CaptureRelay, url: str, gates: list[GateProcess]
) -> None:
    """New-user report: a running older gate's ``/healthz`` said ``"schema_version": 9``
    (the database's) although it knows only 8, after a newer gate migrated the database. It
    answers 503 ``schema_too_new`` naming both numbers, so the balancer drains it; it would
    refuse to start on that database."""
    gates.append(start_gate(tmp_path, relay, url))
    (gate,) = gates
    assert healthz(gate)[1]["schema_version"] == SCHEMA_VERSION
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))

    assert healthz(gate) == (
        503,
        {
            "status": "unavailable",
            "reason": "schema_too_new",
            "schema_version": SCHEMA_VERSION + 1,
            "supported_schema_version": SCHEMA_VERSION,
            "message": f"the database's schema is version {SCHEMA_VERSION + 1}; this gate"
            f" knows up to {SCHEMA_VERSION} (a newer hitl-gate migrated it: replace this gate"
            " by the newer version)",
        },
    )


def test_gate_on_postgres_unreachable_is_one_line(
    tmp_path: Path, relay: CaptureRelay, server: PgServer
) -> None:
    unreachable = f"postgresql://gate@127.0.0.1:{free_port()}/none"
    code, lines = serve_refused(tmp_path, relay, unreachable)
    assert code == 1
    assert len(lines) == 1, lines
    (line,) = lines
    assert line.startswith("Error: cannot open database postgresql://gate@127.0.0.1:"), line
    assert DB_PASSWORD not in line


def test_gate_on_postgres_refuses_a_database_not_utf8_in_one_line(
    tmp_path: Path, relay: CaptureRelay, server: PgServer
) -> None:
    name = f"gate_{next(_databases)}"
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute(
            f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
            " TEMPLATE template0"
        )
    assert serve_refused(tmp_path, relay, server.url(name)) == (
        1,
        [
            f"Error: database {server.url(name)}: the database's encoding is SQL_ASCII; the"
            " gate's texts need UTF8 (createdb --locale=C --encoding=UTF8 --template=template0)"
        ],
    )
    assert rows(server.url(name), "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == [
        (0,)
    ]


def test_gate_on_postgres_names_a_misspelled_url_parameter_in_one_line(
    tmp_path: Path, relay: CaptureRelay, url: str
) -> None:
    code, lines = serve_refused(tmp_path, relay, f"{url}?sslmod=require")
    assert code == 2
    assert len(lines) == 1, lines
    assert 'storage.url: invalid URI query parameter "sslmod"' in lines[0], lines


def test_a_gate_killed_leaves_the_other_serving_and_loses_nothing(
    tmp_path: Path, relay: CaptureRelay, url: str, gates: list[GateProcess]
) -> None:
    gates.append(start_gate(tmp_path / "a", relay, url))
    gates.append(start_gate(tmp_path / "b", relay, url))
    approval_id = gates[0].api().create("q2")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    assert decide(gates[0], decision_body(dispatch, "alice@example.com"))[0] == 200

    gates[0].kill9()
    assert decide(gates[1], decision_body(dispatch, "bob@example.com"))[0] == 200
    gates[0] = GateProcess(gates[0].config, env=gates[0].env).start()

    for gate in gates:
        approval = gate.api().get(approval_id)
        assert (approval["outcome"], len(approval["decisions"])) == ("approved", 2)
    assert_log_whole(url)
