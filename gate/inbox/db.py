"""The inbox's database, a SQLite file or PostgreSQL: its queries (the schema and
migrations are ``gate.inbox.schema``, PostgreSQL's ``gate.inbox.pgschema``; with
``gate.inbox.shortlived`` the only modules of gate/inbox that speak SQL). The queries are
SQLite's, translated once each on PostgreSQL (``gate.postgres.connection``); what differs
(the write lock, the schema version, a new row's id) is the ``Backend``'s.

One connection, used from one thread (every call runs there, in order: writes never race);
on SQLite WAL, ``synchronous=FULL``, the file created 0600, the schema versioned by ``PRAGMA
user_version``. A function that changes something returns after its COMMIT, so what the
relay endpoint acks is on disk. Rows come back as ``gate.inbox.model`` values.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from gate.inbox.followups import FollowUps, News, advance, first_seen, kept_of
from gate.inbox.items import CLOSED, NOTICE_STATES, Incoming, item_from, same_request
from gate.inbox.model import Change, DecisionRecord, Item, Session
from gate.inbox.schema import Backend, SqliteBackend, open_file
from gate.postgres.target import PgTarget

T = TypeVar("T")


class DatabaseUnavailable(OSError):
    """A call the database could not finish (``sqlite3.OperationalError``: its write lock held
    by another inbox on the file past the 5 s busy timeout, a full disk, an I/O error); the
    message is SQLite's. A request is answered 503 in words, the sweep tries again."""


