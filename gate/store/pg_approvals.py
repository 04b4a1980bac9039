"""Approvals on PostgreSQL, where each statement is a round trip to the server: the loader
of the write batch (``PG_APPROVALS``) reads an approval's row, its revisions and its
decisions in one statement, the two lists aggregated as JSON arrays of their columns
(texts and integers: JSON keeps them exact), instead of three (the same values as
``gate.store.approvals.load``'s, whose ``approval`` builds them); and the write batch's
``PgApprovalStatements`` sends a decision's INSERT with the resolution's UPDATE, one
statement where two were. A load also reads the decider's rate-limit window when the
decision's check asked for it ahead (``gate.store.pg_rate``)."""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
from typing import Any

from gate.model import Approval, DecisionRow, Resolvable
from gate.store.approvals import (
    APPROVALS,
    COLUMNS,
    DECISION_COLUMNS,
    INSERT_DECISION,
    REVISION_COLUMNS,
    ApprovalStatements,
    approval,
    decision_values,
)
from gate.store.pg_rate import WINDOW, PgRateEvents
from gate.store.requests import RequestTables, request_values

_SELECT = (
    f"SELECT {', '.join(COLUMNS)},"
    f" (SELECT json_agg(json_build_array({REVISION_COLUMNS}) ORDER BY revision) FROM revisions r"
    "  WHERE r.approval_id = a.approval_id),"
    f" (SELECT json_agg(json_build_array({DECISION_COLUMNS}) ORDER BY decision_id) FROM decisions d"
    "  WHERE d.approval_id = a.approval_id)"
)
LOAD_SQL = f"{_SELECT} FROM approvals a WHERE a.approval_id = ?"
# the same, with an approver's rate-limit window read ahead (``PgRateEvents.ahead``): the
# window's own statement, joined as one row
LOAD_WITH_WINDOW_SQL = (
    f"{_SELECT}, w.* FROM approvals a CROSS JOIN LATERAL ({WINDOW}) w WHERE a.approval_id = ?"
)


def load(
    conn: sqlite3.Connection,
    approval_id: str,
    outbox: bool = True,
    created: bool = True,
    rate: PgRateEvents | None = None,
) -> Approval | None:
    """``gate.store.approvals.load`` with the row, revisions and decisions read in one
    statement (``LOAD_SQL``), and the rate-limit window ``rate`` asked to read ahead
    (``PgRateEvents.ahead``; ``LOAD_WITH_WINDOW_SQL``), if any, in the same statement."""
    ahead = None if rate is None else rate.ahead()
    if ahead is None:
        row = conn.execute(LOAD_SQL, (approval_id,)).fetchone()
    else:
        row = conn.execute(LOAD_WITH_WINDOW_SQL, (*ahead, approval_id)).fetchone()
    if row is None:
        return None
    n = len(COLUMNS)
    if rate is not None and ahead is not None:
        rate.read_ahead(ahead, row[n + 2], row[n + 3])
    values = request_values(conn, APPROVALS, COLUMNS, row[:n], approval_id, outbox, created)
    return approval(values, row[n] or (), row[n + 1] or ())


PG_APPROVALS: RequestTables[Approval, Resolvable] = dataclasses.replace(APPROVALS, load=load)


class PgApprovalStatements(ApprovalStatements):
    """``ApprovalStatements`` of a write batch on PostgreSQL (``PG_APPROVALS``' loader), whose
    ``insert_decision`` holds the row back: sent with the next one-row change (the
    approval's resolution: ``WITH d AS (INSERT ...) UPDATE ...``, which reads no
    decisions), or alone before this object reads again and when the job ends
    (``flush_held``, ``WriteTx.job_ended``);
    dropped when the job is undone (``drop_held``, ``WriteTx.forget_tail``). A held row
    that breaks a constraint fails where it is sent, in its own job."""

    def __init__(self, conn: sqlite3.Connection, rate: PgRateEvents | None = None) -> None:
        tables = PG_APPROVALS
        if rate is not None:  # a load reads ahead the window ``rate`` expects
            tables = dataclasses.replace(PG_APPROVALS, load=functools.partial(load, rate=rate))
        super().__init__(conn, tables)
        self._held: tuple[Any, ...] | None = None

    def insert_decision(self, approval_id: str, row: DecisionRow) -> None:
        self.flush_held()
        self._held = decision_values(approval_id, row)

    def changed_one(self, sql: str, args: tuple[Any, ...]) -> bool:
        held, self._held = self._held, None
        if held is not None:  # the resolution's UPDATE: the decision goes with it
            sql, args = f"WITH d AS ({INSERT_DECISION}) {sql}", (*held, *args)
        return bool(self._conn.execute(sql, args).rowcount == 1)

    def flush_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            self._conn.execute(INSERT_DECISION, held)

    def drop_held(self) -> None:
        self._held = None
