"""The offline readers on PostgreSQL (gate/store/pg_read.py through gate/store/readonly.py
and gate/store/auditlog.py), on a real throwaway server: every SELECT a server-side cursor
(rows fetched as read), one read-only snapshot per connection, a schema newer than the gate
refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gate.audit import chain
from gate.audit.verify import verify_chain
from gate.errors import Unavailable
from gate.store import auditlog, readonly
from gate.store.pg_read import PgTarget
from gate.store.pg_schema import migrate
from gate.store.schema import SCHEMA_VERSION
from tests.pg_server import PgServer, psycopg_or_skip, running_server

psycopg = psycopg_or_skip()

ROWS = 2500
KEY = b"test-receipt-key-pg-read-7e1d"


# ------------------------------------------------------------------ on a real server


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


@pytest.fixture(scope="module")
def db(server: PgServer) -> PgTarget:
    """A migrated database holding a chain of ROWS audit entries with receipts (KEY)."""
    with psycopg.connect(server.database("readers")) as conn, conn.transaction():
        migrate(conn)
        with conn.cursor().copy("COPY audit_log (seq, kind, entry, prev_hash, entry_hash, receipt)"
                                " FROM STDIN") as copy:  # fmt: skip
            prev = chain.GENESIS_HASH
            for seq in range(1, ROWS + 1):
                entry = {"approval_id": None, "kind": "probe", "seq": seq}
                text, digest, receipt = chain.seal(prev, entry, KEY)
                copy.write_row((seq, "probe", text, prev, digest, receipt))
                prev = digest
    return PgTarget(server.url("readers"))


@pytest.mark.e2e
@pytest.mark.postgres
def test_pg_read_streams_through_a_server_side_cursor(db: PgTarget) -> None:
    with readonly.reading(db) as conn:
        cursor = conn.execute("SELECT seq FROM audit_log ORDER BY seq")
        first = cursor.fetchmany(10)
        open_cursors = conn.execute("SELECT name FROM pg_cursors ORDER BY name").fetchall()
        rest = list(auditlog.fetched(cursor))
    assert [r[0] for r in first] == list(range(1, 11))
    assert [r[0] for r in rest] == list(range(11, ROWS + 1))
    assert [r[0] for r in open_cursors] == ["hitl_read_1", "hitl_read_2"]


@pytest.mark.e2e
@pytest.mark.postgres
def test_pg_read_sees_one_snapshot_and_writes_nothing(db: PgTarget) -> None:
    with readonly.reading(db) as conn:
        before = conn.execute("SELECT count(*) FROM audit_log").fetchone()[0]
        with psycopg.connect(db.url) as other:
            other.execute(
                "INSERT INTO audit_log VALUES (%s, NULL, 'x', '{}', 'p', 'h', 'r')", (ROWS + 1,)
            )
            other.commit()
        conn.execute("BEGIN")  # a reader's own snapshot statements change nothing here
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone()[0] == before
        conn.execute("COMMIT")
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone()[0] == before
    with pytest.raises(Unavailable, match="read-only transaction"):
        with readonly.reading(db) as conn:
            conn.execute("DELETE FROM audit_log")
    assert auditlog.seq_bounds(db) == (1, ROWS + 1)
    with psycopg.connect(db.url) as other:
        other.execute("DELETE FROM audit_log WHERE seq = %s", (ROWS + 1,))


@pytest.mark.e2e
@pytest.mark.postgres
def test_pg_read_refuses_a_schema_newer_than_the_gate(server: PgServer) -> None:
    with psycopg.connect(server.database("newer")) as conn, conn.transaction():
        migrate(conn)
        conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (SCHEMA_VERSION + 1,))
    newer = PgTarget(server.url("newer"))
    with pytest.raises(Unavailable, match=f"schema {SCHEMA_VERSION + 1} is newer than this gate"):
        list(auditlog.DatabaseRows(newer))


@pytest.mark.e2e
@pytest.mark.postgres
def test_pg_read_refuses_a_database_not_utf8_in_one_line(server: PgServer) -> None:
    # its texts would read as bytes (audit verify died of a TypeError)
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute(
            "CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
            " TEMPLATE template0"
        )
    with psycopg.connect(server.url("ascii")) as conn, conn.transaction():
        migrate(conn)
    ascii_db = PgTarget(server.url("ascii"))
    with pytest.raises(Unavailable) as refused:
        list(auditlog.DatabaseRows(ascii_db))
    assert refused.value.message == (
        f"database {ascii_db}: the database's encoding is SQL_ASCII; the gate's texts need"
        " UTF8 (createdb --locale=C --encoding=UTF8 --template=template0)"
    )


@pytest.mark.e2e
@pytest.mark.postgres
def test_pg_read_parallel_chain_check_answers_as_one_pass(db: PgTarget) -> None:
    def both() -> tuple[chain.VerifyResult, chain.VerifyResult]:
        whole = chain.verify(auditlog.DatabaseRows(db), KEY)
        return whole, verify_chain(db, KEY, workers=2, segment_rows=1000)  # a connection each

    whole, split = both()
    assert whole.ok and whole.checked == ROWS and split == whole
    with psycopg.connect(db.url) as conn:
        conn.execute("UPDATE audit_log SET entry = entry || ' ' WHERE seq = 1777")
    try:
        whole, split = both()
    finally:
        with psycopg.connect(db.url) as conn:
            conn.execute("UPDATE audit_log SET entry = rtrim(entry) WHERE seq = 1777")
    assert (whole.ok, whole.first_bad_seq) == (False, 1777)
    assert split == whole
