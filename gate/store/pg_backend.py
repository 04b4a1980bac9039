"""The gate on PostgreSQL: the migration at start, and the writer's part of a batch
(``PgBatch``: the ``audit_head`` row lock, which serialises the write batches of every gate
on the database, gives the chain's tail and the database's clock) on a connection opened
again when lost (``PgSide``); where the database is and how to connect to it is
``gate.postgres.target``'s.

psycopg is imported lazily, inside what connects: the base install (without the
``postgres`` extra) imports this module, and a SQLite gate never loads the driver.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
import time
from typing import Any, cast

from gate.audit.chain import AuditRow
from gate.clock import PinnedClock
from gate.errors import Unavailable
from gate.postgres.connection import PgConnection, PgError, as_sqlite_error
from gate.postgres.migrate import SchemaTooNew
from gate.postgres.target import PgTarget, connect
from gate.store.backend import BatchBackend
from gate.store.pg_approvals import PgApprovalStatements
from gate.store.pg_rate import PgRateEvents
from gate.store.pg_schema import migrate
from gate.store.tx import WriteTx

log = logging.getLogger(__name__)

# a write connection idle this long (s) is checked (one round trip) before a batch uses it,
# so a server restarted meanwhile costs a reconnection, not a batch answered 503
CHECK_IDLE_S = 1.0

# the chain's head, locked for the whole batch: the cluster's write exclusion (as SQLite's
# BEGIN IMMEDIATE), the tail the batch's entries follow, the database's time (unix ms) and
# the head entry's receipt (NULL for an empty log), which the batch checks against the key
# it appends with (``WriteTx.follows``): read in the same statement, no round trip more
HEAD_LOCK = (
    "SELECT seq, entry_hash, last_at_ms,"
    " CAST(extract(epoch FROM clock_timestamp()) * 1000 AS BIGINT),"
    " (SELECT receipt FROM audit_log WHERE audit_log.seq = audit_head.seq)"
    " FROM audit_head WHERE id = 1 FOR UPDATE"
)

# the head entry's receipt read again when HEAD_LOCK waited for another gate's batch: in
# READ COMMITTED the locked row comes back as that batch committed it, but the statement's
# other reads (its receipt's subquery) still see the log as it was when the statement
# began, without that batch's entries (NULL)
HEAD_RECEIPT = "SELECT receipt FROM audit_log WHERE seq = ?"

# audit rows kept in memory by the batch (``WriteTx.defer_audit``), written in one
# statement: a column is a field of ``AuditRow`` (seq a bigint, the rest texts)
_AUDIT_COLUMNS = tuple(field.name for field in dataclasses.fields(AuditRow))
AUDIT_ROWS = (
    f"INSERT INTO audit_log ({', '.join(_AUDIT_COLUMNS)}) SELECT * FROM unnest(?::bigint[]"
    + ", ?::text[]" * (len(_AUDIT_COLUMNS) - 1)
    + ")"
)


def write_audit(conn: sqlite3.Connection, rows: list[AuditRow]) -> None:
    """Insert ``rows`` (``AUDIT_ROWS``: one statement, one array a column). Raises
    sqlite3.Error."""
    conn.execute(AUDIT_ROWS, [[getattr(row, name) for row in rows] for name in _AUDIT_COLUMNS])


def prepare(target: PgTarget) -> int:
    """At start: bring the database to this gate's schema (``pg_schema.migrate``: one
    transaction under an advisory lock, so N gates starting together migrate it once);
    returns the schema version. Raises Unavailable 503 ``storage_unavailable`` when the
    server cannot be reached, the database is not UTF8 sorted by code point
    (``text_rules_problem``: nothing is created) or the schema is newer than this gate."""
    try:
        conn = connect(target, "migrate")
    except PgError as exc:
        raise Unavailable("storage_unavailable", f"cannot open database {target}: {exc}") from None
    try:
        driver = conn.driver
        try:
            problem = text_rules_problem(driver)
            if problem is not None:
                raise Unavailable("storage_unavailable", f"database {target}: {problem}")
            driver.execute("BEGIN")
            version = migrate(driver)
            driver.execute("COMMIT")
        except SchemaTooNew as exc:
            raise Unavailable("storage_unavailable", str(exc)) from None
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg"):
                error = as_sqlite_error(exc)
                raise Unavailable(
                    "storage_unavailable", f"cannot migrate database {target}: {error}"
                ) from None
            raise
    finally:
        conn.close()
    return version


CREATEDB = "createdb --locale=C --encoding=UTF8 --template=template0"


def text_rules_problem(driver: Any) -> str | None:
    """Why the database (a psycopg connection) cannot hold the gate's data, or None: it
    must store UTF8 (the entries' bytes are hashed; psycopg reads a SQL_ASCII database's
    text as bytes) and sort text by code point, as the gate's ids and cursors do (``C``,
    ``POSIX``, ``C.UTF-8``; not a language's collation, not ICU's). One rule, asked the
    database itself, for the gate at start, ``storage migrate`` and the offline tools."""
    (encoding,) = driver.execute("SHOW server_encoding").fetchone()
    if isinstance(encoding, bytes):
        encoding = encoding.decode("ascii", "replace")
    if str(encoding).upper() not in ("UTF8", "UTF-8"):
        return f"the database's encoding is {encoding}; the gate's texts need UTF8 ({CREATEDB})"
    (by_code_point,) = driver.execute("SELECT 'Z' < 'a' AND '-' < 'A' AND 'B_1' < 'a'").fetchone()
    if not by_code_point:
        return (
            "the database does not sort text by code point, as the gate's ids sort; create it"
            f" with the C collation ({CREATEDB})"
        )
    return None


class PgBatch(BatchBackend):
    """PostgreSQL's part of a write batch. ``begin``: ``BEGIN`` (READ COMMITTED), then the
    ``audit_head`` row ``FOR UPDATE`` (``HEAD_LOCK``), whose seq and hash the batch's first
    entry follows, whose entry's receipt ``WriteTx.follows`` checks, and whose time pins
    ``clock`` (when given) at ``max(database time, last_at_ms)`` for the batch: timestamps
    never go backwards in ``seq`` order across gates, the batch counts the rate limit's
    attempts in ``rate_events`` (every gate's) and loads approvals in one statement each
    (``gate.store.pg_approvals``).
    ``before_commit``: the batch's rate-limit attempts written (``PgRateEvents.flush``),
    ``audit_head`` set to the batch's newest entry. The probe
    rewrites the head row unchanged (a real write, no lock but the head's). Jobs run
    without SAVEPOINTs (``BatchBackend.savepoints``); ``writes`` is the connection's count
    of statements that may change rows (``PgConnection.writes``)."""

    savepoints = False

    def writes(self, conn: sqlite3.Connection) -> int:
        return cast(PgConnection, conn).writes

    def __init__(self, clock: PinnedClock | None = None) -> None:
        self._clock = clock

    def begin(self, conn: sqlite3.Connection, tx: WriteTx) -> None:
        conn.execute("BEGIN IMMEDIATE")  # translated to BEGIN: READ COMMITTED
        row = conn.execute(HEAD_LOCK).fetchone()
        if row is None:
            raise PgError("the audit_head row is missing (storage migrate sets it)")
        seq, digest, last_at_ms, now_ms, receipt = row
        if receipt is None and seq:  # waited for the lock: its entry is past the snapshot
            receipt = conn.execute(HEAD_RECEIPT, (seq,)).fetchone()[0]
        tx.start_chain((int(seq), str(digest)), int(last_at_ms), receipt)
        rate = PgRateEvents(conn)  # the rate limit's window: every gate's attempts
        tx.rate_events = rate
        tx.use_approvals(PgApprovalStatements(conn, rate))  # one statement a load, and more
        tx.defer_audit(write_audit)  # the batch's entries in one statement, before COMMIT
        if self._clock is not None:
            self._clock.pin(max(int(now_ms), int(last_at_ms)))

    def before_commit(self, conn: sqlite3.Connection, tx: WriteTx) -> None:
        tx.flush_audit()
        if tx.rate_events is not None:
            tx.rate_events.flush()
        if tx.appended_head is not None:
            seq, digest = tx.appended_head
            conn.execute(
                "UPDATE audit_head SET seq = ?, entry_hash = ?, last_at_ms = ? WHERE id = 1",
                (seq, digest, tx.last_at_ms),
            )

    def finished(self) -> None:
        if self._clock is not None:
            self._clock.unpin()

    def probe(self, conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE audit_head SET last_at_ms = last_at_ms WHERE id = 1")


class PgSide:
    """The writer's database on PostgreSQL: its connection (``hitl-gate/writer/<instance>``),
    opened at once (raises ``PgOperationalError`` when it cannot be), and again for the next
    batch once lost (a server restarted, a session ended): ``connection`` raises
    ``PgOperationalError`` while the server cannot be reached, so that batch answers 503
    and the next one tries again. ``backend`` is a ``PgBatch`` on ``clock``."""

    def __init__(self, target: PgTarget, clock: PinnedClock | None = None) -> None:
        self._target = target
        self.backend = PgBatch(clock)
        self._conn: PgConnection | None = connect(target, "writer")
        self._used = time.monotonic()

    def connection(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is not None and not conn.closed and time.monotonic() - self._used > CHECK_IDLE_S:
            try:
                conn.execute("SELECT 1")
            except sqlite3.Error:
                pass  # lost while idle: a new one below
        if conn is None or conn.closed:
            self.close()
            conn = self._conn = connect(self._target, "writer")
            log.warning("event=storage_reconnected role=writer db=%s", self._target)
        self._used = time.monotonic()
        return cast(sqlite3.Connection, conn)  # it offers what the store uses of sqlite3's

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a lost connection
                log.debug("event=close_failed role=writer")


def open_reader(target: PgTarget) -> PgConnection:
    """The daemon's read connection (``hitl-gate/reads/<instance>``, read-only sessions)."""
    return connect(target, "reads", read_only=True)
