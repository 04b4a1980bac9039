"""The inbox's SQLite schema and its migrations: the whole schema as one reviewed
SQL text, then additive migrations, and the one function that opens the file and runs what is
missing. With ``gate.inbox.db`` (the queries), the only modules of gate/inbox that speak SQL.
Times are unix milliseconds, UTC."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

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
# user_version N means MIGRATIONS[:N] ran
MIGRATIONS = (SCHEMA, BATCHES, REASONS, SENT, FOLLOWUPS, ENDED)


def open_file(path: Path) -> sqlite3.Connection:
    """Create (0600) or open the file, set WAL and synchronous=FULL, run what migrations
    are missing, each in one transaction. Raises OSError / sqlite3.Error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
        raise OSError(f"cannot use WAL journal mode on {path}")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA busy_timeout = 5000")
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > len(MIGRATIONS):
        raise OSError(f"{path} has schema version {version}, newer than this inbox knows")
    for number in range(version, len(MIGRATIONS)):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[number].split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return conn
