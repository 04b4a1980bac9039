"""Moving a SQLite gate to PostgreSQL (gate/store/pg_move.py, ``hitl-gate storage migrate``)
and reading PostgreSQL offline (gate/store/pg_read.py: ``audit verify``/``export``), on a real
throwaway server with a database a real gate wrote: approvals approved (one with an
approver's signature), adjusted, skipped, cancelled and pending with reminders and
escalations; a question answered; an approver key enrolled and an invite; a signing key, so
every entry is signed; drafts with non-ASCII text.

The proof the move asks for: the copy equals the source table by table, row by row (values
and their types), and ``audit verify --expect-head`` with the head the gate logged before
the move passes on the new database; a tampered byte in it does not."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.postgres.target import PgTarget
from gate.store.connection import prepare
from gate.store.pg_move import move
from gate.store.pg_schema import migrate
from gate.store.schema import MIGRATIONS
from gate.trust.keys import PRIVATE_KEY_NAME as KEY_NAME
from tests.pg_server import PgServer, psycopg_or_skip, running_server
from tests.support import (
    CaptureRelay,
    CliProcess,
    GateProcess,
    answer,
    ask,
    decision_body,
    dispatch_of,
    gate_env,
    http_request,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)
from tests.test_approver_keys import ADMIN_TOKEN, assertion, digest_of, new_key
from tests.test_signed_audit import sign_config

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg = psycopg_or_skip()

ALICE, BOB = "alice@example.com", "bob@example.com"
ENV = gate_env(HITL_ADMIN_TOKEN=ADMIN_TOKEN)
STEPS: list[dict[str, Any]] = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "opt", "approvers": [101, 102], "timeout": "1h", "approver_signature": "optional"},
    {
        "name": "fu",
        "quorum": 1,
        "approvers": [101],
        "timeout": "1h",
        "remind_after": "1s",
        "remind_every": "1s",
        "escalate": [{"after": "2s", "to": [102]}],
    },
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]
HEAD = re.compile(r"event=audit_head seq=(\d+) hash=([0-9a-f]{64})")


@dataclass(frozen=True)
class History:
    """A stopped gate's SQLite database, its config, public key, and the last chain head
    it logged (``SEQ:HASH``)."""

    db: Path
    config: Path
    public_key: Path
    head: str


def admin(gate: GateProcess, path: str, body: dict[str, Any]) -> Any:
    raw = json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {ADMIN_TOKEN}"}
    status, _, answered = http_request(gate.api_url + path, "POST", raw, headers)
    assert status == 201, (status, answered)
    return json.loads(answered)


def decide(gate: GateProcess, dispatch: dict[str, Any], who: str, verb: str, **extra: Any) -> None:
    status, out, _ = post_decision(gate.callback_url, decision_body(dispatch, who, verb, **extra))
    assert status == 200, out


def write_history(directory: Path) -> History:
    """Run a real gate on a fresh SQLite database, write every kind of row, stop it."""
    relay = CaptureRelay().start()
    try:
        config = write_config(
            directory,
            relay.url,
            steps=STEPS,
            api={"admin_token_env": "HITL_ADMIN_TOKEN"},
            relay={"questions": True, "credentials": True, "notices": True},
        )
        public, _ = sign_config(config)
        gate = GateProcess(config, env=ENV).start()
        try:
            _activity(gate, relay, directory)
        finally:
            assert gate.stop() == 0, gate.log()
        heads = HEAD.findall(gate.log())
        return History(config.parent / "gate.db", config, public, ":".join(heads[-1]))
    finally:
        relay.stop()


def _activity(gate: GateProcess, relay: CaptureRelay, directory: Path) -> None:
    api = gate.api()
    key, pub = new_key(directory, "alice")
    pem = pub.read_text(encoding="ascii")
    credential = admin(gate, "/v1/admin/approvers", {"operator_id": 101, "public_key": pem})
    admin(gate, "/v1/admin/approvers/invites", {"operator_id": 102, "label": "Bobs Schlüssel"})

    signed = api.create("opt", "Zahlung 1.250,00 € — bitte prüfen\n")["approval_id"]
    first = relay.wait_dispatch(signed)
    proof = assertion(key, credential["credential_id"], digest_of(first))
    decide(gate, first, ALICE, "approve", approver_assertion=proof)

    adjusted = api.create("q2", "Hallo Anna,\nRechnung fällig.\n")["approval_id"]
    decide(gate, relay.wait_dispatch(adjusted), ALICE, "adjust", adjust_text="Hallo Anna 👋\n")
    second = relay.wait_dispatch(adjusted, revision=2)
    decide(gate, second, BOB, "approve")

    skipped = api.create("q1", "send it?")["approval_id"]
    decide(gate, relay.wait_dispatch(skipped), BOB, "skip", reason="falscher Betrag")
    cancelled = api.create("q1", "never mind")["approval_id"]
    status, _ = api.call("POST", f"/v1/approvals/{cancelled}/cancel")
    assert status == 200
    pending = api.create("fu", "remind me")["approval_id"]

    question = ask(gate, text="Welcher Lieferant?", response_type="free_text")["question_id"]
    status, out = answer(gate, dispatch_of(relay, question), "Müller GmbH")
    assert status == 200, out
    for aid in (signed, adjusted, skipped):
        api.wait_resolved(aid)
    db = gate.config.parent / "gate.db"
    wait_until(
        lambda: (
            sqlite_rows(db, "SELECT count(*) FROM followup_outbox WHERE kind = 'escalation'")
            == [(1,)]
            and sqlite_rows(
                db, "SELECT escalation_level FROM approvals WHERE approval_id = ?", pending
            )
            == [(1,)]
        ),
        what="the pending approval's reminder and escalation",
    )


def sqlite_rows(path: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def gate_tables(path: Path) -> dict[str, list[str]]:
    """Each table of the SQLite database at ``path`` with its columns."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            )
        ]
        return {n: [r[1] for r in conn.execute(f"PRAGMA table_info({n})")] for n in names}
    finally:
        conn.close()


