"""The daemon's read queries, on one read connection and its own thread (one call per read)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from gate.audit import chain as audit
from gate.errors import Unavailable
from gate.model import Approval, Credential, Question
from gate.store import credentials, followups, question_notices, questions
from gate.store.connection import open_reader
from gate.store.tx import load_full

T = TypeVar("T")

AUDIT_CHUNK = 2000

_DUE_DISPATCHES = """
    SELECT o.approval_id, o.revision, o.attempts, o.next_attempt_at
    FROM outbox o INDEXED BY outbox_due
    JOIN approvals a ON a.approval_id = o.approval_id
    WHERE o.delivered_at IS NULL AND o.next_attempt_at <= ?
      AND a.state = 'pending' AND a.revision = o.revision
    ORDER BY o.next_attempt_at LIMIT ?"""
_NEXT_DISPATCH = """
    SELECT o.next_attempt_at FROM outbox o INDEXED BY outbox_due
    JOIN approvals a ON a.approval_id = o.approval_id
    WHERE o.delivered_at IS NULL AND a.state = 'pending' AND a.revision = o.revision
    ORDER BY o.next_attempt_at LIMIT 1"""


class Reads:
    """The read side of ``Store``: every query runs on the one read connection
    (``connection.open_reader``: the last committed state, WAL) on its own thread. A read
    that fails in SQLite (I/O error, unreadable file) raises Unavailable 503
    ``storage_unavailable``, as does a read while closed."""

    def __init__(self) -> None:
        self._conn: sqlite3.Connection | None = None
        self._pool: ThreadPoolExecutor | None = None

    def open(self, path: Path) -> None:
        """Open the read connection on ``path`` (the pool thread starts on first use)."""
        self._conn = open_reader(path)
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
        conn, pool = self._conn, self._pool
        if conn is None or pool is None:
            raise Unavailable("storage_unavailable", "database is not open")
        with _reading():
            return await asyncio.get_running_loop().run_in_executor(pool, fn, conn, *args)

    async def schema_version(self) -> int:
        """Return ``PRAGMA user_version``."""
        return int(await self.call(lambda conn: conn.execute("PRAGMA user_version").fetchone()[0]))

    async def fetch_approval(self, approval_id: str) -> Approval | None:
        """Return the approval with its revisions, decisions and dispatch, or None."""
        return await self.call(_snapshot, load_full, approval_id)

    async def list_approvals(
        self, state: str, pipeline: str | None, limit: int, after: str | None
    ) -> list[Approval]:
        """Return up to ``limit`` approvals ordered by approval_id (ULID: creation order).

        ``state`` is pending|resolved|all; ``after`` is the cursor (last approval_id seen).
        """
        where: list[str] = []
        args: list[Any] = []
        if state != "all":
            where.append("state = ?")
            args.append(state)
        if pipeline:
            where.append("pipeline = ?")
            args.append(pipeline)
        if after:
            where.append("approval_id > ?")
            args.append(after)
        sql = "SELECT approval_id FROM approvals"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY approval_id LIMIT ?"
        args.append(limit)

        def page(conn: sqlite3.Connection) -> list[Approval]:
            ids = [row[0] for row in conn.execute(sql, args).fetchall()]
            return [full for full in (load_full(conn, i) for i in ids) if full is not None]

        return await self.call(_snapshot, page)

    async def pending_summary(self) -> tuple[int, int | None]:
        """Return ``(number of pending approvals, earliest created_at in unix ms or None)``."""

        def run(conn: sqlite3.Connection) -> tuple[int, int | None]:
            count, oldest = conn.execute(
                "SELECT COUNT(*), MIN(created_at) FROM approvals INDEXED BY"
                " approvals_pending_expiry WHERE state = 'pending'"
            ).fetchone()
            return int(count), None if oldest is None else int(oldest)

        return await self.call(run)

    async def next_expiry(self) -> int | None:
        """Return the earliest ``expires_at`` (unix ms) among pending approvals, or None."""

        def run(conn: sqlite3.Connection) -> int | None:
            row = conn.execute(
                "SELECT MIN(expires_at) FROM approvals INDEXED BY approvals_pending_expiry"
                " WHERE state = 'pending'"
            ).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self.call(run)

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

    async def dispatch_plan(
        self, now_ms: int, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """Return ``(due, next_at)`` from one snapshot (one thread hop): up to ``limit``
        un-acked outbox rows due at ``now_ms`` for pending approvals' current revision
        (``approval_id``, ``revision``, ``attempts``, ``next_attempt_at``; earliest first),
        and the earliest ``next_attempt_at`` (unix ms) of any un-acked live dispatch, due
        or not, or None when there is none."""

        def run(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], int | None]:
            due = [dict(row) for row in conn.execute(_DUE_DISPATCHES, (now_ms, limit))]
            first = conn.execute(_NEXT_DISPATCH).fetchone()
            return due, None if first is None else int(first[0])

        return await self.call(_snapshot, run)

    async def followup_plan(
        self, now_ms: int, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """``gate.store.followups.plan`` from one snapshot: the due reminder, escalation and
        notice sends and the next one's time (unix ms)."""
        return await self.call(_snapshot, followups.plan, now_ms, limit)

    # ---- questions: ``gate.store.questions`` ----------------------------

    async def fetch_question(self, question_id: str) -> Question | None:
        """The question with its versions and dispatches, or None."""
        return await self.call(_snapshot, questions.load, question_id)

    async def list_questions(
        self, state: str, pipeline: str | None, limit: int, after: str | None
    ) -> list[Question]:
        """A page of questions (``gate.store.questions.page``) from one snapshot."""
        return await self.call(_snapshot, questions.page, state, pipeline, limit, after)

    async def next_question_expiry(self) -> int | None:
        """The earliest ``expires_at`` (unix ms) of a pending question, or None."""
        return await self.call(questions.next_expiry)

    async def pending_questions(self) -> int:
        """How many questions are pending."""
        return await self.call(questions.pending_count)

    async def question_dispatch_plan(
        self, now_ms: int, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """``gate.store.questions.dispatch_plan`` from one snapshot."""
        return await self.call(_snapshot, questions.dispatch_plan, now_ms, limit)

    async def question_notice_plan(
        self, now_ms: int, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """``gate.store.question_notices.plan`` from one snapshot."""
        return await self.call(_snapshot, question_notices.plan, now_ms, limit)

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
