"""The SQL of ``question_notices`` (migration 5): a question's resolution notice,
one row per question, queued in the resolving transaction when notices are on. The rules of
``followup_outbox``'s notices: retried with the dispatch backoff until ``give_up_at``."""

from __future__ import annotations

import sqlite3
from typing import Any

_DUE = """
    SELECT question_id, version, attempts, next_attempt_at, give_up_at
    FROM question_notices INDEXED BY question_notices_due
    WHERE delivered_at IS NULL AND failed_at IS NULL AND next_attempt_at <= ?
    ORDER BY next_attempt_at LIMIT ?"""
_NEXT = """
    SELECT next_attempt_at FROM question_notices INDEXED BY question_notices_due
    WHERE delivered_at IS NULL AND failed_at IS NULL
    ORDER BY next_attempt_at LIMIT 1"""


def plan(
    conn: sqlite3.Connection, now_ms: int, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Up to ``limit`` notices due at ``now_ms`` (unix ms; ``question_id, version, attempts,
    next_attempt_at, give_up_at``, earliest first) and the earliest ``next_attempt_at`` of
    any unsent one (None when there is none). Through the partial index: no scan."""
    due = [dict(row) for row in conn.execute(_DUE, (now_ms, limit))]
    first = conn.execute(_NEXT).fetchone()
    return due, None if first is None else int(first[0])


class QuestionNoticeStatements:
    """The ``question_notices`` statements of ``gate.store.tx.WriteTx``."""

    _conn: sqlite3.Connection

    def queue_question_notice(
        self, question_id: str, version: int, at_ms: int, give_up_at_ms: int
    ) -> None:
        """Queue the resolution notice of ``question_id`` (final ``version``), due at
        ``at_ms``, failed if not delivered by ``give_up_at_ms`` (unix ms). A second one for
        the same question changes nothing (a question resolves once)."""
        self._conn.execute(
            "INSERT OR IGNORE INTO question_notices (question_id, version, next_attempt_at,"
            " give_up_at) VALUES (?, ?, ?, ?)",
            (question_id, version, at_ms, give_up_at_ms),
        )

    def question_notice_attempted(
        self,
        question_id: str,
        now_ms: int,
        *,
        acked: bool,
        error: str | None,
        retry_at_ms: int | None,
    ) -> str | None:
        """Record one attempt at ``now_ms``: acked sets ``delivered_at``; else the next try is
        at ``retry_at_ms`` unless that is None or not before ``give_up_at`` (``failed_at``; a
        None ``retry_at_ms`` is a drop, not an attempt). Returns ``"delivered"``, ``"retry"``
        or ``"failed"``; None when the row is gone, delivered or failed (nothing changed)."""
        row = self._conn.execute(
            "SELECT give_up_at FROM question_notices WHERE question_id = ?"
            " AND delivered_at IS NULL AND failed_at IS NULL",
            (question_id,),
        ).fetchone()
        if row is None:
            return None
        if acked:
            state, sets, args = "delivered", "delivered_at = ?", (now_ms,)
        elif retry_at_ms is None or retry_at_ms >= int(row[0]):
            state, sets, args = "failed", "failed_at = ?", (now_ms,)
        else:
            state, sets, args = "retry", "next_attempt_at = ?", (retry_at_ms,)
        counted = 0 if not acked and retry_at_ms is None else 1
        self._conn.execute(
            f"UPDATE question_notices SET attempts = attempts + ?, {sets}, last_error = ?"
            " WHERE question_id = ?",
            (counted, *args, error, question_id),
        )
        return state
