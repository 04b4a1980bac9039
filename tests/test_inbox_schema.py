"""The inbox's SQLite schema and migrations (gate/inbox/schema.py): an inbox file
written before a migration opens, is migrated once in one transaction, keeps its rows, and a
migration that fails leaves the file as it was. Real files, no process."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gate.inbox.db import InboxDb
from gate.inbox.followups import FollowUps
from gate.inbox.model import DecisionRecord, Session
from gate.inbox.schema import MIGRATIONS


def old_file(path: Path, version: int) -> None:
    """An inbox file as an inbox of schema ``version`` left it, with one decision row."""
    conn = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS[:version]:
        conn.executescript(script)
    conn.execute(
        "INSERT INTO decisions (approval_id, revision, identity, decision, http_status,"
        " answer, decided_at) VALUES ('a1', 1, 'alice@example.com', 'skip', 200, '{}', 5)"
    )
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


def user_version(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("version", "column", "value"),
    [(2, "reason", "line 1\nline 2"), (3, "sent", "Pay 8 EUR")],
)
async def test_inbox_schema_a_migration_keeps_old_rows_without_its_column(
    tmp_path: Path, version: int, column: str, value: str
) -> None:
    path = tmp_path / "inbox.db"
    old_file(path, version)

    db = await InboxDb.open(path)
    try:
        [before] = await db.decisions_of("alice@example.com")
        number = await db.add_decision(
            DecisionRecord("a2", 1, "alice@example.com", "skip", 0, {}, 9, **{column: value})
        )
        after = await db.decision(number)
    finally:
        await db.close()

    assert user_version(path) == len(MIGRATIONS) == 7
    assert (before.approval_id, before.decision, getattr(before, column)) == ("a1", "skip", None)
    assert after is not None and getattr(after, column) == value


async def test_inbox_schema_an_item_kept_before_followups_reads_what_its_dispatch_says(
    tmp_path: Path,
) -> None:
    path = tmp_path / "inbox.db"
    old_file(path, 4)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(
        "INSERT INTO items VALUES ('a1', 'approval', 1, 'n1', 'sha256:00', ?, NULL, 'pending',"
        " NULL, 9000, 5, 1)",
        ('{"pipeline": "p", "step": "s", "reminder": 2, "escalation": 1}',),
    )
    conn.close()

    db = await InboxDb.open(path)
    try:
        item = await db.item("a1", 0)
    finally:
        await db.close()

    assert user_version(path) == len(MIGRATIONS)
    assert item is not None  # its stored dispatch still says what it said
    assert item.followups == FollowUps(2, 1, ())


async def test_inbox_schema_a_session_from_before_ended_stays_signed_in_until_revoked(
    tmp_path: Path,
) -> None:
    path = tmp_path / "inbox.db"
    old_file(path, 4)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("INSERT INTO sessions VALUES ('h1', 'alice@example.com', 101, 'c1', 't', 1, 99)")
    conn.close()

    db = await InboxDb.open(path)
    try:
        kept = await db.session("h1", 10)
        await db.end_revoked("h1")
        after, why = await db.session("h1", 10), await db.session_ended("h1", 10)
        expired = await db.session_ended("h1", 99)
    finally:
        await db.close()

    assert kept == Session("alice@example.com", 101, "c1", "t", 1, 99)
    assert (after, why, expired) == (None, "revoked", None)


async def test_inbox_schema_reopening_a_migrated_file_runs_nothing_again(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    for _ in range(2):
        db = await InboxDb.open(path)
        await db.close()

    assert user_version(path) == len(MIGRATIONS)


async def test_inbox_schema_a_failed_migration_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "inbox.db"
    old_file(path, 2)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("ALTER TABLE decisions ADD COLUMN reason INTEGER")  # what migration 3 adds
    conn.close()

    with pytest.raises(OSError, match="cannot open the database .*duplicate column name"):
        await InboxDb.open(path)

    assert user_version(path) == 2
