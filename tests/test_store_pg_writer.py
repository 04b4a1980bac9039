"""The writer on PostgreSQL (gate/store/pg_backend.py) on a real throwaway server: the batch
runner with ``PgBatch`` (the ``audit_head`` row lock, its tail and the database's clock),
``PgSide``'s connection (session settings, a new one once the session was ended), the
probe, the lock timeout, and the reads' schema version."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.clock import PinnedClock
from gate.config import Config, load_config
from gate.core.commands import ReceiptKey
from gate.core.transactions import Transactions
from gate.errors import Fenced, GateError, Unavailable
from gate.postgres import target as pg_target
from gate.postgres.target import PgTarget
from gate.store import pg_backend
from gate.store.batch import PROBE, Faults, Job, run_batch, run_guarded
from gate.store.pg_backend import PgBatch, PgSide
from gate.store.pg_schema import migrate
from gate.store.reads import Reads
from gate.store.schema import SCHEMA_VERSION
from gate.store.tx import WriteTx
from tests.pg_server import PgServer, psycopg_or_skip, running_server
from tests.support import ENV, wait_until, write_config
from tests.test_store_pg_connection import Hand, ManualClock

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg = psycopg_or_skip()

KEY = b"test-receipt-key-writer-7d1e"
_databases = iter(range(1, 1000))


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    yield from running_server()


@pytest.fixture(scope="module")
def migrated(server: PgServer) -> str:
    url = server.database("writer_template")
    with psycopg.connect(url) as conn, conn.transaction():
        migrate(conn)
    return "writer_template"


@pytest.fixture
def target(server: PgServer, migrated: str) -> PgTarget:
    """A fresh migrated database."""
    return PgTarget(server.database(f"writer_{next(_databases)}", migrated), instance="test")


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    return load_config(write_config(tmp_path, "http://127.0.0.1:9/relay"))


@pytest.fixture
def writers(target: PgTarget, config: Config) -> Iterator[Callable[..., Writer]]:
    """``writers()`` is a new ``Writer`` on the test's database; all closed afterwards."""
    made: list[Writer] = []

    def make(key: bytes = KEY, previous: bytes | None = None) -> Writer:
        made.append(Writer(target, config, key, previous))
        return made[-1]

    yield make
    for writer in made:
        writer.side.close()


class Writer:
    """A ``PgSide`` with the gate's transactions on a manual clock (pinned per batch),
    appending with the receipt ``key`` (``previous``: a declared rotation's old one)."""

    def __init__(
        self, target: PgTarget, config: Config, key: bytes = KEY, previous: bytes | None = None
    ) -> None:
        self.manual = ManualClock()
        self.clock = PinnedClock(self.manual)
        self.side = PgSide(target, self.clock)
        self.target = target
        self.key = key
        self.t = Transactions(config, self.clock, key, None, previous_receipt_key=previous)
        self.faults = Faults(str(target))

    def run(
        self, *fns: Callable[[WriteTx], Any] | ReceiptKey
    ) -> list[tuple[Any, BaseException | None]]:
        jobs = [Job(fn if isinstance(fn, ReceiptKey) else Hand(fn)) for fn in fns]
        answers = run_guarded(self.side, jobs, self.t.run, self.faults).answers
        by_job = {id(job): (value, error) for job, value, error in answers}
        return [by_job[id(job)] for job in jobs]

    def append(self, tx: WriteTx, n: int = 0) -> int:
        now = self.t.clock.now_ms()
        tx.append_audit("probe_entry", None, now, {"n": n}, self.key)
        return now


def head(target: PgTarget) -> tuple[Any, ...]:
    with psycopg.connect(target.url) as conn:
        found: tuple[Any, ...] = conn.execute(
            "SELECT seq, entry_hash, last_at_ms FROM audit_head WHERE id = 1"
        ).fetchone()
        return found