def typed(rows: list[Any]) -> list[tuple[tuple[str, Any], ...]]:
    """Rows with each value's type beside it: 1 and 1.0 and "1" differ."""
    return [tuple((type(v).__name__, v) for v in row) for row in rows]


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return write_history(tmp_path_factory.mktemp("pgmove"))


_databases = iter(range(1, 1000))


def empty_database(server: PgServer) -> str:
    """The URL of a new empty database on the module's server."""
    return server.database(f"move_{next(_databases)}")


def migrate_to(history: History, url: str) -> Any:
    return run_cli("storage", "migrate", "--from", str(history.db), "--to", url, env=ENV)


@pytest.fixture(scope="module")
def moved(server: PgServer, history: History) -> str:
    """The URL of a database the history was moved into (once for the module)."""
    url = empty_database(server)
    done = migrate_to(history, url)
    assert done.returncode == 0, done.stderr.decode()
    return url


def cli(*args: str) -> tuple[int, str, str]:
    done = run_cli(*args, env=ENV)
    return done.returncode, done.stdout.decode(), done.stderr.decode()


# ------------------------------------------------------------------ the move


def test_pg_move_copies_every_table_row_by_row(history: History, moved: str) -> None:
    tables = gate_tables(history.db)
    assert {"approvals", "decisions", "audit_log", "approver_invites"} <= set(tables)
    with psycopg.connect(moved) as conn:
        for table, columns in tables.items():
            names = ", ".join(columns)
            want = sqlite_rows(history.db, f"SELECT {names} FROM {table} ORDER BY {names}")
            got = conn.execute(f"SELECT {names} FROM {table} ORDER BY {names}").fetchall()
            assert typed(got) == typed(want), table
            assert want or table in ("followup_outbox", "question_notices"), f"{table} empty"


