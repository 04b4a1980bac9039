"""The PostgreSQL schema (gate/store/pg_schema.py) on a real throwaway server: equal to the
SQLite schema at its last migration (tables, columns in order, types, NOT NULL, defaults,
primary and unique keys, foreign keys, checks, named and partial indexes), applied once when
several gates migrate at the same moment, a second time a no-op, and refused when the
database is newer than the gate; the PostgreSQL-only ``audit_head`` row, created for an empty
chain and set again from the log by ``sync_audit_head``."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gate.audit.chain import GENESIS_HASH
from gate.postgres.migrate import SchemaTooNew
from gate.store.pg_schema import (
    CLUSTER_TABLES,
    PG_MIGRATIONS,
    migrate,
    sync_audit_head,
)
from gate.store.schema import MIGRATIONS, SCHEMA_VERSION
from tests.pg_server import PgServer, psycopg_or_skip, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg = psycopg_or_skip()

TYPES = {"INTEGER": "bigint", "TEXT": "text", "REAL": "double precision"}


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


_databases = iter(range(1, 1000))


@pytest.fixture
def url(server: PgServer) -> str:
    """A fresh empty database on the module's server."""
    return server.database(f"schema_{next(_databases)}")


def migrated(url: str) -> int:
    with psycopg.connect(url) as conn, conn.transaction():
        return migrate(conn)


def normal(predicate: str | None) -> str | None:
    """A partial index's predicate without what PostgreSQL adds when it prints one
    (parentheses, ``::text`` casts, case, spaces)."""
    if predicate is None:
        return None
    return re.sub(r"[()\s]|::text", "", predicate).lower()


def sqlite_schema() -> dict[str, Any]:
    db = sqlite3.connect(":memory:")
    for migration in MIGRATIONS:
        for statement in migration:
            db.execute(statement)
    schema: dict[str, Any] = {}
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        info = db.execute(f"PRAGMA table_info({table})").fetchall()
        columns = [
            (name, TYPES[kind], bool(notnull or pk), default)
            for _, name, kind, notnull, default, pk in info
        ]
        keys = set()
        for _, index, unique, origin, _partial in db.execute(f"PRAGMA index_list({table})"):
            if origin in ("pk", "u") and unique:
                cols = tuple(r[2] for r in db.execute(f"PRAGMA index_info({index})"))
                keys.add(("p" if origin == "pk" else "u", cols))
        pk = tuple(name for _, name, *_, order in sorted(info, key=lambda r: r[5]) if order)
        keys.add(("p", pk))
        foreign = {
            (r[3], r[2], r[4]) for r in db.execute(f"PRAGMA foreign_key_list({table})")
        }  # (column, table, its column)
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        schema[table] = {
            "columns": columns,
            "keys": keys,
            "foreign": foreign,
            "checks": sql.count("CHECK"),
        }
    schema["indexes"] = {}
    for name, table, sql in db.execute(
        "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    ):
        cols = tuple(r[2] for r in db.execute(f"PRAGMA index_info({name})"))
        predicate = sql.split(" WHERE ", 1)[1] if " WHERE " in sql else None
        schema["indexes"][name] = (table, cols, normal(predicate))
    return schema


def pg_schema(url: str) -> dict[str, Any]:
    schema: dict[str, Any] = {}
    with psycopg.connect(url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
                " AND table_name NOT IN ('schema_migrations', 'audit_head')"
            )
            if r[0] not in CLUSTER_TABLES
        ]
        for table in tables:
            columns = [
                (name, kind, notnull == "NO", default)
                for name, kind, notnull, default in conn.execute(
                    "SELECT column_name, data_type, is_nullable, column_default"
                    " FROM information_schema.columns WHERE table_name = %s"
                    " ORDER BY ordinal_position",
                    (table,),
                )
            ]
            constraints = conn.execute(
                "SELECT c.contype,"
                " array(SELECT a.attname FROM unnest(c.conkey) WITH ORDINALITY k(n, i)"
                "       JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.n"
                "       ORDER BY k.i),"
                " f.relname,"
                " array(SELECT a.attname FROM unnest(c.confkey) k(n)"
                "       JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k.n)"
                " FROM pg_constraint c LEFT JOIN pg_class f ON f.oid = c.confrelid"
                " WHERE c.conrelid = %s::regclass",
                (table,),
            ).fetchall()
            schema[table] = {
                "columns": columns,
                "keys": {(t, tuple(cols)) for t, cols, _, _ in constraints if t in ("p", "u")},
                "foreign": {
                    (cols[0], ref, refcols[0]) for t, cols, ref, refcols in constraints if t == "f"
                },
                "checks": sum(1 for t, *_ in constraints if t == "c"),
            }
        schema["indexes"] = {
            name: (table, tuple(cols), normal(predicate))
            for name, table, cols, predicate in conn.execute(
                "SELECT i.relname, t.relname,"
                " array(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY k(n, o)"
                "       JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.n ORDER BY k.o),"
                " pg_get_expr(x.indpred, x.indrelid)"
                " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
                " JOIN pg_class t ON t.oid = x.indrelid"
                " JOIN pg_namespace s ON s.oid = t.relnamespace"
                " WHERE s.nspname = 'public' AND NOT x.indisprimary AND NOT x.indisunique"
            )
            if table not in CLUSTER_TABLES
        }
    return schema


