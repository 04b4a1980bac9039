"""Store: one writer connection (BEGIN IMMEDIATE behind a lock), one reader; WAL, synchronous=FULL."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from gate import audit
from gate.errors import Unavailable
from gate.store.schema import MIGRATIONS, SCHEMA_VERSION

log = logging.getLogger(__name__)
# aiosqlite logs every statement with its parameters (draft bodies, nonces) at DEBUG: never let
# those records through, whatever level the daemon runs at.
logging.getLogger("aiosqlite").setLevel(logging.INFO)

BUSY_TIMEOUT_MS = 10_000
PROBE_INTERVAL_S = 1.0
# Primary SQLite result codes that mean "the environment refuses writes" (disk full, read-only
# file or mount, I/O error, ...), as opposed to a constraint or a bug: they mark a storage fault.
_FAULT_CODES = frozenset({
    3,   # SQLITE_PERM
    5,   # SQLITE_BUSY
    6,   # SQLITE_LOCKED
    8,   # SQLITE_READONLY
    10,  # SQLITE_IOERR
    11,  # SQLITE_CORRUPT
    13,  # SQLITE_FULL
    14,  # SQLITE_CANTOPEN
    26,  # SQLITE_NOTADB
})


def _is_fault(exc: sqlite3.Error) -> bool:
    """True for a failure of the storage itself (see ``_FAULT_CODES``)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return isinstance(exc, sqlite3.OperationalError)
    return (code & 0xFF) in _FAULT_CODES


async def _connect(path: Path) -> aiosqlite.Connection:
    conn = await aiosqlite.connect(str(path), isolation_level=None)
    conn.row_factory = sqlite3.Row
    await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    await conn.execute("PRAGMA foreign_keys = ON")
    return conn