def test_pg_move_copies_the_audit_entries_byte_for_byte(history: History, moved: str) -> None:
    want = sqlite_rows(history.db, "SELECT seq, CAST(entry AS BLOB) FROM audit_log ORDER BY seq")
    with psycopg.connect(moved) as conn:
        got = conn.execute("SELECT seq, convert_to(entry, 'UTF8') FROM audit_log ORDER BY seq")
        assert [(s, bytes(b)) for s, b in got] == want
        assert any(b"\\u" not in e and "ü".encode() in e for _, e in want)  # raw UTF-8


def test_pg_move_sets_the_head_and_the_identity_past_the_copy(history: History, moved: str) -> None:
    seq, digest = history.head.split(":")
    (top,) = sqlite_rows(history.db, "SELECT max(decision_id) FROM decisions")[0]
    with psycopg.connect(moved) as conn:
        head = conn.execute("SELECT seq, entry_hash FROM audit_head WHERE id = 1").fetchone()
        assert head == (int(seq), digest)
        (following,) = conn.execute(
            "SELECT nextval(pg_get_serial_sequence('decisions', 'decision_id'))"
        ).fetchone()
        assert following == top + 1
        conn.rollback()


def test_pg_move_says_what_it_copied_in_one_line(server: PgServer, history: History) -> None:
    url = empty_database(server)
    done = migrate_to(history, url)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode()
    assert done.stderr == b""
    seq, digest = history.head.split(":")
    (entries,) = sqlite_rows(history.db, "SELECT count(*) FROM audit_log")[0]
    assert out.count("\n") == 1
    assert out.startswith(f"moved {history.db} to {url}: approvals 5, revisions 6, decisions ")
    assert f", audit_log {entries}, " in out
    assert out.endswith(f"; head seq {seq} hash {digest}; the copy verifies\n")


def pg_config(history: History, url: str, directory: Path, relay_url: str = "") -> Path:
    """The history's config with ``storage.url`` set to ``url`` instead of its file (and
    ``relay.url`` to ``relay_url`` when given)."""
    config = yaml.safe_load(history.config.read_text(encoding="utf-8"))
    config["storage"] = {"url": url}
    if relay_url:
        config["relay"]["url"] = relay_url
    config["receipts"]["signing_key_file"] = str(history.config.parent / "keys" / KEY_NAME)
    path = directory / "pg.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("by", ["--db", "-c"])
def test_pg_move_head_logged_before_the_move_verifies_on_postgres(
    history: History, moved: str, tmp_path: Path, by: str
) -> None:
    if by == "--db":
        where = ["--db", moved, "--key-env", "HITL_RECEIPT_KEY"]
        where += ["--public-key", str(history.public_key)]
    else:  # the config's receipt key, signing key and storage.url
        where = ["-c", str(pg_config(history, moved, tmp_path))]
    code, out, err = cli("audit", "verify", *where, "--expect-head", history.head)
    assert (code, err) == (0, ""), out + err
    seq = history.head.split(":")[0]
    assert out.startswith(
        f"ok: {seq} entries, chain, receipts and signatures intact; holds the logged head at"
        f" entry {seq}\n"
    ), out
    assert "ok: 5 approvals match the audit log" in out
    assert "ok: 1 questions match the audit log" in out


@pytest.mark.parametrize("by", ["--db", "-c"])
def test_pg_move_export_from_postgres_equals_the_sqlite_export(
    history: History, moved: str, tmp_path: Path, by: str
) -> None:
    code, lite, err = cli("audit", "export", "-c", str(history.config))
    assert code == 0, err
    where = ["--db", moved] if by == "--db" else ["-c", str(pg_config(history, moved, tmp_path))]
    code, pg, err = cli("audit", "export", *where, "-o", str(tmp_path / "pg.jsonl"))
    assert (code, pg, err) == (0, "", "")
    assert (tmp_path / "pg.jsonl").read_text(encoding="utf-8") == lite


