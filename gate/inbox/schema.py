"""The inbox's SQLite schema and its migrations: the whole schema as one reviewed
SQL text, then additive migrations, and the one function that opens the file and runs what is
missing; what differs between the backends behind ``Backend`` (SQLite's here, PostgreSQL's
in ``gate.inbox.pgschema``). With ``gate.inbox.db`` (the queries), the only modules of
gate/inbox that speak SQL. Times are unix milliseconds, UTC."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

SCHEMA = """
CREATE TABLE items (
    approval_id   TEXT PRIMARY KEY,
    kind          TEXT NOT NULL CHECK (kind IN ('approval', 'question')),
    revision      INTEGER NOT NULL,
    nonce         TEXT NOT NULL,
    payload_hash  TEXT NOT NULL,
    dispatch      TEXT NOT NULL,
    previous_body TEXT,
    state         TEXT NOT NULL CHECK (state IN ('pending', 'resolved', 'cancelled', 'expired')),
    outcome       TEXT,
    expires_at    INTEGER NOT NULL,
    received_at   INTEGER NOT NULL,
    updated_seq   INTEGER NOT NULL
);
CREATE INDEX items_updated_seq ON items (updated_seq);
CREATE INDEX items_state_expiry ON items (state, expires_at);
CREATE TABLE decisions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    approval_id TEXT NOT NULL,
    revision    INTEGER NOT NULL,
    identity    TEXT NOT NULL,
    decision    TEXT NOT NULL,
    http_status INTEGER NOT NULL,
    answer      TEXT NOT NULL,
    decided_at  INTEGER NOT NULL
);
CREATE INDEX decisions_identity ON decisions (identity, decided_at);
CREATE TABLE sessions (
    id_hash       TEXT PRIMARY KEY,
    identity      TEXT NOT NULL,
    operator_id   INTEGER NOT NULL,
    credential_id TEXT NOT NULL,
    csrf          TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL
);
"""
BATCHES = """
ALTER TABLE decisions ADD COLUMN batch_id TEXT;
CREATE INDEX decisions_batch ON decisions (batch_id)
"""  # the decisions of one bulk approval (NULL for a single decision)
REASONS = """
ALTER TABLE decisions ADD COLUMN reason TEXT
"""  # the reason the approver gave with a decision, as posted (NULL: none; rows before it)
SENT = """
ALTER TABLE decisions ADD COLUMN sent TEXT
"""  # what the approver sent besides the verb: an adjust's text, an answer's value as JSON
FOLLOWUPS = """
ALTER TABLE items ADD COLUMN reminder INTEGER NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN escalation INTEGER NOT NULL DEFAULT 0;
ALTER TABLE items ADD COLUMN escalated_to TEXT NOT NULL DEFAULT '[]'
"""  # the highest reminder / escalation level seen, and whom escalations added (JSON list)
ENDED = """
ALTER TABLE sessions ADD COLUMN ended TEXT
"""  # why a session ended before its time ('revoked'), kept so every later request says it
SHARED = """
CREATE TABLE challenges (
    challenge TEXT PRIMARY KEY,
    pre_hash  TEXT NOT NULL,
    next_path TEXT NOT NULL,
    address   TEXT NOT NULL,
    issued_at INTEGER NOT NULL
);
CREATE INDEX challenges_issued ON challenges (issued_at);
CREATE INDEX challenges_address ON challenges (address, pre_hash);
CREATE TABLE signin_tries (
    scope TEXT NOT NULL CHECK (scope IN ('address', 'credential')),
    key   TEXT NOT NULL,
    at    INTEGER NOT NULL
);
CREATE INDEX signin_tries_key ON signin_tries (scope, key, at);
CREATE INDEX signin_tries_at ON signin_tries (at);
CREATE TABLE bulk_batches (
    batch_key  TEXT PRIMARY KEY,
    items      TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX bulk_batches_expiry ON bulk_batches (expires_at)
"""  # what an approver's next request may depend on, shared by every inbox on the file:
# sign-in challenges (base64url of 32 random bytes, single use, bound to the SHA-256 hex of a
# pre-session token, issued_at ms), counted sign-in tries (per client address, and failed
# ones per credential; at ms) and challenged bulk batches (batch_key: SHA-256 hex of the
# identity and the picks; items: JSON [[approval_id, revision, nonce, payload_hash], ...]
# as challenged; expires_at ms)
# user_version N means MIGRATIONS[:N] ran
MIGRATIONS = (SCHEMA, BATCHES, REASONS, SENT, FOLLOWUPS, ENDED, SHARED)


def statements(migration: str) -> list[str]:
    """The statements of one migration's text, in order."""
    return [statement for statement in migration.split(";") if statement.strip()]


class Backend(Protocol):
    """What the inbox's queries do differently on each backend."""

    def begin(self, conn: sqlite3.Connection) -> None:
        """Open a write transaction that excludes every other inbox's on the database."""

    def version(self, conn: sqlite3.Connection) -> int:
        """The database's schema version (``len(MIGRATIONS)`` once migrated)."""

    def insert_id(self, conn: sqlite3.Connection, sql: str, row: Mapping[str, Any]) -> int:
        """Run the INSERT ``sql`` with ``row``; the new row's ``id``."""

    def reconnect(self, conn: sqlite3.Connection) -> sqlite3.Connection | None:
        """A new connection when ``conn`` was lost (a server restarted), else None; raises
        ``sqlite3.OperationalError`` when the database cannot be reached."""


class SqliteBackend:
    """SQLite's: ``BEGIN IMMEDIATE`` (the file's write lock), ``PRAGMA user_version``,
    ``lastrowid``; a file is never lost."""

    def begin(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")

    def version(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def insert_id(self, conn: sqlite3.Connection, sql: str, row: Mapping[str, Any]) -> int:
        return int(conn.execute(sql, row).lastrowid or 0)

    def reconnect(self, conn: sqlite3.Connection) -> sqlite3.Connection | None:
        return None  # a file is not lost


def open_file(path: Path) -> sqlite3.Connection:
    """Create (0600) or open the file, set WAL and synchronous=FULL, run what migrations
    are missing, each in one transaction. Several inboxes may open one file at once (the
    replicas of one host): the version is read again under the write lock, so a migration
    another one ran meanwhile is not run twice. Raises OSError / sqlite3.Error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # another replica created it just now
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout = 5000")
    if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
        raise OSError(f"cannot use WAL journal mode on {path}")
    conn.execute("PRAGMA synchronous = FULL")
    while (number := _version(conn, path)) < len(MIGRATIONS):
        conn.execute("BEGIN IMMEDIATE")
        try:
            if _version(conn, path) == number:
                for statement in statements(MIGRATIONS[number]):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return conn


def _version(conn: sqlite3.Connection, path: Path) -> int:
    """The file's ``user_version``; raises OSError when it is newer than this inbox knows."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise OSError(f"{path} has schema version {version}, newer than this inbox knows")
    return version
