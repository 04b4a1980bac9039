"""The daemon's read queries, on one read connection and its own thread (one call per read):
SQLite's file (WAL), or a PostgreSQL session, opened again when lost."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from gate.audit import chain as audit
from gate.errors import Unavailable
from gate.model import Credential
from gate.postgres.target import PgTarget
from gate.store import credentials, outbox, pg_backend, requests
from gate.store.connection import open_reader
from gate.store.outbox import OutboxTable
from gate.store.requests import RequestTables

T = TypeVar("T")
F = TypeVar("F")
R = TypeVar("R")

AUDIT_CHUNK = 2000


class Reads:
    """The read side of ``Store``: every query runs on the one read connection on its own
    thread: SQLite's (``connection.open_reader``: the last committed state, WAL), or a
    read-only PostgreSQL session (``pg_backend.open_reader``; a read of several statements
    is one REPEATABLE READ snapshot), opened again when lost: a read that finds it lost runs
    once more on a new one (reads change nothing). A read that fails (I/O error, unreadable
    file, server gone) raises Unavailable 503 ``storage_unavailable``, as does a read while
    closed."""

    def __init__(self) -> None:
        self._conn: sqlite3.Connection | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._target: PgTarget | None = None  # PostgreSQL: what to connect to again

    def open(self, where: Path | PgTarget) -> None:
        """Open the read connection on ``where`` (the pool thread starts on first use)."""
        if isinstance(where, PgTarget):
            self._target = where
            self._conn = _as_sqlite(pg_backend.open_reader(where))
        else:
            self._conn = open_reader(where)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gate-reader")

    def close(self) -> None:
        """Wait for the reads under way, close the connection (idempotent)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Return ``fn(conn, *args)`` run on the read thread."""
        pool = self._pool
        if pool is None:
            raise Unavailable("storage_unavailable", "database is not open")
        with _reading():
            return await asyncio.get_running_loop().run_in_executor(pool, self._run, fn, args)

    def _run(self, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        # on the read thread: PostgreSQL's connection, lost, is opened again here (and a
        # read that found it lost runs once more)
        try:
            return fn(self._connection(), *args)
        except sqlite3.OperationalError:
            if self._target is None or not getattr(self._conn, "closed", False):
                raise
            return fn(self._connection(), *args)

    def _connection(self) -> sqlite3.Connection:
        conn = self._conn
        if self._target is not None and (conn is None or getattr(conn, "closed", False)):
            self._conn = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            conn = self._conn = _as_sqlite(pg_backend.open_reader(self._target))
        if conn is None:
            raise Unavailable("storage_unavailable", "database is not open")
        return conn

    async def schema_version(self) -> int:
        """Return the database's schema version: SQLite's ``PRAGMA user_version``,
        PostgreSQL's newest ``schema_migrations`` row."""
        sql = "PRAGMA user_version"
        if self._target is not None:
            sql = "SELECT coalesce(max(version), 0) FROM schema_migrations"
        return int(await self.call(lambda conn: conn.execute(sql).fetchone()[0]))

    async def fetch(self, kind: RequestTables[F, Any], request_id: str) -> F | None:
        """The request of ``kind`` whole (``gate.store.requests.RequestTables.load``: versions,
        outbox rows, created receipt; an approval's decisions too) from one snapshot, or
        None."""
        if requests.names_nothing(request_id):
            return None
        return await self.call(_snapshot, kind.load, request_id, True, True)

    async def page(
        self,
        kind: RequestTables[F, Any],
        state: str,
        pipeline: str | None,
        limit: int,
        after: str | None,
    ) -> list[F]:
        """Up to ``limit`` requests of ``kind`` ordered by id (ULID: creation order), from one
        snapshot (``gate.store.requests.page``). ``state`` is pending|resolved|all;
        ``after`` is the cursor (last id seen)."""
        return await self.call(_snapshot, requests.page, kind, state, pipeline, limit, after)

    async def pending_summary(self, kind: RequestTables[Any, Any]) -> tuple[int, int | None]:
        """Return ``(number of pending requests of kind, earliest created_at in unix ms or
        None)``."""
        return await self.call(requests.pending_summary, kind)

    async def next_expiry(self, kind: RequestTables[Any, Any]) -> int | None:
        """Return the earliest ``expires_at`` (unix ms) among pending requests of ``kind``, or
        None."""
        return await self.call(requests.next_expiry, kind)

    async def oldest_pending_by_step(self) -> list[tuple[str, str, int]]:
        """Return ``(pipeline, step, earliest created_at in unix ms)`` of every step with a
        pending approval: one statement over the pending partial index, reading
        each pending row once (no per-step index without a migration)."""

        def run(conn: sqlite3.Connection) -> list[tuple[str, str, int]]:
            rows = conn.execute(
                "SELECT pipeline, step, MIN(created_at) FROM approvals INDEXED BY"
                " approvals_pending_expiry WHERE state = 'pending' GROUP BY pipeline, step"
            ).fetchall()
            return [(str(p), str(s), int(oldest)) for p, s, oldest in rows]

        return await self.call(run)

    async def next_followup(self) -> int | None:
        """Return the earliest ``next_followup_at`` (unix ms) among pending approvals, or
        None (one lookup in the partial index ``approvals_followup_due``)."""

        def run(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT MIN(next_followup_at) FROM approvals INDEXED BY approvals_followup_due"
                " WHERE state = 'pending' AND next_followup_at IS NOT NULL"
            ).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self.call(run)

    async def outbox_plan(
        self, table: OutboxTable[R], now_ms: int, limit: int
    ) -> tuple[list[R], int | None]:
        """``gate.store.outbox.plan`` from one snapshot (one thread hop): the rows of
        ``table`` due at ``now_ms`` and the next one's time (unix ms)."""
        return await self.call(_snapshot, outbox.plan, table, now_ms, limit)

    async def credentials_in_force(self) -> list[Credential]:
        """The approver credentials not revoked, by credential_id."""
        return await self.call(credentials.in_force)

    async def audit_rows(self) -> AsyncIterator[audit.AuditRow]:
        """Yield every audit row in ascending seq (with its key id and signature, if signed),
        read in chunks of ``AUDIT_CHUNK`` (constant memory)."""
        after = 0
        while True:
            chunk = await self.call(audit_chunk, after, AUDIT_CHUNK)
            for row in chunk:
                yield row
            if len(chunk) < AUDIT_CHUNK:
                return
            after = chunk[-1].seq


def _as_sqlite(conn: Any) -> sqlite3.Connection:
    """A ``PgConnection`` where the read functions take a sqlite3 connection: it offers
    what they use of one (``gate.postgres.connection``)."""
    return cast(sqlite3.Connection, conn)


def audit_chunk(conn: sqlite3.Connection, after: int, limit: int) -> list[audit.AuditRow]:
    """Return up to ``limit`` audit rows with seq > ``after``, ascending."""
    rows = conn.execute(
        "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id,"
        " signature FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?",
        (after, limit),
    ).fetchall()
    return [audit.AuditRow(*row) for row in rows]


def _snapshot(conn: sqlite3.Connection, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(conn, *args)`` inside one read transaction: its statements see one snapshot."""
    conn.execute("BEGIN")
    try:
        return fn(conn, *args)
    finally:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("COMMIT")


@contextmanager
def _reading() -> Iterator[None]:
    """Turn a failed read (I/O error, unreadable file) into Unavailable 503, not a 500."""
    try:
        yield
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc
