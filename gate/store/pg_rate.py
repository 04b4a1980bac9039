"""The decision rate limit's attempts on PostgreSQL (``rate_events``), shared by every gate on
the database: read and written inside the serialised write batch (under the ``audit_head``
lock), so the window is exact across gates. The rule is the core's
(``gate.core.ratelimit``); here is only where its attempts are kept.

An attempt is written once its job ran (``flush``, called by the batch runner before the
job's ``RELEASE``, and after its ``ROLLBACK TO`` for a job refused after check 13), so a
refused attempt counts as it does in the writer's memory on SQLite. Each write also deletes
that approver's attempts that no longer count (older than the window the rule read): the
table holds about a minute of attempts.
"""

from __future__ import annotations

import sqlite3


class PgRateEvents:
    """The attempts of the rate limit in ``rate_events`` on ``conn``, the write batch's
    connection (in its transaction). ``times`` reads them, ``add`` keeps an attempt for
    ``flush``; ``discard`` drops what was kept (a job failed on a storage error)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._pending: list[tuple[int, int, int]] = []

    def times(self, operator_id: int, since_ms: int) -> list[int]:
        """The times (unix ms, ascending) of ``operator_id``'s attempts after ``since_ms``,
        those of the running job (not yet flushed) included."""
        rows = self._conn.execute(
            "SELECT at_ms FROM rate_events WHERE operator_id = ? AND at_ms > ? ORDER BY at_ms",
            (operator_id, since_ms),
        ).fetchall()
        kept = [at for op, at, _ in self._pending if op == operator_id and at > since_ms]
        return sorted([int(row[0]) for row in rows] + kept)

    def add(self, operator_id: int, at_ms: int, since_ms: int) -> None:
        """Count one attempt of ``operator_id`` at ``at_ms`` (written by ``flush``); its
        attempts at or before ``since_ms`` no longer count (``flush`` deletes them)."""
        self._pending.append((operator_id, at_ms, since_ms))

    def flush(self) -> None:
        """Write the attempts kept since the last flush (after the job's own statements, or
        after they were rolled back) and delete their approvers' attempts that no longer
        count. Raises sqlite3.Error."""
        pending, self._pending = self._pending, []
        for operator_id, at_ms, since_ms in pending:  # one round trip each, under the lock
            self._conn.execute(
                "WITH gone AS (DELETE FROM rate_events WHERE operator_id = ? AND at_ms <= ?)"
                " INSERT INTO rate_events (operator_id, at_ms) VALUES (?, ?)",
                (operator_id, since_ms, operator_id, at_ms),
            )

    def discard(self) -> None:
        """Forget the attempts kept since the last flush (their job's outcome is unknown to
        its caller: 503)."""
        self._pending = []