class Store:
    """The gate's SQLite database.

    All writes go through ``write()``: one connection, one transaction at a time
    (``BEGIN IMMEDIATE``), so a later group commit changes only this class. Reads use
    a second connection and see the last committed state (WAL).

    Storage faults (disk full, file made read-only, I/O errors) make the failing write
    roll back and raise Unavailable (503 ``storage_unavailable``); the connection stays
    usable, so writes succeed again as soon as the fault is fixed, without a restart.
    ``write_fault`` holds the last fault's message until a write succeeds again
    (``check_writable`` probes for that).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._lock = asyncio.Lock()
        self.write_fault: str | None = None
        self._probed_at = 0.0

    async def open(self) -> None:
        """Open (creating if needed) the file, set WAL + synchronous=FULL, run migrations.

        Raises Unavailable when the file cannot be opened or is newer than this code.
        """
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = await _connect(self.path)
            mode = await self._scalar(self._writer, "PRAGMA journal_mode = WAL")
            if str(mode).lower() != "wal":
                raise Unavailable("storage_unavailable", f"could not enable WAL (got {mode})")
            await self._writer.execute("PRAGMA synchronous = FULL")
            await self._migrate()
            self._reader = await _connect(self.path)
            await self._reader.execute("PRAGMA query_only = ON")
        except (sqlite3.Error, OSError) as exc:
            await self.close()
            raise Unavailable("storage_unavailable",
                              f"cannot open database {self.path}: {exc}") from exc

    async def close(self) -> None:
        """Close both connections (idempotent)."""
        for conn in (self._reader, self._writer):
            if conn is not None:
                try:
                    await conn.close()
                except (sqlite3.Error, ValueError):
                    pass
        self._reader = self._writer = None

    @staticmethod
    async def _scalar(conn: aiosqlite.Connection, sql: str, args: tuple[Any, ...] = ()) -> Any:
        rows = list(await conn.execute_fetchall(sql, args))
        return rows[0][0] if rows else None

    async def _migrate(self) -> None:
        assert self._writer is not None
        version = int(await self._scalar(self._writer, "PRAGMA user_version"))
        if version > SCHEMA_VERSION:
            raise Unavailable("storage_unavailable",
                              f"database schema {version} is newer than this gate ({SCHEMA_VERSION})")
        for index in range(version, SCHEMA_VERSION):
            await self._writer.execute("BEGIN IMMEDIATE")
            try:
                for statement in MIGRATIONS[index]:
                    await self._writer.execute(statement)
                await self._writer.execute(f"PRAGMA user_version = {index + 1}")
                await self._writer.execute("COMMIT")
            except BaseException:
                await self._writer.execute("ROLLBACK")
                raise
            log.info("event=migrated schema_version=%d", index + 1)

    async def schema_version(self) -> int:
        """Return ``PRAGMA user_version`` (what ``/healthz`` reports).

        Raises Unavailable 503 ``storage_unavailable`` while the database refuses writes
        (``check_writable``), so a health check sees a full disk or a read-only file.
        """
        await self.check_writable()
        with _reading():
            return int(await self._scalar(self._read(), "PRAGMA user_version"))

    async def check_writable(self) -> None:
        """Raise Unavailable while the last write failed on a storage fault.

        At most once per ``PROBE_INTERVAL_S`` a probe transaction rewrites the database
        header (``PRAGMA user_version`` set to its own value, committed: it needs room in
        the WAL and a writable file); once it commits, the fault is over.
        """
        if self.write_fault is None:
            return
        if time.monotonic() - self._probed_at >= PROBE_INTERVAL_S and not self._lock.locked():
            self._probed_at = time.monotonic()
            try:
                async with self.write() as tx:
                    await tx.probe()
            except Unavailable:
                pass
            else:
                self._recovered()
        if self.write_fault is not None:
            raise Unavailable("storage_unavailable",
                              f"database refuses writes: {self.write_fault}")

    def _faulted(self, exc: sqlite3.Error) -> None:
        if _is_fault(exc):
            if self.write_fault is None:
                log.error("event=storage_unavailable db=%s error=%s", self.path, exc)
            self.write_fault = str(exc)

    def _recovered(self) -> None:
        if self.write_fault is not None:
            log.warning("event=storage_recovered db=%s", self.path)
            self.write_fault = None

    def _read(self) -> aiosqlite.Connection:
        if self._reader is None:
            raise Unavailable("storage_unavailable", "database is not open")
        return self._reader

    @asynccontextmanager
    async def write(self) -> AsyncIterator[WriteTx]:
        """Run one write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``); rolls back on error.

        When the block exits without error the transaction is committed (on disk with
        synchronous=FULL) before the caller continues. sqlite3 errors become Unavailable (503).
        A transaction commits whole or not at all, also when the calling task is cancelled
        (e.g. at shutdown): the ROLLBACK is queued behind whatever statement the connection's
        thread is still running, so the next writer never finds a transaction left open.
        """
        if self._writer is None:
            raise Unavailable("storage_unavailable", "database is not open")
        conn = self._writer
        async with self._lock:
            try:
                await conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                self._faulted(exc)
                raise Unavailable("storage_unavailable", f"database write failed: {exc}") from exc
            except BaseException:  # cancelled: the BEGIN may still run in the thread; undo it
                await _rollback_quietly(conn)
                raise
            changes = conn.total_changes
            try:
                yield WriteTx(conn)
                await conn.execute("COMMIT")
            except BaseException as exc:
                await _rollback_quietly(conn)
                if isinstance(exc, sqlite3.Error):
                    self._faulted(exc)
                    raise Unavailable("storage_unavailable",
                                      f"database write failed: {exc}") from exc
                raise
            if conn.total_changes != changes:  # rows reached the disk: the storage works
                self._recovered()

    # ---- reads (reader connection) -------------------------------------------------

    async def fetch_approval(self, approval_id: str) -> dict[str, Any] | None:
        """Return the approval with its revisions, decisions and dispatch, or None."""
        with _reading():
            return await _load_full(self._read(), approval_id)

    async def list_approvals(self, state: str, pipeline: str | None, limit: int,
                             after: str | None) -> list[dict[str, Any]]:
        """Return up to ``limit`` approvals ordered by approval_id (ULID: creation order).

        ``state`` is pending|resolved|all; ``after`` is the cursor (last approval_id seen).
        """
        where, args = [], []
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
        conn = self._read()
        with _reading():
            ids = [row[0] for row in await conn.execute_fetchall(sql, args)]
            out = []
            for approval_id in ids:
                full = await _load_full(conn, approval_id)
                if full is not None:
                    out.append(full)
        return out

    async def next_expiry(self) -> int | None:
        """Return the earliest ``expires_at`` (unix ms) among pending approvals, or None."""
        with _reading():
            value = await self._scalar(
                self._read(), "SELECT MIN(expires_at) FROM approvals WHERE state = 'pending'")
        return None if value is None else int(value)

    async def due_dispatches(self, now_ms: int, limit: int) -> list[dict[str, Any]]:
        """Return un-acked outbox rows due at ``now_ms`` for pending approvals' current revision."""
        sql = """
            SELECT o.approval_id, o.revision, o.attempts, o.next_attempt_at
            FROM outbox o JOIN approvals a ON a.approval_id = o.approval_id
            WHERE o.delivered_at IS NULL AND o.next_attempt_at <= ?
              AND a.state = 'pending' AND a.revision = o.revision
            ORDER BY o.next_attempt_at LIMIT ?"""
        with _reading():
            return [dict(row) for row in await self._read().execute_fetchall(sql, (now_ms, limit))]

    async def next_dispatch_at(self) -> int | None:
        """Return the earliest ``next_attempt_at`` of an un-acked live dispatch, or None."""
        with _reading():
            value = await self._scalar(self._read(), """
                SELECT MIN(o.next_attempt_at) FROM outbox o
                JOIN approvals a ON a.approval_id = o.approval_id
                WHERE o.delivered_at IS NULL AND a.state = 'pending'
                  AND a.revision = o.revision""")
        return None if value is None else int(value)

    async def audit_rows(self) -> AsyncIterator[audit.AuditRow]:
        """Yield every audit row in ascending seq (with its key id and signature, if signed)."""
        async with self._read().execute(
            "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id,"
            " signature FROM audit_log ORDER BY seq"
        ) as cur:
            async for row in cur:
                yield audit.AuditRow(*row)