class InboxDb:
    """The inbox database; open with ``await InboxDb.open(path)``, ``await close()``."""

    def __init__(
        self, conn: sqlite3.Connection, executor: ThreadPoolExecutor, backend: Backend
    ) -> None:
        self._conn = conn
        self._executor = executor
        self._backend = backend

    @classmethod
    async def open(cls, where: Path | PgTarget) -> InboxDb:
        """Open (creating and migrating) the SQLite file at ``where``, or the PostgreSQL
        database ``where`` names; raises OSError (naming it, never a password) when it
        cannot."""
        from gate.inbox.pgschema import PgBackend, open_database  # noqa: PLC0415

        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inbox-db")
        backend: Backend = PgBackend(where) if isinstance(where, PgTarget) else SqliteBackend()
        loop = asyncio.get_running_loop()
        try:
            if isinstance(where, PgTarget):
                conn = await loop.run_in_executor(executor, open_database, where)
            else:
                conn = await loop.run_in_executor(executor, open_file, where)
        except sqlite3.Error as exc:
            executor.shutdown(wait=False)
            raise OSError(f"cannot open the database {where}: {exc}") from exc
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(conn, executor, backend)

    async def close(self) -> None:
        """Close the connection and its thread."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
        self._executor.shutdown(wait=True)

    async def _rows(self, sql: str, args: tuple[Any, ...]) -> list[sqlite3.Row]:
        """The rows one read of ``sql`` with ``args`` gives."""
        return await self._run(lambda: self._conn.execute(sql, args).fetchall())

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the database's thread, on a connection opened again first when
        the backend says it was lost (``Backend.reconnect``); raises DatabaseUnavailable for
        a ``sqlite3.OperationalError``."""

        def call() -> T:
            fresh = self._backend.reconnect(self._conn)
            if fresh is not None:
                self._conn = fresh
            return fn(*args)

        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        except sqlite3.OperationalError as exc:
            raise DatabaseUnavailable(str(exc)) from exc

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` on the database's thread in one write transaction (BEGIN
        IMMEDIATE … COMMIT; ROLLBACK when it raises); returns after the COMMIT."""
        return await self._run(self._tx, fn)

    def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in one write transaction (the backend's BEGIN … COMMIT)."""
        self._backend.begin(self._conn)
        try:
            result = fn(self._conn)
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")
        return result

    # ------------------------------------------------------------------ items

    async def receive(
        self, incoming: Incoming, raw: str, received_at: int
    ) -> tuple[str, list[News]]:
        """Keep a verified dispatch (``raw``: its JSON text exactly as received) and return
        what happened, with whom it should tell what (``followups.first_seen`` for a new
        item, ``followups.advance`` for a reminder or an escalation; [] otherwise): ``new``
        (a row), ``same`` (a re-send with nothing new: no change),
        ``updated`` (same nonce, other bytes asking the same thing: a reminder or an
        escalation; the stored dispatch replaced, ``updated_seq`` kept: nothing the approver
        reads changed, so ``/live`` does not report it; its quorum progress is read from the
        stored dispatch on every poll), ``conflict`` (same nonce, but another
        revision, hash, draft or question: nothing changes; review rev17a), ``revision`` (a
        newer revision or version replaced the item; the body before kept in
        ``previous_body``; pending unless closed), ``stale``
        (an older revision than the one kept: nothing changes). The highest reminder number and
        escalation level seen, and whom escalations added, are kept in their columns across
        every later dispatch. Returns after the COMMIT."""
        return await self._run(self._tx, lambda c: _receive(c, incoming, raw, received_at))

    async def close_item(self, approval_id: str, outcome: str) -> bool:
        """A notice's ``outcome`` closes the item (resolved, cancelled or, for ``timeout``,
        expired); False when the inbox has no such item or it is closed already."""
        return await self._run(self._tx, lambda c: _close(c, approval_id, outcome))

    async def expire_due(self, now_ms: int) -> int:
        """Mark pending items past ``expires_at`` expired (bumping their ``updated_seq``);
        returns how many."""
        return await self._run(self._tx, lambda c: _expire(c, now_ms))

    async def item(self, approval_id: str, now_ms: int) -> Item | None:
        """One item (expired at read time when past its ``expires_at``), or None."""
        rows = await self._rows("SELECT * FROM items WHERE approval_id = ?", (approval_id,))
        return _item(rows[0], now_ms) if rows else None

    async def items(self, now_ms: int, state: str | None = None) -> list[Item]:
        """Every item (or those in ``state`` as read at ``now_ms``), soonest expiry first."""
        rows = await self._rows("SELECT * FROM items ORDER BY expires_at, approval_id", ())
        found = [_item(row, now_ms) for row in rows]
        return [i for i in found if state is None or i.state == state]

    async def health(self, now_ms: int) -> tuple[int, int]:
        """``(schema version, items waiting)``: the backend's schema version and the pending items
        not yet past ``expires_at`` at ``now_ms`` (one read over the state index). Raises
        OSError when the file cannot be read."""
        try:
            return await self._run(lambda: _health(self._conn, self._backend, now_ms))
        except (sqlite3.Error, DatabaseUnavailable) as exc:
            raise OSError(f"the database cannot be read: {exc}") from exc

    async def changes_since(self, seq: int) -> list[Change]:
        """Items changed after ``updated_seq`` ``seq``, in change order (live updates)."""
        rows = await self._rows(
            "SELECT approval_id, state, revision, updated_seq FROM items"
            " WHERE updated_seq > ? ORDER BY updated_seq",
            (seq,),
        )
        return [Change(r["approval_id"], r["state"], r["revision"], r["updated_seq"]) for r in rows]

    # ------------------------------------------------------------------ decisions, sessions

    async def add_decision(self, record: DecisionRecord, batch_id: str | None = None) -> int:
        """Keep a decision for an approver (before it is posted: ``status`` 0, ``answer``
        {}; ``reason`` as posted, None without one), one item of bulk approval ``batch_id``
        or alone (None), and return its row id (``/decisions/<id>``)."""
        backend = self._backend
        return await self._run(self._tx, lambda c: _insert_decision(c, backend, record, batch_id))

    async def add_batch(self, records: list[DecisionRecord], batch_id: str) -> list[int]:
        """Keep every item of bulk approval ``batch_id`` at once, before any is posted (each
        ``record`` as it is: ``answer`` ``NOT_SENT`` until ``set_decision_answer`` marks it
        sent), in one transaction; their row ids, in order."""
        backend = self._backend

        def insert(c: sqlite3.Connection) -> list[int]:
            return [_insert_decision(c, backend, r, batch_id) for r in records]

        return await self._run(self._tx, insert)

    async def approvers_recorded(self, approval_id: str, revision: int) -> list[str]:
        """The distinct identities whose ``approve`` of ``revision`` the inbox posted and the
        gate answered 2xx (recorded), first decided first (quorum progress;
        a decision made through another relay is not here)."""
        rows = await self._rows(
            "SELECT identity, MIN(decided_at) AS at FROM decisions WHERE approval_id = ?"
            " AND revision = ? AND decision = 'approve' AND http_status BETWEEN 200 AND 299"
            " GROUP BY identity ORDER BY at, identity",
            (approval_id, revision),
        )
        return [str(r["identity"]) for r in rows]

    async def recorded_on(self, approval_id: str) -> list[DecisionRecord]:
        """Every decision on ``approval_id`` the gate answered 2xx (recorded), any
        identity, first decided first: what the item's page says was decided through the
        inbox (an adjust's final text, an answer)."""
        rows = await self._rows(
            "SELECT * FROM decisions WHERE approval_id = ? AND http_status BETWEEN 200 AND 299"
            " ORDER BY decided_at, id",
            (approval_id,),
        )
        return [_decision(r) for r in rows]

    async def batch(self, batch_id: str) -> list[DecisionRecord]:
        """The decisions of bulk approval ``batch_id`` in the order posted (none: [])."""
        rows = await self._rows(
            "SELECT * FROM decisions WHERE batch_id = ? ORDER BY id",
            (batch_id,),
        )
        return [_decision(r) for r in rows]

    async def set_decision_answer(self, number: int, status: int, answer: dict[str, Any]) -> None:
        """Record the gate's HTTP ``status`` and JSON ``answer`` on decision row ``number``."""
        sql = "UPDATE decisions SET http_status = ?, answer = ? WHERE id = ?"
        args = (status, json.dumps(answer, ensure_ascii=False), number)
        await self._run(self._tx, lambda c: c.execute(sql, args))

    async def decision(self, number: int) -> DecisionRecord | None:
        """Decision row ``number``, or None."""
        rows = await self._rows("SELECT * FROM decisions WHERE id = ?", (number,))
        return _decision(rows[0]) if rows else None

    async def decisions_of(self, identity: str, limit: int = 50) -> list[DecisionRecord]:
        """``identity``'s decisions, newest first (at most ``limit``)."""
        rows = await self._rows(
            "SELECT * FROM decisions WHERE identity = ? ORDER BY decided_at DESC, id DESC LIMIT ?",
            (identity, limit),
        )
        return [_decision(r) for r in rows]

    async def add_session(self, id_hash: str, session: Session) -> None:
        """Keep a session under the SHA-256 ``id_hash`` of its cookie's random id."""
        sql = (
            "INSERT INTO sessions (id_hash, identity, operator_id, credential_id, csrf,"
            " created_at, expires_at) VALUES (:id_hash, :identity, :operator_id,"
            " :credential_id, :csrf, :created_at, :expires_at)"
        )
        row = {"id_hash": id_hash, **asdict(session)}
        await self._run(self._tx, lambda c: c.execute(sql, row))

    async def session(self, id_hash: str, now_ms: int) -> Session | None:
        """The session under ``id_hash``, or None when there is none, it expired or it
        ended (``end_revoked``)."""
        rows = await self._rows(
            "SELECT identity, operator_id, credential_id, csrf, created_at, expires_at"
            " FROM sessions WHERE id_hash = ? AND expires_at > ? AND ended IS NULL",
            (id_hash, now_ms),
        )
        return Session(*rows[0]) if rows else None

    async def end_revoked(self, id_hash: str) -> None:
        """End the session ``id_hash`` because its passkey was revoked: the row stays (never
        valid again) until it expires, so every later request of its cookie can say why."""
        sql = "UPDATE sessions SET ended = 'revoked' WHERE id_hash = ?"
        await self._run(self._tx, lambda c: c.execute(sql, (id_hash,)))

    async def session_ended(self, id_hash: str, now_ms: int) -> str | None:
        """Why the unexpired session ``id_hash`` ended (``"revoked"``), None when it did not."""
        rows = await self._rows(
            "SELECT ended FROM sessions WHERE id_hash = ? AND expires_at > ?",
            (id_hash, now_ms),
        )
        return str(rows[0]["ended"]) if rows and rows[0]["ended"] is not None else None

    async def end_sessions(self, now_ms: int, id_hash: str | None = None) -> int:
        """Delete the session ``id_hash`` (sign-out), or with None every expired one."""
        args: tuple[Any, ...] = (now_ms,)
        sql = "DELETE FROM sessions WHERE expires_at <= ?"
        if id_hash is not None:
            sql, args = "DELETE FROM sessions WHERE id_hash = ?", (id_hash,)
        return await self._run(self._tx, lambda c: c.execute(sql, args).rowcount)


def _insert_decision(
    conn: sqlite3.Connection, backend: Backend, record: DecisionRecord, batch: str | None
) -> int:
    return backend.insert_id(
        conn,
        "INSERT INTO decisions (approval_id, revision, identity, decision, http_status,"
        " answer, decided_at, batch_id, reason, sent) VALUES (:approval_id, :revision,"
        " :identity, :decision, :status, :answer, :decided_at, :batch_id, :reason, :sent)",
        {
            **asdict(record),
            "answer": json.dumps(record.answer, ensure_ascii=False),
            "batch_id": batch,
        },
    )


def _decision(r: sqlite3.Row) -> DecisionRecord:
    same = ("approval_id", "revision", "identity", "decision", "decided_at", "reason", "sent",
            "batch_id")  # fmt: skip
    kept = {column: r[column] for column in same}
    return DecisionRecord(**kept, status=r["http_status"], answer=json.loads(r["answer"]))


def _health(conn: sqlite3.Connection, backend: Backend, now_ms: int) -> tuple[int, int]:
    version = backend.version(conn)
    sql = "SELECT COUNT(*) FROM items WHERE state = 'pending' AND expires_at > ?"
    return version, int(conn.execute(sql, (now_ms,)).fetchone()[0])


def _item(row: sqlite3.Row, now_ms: int) -> Item:
    return item_from(dict(row), json.loads(row["dispatch"]), now_ms)


def _next_seq(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT COALESCE(MAX(updated_seq), 0) + 1 FROM items").fetchone()[0])


def _receive(conn: sqlite3.Connection, new: Incoming, raw: str, at: int) -> tuple[str, list[News]]:
    old = conn.execute(
        "SELECT revision, nonce, dispatch, state, reminder, escalation, escalated_to FROM items"
        " WHERE approval_id = ?",
        (new.approval_id,),
    ).fetchone()
    row = {**asdict(new), "dispatch": raw}
    if old is None:
        kept, news = first_seen(json.loads(raw))
        conn.execute(
            "INSERT INTO items (approval_id, kind, revision, nonce, payload_hash, dispatch,"
            " state, expires_at, received_at, updated_seq, reminder, escalation)"
            " VALUES (:approval_id, :kind, :revision, :nonce, :payload_hash, :dispatch,"
            " 'pending', :expires_at, :at, :seq, :reminder, :escalation)",
            {**row, "at": at, "seq": _next_seq(conn), **_followups(kept)},
        )
        return "new", news
    if new.revision < old["revision"]:
        return "stale", []
    before = json.loads(old["dispatch"])
    kept, news = advance(kept_of(dict(old), before), before, json.loads(raw))
    row |= _followups(kept)
    if new.nonce == old["nonce"]:
        if raw == old["dispatch"]:
            return "same", []
        if not same_request(before, json.loads(raw)):
            return "conflict", []
        conn.execute(
            "UPDATE items SET dispatch = :dispatch, expires_at = :expires_at,"
            " reminder = :reminder, escalation = :escalation, escalated_to = :escalated_to"
            " WHERE approval_id = :approval_id",
            row,
        )
        return "updated", news
    part, key = ("question", "text") if new.kind == "question" else ("draft", "body")
    previous = (before.get(part) or {}).get(key)
    state = old["state"] if old["state"] in CLOSED else "pending"
    conn.execute(
        "UPDATE items SET revision = :revision, nonce = :nonce, payload_hash = :payload_hash,"
        " dispatch = :dispatch, previous_body = :previous, state = :state,"
        " expires_at = :expires_at, updated_seq = :seq, reminder = :reminder,"
        " escalation = :escalation, escalated_to = :escalated_to WHERE approval_id = :approval_id",
        {**row, "previous": previous, "state": state, "seq": _next_seq(conn)},
    )
    return "revision", []


def _followups(kept: FollowUps) -> dict[str, Any]:
    """The follow-up columns of ``kept``: reminder, escalation and escalated_to (JSON)."""
    return {
        "reminder": kept.reminder,
        "escalation": kept.escalation,
        "escalated_to": json.dumps(list(kept.escalated_to)),
    }


def _close(conn: sqlite3.Connection, approval_id: str, outcome: str) -> bool:
    state = NOTICE_STATES.get(outcome, "resolved")
    cursor = conn.execute(
        "UPDATE items SET state = ?, outcome = ?, updated_seq = ?"
        " WHERE approval_id = ? AND state NOT IN ('resolved', 'cancelled')",
        (state, outcome, _next_seq(conn), approval_id),
    )
    return cursor.rowcount > 0


def _expire(conn: sqlite3.Connection, now_ms: int) -> int:
    due = conn.execute(
        "SELECT approval_id FROM items WHERE state = 'pending' AND expires_at <= ?"
        " ORDER BY expires_at",
        (now_ms,),
    ).fetchall()
    for row in due:
        conn.execute(
            "UPDATE items SET state = 'expired', updated_seq = ? WHERE approval_id = ?",
            (_next_seq(conn), row["approval_id"]),
        )
    return len(due)