@pytest.mark.parametrize("by", ["--db", "-c"])
def test_pg_move_signatures_read_from_postgres(
    history: History, moved: str, tmp_path: Path, by: str
) -> None:
    code, lite, err = cli("audit", "signatures", "-c", str(history.config))
    assert code == 0, err
    where = ["--db", moved] if by == "--db" else ["-c", str(pg_config(history, moved, tmp_path))]
    code, pg, err = cli("audit", "signatures", *where)
    assert (code, pg, err) == (0, lite, "")
    assert len(pg.splitlines()) == 2  # the header and alice's signed approval


def test_pg_move_an_older_gates_database_keeps_its_anchors(
    server: PgServer, tmp_path: Path
) -> None:
    """The database an older gate wrote (tests/fixtures/old_gate), moved: the head and the
    receipt kept from before verify on PostgreSQL."""
    old = Path(__file__).resolve().parent / "fixtures" / "old_gate"
    source = tmp_path / "gate.db"
    shutil.copyfile(old / "gate.db", source)
    url = empty_database(server)
    done = run_cli("storage", "migrate", "--from", str(source), "--to", url, env=ENV)
    assert done.returncode == 0, done.stderr.decode()
    head = (old / "head.txt").read_text(encoding="utf-8").strip()
    code, out, err = cli(
        "audit", "verify", "--db", url, "--key-env", "HITL_RECEIPT_KEY",
        "--public-key", str(old / "audit.pub"), "--expect-head", head,
        "--expect", str(old / "receipt.json"),
    )  # fmt: skip
    assert (code, err) == (0, ""), out + err


def test_pg_move_a_database_of_an_older_schema_as_if_migrated_first(
    server: PgServer, tmp_path: Path
) -> None:
    """A source at schema 1 is copied as SQLite's migrations would have left it: each column
    it lacks gets its default (``move`` itself: the copy, not its audit check)."""
    source = tmp_path / "v1.db"
    conn = sqlite3.connect(source, isolation_level=None)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO approvals (approval_id, run_id, pipeline, step, risk, content_type,"
        " quorum_required, scope, spend, state, created_at, expires_at, request_hash)"
        " VALUES ('A1', 'r', 'p', 'q1', 'low', 'text/plain', 1, '[]', 12.5, 'pending', 1, 2, 'h')"
    )
    conn.close()
    url = empty_database(server)

    moved = move(source, PgTarget(url))

    assert dict(moved.tables)["approvals"] == 1 and moved.head is None
    migrated = prepare(source)  # the gate's own migrations, then the same row read back
    columns = [r[1] for r in migrated.execute("PRAGMA table_info(approvals)")]
    want = migrated.execute(f"SELECT {', '.join(columns)} FROM approvals").fetchall()
    migrated.close()
    with psycopg.connect(url) as pg:
        got = pg.execute(f"SELECT {', '.join(columns)} FROM approvals").fetchall()
    assert typed(got) == typed([tuple(r) for r in want])


def test_pg_move_a_gate_started_on_the_copy_appends_after_its_head(
    server: PgServer, history: History, tmp_path: Path
) -> None:
    url = empty_database(server)
    assert migrate_to(history, url).returncode == 0
    relay = CaptureRelay().start()
    config = pg_config(history, url, tmp_path, relay.url)
    gate = GateProcess(config, env=ENV).start()
    try:
        api = gate.api()
        approval = api.create("q1", "nach dem Umzug")["approval_id"]
        decide(gate, relay.wait_dispatch(approval), ALICE, "approve")
        api.wait_resolved(approval)
    finally:
        assert gate.stop() == 0, gate.log()
        relay.stop()
    old_seq = int(history.head.split(":")[0])
    new_seq, new_hash = HEAD.findall(gate.log())[-1]
    assert int(new_seq) > old_seq
    code, out, err = cli(
        "audit", "verify", "-c", str(config),
        "--expect-head", history.head, "--expect-head", f"{new_seq}:{new_hash}",
    )  # fmt: skip
    assert (code, err) == (0, ""), out + err
    (top,) = sqlite_rows(history.db, "SELECT max(decision_id) FROM decisions")[0]
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT decision_id FROM decisions WHERE approval_id = %s", (approval,)
        ).fetchall()
        first = conn.execute("SELECT min(seq) FROM audit_log WHERE approval_id = %s", (approval,))
        assert (found, first.fetchone()) == ([(top + 1,)], (old_seq + 1,))