@contextmanager
def _reading() -> Iterator[None]:
    """Turn a failed read (I/O error, unreadable file) into Unavailable 503, not a 500."""
    try:
        yield
    except sqlite3.Error as exc:
        raise Unavailable("storage_unavailable", f"database read failed: {exc}") from exc


async def _rollback_quietly(conn: aiosqlite.Connection) -> None:
    """ROLLBACK, ignoring "no transaction is active" (SQLite already rolled back a COMMIT
    that failed on SQLITE_FULL/IOERR) and a connection closed meanwhile."""
    try:
        await conn.execute("ROLLBACK")
    except (sqlite3.Error, ValueError):
        pass


async def _fetchall(conn: aiosqlite.Connection, sql: str,
                    args: tuple[Any, ...]) -> list[dict[str, Any]]:
    # one call into the connection's thread: the statement runs to completion, so no read
    # transaction stays open while other coroutines use the same reader (a stale snapshot)
    return [dict(row) for row in await conn.execute_fetchall(sql, args)]


async def _load_full(conn: aiosqlite.Connection, approval_id: str) -> dict[str, Any] | None:
    rows = await _fetchall(conn, "SELECT * FROM approvals WHERE approval_id = ?", (approval_id,))
    if not rows:
        return None
    approval = rows[0]
    approval["scope"] = json.loads(approval["scope"])
    approval["budget"] = json.loads(approval["budget"]) if approval["budget"] else None
    approval["receipt"] = json.loads(approval["receipt"]) if approval["receipt"] else None
    approval["revisions"] = await _fetchall(
        conn, "SELECT * FROM revisions WHERE approval_id = ? ORDER BY revision", (approval_id,))
    approval["decisions"] = await _fetchall(
        conn, "SELECT * FROM decisions WHERE approval_id = ? ORDER BY decision_id",
        (approval_id,))
    approval["outbox"] = await _fetchall(
        conn, "SELECT * FROM outbox WHERE approval_id = ? ORDER BY revision", (approval_id,))
    return approval