def test_pg_writer_clock_is_the_databases_and_never_goes_back(
    target: PgTarget, writers: Callable[[], Writer]
) -> None:
    writer = writers()  # the gate's own clock says 2026-01-01
    ((at, error),) = writer.run(writer.append)
    assert error is None
    assert abs(at - time.time() * 1000) < 60_000  # the database's time, not the gate's
    assert writer.clock.now_ms() == writer.manual.now  # unpinned after the batch
    seq, _, last_at_ms = head(target)
    assert (seq, last_at_ms) == (1, at)

    ahead = at + 3_600_000  # an entry written by a gate whose clock runs an hour ahead
    with psycopg.connect(target.url) as conn:
        conn.execute("UPDATE audit_head SET last_at_ms = %s", (ahead,))
    ((later, error),) = writer.run(writer.append)
    assert error is None and later >= ahead
    assert head(target)[::2] == (2, later)


def test_pg_writer_head_follows_what_the_batch_kept(
    target: PgTarget, writers: Callable[[], Writer]
) -> None:
    writer = writers()

    def refused(tx: WriteTx) -> None:
        writer.append(tx, 2)
        raise GateError("refused_here", "refused after an entry", status=409)

    (first, _), (_, error), (_, none) = writer.run(writer.append, refused, writer.append)

    assert isinstance(error, GateError) and none is None
    with psycopg.connect(target.url) as conn:
        seq, digest = conn.execute(
            "SELECT seq, entry_hash FROM audit_log ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        entries = conn.execute("SELECT count(*) FROM audit_log").fetchone()[0]
    assert (seq, entries) == (2, 2)
    assert head(target)[:2] == (seq, digest)


def test_pg_writer_appends_only_after_an_entry_receipted_with_its_own_key(
    target: PgTarget, writers: Callable[..., Writer], caplog: pytest.LogCaptureFixture
) -> None:
    old = writers()
    ((_, error),) = old.run(old.append)
    assert error is None
    new = writers(b"test-receipt-key-writer-new-90c2", KEY)
    (rotated, error), (_, after) = new.run(ReceiptKey(), new.append)  # the start's rotation
    assert error is None and after is None and rotated[0] == "rotated"
    entries = head(target)

    # a gate still on the retired key: every job refused, nothing written, logged once
    answers = old.run(old.append, lambda tx: "no entry") + old.run(old.append)
    assert [value for value, _ in answers] == [None] * 3
    for _, refusal in answers:
        assert isinstance(refusal, Fenced)
        assert (refusal.status, refusal.code) == (503, "receipt_key_retired")
        assert refusal.body()["message"] == (
            "another gate rotated the receipt key; restart this gate with "
            "receipts.key_env holding the new key"
        )
    assert head(target) == entries
    assert caplog.text.count("event=receipt_key_retired") == 1
    assert new.run(new.append)[0][1] is None  # the gate on the new key goes on


def test_pg_writer_waiting_for_the_head_lock_checks_the_receipt_of_the_entry_it_waited_for(
    server: PgServer, target: PgTarget, writers: Callable[..., Writer]
) -> None:
    """A batch that waited for the head lock while another gate rotated the receipt key
    checks the rotation's entry, not the one it found when it began waiting: PostgreSQL
    hands the waiter the head row as the other gate committed it, while the statement's
    other reads still see the log as it was when the statement began."""
    old = writers()
    ((_, error),) = old.run(old.append)
    assert error is None
    new = writers(b"test-receipt-key-writer-new-90c2", KEY)
    rotated, release = threading.Event(), threading.Event()

    def holds_the_rotation(tx: WriteTx) -> None:
        rotated.set()
        assert release.wait(timeout=60)

    pid = old.side.connection().execute("SELECT pg_backend_pid()").fetchone()[0]
    answers: dict[str, list[tuple[Any, BaseException | None]]] = {}
    threads = [
        threading.Thread(
            target=lambda: answers.update(new=new.run(ReceiptKey(), holds_the_rotation))
        )
    ]
    threads[0].start()
    try:
        assert rotated.wait(timeout=60)
        threads.append(threading.Thread(target=lambda: answers.update(old=old.run(old.append))))
        threads[1].start()
        waiting = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
        with psycopg.connect(target.url, autocommit=True) as watch:
            wait_until(lambda: watch.execute(waiting, (pid,)).fetchone(), what="the old's wait")
    finally:
        release.set()
        for thread in threads:
            thread.join(timeout=60)

    (settled, error), (_, none) = answers["new"]
    assert error is None and none is None and settled[0] == "rotated"
    ((_, refusal),) = answers["old"]
    assert isinstance(refusal, Fenced) and refusal.code == "receipt_key_retired", refusal
    with psycopg.connect(target.url) as conn:
        kinds = [kind for (kind,) in conn.execute("SELECT kind FROM audit_log ORDER BY seq")]
    assert kinds == ["probe_entry", "receipt_key_rotated"]


def test_pg_writer_probe_is_a_write_through_the_backend(
    target: PgTarget, writers: Callable[[], Writer]
) -> None:
    writer = writers()
    conn = writer.side.connection()
    changes = conn.total_changes

    ran = run_batch(conn, [Job(PROBE)], writer.t.run, writer.faults, None, PgBatch())
    ((_, _, error),) = ran.answers

    assert error is None and conn.total_changes == changes + 1
    assert head(target) == (0, "0" * 64, 0)


def test_pg_writer_session_is_named_and_bounded(
    target: PgTarget, writers: Callable[[], Writer]
) -> None:
    writer = writers()
    conn = writer.side.connection()

    settings = [
        conn.execute(f"SHOW {name}").fetchone()[0]
        for name in ("idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout")
    ]
    assert settings == ["5s", "10s", "30s"]
    (name,) = conn.execute("SELECT application_name FROM pg_stat_activity WHERE pid ="
                           " pg_backend_pid()").fetchone()  # fmt: skip
    assert name == "hitl-gate/writer/test"


def test_pg_writer_connects_again_after_its_session_was_ended(
    server: PgServer,
    target: PgTarget,
    writers: Callable[[], Writer],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pg_backend, "CHECK_IDLE_S", 3600.0)  # no check of an idle one
    writer = writers()
    assert writer.run(writer.append)[0][1] is None
    pid = writer.side.connection().execute("SELECT pg_backend_pid()").fetchone()[0]
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    # the next batch finds the session gone (before or at BEGIN: nothing ran) and runs on a
    # new connection
    assert writer.run(writer.append)[0][1] is None
    assert writer.faults.write_fault is None
    again = writer.side.connection().execute("SELECT pg_backend_pid()").fetchone()[0]
    assert again != pid
    with psycopg.connect(target.url) as conn:
        seq = conn.execute("SELECT max(seq) FROM audit_log").fetchone()[0]
    assert head(target)[0] == seq >= 2


def test_pg_writer_waiting_for_the_head_lock_answers_503_at_the_lock_timeout(
    writers: Callable[[], Writer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pg_target, "LOCK_TIMEOUT_MS", 300)
    holder, waiter = writers(), writers()
    locked, release = threading.Event(), threading.Event()

    def hold(tx: WriteTx) -> None:
        locked.set()
        assert release.wait(timeout=60)

    thread = threading.Thread(target=holder.run, args=(hold,))
    thread.start()
    try:
        assert locked.wait(timeout=60)
        started = time.monotonic()
        ((_, error),) = waiter.run(waiter.append)
        waited = time.monotonic() - started
    finally:
        release.set()
        thread.join(timeout=60)

    assert isinstance(error, Unavailable) and error.code == "storage_unavailable"
    assert "lock timeout" in error.message and waited < 30
    assert waiter.run(waiter.append)[0][1] is None  # the next batch gets the lock


def test_pg_reads_schema_version(target: PgTarget) -> None:
    reads = Reads()
    reads.open(target)
    try:
        assert asyncio.run(reads.schema_version()) == SCHEMA_VERSION
    finally:
        reads.close()


def test_pg_reads_connect_again_after_their_session_was_ended(
    server: PgServer, target: PgTarget
) -> None:
    reads = Reads()
    reads.open(target)

    async def pid() -> int:
        return int(await reads.call(lambda c: c.execute("SELECT pg_backend_pid()").fetchone()[0]))

    try:
        before = asyncio.run(pid())
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (before,))
        assert asyncio.run(pid()) != before  # found gone: run again on a new session
        server.stop("fast")
        try:
            with pytest.raises(Unavailable):  # no server: 503
                asyncio.run(pid())
        finally:
            server.start()
        assert asyncio.run(pid()) != before
    finally:
        reads.close()


@pytest.mark.parametrize("idle_ms", [300, None], ids=["short", "as-shipped"])
def test_pg_writer_frozen_holding_the_head_lock_loses_it_and_its_batch_answers_503(
    writers: Callable[[], Writer], monkeypatch: pytest.MonkeyPatch, idle_ms: int | None
) -> None:
    """A writer that stops inside its batch (a frozen process, a cut network) is idle in
    transaction: the server ends its session after ``idle_in_transaction_session_timeout``
    and the other gates' batches go on; the frozen one's callers get 503, never 200. With
    the timeouts as shipped, the waiting writer's ``lock_timeout`` must not expire first:
    it would answer 503 and count a storage fault (its gate's /healthz 503, drained by the
    balancer) while the frozen gate stays in."""
    if idle_ms is not None:
        monkeypatch.setattr(pg_target, "IDLE_IN_TRANSACTION_MS", idle_ms)
    frozen, other = writers(), writers()
    appended, thawed = threading.Event(), threading.Event()
    answer: list[BaseException | None] = []

    def freeze(tx: WriteTx) -> None:
        frozen.append(tx)
        appended.set()
        assert thawed.wait(timeout=60)

    thread = threading.Thread(target=lambda: answer.append(frozen.run(freeze)[0][1]))
    thread.start()
    try:
        assert appended.wait(timeout=60)
        ((_, error),) = other.run(other.append)  # waits for the lock until the session ends
    finally:
        thawed.set()
        thread.join(timeout=60)

    assert error is None and other.faults.write_fault is None
    assert isinstance(answer[0], Unavailable) and answer[0].code == "storage_unavailable"
    assert frozen.run(frozen.append)[0][1] is None  # on a new connection
    assert head(other.target)[0] == 2


def test_pg_connect_refuses_a_url_libpq_refuses_in_one_line() -> None:
    # the config refuses it at load; what reaches connect anyway is one line, no traceback
    target = PgTarget("postgresql://gate@127.0.0.1:1/hitl?application_name=%zz")
    with pytest.raises(Unavailable) as refused:
        pg_target.connect(target, "migrate")
    assert refused.value.message == 'storage.url: invalid percent-encoded token: "%zz"'


CREATEDB = "(createdb --locale=C --encoding=UTF8 --template=template0)"


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ("LOCALE 'C'", None),
        ("LOCALE 'C.UTF-8'", None),
        (
            "LOCALE_PROVIDER icu ICU_LOCALE 'und'",
            "the database does not sort text by code point, as the gate's ids sort; create it"
            f" with the C collation {CREATEDB}",
        ),
        (
            "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'",
            f"the database's encoding is SQL_ASCII; the gate's texts need UTF8 {CREATEDB}",
        ),
    ],
    ids=["c", "c-utf8", "icu", "sql-ascii"],
)
def test_pg_prepare_refuses_a_database_not_utf8_or_not_sorted_by_code_point(
    server: PgServer, caplog: pytest.LogCaptureFixture, options: str, refusal: str | None
) -> None:
    name = f"collation_{next(_databases)}"
    with psycopg.connect(server.url(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name} {options} TEMPLATE template0")
    caplog.set_level("INFO", logger="gate.store")
    target = PgTarget(server.url(name))

    if refusal is None:
        assert pg_backend.prepare(target) == SCHEMA_VERSION
    else:
        with pytest.raises(Unavailable) as refused:
            pg_backend.prepare(target)
        assert refused.value.code == "storage_unavailable"
        assert refused.value.message == f"database {target}: {refusal}"
        with psycopg.connect(server.url(name)) as conn:  # nothing was created
            assert conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            ).fetchone() == (0,)

    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "collation" in m], messages
    migrated = f"event=migrated schema_version={SCHEMA_VERSION}" in messages
    assert migrated is (refusal is None), messages