def test_pg_move_a_tampered_copy_fails_verify(server: PgServer, history: History) -> None:
    url = empty_database(server)
    assert migrate_to(history, url).returncode == 0
    with psycopg.connect(url) as conn:  # one byte of the first approval's created entry
        (seq,) = conn.execute("SELECT min(seq) FROM audit_log WHERE kind = 'created'").fetchone()
        conn.execute(
            'UPDATE audit_log SET entry = replace(entry, \'"step":"opt"\', \'"step":"opu"\')'
            " WHERE seq = %s",
            (seq,),
        )
    code, out, err = cli(
        "audit", "verify", "--db", url, "--key-env", "HITL_RECEIPT_KEY",
        "--expect-head", history.head,
    )  # fmt: skip
    assert (code, err) == (1, ""), out + err
    assert out.startswith(f"TAMPERED: entry {seq}: "), out


def test_pg_move_a_source_whose_log_does_not_verify_is_named(
    server: PgServer, history: History, tmp_path: Path
) -> None:
    source = tmp_path / "gate.db"
    shutil.copyfile(history.db, source)
    with sqlite3.connect(source) as conn:
        conn.execute(
            'UPDATE audit_log SET entry = replace(entry, \'"step":"q1"\', \'"step":"q0"\')'
        )
    url = empty_database(server)
    done = run_cli("storage", "migrate", "--from", str(source), "--to", url, env=ENV)
    err = done.stderr.decode()
    assert (done.returncode, done.stdout) == (1, b""), err
    assert re.fullmatch(
        rf"Error: the copy in {url} does not verify: TAMPERED: entry \d+: entry hash does not"
        rf" match its content \(changed\) \(\d+ entries before it verified\) \(it stays there:"
        rf" check the source with `hitl-gate"
        rf" audit verify --db {source}`, drop the copy, move again\)\n",
        err,
    ), err


@pytest.mark.parametrize(
    ("value", "held"),
    [("'run' || char(0) || 'id'", "approvals.run_id of row 1 holds U+0000, which PostgreSQL"
      " text cannot hold"),
     ("x'00ff'", "approvals.run_id of row 1 holds a BLOB, which its PostgreSQL column cannot"
      " hold unchanged"),
     ("CAST(x'ff' AS TEXT)", "approvals.run_id holds text that is not UTF-8 (in rows 1 to"
      " 1000)")],
    ids=["nul", "blob", "not-utf8"],
)  # fmt: skip
def test_pg_move_a_value_postgres_cannot_hold_is_named(
    server: PgServer, tmp_path: Path, value: str, held: str
) -> None:
    source = tmp_path / "gate.db"
    prepare(source).close()
    with sqlite3.connect(source) as conn:
        conn.execute(
            "INSERT INTO approvals (approval_id, run_id, pipeline, step, risk, content_type,"
            " quorum_required, scope, state, created_at, expires_at, request_hash)"
            f" VALUES ('A1', {value}, 'p', 'q1', 'low', 'text/plain', 1, '[]', 'pending', 1, 2,"
            " 'h')"
        )
    url = empty_database(server)
    done = run_cli("storage", "migrate", "--from", str(source), "--to", url, env=ENV)
    assert (done.returncode, done.stdout) == (1, b"")
    assert done.stderr.decode() == f"Error: {held}\n"
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone() == (0,)


