"""The SQL of ``followup_outbox`` (migration 4): the sends that are not a revision's
first dispatch (reminders, escalations, resolution notices), one row per (approval, kind, n).

Plain functions over a connection: the writer's run through ``WriteTx``, the reads through
``Reads`` (``gate.store.reads``).
"""

from __future__ import annotations

import sqlite3
from typing import Any

KINDS = ("reminder", "escalation", "notice")

_DUE = """
    SELECT approval_id, kind, n, revision, attempts, next_attempt_at, give_up_at
    FROM followup_outbox INDEXED BY followup_outbox_due
    WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= ?
    ORDER BY next_attempt_at LIMIT ?"""
_NEXT = """
    SELECT next_attempt_at FROM followup_outbox INDEXED BY followup_outbox_due
    WHERE delivered_at IS NULL AND failed_at IS NULL
    ORDER BY next_attempt_at LIMIT 1"""


def insert(
    conn: sqlite3.Connection,
    approval_id: str,
    kind: str,
    n: int,
    revision: int,
    at_ms: int,
    give_up_at_ms: int,
) -> bool:
    """Queue the send ``(approval_id, kind, n)`` of ``revision``, due at ``at_ms`` and given
    up at ``give_up_at_ms`` (unix ms). Returns False (nothing changed) when that row exists
    already: each reminder, level and notice is queued exactly once (its primary key).
    Raises ValueError for a ``kind`` outside ``KINDS``."""
    if kind not in KINDS:
        raise ValueError(f"unknown follow-up kind {kind!r}")
    cur = conn.execute(
        "INSERT OR IGNORE INTO followup_outbox (approval_id, kind, n, revision,"
        " next_attempt_at, give_up_at) VALUES (?, ?, ?, ?, ?, ?)",
        (approval_id, kind, n, revision, at_ms, give_up_at_ms),
    )
    return cur.rowcount == 1


def attempted(
    conn: sqlite3.Connection,
    key: tuple[str, str, int],
    now_ms: int,
    *,
    acked: bool,
    error: str | None,
    retry_at_ms: int | None,
) -> str | None:
    """Record one attempt of the row ``key`` = (approval_id, kind, n) at ``now_ms``: acked
    sets ``delivered_at``; otherwise the next attempt is at ``retry_at_ms``, unless that is
    None or not before the row's ``give_up_at`` (then ``failed_at``). ``error`` becomes
    ``last_error``. Returns ``"delivered"``, ``"retry"`` or ``"failed"``; None when the row
    is gone or already delivered or failed (nothing changed)."""
    row = conn.execute(
        "SELECT give_up_at FROM followup_outbox WHERE approval_id = ? AND kind = ? AND n = ?"
        " AND delivered_at IS NULL AND failed_at IS NULL",
        key,
    ).fetchone()
    if row is None:
        return None
    if acked:
        state, sets, args = "delivered", "delivered_at = ?", (now_ms,)
    elif retry_at_ms is None or retry_at_ms >= int(row[0]):
        state, sets, args = "failed", "failed_at = ?", (now_ms,)
    else:
        state, sets, args = "retry", "next_attempt_at = ?", (retry_at_ms,)
    counted = 0 if not acked and retry_at_ms is None else 1  # a drop is no attempt
    conn.execute(
        f"UPDATE followup_outbox SET attempts = attempts + ?, {sets}, last_error = ?"
        " WHERE approval_id = ? AND kind = ? AND n = ?",
        (counted, *args, error, *key),
    )
    return state


def plan(
    conn: sqlite3.Connection, now_ms: int, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` rows due at ``now_ms`` (neither delivered nor failed; earliest first:
    ``approval_id, kind, n, revision, attempts, next_attempt_at, give_up_at``) and the
    earliest ``next_attempt_at`` of any such row, due or not (None when there is none).
    Both through the partial index ``followup_outbox_due``: no scan."""
    due = [dict(row) for row in conn.execute(_DUE, (now_ms, limit))]
    first = conn.execute(_NEXT).fetchone()
    return due, None if first is None else int(first[0])
