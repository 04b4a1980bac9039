"""``hitl-gate doctor`` on PostgreSQL (gate/tools/doctor_cluster.py) against a real throwaway
server: the gates on the database (their rows as the gates write them), one config or not,
a clock off the database's, nobody live, the database unreachable; and the report of a
config with ``storage.url``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from gate.config import load_config
from gate.config.fingerprint import config_hash
from gate.postgres.target import PgTarget
from gate.store.pg_instances import Instance, beat
from gate.store.pg_lease import TIMERS, claim
from gate.store.pg_session import close_quietly, connect
from gate.store.schema import SCHEMA_VERSION
from gate.tools.doctor import run_checks
from gate.tools.doctor_audit import check_audit, check_database
from gate.tools.doctor_cluster import check_cluster
from tests.pg_server import PgServer, free_port, pg_fixtures, psycopg_or_skip
from tests.support import ENV, CaptureRelay, refused_dispatch, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg = psycopg_or_skip()

GATE = Instance("01GATEA", "0.1.0", "c0ffee" * 4, "host-a", 11, 0, 0, 0)


server, url = pg_fixtures()


async def gates(url: str, *rows: Instance, holder: str | None = None) -> None:
    conn = await connect(url, "test", "test")
    try:
        for row in rows:
            await beat(conn, row)
        if holder is not None:
            assert await claim(conn, TIMERS, holder, 60_000) is not None
    finally:
        await close_quietly(conn)


async def test_doctor_cluster_passes_live_gates_on_one_config(url: str) -> None:
    other = dataclasses.replace(GATE, instance_id="01GATEB", host="host-b", pid=12)
    await gates(url, GATE, other, holder="01GATEB")

    check = await check_cluster(url, None, GATE.config_hash)

    assert check.line() == (
        "PASS cluster: 2 gates live (version 0.1.0), one config; timers on 01GATEB (host-b pid 12)"
    )


async def test_doctor_cluster_fails_divergent_configs_and_a_skewed_clock(url: str) -> None:
    """Each gate is named with its host and pid, as the lease's holder is (new-user report:
    instance ids alone did not say which machine to look at)."""
    other = dataclasses.replace(GATE, instance_id="01GATEB", config_hash="beef" * 6, pid=12)
    skewed = dataclasses.replace(GATE, instance_id="01GATEC", clock_offset_ms=-12_000, pid=13)
    await gates(url, GATE, other, skewed)

    check = await check_cluster(url, None, GATE.config_hash)

    assert not check.ok
    assert check.detail == (
        "live gates run different configs: config beefbeefbeef on 01GATEB (host-a pid 12);"
        " config c0ffeec0ffee on 01GATEA (host-a pid 11), 01GATEC (host-a pid 13);"
        " clock off the database's by more than 5 s: 01GATEC (host-a pid 13) -12.0 s"
    )


async def test_doctor_cluster_fails_a_config_other_than_the_live_gates(url: str) -> None:
    await gates(url, GATE)

    check = await check_cluster(url, None, "0123456789ab" + "0" * 52)

    assert check.line() == (
        "FAIL cluster: the live gates run another config (c0ffeec0ffee) than this file"
        " (0123456789ab)"
    )


async def test_doctor_cluster_warns_when_no_gate_is_live(url: str) -> None:
    check = await check_cluster(url, None, GATE.config_hash)
    assert check.line() == (
        "WARN cluster: no gate is running on this database (no heartbeat in the last 15 s)"
    )


async def test_doctor_cluster_fails_an_unreachable_database() -> None:
    check = await check_cluster(f"postgresql://gate@127.0.0.1:{free_port()}/x", None, "h")
    assert not check.ok
    assert check.detail.startswith("connecting the doctor session: ")


async def test_doctor_on_postgres_reports_the_cluster_dispatches_and_passkeys(
    url: str, tmp_path: Path
) -> None:
    path = write_config(tmp_path, "http://127.0.0.1:9/relay")
    raw = yaml.safe_load(path.read_text())
    raw["storage"] = {"url": url}
    path.write_text(yaml.safe_dump(raw))
    await gates(url, dataclasses.replace(GATE, config_hash=config_hash(load_config(path))))

    checks = await run_checks(str(path), ENV)

    by_name = {check.name: check for check in checks}
    assert [check.name for check in checks] == [
        "config",
        "followups",
        "secrets",
        "keys",
        "database",
        "audit",
        "cluster",
        "relay",
        "dispatch",
        "passkeys",
        "clock",
    ]
    assert by_name["cluster"].label == "PASS"
    assert by_name["audit"].label == "PASS", by_name["audit"].line()
    assert by_name["database"].line() == (
        f"PASS database: {url}: schema {SCHEMA_VERSION}, 0 approvals, 0 audit entries; its"
        " pages are the server's to check (data checksums, pg_amcheck)"
    )
    assert by_name["dispatch"].line() == (
        "PASS dispatch: every pending approval's dispatch was acked"
    )
    assert by_name["passkeys"].line() == (
        "PASS passkeys: rp_id localhost, origins http://localhost:0 (the bound port at start);"
        " 0 passkeys enrolled"
    )


async def test_doctor_on_postgres_reads_dispatches_and_passkeys_a_real_gate_wrote(
    server: PgServer, tmp_path: Path
) -> None:
    """New-user report: on PostgreSQL doctor said SKIP for dispatch and passkeys though the
    readers work on the database; a gate whose relay refuses every dispatch now FAILs
    dispatch there, as on SQLite."""
    relay = CaptureRelay().start()
    relay.status = 401
    try:
        path = write_config(tmp_path, relay.url)
        raw = yaml.safe_load(path.read_text())
        raw["storage"] = {"url": server.database("doctor_dispatch")}
        path.write_text(yaml.safe_dump(raw))
        refused_dispatch(path)
        checks = await run_checks(str(path), ENV)
    finally:
        relay.stop()

    by_name = {check.name: check for check in checks}
    assert (
        by_name["dispatch"]
        .line()
        .startswith(
            "FAIL dispatch: 1 pending approval not delivered to the relay; latest error: relay "
            "answered HTTP 401"
        )
    ), by_name["dispatch"].line()
    assert by_name["passkeys"].line().endswith("; 0 passkeys enrolled")
    assert by_name["audit"].label == "PASS", by_name["audit"].line()
    assert by_name["database"].detail.startswith(f"{raw['storage']['url']}: schema ")
    assert ", 1 approvals, " in by_name["database"].detail


def test_doctor_database_on_postgres_before_the_first_start_and_after_a_newer_version(
    server: PgServer,
) -> None:
    """The database line on PostgreSQL: a database without tables is a warning (the gates
    create them; no audit log to check yet, as for a SQLite file not created yet), one a
    newer hitl-gate migrated fails as the gate would refuse it."""
    empty = server.database("doctor_empty")
    assert check_database(PgTarget(empty)).line() == (
        f"WARN database: {empty} has no tables yet; the gates create them at their first start"
    )
    assert check_audit(PgTarget(empty), None, None).line() == "SKIP audit: no tables yet"
    newer = server.migrated_database()
    with psycopg.connect(newer, autocommit=True) as conn:
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    assert check_database(PgTarget(newer)).line() == (
        f"FAIL database: {newer}: schema {SCHEMA_VERSION + 1} is newer than this"
        f" hitl-gate's ({SCHEMA_VERSION}); upgrade hitl-gate"
    )


PASSWORD_ROLE, PASSWORD = "gate_with_password", "doctor-db-password-3f9a"


def password_url(server: PgServer, url: str) -> str:
    """``url`` for a role that must sign in with a password (SCRAM on loopback: a line for it
    before the test server's ``trust`` lines), so a connection without it is refused."""
    hba = server.data / "pg_hba.conf"
    line = f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
    if line not in hba.read_text():
        hba.write_text(line + hba.read_text())
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN SUPERUSER PASSWORD '{PASSWORD}'")
            admin.execute("SELECT pg_reload_conf()")
    return url.replace("://gate@", f"://{PASSWORD_ROLE}@", 1)


async def test_doctor_on_postgres_reads_the_database_password_when_another_secret_is_missing(
    server: PgServer, url: str, tmp_path: Path
) -> None:
    """A missing pipeline token is the secrets line's failure alone: the database, the audit
    chain and the gates are still checked, with the password the config names (new-user
    report: every database line said ``no password supplied``)."""
    path = write_config(tmp_path, "http://127.0.0.1:9/relay")
    raw = yaml.safe_load(path.read_text())
    raw["storage"] = {"url": password_url(server, url), "password_env": "HITL_DB_PASSWORD"}
    path.write_text(yaml.safe_dump(raw))
    environ = {name: value for name, value in ENV.items() if name != "HITL_API_TOKEN"}
    environ["HITL_DB_PASSWORD"] = PASSWORD

    checks = await run_checks(str(path), environ)

    by_name = {check.name: check for check in checks}
    assert by_name["secrets"].label == "FAIL" and "HITL_API_TOKEN" in by_name["secrets"].line()
    for name in ("database", "audit", "dispatch", "passkeys"):
        assert by_name[name].label == "PASS", by_name[name].line()
    assert "password" not in by_name["cluster"].line(), by_name["cluster"].line()
