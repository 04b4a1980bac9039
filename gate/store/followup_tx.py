"""The statements of a write transaction about reminders and escalation levels,
mixed into ``gate.store.tx.WriteTx`` (sync, run on the writer)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any


class FollowupStatements:
    """Follow-up statements of ``WriteTx``: the due approvals (partial index
    ``approvals_followup_due``), their state, and the ``followup_outbox`` rows."""

    _conn: sqlite3.Connection

    def _one(self, sql: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
        row = self._conn.execute(sql, args).fetchone()
        return None if row is None else dict(row)

    def due_followup_ids(self, now_ms: int, limit: int) -> list[str]:
        """Pending approvals whose ``next_followup_at`` is at or before ``now_ms`` (unix ms),
        earliest first, at most ``limit``: through the partial index, no scan."""
        rows = self._conn.execute(
            "SELECT approval_id FROM approvals INDEXED BY approvals_followup_due"
            " WHERE state = 'pending' AND next_followup_at IS NOT NULL AND next_followup_at <= ?"
            " ORDER BY next_followup_at LIMIT ?",
            (now_ms, limit),
        ).fetchall()
        return [str(row[0]) for row in rows]

    def followup_state(self, approval_id: str) -> dict[str, Any] | None:
        """What a due follow-up needs of a pending approval: ``scope`` (JSON text),
        ``followups`` (JSON text), ``reminders_sent``, ``escalation_level``, ``created_at``,
        ``expires_at``, ``revision`` and ``delivered``: whether the current revision's dispatch
        was acked (1/0). None when the approval is not pending."""
        return self._one(
            "SELECT a.scope, a.followups, a.reminders_sent, a.escalation_level, a.created_at,"
            " a.expires_at, a.revision, o.delivered_at IS NOT NULL AS delivered"
            " FROM approvals a LEFT JOIN outbox o"
            " ON o.approval_id = a.approval_id AND o.revision = a.revision"
            " WHERE a.approval_id = ? AND a.state = 'pending'",
            (approval_id,),
        )

    def set_followup_state(
        self,
        approval_id: str,
        scope: list[list[Any]],
        reminders_sent: int,
        escalation_level: int,
        next_followup_at: int | None,
    ) -> None:
        """Store where a pending approval's follow-ups stand: its (widened) ``scope``, the
        reminder count, the escalation level and the next due time (unix ms, or None)."""
        self._conn.execute(
            "UPDATE approvals SET scope = ?, reminders_sent = ?, escalation_level = ?,"
            " next_followup_at = ? WHERE approval_id = ? AND state = 'pending'",
            (
                json.dumps(scope, ensure_ascii=False),
                reminders_sent,
                escalation_level,
                next_followup_at,
                approval_id,
            ),
        )

    def queue_followup(
        self, approval_id: str, kind: str, n: int, revision: int, at_ms: int, give_up_at: int
    ) -> None:
        """Insert a ``followup_outbox`` row (``kind`` reminder|escalation|notice, number
        ``n``) sending ``revision``, due at ``at_ms``, failed if undelivered by ``give_up_at``
        (unix ms). Its primary key (approval_id, kind, n) makes a second one an error."""
        self._conn.execute(
            "INSERT INTO followup_outbox (approval_id, kind, n, revision, next_attempt_at,"
            " give_up_at) VALUES (?, ?, ?, ?, ?, ?)",
            (approval_id, kind, n, revision, at_ms, give_up_at),
        )
