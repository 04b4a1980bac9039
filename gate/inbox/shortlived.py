"""The inbox's short-lived state, kept in its database (not in one process's memory):
sign-in challenges, counted sign-in tries (the rate limits) and challenged bulk batches. Every
inbox on the database sees the same rows, so a sign-in page served by one replica is
completed at another, a batch challenged at one is decided at another, and a replica killed
loses none of them. With ``gate.inbox.db`` and ``gate.inbox.schema``, the only modules of
gate/inbox that speak SQL. Times are unix milliseconds, UTC."""

from __future__ import annotations

import json
import secrets
import sqlite3
from dataclasses import dataclass

from gate.inbox.db import InboxDb

CHALLENGE_TTL_MS = 300_000
MAX_PENDING = 1000
PER_ADDRESS = 100  # live challenges one client address may hold (review rev17a)
TRY_LIMIT = 10
TRY_WINDOW_MS = 300_000
SCOPES = ("address", "credential")  # tries per client address; failed tries per credential

Picked = tuple[str, int, str, str]
"""One item of a challenged batch as it was signed: approval_id, revision, nonce and
payload_hash."""


@dataclass(frozen=True, slots=True)
class Pending:
    """A challenge issued: the pre-session token's hash it is bound to, where to go after,
    when it was issued (unix ms) and the client address it was issued to."""

    pre_hash: str
    next_path: str
    issued_at: int
    address: str = "?"