class WriteTx:
    """The statements available inside one write transaction (``Store.write()``)."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def _one(self, sql: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
        async with self._conn.execute(sql, args) as cur:
            row = await cur.fetchone()
        return None if row is None else dict(row)

    async def probe(self) -> None:
        """Rewrite the database header unchanged (``Store.check_writable``)."""
        version = await Store._scalar(self._conn, "PRAGMA user_version")
        await self._conn.execute(f"PRAGMA user_version = {int(version)}")

    async def load_approval(self, approval_id: str) -> dict[str, Any] | None:
        """Return the full approval (as ``Store.fetch_approval``) as seen inside this transaction."""
        return await _load_full(self._conn, approval_id)

    async def approval_by_idempotency_key(self, key: str) -> dict[str, Any] | None:
        """Return ``{approval_id, request_hash}`` for an Idempotency-Key, or None."""
        return await self._one(
            "SELECT approval_id, request_hash FROM approvals WHERE idempotency_key = ?", (key,))

    async def revision_by_nonce(self, approval_id: str, nonce: str) -> int | None:
        """Return the revision number that ``nonce`` was issued for on this approval, or None."""
        row = await self._one(
            "SELECT revision FROM revisions WHERE approval_id = ? AND nonce = ?",
            (approval_id, nonce))
        return None if row is None else int(row["revision"])

    async def spent(self, since_ms: int, pipeline: str | None) -> float:
        """Return the summed ``spend`` of approvals that fired (approved/adjusted) since ``since_ms``."""
        sql = ("SELECT COALESCE(SUM(spend), 0) AS s FROM approvals WHERE outcome IN "
               "('approved', 'adjusted') AND resolved_at >= ?")
        args: tuple[Any, ...] = (since_ms,)
        if pipeline is not None:
            sql += " AND pipeline = ?"
            args += (pipeline,)
        row = await self._one(sql, args)
        return float(row["s"]) if row else 0.0

    async def insert_approval(self, row: dict[str, Any]) -> None:
        """Insert an approvals row (``scope``/``budget`` given as Python values, stored as JSON)."""
        values = dict(row)
        values["scope"] = json.dumps(values["scope"], ensure_ascii=False)
        values["budget"] = (json.dumps(values["budget"], ensure_ascii=False)
                            if values.get("budget") is not None else None)
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        await self._conn.execute(f"INSERT INTO approvals ({cols}) VALUES ({marks})",
                                 tuple(values.values()))

    async def insert_revision(self, approval_id: str, revision: int, body: str, payload_hash: str,
                              nonce: str, created_at: int, created_by: int | None) -> None:
        """Insert a revision of the draft with its nonce."""
        await self._conn.execute(
            "INSERT INTO revisions (approval_id, revision, body, payload_hash, nonce, created_at,"
            " created_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (approval_id, revision, body, payload_hash, nonce, created_at, created_by))

    async def set_revision(self, approval_id: str, revision: int) -> None:
        """Make ``revision`` the approval's current revision."""
        await self._conn.execute("UPDATE approvals SET revision = ? WHERE approval_id = ?",
                                 (revision, approval_id))

    async def insert_decision(self, row: dict[str, Any]) -> None:
        """Insert an accepted decision; UNIQUE(approval_id, revision, operator_id) guards recounts."""
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        await self._conn.execute(f"INSERT INTO decisions ({cols}) VALUES ({marks})",
                                 tuple(row.values()))

    async def enqueue_dispatch(self, approval_id: str, revision: int, at_ms: int) -> None:
        """Add the outbox row for dispatching ``revision`` (due at ``at_ms``)."""
        await self._conn.execute(
            "INSERT INTO outbox (approval_id, revision, next_attempt_at) VALUES (?, ?, ?)",
            (approval_id, revision, at_ms))

    async def dispatch_attempted(self, approval_id: str, revision: int, *, delivered_at: int | None,
                                 next_attempt_at: int, error: str | None) -> int:
        """Count one attempt; set delivered_at or the next attempt time and last error.

        Returns the attempts so far. Already-acked rows are left alone (returns -1).
        """
        cur = await self._conn.execute(
            "UPDATE outbox SET attempts = attempts + 1, delivered_at = ?, next_attempt_at = ?,"
            " last_error = ? WHERE approval_id = ? AND revision = ? AND delivered_at IS NULL",
            (delivered_at, next_attempt_at, error, approval_id, revision))
        if cur.rowcount != 1:
            return -1
        row = await self._one(
            "SELECT attempts FROM outbox WHERE approval_id = ? AND revision = ?",
            (approval_id, revision))
        return int(row["attempts"]) if row else -1

    async def resolve(self, approval_id: str, outcome: str, at_ms: int) -> bool:
        """Mark a pending approval resolved with ``outcome``; False if it was not pending."""
        cur = await self._conn.execute(
            "UPDATE approvals SET state = 'resolved', outcome = ?, resolved_at = ?"
            " WHERE approval_id = ? AND state = 'pending'", (outcome, at_ms, approval_id))
        return cur.rowcount == 1

    async def set_receipt(self, approval_id: str, receipt: dict[str, Any]) -> None:
        """Store the resolution receipt on the approval."""
        await self._conn.execute("UPDATE approvals SET receipt = ? WHERE approval_id = ?",
                                 (json.dumps(receipt), approval_id))

    async def due_expiries(self, now_ms: int, limit: int) -> list[str]:
        """Return ids of pending approvals with ``expires_at <= now_ms`` (uses the partial index)."""
        async with self._conn.execute(
            "SELECT approval_id FROM approvals WHERE state = 'pending' AND expires_at <= ?"
            " ORDER BY expires_at LIMIT ?", (now_ms, limit)) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def append_audit(self, kind: str, approval_id: str | None, at_ms: int,
                           data: dict[str, Any], key: bytes,
                           signer: audit.Signer | None = None) -> audit.AuditRow:
        """Append one hash-chained audit entry with its HMAC receipt and, with ``signer``,
        its Ed25519 signature and key id; return the stored row."""
        last = await self._one("SELECT seq, entry_hash FROM audit_log ORDER BY seq DESC LIMIT 1",
                               ())
        prev_hash = last["entry_hash"] if last else audit.GENESIS_HASH
        seq = (int(last["seq"]) if last else 0) + 1
        entry = audit.make_entry(seq, kind, approval_id, at_ms, data)
        entry_json, digest, receipt = audit.seal(prev_hash, entry, key)
        key_id, signature = audit.sign(signer, digest) if signer is not None else (None, None)
        await self._conn.execute(
            "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, entry_hash, receipt,"
            " key_id, signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, approval_id, kind, entry_json, prev_hash, digest, receipt, key_id, signature))
        return audit.AuditRow(seq, approval_id, kind, entry_json, prev_hash, digest, receipt,
                              key_id, signature)

    async def set_permit(self, approval_id: str, permit: str) -> None:
        """Store the execution permit (compact JWS) issued for a resolved approval."""
        await self._conn.execute("UPDATE approvals SET permit = ? WHERE approval_id = ?",
                                 (permit, approval_id))