def test_pg_schema_equals_the_sqlite_schema_at_its_last_migration(url: str) -> None:
    assert migrated(url) == SCHEMA_VERSION

    want, got = sqlite_schema(), pg_schema(url)

    assert sorted(got) == sorted(want)
    for table in sorted(set(want) - {"indexes"}):
        assert got[table]["keys"] == want[table]["keys"], table
        assert got[table]["foreign"] == want[table]["foreign"], table
        assert got[table]["checks"] == want[table]["checks"], table
        # decisions.decision_id: SQLite's rowid alias is an identity column (no default text)
        assert got[table]["columns"] == want[table]["columns"], table
    assert got["indexes"] == want["indexes"]


def test_pg_schema_migrates_once_when_gates_start_together(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="gate.store.pg_schema")
    barrier = threading.Barrier(4)
    versions: list[int] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            with psycopg.connect(url) as conn:
                barrier.wait(timeout=30)
                with conn.transaction():
                    versions.append(migrate(conn))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert versions == [SCHEMA_VERSION] * 4
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version, step FROM schema_migrations ORDER BY step")
        assert rows.fetchall() == sorted(PG_MIGRATIONS)
        assert conn.execute("SELECT count(*) FROM approvals").fetchone() == (0,)
    # one line: a first start migrates once (its steps do not read as migrating again)
    assert [r.getMessage() for r in caplog.records] == [
        f"event=migrated schema_version={SCHEMA_VERSION}"
    ]


def test_pg_schema_migrating_again_changes_nothing(url: str) -> None:
    migrated(url)
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO approver_invites VALUES ('h', 1, NULL, 'c', 1, 2, NULL, NULL)")
        conn.commit()

    assert migrated(url) == SCHEMA_VERSION

    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT invite_hash FROM approver_invites").fetchall() == [("h",)]
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone() == (
            len(PG_MIGRATIONS),
        )


def test_pg_schema_newer_than_the_gate_is_refused_and_left_alone(url: str) -> None:
    migrated(url)
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
        conn.commit()

    with pytest.raises(SchemaTooNew, match=f"version {SCHEMA_VERSION + 1}; this gate knows up to"):
        migrated(url)

    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version, step FROM schema_migrations ORDER BY 1, 2").fetchall()
    assert rows == [*sorted(PG_MIGRATIONS), (SCHEMA_VERSION + 1, 0)]


def test_pg_schema_adds_the_cluster_tables_to_a_database_at_the_baseline(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # a database migrated before PostgreSQL's own step existed: only step 0
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute(
            "CREATE TABLE schema_migrations (version BIGINT NOT NULL,"
            " step BIGINT NOT NULL DEFAULT 0,"
            " applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),"
            " PRIMARY KEY (version, step))"
        )
        for statement in PG_MIGRATIONS[(SCHEMA_VERSION, 0)]:
            conn.execute(statement)
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION,))

    caplog.set_level("INFO", logger="gate.store.pg_schema")

    assert migrated(url) == SCHEMA_VERSION

    last_step = max(step for _, step in PG_MIGRATIONS)
    assert [r.getMessage() for r in caplog.records] == [
        f"event=migrated schema_version={SCHEMA_VERSION} step={last_step}"
    ]
    with psycopg.connect(url) as conn:
        for table in CLUSTER_TABLES:
            assert conn.execute("SELECT count(*) FROM " + table).fetchone() == (0,)
        steps = conn.execute("SELECT step FROM schema_migrations ORDER BY step").fetchall()
    assert steps == [(step,) for _, step in sorted(PG_MIGRATIONS)]


def test_pg_schema_audit_head_starts_as_the_empty_chain(url: str) -> None:
    migrated(url)
    migrated(url)
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, seq, entry_hash, last_at_ms FROM audit_head").fetchall()
        assert rows == [(1, 0, GENESIS_HASH, 0)]
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO audit_head VALUES (2, 0, 'x', 0)")


def _entry(seq: int, at: str) -> tuple[Any, ...]:
    entry = f'{{"approval_id":null,"at":"{at}","data":{{}},"kind":"probe","seq":{seq}}}'
    return (seq, None, "probe", entry, f"prev{seq}", f"hash{seq}", "r", None, None)


def test_pg_schema_sync_audit_head_takes_the_newest_entry(url: str) -> None:
    migrated(url)
    with psycopg.connect(url) as conn:
        conn.execute("DELETE FROM audit_head")
        for row in (_entry(1, "2026-01-01T00:00:00Z"), _entry(2, "2026-01-01T00:00:01.5Z")):
            conn.execute("INSERT INTO audit_log VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)", row)

        head = sync_audit_head(conn)  # the row was missing: created
        conn.commit()

        assert head == (2, "hash2", 1767225601500)
        assert conn.execute("SELECT * FROM audit_head").fetchall() == [(1, *head)]
        conn.execute("DELETE FROM audit_log")
        assert sync_audit_head(conn) == (0, GENESIS_HASH, 0)  # an empty log: the genesis
        assert conn.execute("SELECT * FROM audit_head").fetchall() == [(1, 0, GENESIS_HASH, 0)]


def test_pg_schema_with_a_later_postgresql_step_is_refused(url: str) -> None:
    migrated(url)
    last = max(PG_MIGRATIONS)
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO schema_migrations (version, step) VALUES (%s, %s)", (last[0], last[1] + 1)
        )
        conn.commit()

    with pytest.raises(SchemaTooNew) as refused:
        migrated(url)

    assert str(refused.value) == (
        f"the database's schema is version {last[0]} with PostgreSQL's step {last[1] + 1};"
        f" this gate knows up to step {last[1]}"
    )