def test_pg_move_a_row_postgres_refuses_is_one_line_without_the_row(
    server: PgServer, tmp_path: Path
) -> None:
    """A revision whose approval is missing (SQLite checks foreign keys only when told to):
    PostgreSQL refuses it; the line names the constraint, never the draft."""
    source = tmp_path / "gate.db"
    prepare(source).close()
    with sqlite3.connect(source) as conn:  # foreign keys off, as sqlite3 opens by default
        conn.execute(
            "INSERT INTO revisions VALUES ('NOPE', 1, 'geheimer Entwurf', 'sha256:x', 'n', 1, NULL)"
        )
    url = empty_database(server)
    done = run_cli("storage", "migrate", "--from", str(source), "--to", url, env=ENV)
    err = done.stderr.decode()
    assert (done.returncode, done.stdout) == (1, b""), err
    assert err == (
        'Error: the copy failed: insert or update on table "revisions" violates foreign key'
        ' constraint "revisions_approval_id_fkey"\n'
    )


@pytest.mark.parametrize("clash", [False, True], ids=["gate-table-with-a-row", "foreign-table"])
def test_pg_move_refuses_a_non_empty_target_and_leaves_it(
    server: PgServer, history: History, clash: bool
) -> None:
    url = empty_database(server)
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE approver_invites (invite_hash TEXT PRIMARY KEY)")
        if not clash:
            conn.execute("INSERT INTO approver_invites VALUES ('kept')")
    done = migrate_to(history, url)
    err = done.stderr.decode()
    assert (done.returncode, done.stdout) == (2, b""), err
    if clash:
        assert err == (
            'Error: --to: cannot apply the gate\'s schema: relation "approver_invites" '
            "already exists\n"
        )
    else:
        assert err == (
            "Error: --to: the database is not empty: table approver_invites has rows (the "
            "move copies into an empty database only; nothing was written)\n"
        )
    with psycopg.connect(url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
        assert tables == [("approver_invites",)]
        kept = conn.execute("SELECT * FROM approver_invites").fetchall()
        assert kept == ([] if clash else [("kept",)])


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (
            "ENCODING 'LATIN1'",
            "the database's encoding is LATIN1; the gate's texts need UTF8 (createdb"
            " --locale=C --encoding=UTF8 --template=template0)",
        ),
        (
            "LOCALE_PROVIDER icu ICU_LOCALE 'und'",
            "the database does not sort text by code point, as the gate's ids sort; create it"
            " with the C collation (createdb --locale=C --encoding=UTF8 --template=template0)",
        ),
    ],
    ids=["latin1", "icu-collation"],
)
def test_pg_move_refuses_a_database_not_utf8_or_not_by_code_point(
    server: PgServer, history: History, options: str, line: str
) -> None:
    name = f"move_{next(_databases)}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} {options} TEMPLATE template0")
    done = migrate_to(history, server.url(name))
    assert (done.returncode, done.stdout) == (2, b"")
    assert done.stderr.decode() == f"Error: --to: {line}\n"
    with psycopg.connect(server.url(name)) as conn:
        assert conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone() == (0,)


def test_pg_move_waits_for_a_gate_writing_there_and_then_refuses(
    server: PgServer, history: History
) -> None:
    """A gate already running on the target holds the head lock while it writes: the move
    waits for that transaction, then finds its row and refuses (nothing of its own kept)."""
    url = empty_database(server)
    with psycopg.connect(url) as conn, conn.transaction():
        migrate(conn)
    writer = psycopg.connect(url)  # what a gate's writer does in a batch
    writer.execute("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE")
    watch = psycopg.connect(url, autocommit=True)  # each look a fresh pg_stat_activity
    mover = CliProcess("storage", "migrate", "--from", str(history.db), "--to", url, env=ENV)
    try:
        wait_until(
            lambda: (
                watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE"
                    " 'hitl-gate/move/%' AND wait_event_type = 'Lock'"
                ).fetchone()
                == (1,)
            ),
            what="the move waiting for the head lock",
        )
        writer.execute("INSERT INTO approver_invites VALUES ('h', 1, NULL, 'c', 1, 2, NULL, NULL)")
        writer.commit()
        code, out, err = mover.finish()
    finally:
        writer.close()
        watch.close()
        if mover.proc.poll() is None:
            mover.stop()
    assert (code, out) == (2, b""), err
    assert err.startswith("Error: --to: the database is not empty: table approver_invites"), err
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM approvals").fetchone() == (0,)
        assert conn.execute("SELECT seq FROM audit_head").fetchone() == (0,)


