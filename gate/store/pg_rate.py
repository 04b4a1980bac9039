"""The decision rate limit's attempts on PostgreSQL (``rate_events``), shared by every gate on
the database: read and written inside the serialised write batch (under the ``audit_head``
lock), so the window is exact across gates. The rule is the core's
(``gate.core.ratelimit``); here is only where its attempts are kept.

The window is read as one row, ``(count, oldest)``: what the rule needs, not the attempts
themselves (a busy approver has hundreds in a minute). An attempt counts once its job ran
(``job_ended``: after its own statements, or after they were rolled back for a refusal
after check 13), so a refused attempt counts as it does in the writer's memory on SQLite;
the batch's attempts are written together, in one statement before its COMMIT (``flush``),
which also deletes those approvers' attempts that no longer count (older than the window
the rule read): the table holds about a minute of attempts.
"""

from __future__ import annotations

import sqlite3
from itertools import chain

# the batch's attempts, and their approvers' attempts that left the window, in one statement
FLUSH = (
    "WITH gone AS (DELETE FROM rate_events WHERE operator_id = ANY(?::bigint[]) AND at_ms <= ?)"
    " INSERT INTO rate_events (operator_id, at_ms)"
    " SELECT * FROM unnest(?::bigint[], ?::bigint[])"
)

# one approver's window: how many attempts after a time, and the oldest (one row, always;
# also joined to the approval's load: ``gate.store.pg_approvals``)
WINDOW = "SELECT count(*), min(at_ms) FROM rate_events WHERE operator_id = ? AND at_ms > ?"


class PgRateEvents:
    """The attempts of the rate limit in ``rate_events`` on ``conn``, the write batch's
    connection (in its transaction). ``window`` reads them, ``add`` counts one for the
    running job; ``job_started``/``job_ended`` bound a job (a job that failed on a storage
    error, never ended, counts nothing); ``flush`` writes the ended jobs' attempts."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._kept: list[tuple[int, int, int]] = []  # (operator, at, since) of ended jobs
        self._job: list[tuple[int, int, int]] = []  # the running job's
        self._expected: tuple[int, int] | None = None  # (operator, since) to read ahead
        # windows read ahead, as the table holds them in this batch (it changes only at
        # ``flush``, and no other gate writes while the batch holds the head lock)
        self._read: dict[tuple[int, int], tuple[int, int | None]] = {}

    def expect(self, operator_id: int, since_ms: int) -> None:
        self._expected = (operator_id, since_ms)

    def ahead(self) -> tuple[int, int] | None:
        """``(operator, since)`` of the window ``expect`` asked to read ahead (once), or None;
        the statement that reads it gives it to ``read_ahead``."""
        expected, self._expected = self._expected, None
        return None if expected in self._read else expected

    def read_ahead(self, expected: tuple[int, int], count: int, oldest: int | None) -> None:
        """The window ``ahead`` named, as a statement read it: ``window`` answers from it."""
        self._read[expected] = (int(count), None if oldest is None else int(oldest))

    def window(self, operator_id: int, since_ms: int) -> tuple[int, int | None]:
        """``(count, oldest)``: how many attempts ``operator_id`` made after ``since_ms``
        and the time (unix ms) of the oldest (None: none), this batch's unwritten ones
        included."""
        count, oldest = (
            self._read.get((operator_id, since_ms))
            or self._conn.execute(WINDOW, (operator_id, since_ms)).fetchone()
        )
        count, oldest = int(count), None if oldest is None else int(oldest)
        for op, at, _ in chain(self._kept, self._job):
            if op == operator_id and at > since_ms:
                count += 1
                oldest = at if oldest is None else min(oldest, at)
        return count, oldest

    def add(self, operator_id: int, at_ms: int, since_ms: int) -> None:
        """Count one attempt of ``operator_id`` at ``at_ms`` for the running job; its
        attempts at or before ``since_ms`` no longer count (``flush`` deletes them)."""
        self._job.append((operator_id, at_ms, since_ms))

    def job_started(self) -> None:
        """A job begins: what a job before it counted without ending (it failed on a storage
        error) is dropped."""
        self._job = []

    def job_ended(self) -> None:
        """The running job ran, or was refused and rolled back: its attempts count."""
        self._kept += self._job
        self._job = []

    def running(self) -> list[tuple[int, int, int]]:
        """The running job's attempts (a refused job's, carried into a new transaction)."""
        return list(self._job)

    def carry(self, attempts: list[tuple[int, int, int]]) -> None:
        """Count ``attempts`` (``running``'s, from a transaction rolled back) as ended."""
        self._kept += attempts

    def flush(self) -> None:
        """Write the ended jobs' attempts (one statement, in the batch's transaction, before
        its COMMIT) and delete their approvers' attempts that no longer count. Raises
        sqlite3.Error."""
        kept, self._kept = self._kept, []
        if not kept:
            return
        operators = sorted({op for op, _, _ in kept})
        since = min(since for _, _, since in kept)  # every later window starts after it
        self._conn.execute(
            FLUSH, (operators, since, [op for op, _, _ in kept], [at for _, at, _ in kept])
        )
