"""The SQL of approvals (migration 1 and on): the ``approvals``, ``revisions`` and
``decisions`` tables. ``APPROVALS`` names them for the reads and statements every kind
shares (``gate.store.requests``); what only approvals have is here: the loader, decisions,
revisions, the spend of a day, remembered approvals and where follow-ups stand."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gate.model import Approval, DecisionRow, Resolvable, Revision, field_values
from gate.store.requests import RequestStatements, RequestTables, request_row

# the columns of the model's fields (``gate.model.Approval``), named alike
COLUMNS = (
    *("approval_id", "run_id", "pipeline", "step", "risk", "content_type", "quorum_required"),
    *("scope", "budget", "spend", "revision", "state", "outcome", "created_at", "expires_at"),
    *("resolved_at", "idempotency_key", "request_hash", "receipt", "requested_by"),
    *("requested_by_id", "allow_self_approval", "permit", "reminders_sent", "escalation_level"),
    "approver_signature",
)
# the columns of ``Revision`` and of ``DecisionRow``, in their fields' order (also the
# one-statement loader's: ``gate.store.pg_approvals``)
REVISION_COLUMNS = "revision, body, payload_hash, nonce, created_at, created_by"
DECISION_COLUMNS = (
    "revision, operator_id, identity, display, channel, decision, payload_hash, adjust_text,"
    " decided_at, recorded_at, reason, on_behalf_of, credential_id"
)
_REVISIONS_SQL = f"SELECT {REVISION_COLUMNS} FROM revisions WHERE approval_id = ? ORDER BY revision"
_DECISIONS_SQL = (
    f"SELECT {DECISION_COLUMNS} FROM decisions WHERE approval_id = ? ORDER BY decision_id"
)

_REVISION_VALUES = field_values(Revision)
_DECISION_VALUES = field_values(DecisionRow)
INSERT_DECISION = (
    "INSERT INTO decisions (approval_id, revision, operator_id, identity, display, channel,"
    " decision, payload_hash, adjust_text, decided_at, recorded_at, reason, on_behalf_of,"
    " credential_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


def decision_values(approval_id: str, row: DecisionRow) -> tuple[Any, ...]:
    """``INSERT_DECISION``'s parameters: the columns in the model's field order."""
    return (approval_id, *_DECISION_VALUES(row))


def load(
    conn: sqlite3.Connection, approval_id: str, outbox: bool = True, created: bool = True
) -> Approval | None:
    """Return the approval with its revisions, decisions, (unless ``outbox`` is False)
    outbox rows and (unless ``created`` is False) ``created_receipt``: the receipt
    object (``gate.audit.receipts.receipt_object``) of its ``created`` audit entry, read from the
    log itself (None when the log holds no such entry), or None."""
    values = request_row(conn, APPROVALS, COLUMNS, approval_id, outbox, created)
    if values is None:
        return None
    revisions = conn.execute(_REVISIONS_SQL, (approval_id,))
    return approval(values, revisions, conn.execute(_DECISIONS_SQL, (approval_id,)))


def approval(
    values: dict[str, Any], revisions: Iterable[Sequence[Any]], decisions: Iterable[Sequence[Any]]
) -> Approval:
    """The ``Approval`` of its row's values (``request_row``'s), its revisions' rows (the
    columns of ``Revision``, by revision) and its decisions' (those of ``DecisionRow``, in
    the order they were recorded)."""
    values.update(
        budget=json.loads(values["budget"]) if values["budget"] else None,
        allow_self_approval=bool(values["allow_self_approval"]),
        reminders_sent=int(values["reminders_sent"]),
        escalation_level=int(values["escalation_level"]),
        revisions=tuple(Revision(*r) for r in revisions),
        decisions=tuple(DecisionRow(*r) for r in decisions),
    )
    return Approval(**values)


APPROVALS: RequestTables[Approval, Resolvable] = RequestTables(
    table="approvals",
    id="approval_id",
    version="revision",
    versions="revisions",
    version_hash="payload_hash",
    request_hash="request_hash",
    outbox="outbox",
    created="created",
    json_columns=("scope", "budget"),
    permit=True,
    due_extra=("quorum_required",),
    due_row=Resolvable,
    load=load,
)


@dataclass(frozen=True, slots=True)
class FollowupState:
    """What a due follow-up needs of a pending approval: ``scope`` and its follow-up plan
    ``followups`` (JSON text; None without one), ``reminders_sent``, ``escalation_level``,
    ``created_at``/``expires_at`` (unix ms), the current ``revision`` and whether its
    dispatch was acked (``delivered``)."""

    scope: str
    followups: str | None
    reminders_sent: int
    escalation_level: int
    created_at: int
    expires_at: int
    revision: int
    delivered: bool


class ApprovalStatements(RequestStatements[Approval, Resolvable]):
    """The statements of a write transaction about approvals (``WriteTx.approvals``): the
    ones every kind shares, and these; ``kind`` is ``APPROVALS`` or a backend's own form of
    it (a loader in fewer statements: ``gate.store.pg_approvals``)."""

    def __init__(
        self, conn: sqlite3.Connection, kind: RequestTables[Approval, Resolvable] = APPROVALS
    ) -> None:
        super().__init__(conn, kind)

    def remembered(
        self,
        pipeline: str,
        step: str,
        content_type: str,
        digest: str,
        since_ms: int,
        spend: float | None = None,
    ) -> tuple[str, tuple[int, ...]] | None:
        """``remember_approval``: the newest approval of ``pipeline``/``step`` a
        person approved (outcome ``approved`` on revision 1, no policy decision: operator 0)
        at or after ``since_ms`` whose draft has ``content_type``, hashes to ``digest`` and
        asked for the same ``spend`` (both none, or equal: review C5); its id and the
        operator ids of its approve decisions, or None."""
        self.flush_held()
        row = self._conn.execute(
            "SELECT a.approval_id FROM approvals a JOIN revisions r"
            " ON r.approval_id = a.approval_id AND r.revision = 1"
            " WHERE a.state = 'resolved' AND a.outcome = 'approved' AND a.revision = 1"
            " AND a.pipeline = ? AND a.step = ? AND a.resolved_at >= ? AND r.payload_hash = ?"
            " AND a.content_type = ? AND a.spend IS ?"
            " AND NOT EXISTS (SELECT 1 FROM decisions d"
            " WHERE d.approval_id = a.approval_id AND d.operator_id = 0)"
            " ORDER BY a.resolved_at DESC LIMIT 1",
            (pipeline, step, since_ms, digest, content_type, spend),
        ).fetchone()
        if row is None:
            return None
        approval_id = str(row[0])
        approvers = self._conn.execute(
            "SELECT operator_id FROM decisions WHERE approval_id = ? AND revision = 1"
            " AND decision = 'approve'",
            (approval_id,),
        ).fetchall()
        return approval_id, tuple(int(r[0]) for r in approvers)

    def spent(self, since_ms: int, pipeline: str | None) -> float:
        """Return the summed ``spend`` of approvals that fired (approved/adjusted) since
        ``since_ms``."""
        sql = (
            "SELECT COALESCE(SUM(spend), 0) AS s FROM approvals WHERE outcome IN "
            "('approved', 'adjusted') AND resolved_at >= ?"
        )
        args: tuple[Any, ...] = (since_ms,)
        if pipeline is not None:
            sql += " AND pipeline = ?"
            args += (pipeline,)
        row = self._conn.execute(sql, args).fetchone()
        return float(row[0]) if row else 0.0

    def insert_revision(self, approval_id: str, revision: Revision) -> None:
        """Insert a revision of the draft with its nonce."""
        self._conn.execute(
            "INSERT INTO revisions (approval_id, revision, body, payload_hash, nonce, created_at,"
            " created_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (approval_id, *_REVISION_VALUES(revision)),  # the columns in the model's field order
        )

    def insert_decision(self, approval_id: str, row: DecisionRow) -> None:
        """Insert an accepted decision; UNIQUE(approval_id, revision, operator_id) guards
        recounts."""
        self._conn.execute(INSERT_DECISION, decision_values(approval_id, row))

    def load(
        self, request_id: str, outbox: bool = True, created_receipt: bool = True
    ) -> Approval | None:
        self.flush_held()  # the loader reads decisions: what is held back goes first
        return super().load(request_id, outbox, created_receipt)

    def flush_held(self) -> None:
        """Send what this object holds back (a backend's form may hold a statement to send
        it with the next: ``gate.store.pg_approvals``); here nothing is held."""

    def drop_held(self) -> None:
        """Forget what this object holds back (its job is undone); here nothing is held."""

    def due_followups(self, now_ms: int, limit: int) -> list[str]:
        """Pending approvals whose ``next_followup_at`` is at or before ``now_ms`` (unix ms),
        earliest first, at most ``limit``: through the partial index
        ``approvals_followup_due``, no scan."""
        rows = self._conn.execute(
            "SELECT approval_id FROM approvals INDEXED BY approvals_followup_due"
            " WHERE state = 'pending' AND next_followup_at IS NOT NULL AND next_followup_at <= ?"
            " ORDER BY next_followup_at LIMIT ?",
            (now_ms, limit),
        ).fetchall()
        return [str(row[0]) for row in rows]

    def followup_state(self, approval_id: str) -> FollowupState | None:
        """Where the follow-ups of a pending approval stand; None when it is not pending."""
        row = self._conn.execute(
            "SELECT a.scope, a.followups, a.reminders_sent, a.escalation_level, a.created_at,"
            " a.expires_at, a.revision, o.delivered_at IS NOT NULL AS delivered"
            " FROM approvals a LEFT JOIN outbox o"
            " ON o.approval_id = a.approval_id AND o.revision = a.revision"
            " WHERE a.approval_id = ? AND a.state = 'pending'",
            (approval_id,),
        ).fetchone()
        if row is None:
            return None
        scope, plan, sent, level, created_at, expires_at, revision, delivered = row
        return FollowupState(
            scope,
            plan,
            int(sent),
            int(level),
            int(created_at),
            int(expires_at),
            int(revision),
            bool(delivered),
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