def test_pg_move_refuses_a_target_a_gate_already_wrote(
    server: PgServer, history: History, moved: str
) -> None:
    with psycopg.connect(moved) as conn:
        before = conn.execute("SELECT count(*) FROM audit_log").fetchone()
    done = migrate_to(history, moved)
    assert done.returncode == 2
    assert done.stderr.decode().startswith(
        "Error: --to: the database is not empty: table approvals has rows"
    )
    with psycopg.connect(moved) as conn:
        assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == before


def test_pg_move_refuses_a_source_a_gate_runs_on(
    server: PgServer, history: History, tmp_path: Path
) -> None:
    config = yaml.safe_load(history.config.read_text(encoding="utf-8"))
    config["relay"]["url"] = "http://127.0.0.1:9/relay"
    running = tmp_path / "config.yaml"
    running.write_text(yaml.safe_dump(config), encoding="utf-8")
    (tmp_path / "keys").symlink_to(history.config.parent / "keys")
    copy = tmp_path / "gate.db"
    copy.write_bytes(history.db.read_bytes())
    url = empty_database(server)
    gate = GateProcess(running, env=ENV).start()
    try:
        done = run_cli("storage", "migrate", "--from", str(copy), "--to", url, env=ENV)
    finally:
        gate.stop()
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert re.fullmatch(
        rf"Error: --from: database in use by another hitl-gate process \(pid [\d, ]+\): {copy}\n",
        err,
    ), err
    with psycopg.connect(url) as conn:
        assert conn.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone() == (0,)


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        (
            "INSERT INTO gate_instances VALUES ('01J', 'v', 'h', 'host', 1, 0, 1, 2)",
            "table gate_instances has rows",
        ),
        ("INSERT INTO gate_lease VALUES ('timers', '01J', 1, 1, 2)", "table gate_lease has rows"),
        ("INSERT INTO rate_events VALUES (1, 1)", "table rate_events has rows"),
        ("UPDATE audit_head SET seq = 3", "its audit head is at entry 3"),
    ],
    ids=["gate_instances", "gate_lease", "rate_events", "audit_head"],
)
def test_pg_move_refuses_a_target_gates_run_or_have_run_on(
    server: PgServer, history: History, rows: str, reason: str
) -> None:
    """A gate that started on the target left a trace in PostgreSQL's own tables (which the
    source has none of): refused in one line before anything is written."""
    url = empty_database(server)
    with psycopg.connect(url) as conn, conn.transaction():
        migrate(conn)
        conn.execute(rows)
    done = migrate_to(history, url)
    assert (done.returncode, done.stdout) == (2, b""), done.stderr.decode()
    assert done.stderr.decode() == (
        f"Error: --to: gates run or have run on this database: {reason} (the move copies"
        " into a database no gate has used; nothing was written)\n"
    )
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM approvals").fetchone() == (0,)


def test_pg_move_refuses_a_target_a_gate_is_running_on(
    server: PgServer, history: History, tmp_path: Path
) -> None:
    """The new user's case: a gate started on the empty target (it wrote no approval) and
    is running: the move is refused and the gate has nothing to act on."""
    url = empty_database(server)
    gate = GateProcess(pg_config(history, url, tmp_path, "http://127.0.0.1:9/relay"), env=ENV)
    gate.start()
    try:
        done = migrate_to(history, url)
    finally:
        gate.stop()
    assert (done.returncode, done.stdout) == (2, b""), done.stderr.decode()
    assert done.stderr.decode().startswith(
        "Error: --to: gates run or have run on this database: table gate_instances has rows"
    )
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM approvals").fetchone() == (0,)
