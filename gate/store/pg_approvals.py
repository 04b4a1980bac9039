"""Approvals on PostgreSQL, where each statement is a round trip to the server: the loader
of the write batch (``PG_APPROVALS``) reads an approval's row, its revisions and its
decisions in one statement, the two lists aggregated as JSON arrays of their columns
(texts and integers: JSON keeps them exact), instead of three. The same values as
``gate.store.approvals.load``'s, whose ``approval`` builds them."""

from __future__ import annotations

import dataclasses
import sqlite3

from gate.model import Approval, Resolvable
from gate.store.approvals import APPROVALS, COLUMNS, approval
from gate.store.requests import RequestTables, request_values

_REVISIONS = "revision, body, payload_hash, nonce, created_at, created_by"
_DECISIONS = (
    "revision, operator_id, identity, display, channel, decision, payload_hash, adjust_text,"
    " decided_at, recorded_at, reason, on_behalf_of, credential_id"
)
LOAD_SQL = (
    f"SELECT {', '.join(COLUMNS)},"
    f" (SELECT json_agg(json_build_array({_REVISIONS}) ORDER BY revision) FROM revisions r"
    "  WHERE r.approval_id = a.approval_id),"
    f" (SELECT json_agg(json_build_array({_DECISIONS}) ORDER BY decision_id) FROM decisions d"
    "  WHERE d.approval_id = a.approval_id)"
    " FROM approvals a WHERE a.approval_id = ?"
)


def load(
    conn: sqlite3.Connection, approval_id: str, outbox: bool = True, created: bool = True
) -> Approval | None:
    """``gate.store.approvals.load`` with the row, revisions and decisions read in one
    statement (``LOAD_SQL``)."""
    row = conn.execute(LOAD_SQL, (approval_id,)).fetchone()
    if row is None:
        return None
    n = len(COLUMNS)
    values = request_values(conn, APPROVALS, COLUMNS, row[:n], approval_id, outbox, created)
    return approval(values, row[n] or (), row[n + 1] or ())


PG_APPROVALS: RequestTables[Approval, Resolvable] = dataclasses.replace(APPROVALS, load=load)