class ShortLived:
    """Challenges, tries and batches in the inbox database ``db``; each call is one
    transaction (BEGIN IMMEDIATE on SQLite: every replica's calls are serialised by the
    file's write lock, so a count and the insert it allows cannot interleave with another's)."""

    def __init__(self, db: InboxDb) -> None:
        self._db = db

    async def issue_challenge(
        self, pre_hash: str, next_path: str, now_ms: int, address: str = "?", replaces: str = ""
    ) -> str | None:
        """A fresh 32-byte challenge (base64url) bound to ``pre_hash``, or None when
        ``MAX_PENDING`` live challenges are held in all or ``PER_ADDRESS`` by ``address``.
        ``replaces``: the hash of the pre-session token the browser still holds (its
        challenge is dropped: a new page replaces its own). Only expired challenges are
        evicted: a full pool refuses new pages rather than drop someone's live challenge
        (review rev17a finding 5)."""

        def issue(conn: sqlite3.Connection) -> str | None:
            _drop_expired(conn, now_ms)
            if replaces:
                conn.execute(
                    "DELETE FROM challenges WHERE address = ? AND pre_hash = ?", (address, replaces)
                )
            mine = _count(conn, "SELECT COUNT(*) FROM challenges WHERE address = ?", address)
            held = _count(conn, "SELECT COUNT(*) FROM challenges")
            if mine >= PER_ADDRESS or held >= MAX_PENDING:
                return None
            challenge = secrets.token_urlsafe(32)
            conn.execute(
                "INSERT INTO challenges (challenge, pre_hash, next_path, address, issued_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (challenge, pre_hash, next_path, address, now_ms),
            )
            return challenge

        return await self._db.transaction(issue)

    async def take_challenge(self, challenge: str, now_ms: int) -> Pending | None:
        """The challenge's Pending, deleted (single use: of two replicas taking it at once,
        one gets it, ``_taken``), or None if unknown or expired."""
        read = "SELECT pre_hash, next_path, issued_at, address FROM challenges WHERE challenge = ?"
        drop = "DELETE FROM challenges WHERE challenge = ?"
        row = await self._db.transaction(lambda c: _taken(c, read, drop, challenge))
        if row is None or now_ms - row["issued_at"] >= CHALLENGE_TTL_MS:
            return None
        return Pending(*row)

    async def blocked_for(self, scope: str, key: str, now_ms: int) -> int:
        """0 when ``key`` of ``scope`` may try now (nothing counted); else the seconds until
        it may (``TRY_LIMIT`` tries in ``TRY_WINDOW_MS``)."""
        return await self._db.transaction(lambda c: _wait(c, scope, key, now_ms))

    async def count_try(self, scope: str, key: str, now_ms: int) -> int:
        """0 and the try counted when ``key`` of ``scope`` may try now; else the seconds
        until it may (nothing counted)."""

        def count(conn: sqlite3.Connection) -> int:
            wait = _wait(conn, scope, key, now_ms)
            if not wait:
                conn.execute(
                    "INSERT INTO signin_tries (scope, key, at) VALUES (?, ?, ?)",
                    (scope, key, now_ms),
                )
            return wait

        return await self._db.transaction(count)

    async def keep_batch(
        self, batch_key: str, items: list[Picked], until_ms: int, now_ms: int, max_kept: int
    ) -> None:
        """Keep the challenged batch ``batch_key`` (its ``items`` as signed) until
        ``until_ms``, replacing one kept under the same key; when ``max_kept`` are kept, the
        one expiring first is dropped."""
        text = json.dumps(items)

        def keep(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM bulk_batches WHERE expires_at <= ?", (now_ms,))
            conn.execute("DELETE FROM bulk_batches WHERE batch_key = ?", (batch_key,))
            if _count(conn, "SELECT COUNT(*) FROM bulk_batches") >= max_kept:
                conn.execute(
                    "DELETE FROM bulk_batches WHERE batch_key IN (SELECT batch_key FROM"
                    " bulk_batches ORDER BY expires_at, batch_key LIMIT 1)"
                )
            conn.execute(
                "INSERT INTO bulk_batches (batch_key, items, expires_at) VALUES (?, ?, ?)",
                (batch_key, text, until_ms),
            )

        await self._db.transaction(keep)

    async def take_batch(self, batch_key: str, now_ms: int) -> list[Picked] | None:
        """The items of the batch kept under ``batch_key``, deleted in the same statement
        (one decide per challenge), or None when none is kept or it expired."""

        read = "SELECT items, expires_at FROM bulk_batches WHERE batch_key = ?"
        drop = "DELETE FROM bulk_batches WHERE batch_key = ?"
        row = await self._db.transaction(lambda c: _taken(c, read, drop, batch_key))
        if row is None or row["expires_at"] <= now_ms:
            return None
        return [(str(a), int(r), str(n), str(h)) for a, r, n, h in json.loads(row["items"])]

    async def prune(self, now_ms: int) -> None:
        """Delete expired challenges and batches and tries older than the window (the
        sweep's; each call above also ignores what is past its time)."""

        def prune(conn: sqlite3.Connection) -> None:
            _drop_expired(conn, now_ms)
            conn.execute("DELETE FROM signin_tries WHERE at <= ?", (now_ms - TRY_WINDOW_MS,))
            conn.execute("DELETE FROM bulk_batches WHERE expires_at <= ?", (now_ms,))

        await self._db.transaction(prune)


def _drop_expired(conn: sqlite3.Connection, now_ms: int) -> None:
    """Delete the challenges past ``CHALLENGE_TTL_MS`` at ``now_ms``."""
    conn.execute("DELETE FROM challenges WHERE issued_at <= ?", (now_ms - CHALLENGE_TTL_MS,))


def _taken(conn: sqlite3.Connection, read: str, drop: str, key: str) -> sqlite3.Row | None:
    """The row ``read`` reads for ``key``, once this transaction's ``drop`` deleted it; None
    when there is none or another transaction deleted it first. On SQLite the write lock
    already serialises the replicas; on PostgreSQL a second DELETE of the same row waits for
    the first's COMMIT and then deletes nothing (rowcount 0): the row is used once either way
    (and no RETURNING is needed, which SQLite before 3.35 lacks)."""
    row: sqlite3.Row | None = conn.execute(read, (key,)).fetchone()
    if row is None:
        return None
    deleted = conn.execute(drop, (key,)).rowcount
    return row if deleted == 1 else None


def _count(conn: sqlite3.Connection, sql: str, *args: object) -> int:
    return int(conn.execute(sql, args).fetchone()[0])


def _wait(conn: sqlite3.Connection, scope: str, key: str, now_ms: int) -> int:
    """The seconds until ``key`` of ``scope`` may try again (0: now), from its tries in the
    window."""
    count, oldest = conn.execute(
        "SELECT COUNT(*), MIN(at) FROM signin_tries WHERE scope = ? AND key = ? AND at > ?",
        (scope, key, now_ms - TRY_WINDOW_MS),
    ).fetchone()
    if count < TRY_LIMIT:
        return 0
    return max(1, (TRY_WINDOW_MS - (now_ms - int(oldest))) // 1000 + 1)
