"""The statements of one write transaction (sync, run on the writer: a thread or the writer
process) and the approval loader."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from gate.audit import chain as audit
from gate.audit.receipts import receipt_object
from gate.model import Approval, DecisionRow, Dispatch, Resolvable, Revision
from gate.store import followups
from gate.store.credentials import CredentialStatements
from gate.store.followup_tx import FollowupStatements
from gate.store.invites import InviteStatements
from gate.store.question_notices import QuestionNoticeStatements
from gate.store.questions import QuestionStatements

# the columns of the model's fields, in their order (``gate.model``)
_APPROVAL_SQL = (
    "SELECT approval_id, run_id, pipeline, step, risk, content_type, quorum_required, scope,"
    " budget, spend, revision, state, outcome, created_at, expires_at, resolved_at,"
    " idempotency_key, request_hash, receipt, requested_by, requested_by_id,"
    " allow_self_approval, permit, reminders_sent, escalation_level, approver_signature"
    " FROM approvals"
    " WHERE approval_id = ?"
)
_REVISIONS_SQL = (
    "SELECT revision, body, payload_hash, nonce, created_at, created_by FROM revisions"
    " WHERE approval_id = ? ORDER BY revision"
)
_DECISIONS_SQL = (
    "SELECT revision, operator_id, identity, display, channel, decision, payload_hash,"
    " adjust_text, decided_at, recorded_at, reason, on_behalf_of, credential_id FROM decisions"
    " WHERE approval_id = ?"
    " ORDER BY decision_id"
)
_OUTBOX_SQL = (
    "SELECT revision, attempts, next_attempt_at, delivered_at, last_error FROM outbox"
    " WHERE approval_id = ? ORDER BY revision"
)


def fetchall(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Run ``sql`` to completion and return its rows as dicts."""
    return [dict(row) for row in conn.execute(sql, args).fetchall()]


# the ``created`` audit entry of one approval, through the partial index of migration 3
CREATED_ENTRY_SQL = (
    "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id, signature"
    " FROM audit_log INDEXED BY audit_log_created WHERE approval_id = ? AND kind = 'created'"
    " ORDER BY seq LIMIT 1"
)


def load_full(
    conn: sqlite3.Connection, approval_id: str, outbox: bool = True, created_receipt: bool = True
) -> Approval | None:
    """Return the approval with its revisions, decisions, (unless ``outbox`` is False)
    outbox rows and (unless ``created_receipt`` is False) ``created_receipt``: the receipt
    object (``gate.audit.receipts.receipt_object``) of its ``created`` audit entry, read from the
    log itself (None when the log holds no such entry), or None."""
    row = conn.execute(_APPROVAL_SQL, (approval_id,)).fetchone()
    if row is None:
        return None
    receipt = None
    if created_receipt:
        entry = conn.execute(CREATED_ENTRY_SQL, (approval_id,)).fetchone()
        receipt = receipt_object(audit.AuditRow(*entry)) if entry is not None else None
    return Approval(
        approval_id=row[0],
        run_id=row[1],
        pipeline=row[2],
        step=row[3],
        risk=row[4],
        content_type=row[5],
        quorum_required=row[6],
        scope=tuple((int(op_id), str(identity)) for op_id, identity in json.loads(row[7])),
        budget=json.loads(row[8]) if row[8] else None,
        spend=row[9],
        revision=row[10],
        state=row[11],
        outcome=row[12],
        created_at=row[13],
        expires_at=row[14],
        resolved_at=row[15],
        idempotency_key=row[16],
        request_hash=row[17],
        receipt=json.loads(row[18]) if row[18] else None,
        requested_by=row[19],
        requested_by_id=row[20],
        allow_self_approval=bool(row[21]),
        permit=row[22],
        revisions=tuple(
            Revision(*r) for r in conn.execute(_REVISIONS_SQL, (approval_id,)).fetchall()
        ),
        decisions=tuple(
            DecisionRow(*r) for r in conn.execute(_DECISIONS_SQL, (approval_id,)).fetchall()
        ),
        outbox=tuple(Dispatch(*r) for r in conn.execute(_OUTBOX_SQL, (approval_id,)).fetchall())
        if outbox
        else (),
        created_receipt=receipt,
        reminders_sent=int(row[23]),
        escalation_level=int(row[24]),
        approver_signature=row[25],
    )


class WriteTx(
    FollowupStatements,
    QuestionStatements,
    QuestionNoticeStatements,
    CredentialStatements,
    InviteStatements,
):
    """The statements available inside one write transaction (``Store.transact``).

    Synchronous: a transaction runs whole on the store's writer (its thread, or the writer
    process), inside the batch's transaction and its own SAVEPOINT (``gate.store.batch``),
    so a transaction costs one hop to the writer however many statements it runs.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        # (seq, entry_hash) of the newest audit entry, known inside this transaction; None
        # = read it. The store forgets it whenever it rolls anything back (``forget_tail``).
        self._audit_tail: tuple[int, str] | None = None
        # (seq, entry_hash) of the newest entry this transaction appended and still holds
        # (None: none); what it was when the current job began, to go back to on its rollback
        self.appended_head: tuple[int, str] | None = None
        self._head_at_job: tuple[int, str] | None = None

    def job_started(self) -> None:
        """A job begins (its SAVEPOINT): ``forget_tail`` goes back to the head as it is now."""
        self._head_at_job = self.appended_head

    def forget_tail(self) -> None:
        """Drop what this transaction remembers of the audit log (after a rollback): the
        tail is read again, and ``appended_head`` is what it was when the job began."""
        self._audit_tail = None
        self.appended_head = self._head_at_job

    def _one(self, sql: str, args: tuple[Any, ...]) -> dict[str, Any] | None:
        row = self._conn.execute(sql, args).fetchone()
        return None if row is None else dict(row)

    def probe(self) -> None:
        """Rewrite the database header unchanged (``Store.check_writable``)."""
        version = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        self._conn.execute(f"PRAGMA user_version = {version}")

    def load_approval(
        self, approval_id: str, outbox: bool = True, created_receipt: bool = True
    ) -> Approval | None:
        """Return the full approval (as ``Store.fetch_approval``; without outbox rows when
        ``outbox`` is False, without ``created_receipt`` when that is False) as seen inside
        this transaction."""
        return load_full(self._conn, approval_id, outbox, created_receipt)

    def approval_by_idempotency_key(self, key: str) -> dict[str, Any] | None:
        """Return ``{approval_id, request_hash}`` for an Idempotency-Key, or None."""
        return self._one(
            "SELECT approval_id, request_hash FROM approvals WHERE idempotency_key = ?", (key,)
        )

    def remembered_approval(
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
        row = self._one(
            "SELECT a.approval_id FROM approvals a JOIN revisions r"
            " ON r.approval_id = a.approval_id AND r.revision = 1"
            " WHERE a.state = 'resolved' AND a.outcome = 'approved' AND a.revision = 1"
            " AND a.pipeline = ? AND a.step = ? AND a.resolved_at >= ? AND r.payload_hash = ?"
            " AND a.content_type = ? AND a.spend IS ?"
            " AND NOT EXISTS (SELECT 1 FROM decisions d"
            " WHERE d.approval_id = a.approval_id AND d.operator_id = 0)"
            " ORDER BY a.resolved_at DESC LIMIT 1",
            (pipeline, step, since_ms, digest, content_type, spend),
        )
        if row is None:
            return None
        approval_id = str(row["approval_id"])
        approvers = self._conn.execute(
            "SELECT operator_id FROM decisions WHERE approval_id = ? AND revision = 1"
            " AND decision = 'approve'",
            (approval_id,),
        ).fetchall()
        return approval_id, tuple(int(r["operator_id"]) for r in approvers)

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
        row = self._one(sql, args)
        return float(row["s"]) if row else 0.0

    def insert_approval(self, row: dict[str, Any]) -> None:
        """Insert an approvals row (``scope``/``budget`` given as Python values, stored as JSON)."""
        values = dict(row)
        values["scope"] = json.dumps(values["scope"], ensure_ascii=False)
        values["budget"] = (
            json.dumps(values["budget"], ensure_ascii=False)
            if values.get("budget") is not None
            else None
        )
        cols = ", ".join(values)
        marks = ", ".join("?" for _ in values)
        self._conn.execute(
            f"INSERT INTO approvals ({cols}) VALUES ({marks})", tuple(values.values())
        )

    def insert_revision(
        self,
        approval_id: str,
        revision: int,
        body: str,
        payload_hash: str,
        nonce: str,
        created_at: int,
        created_by: int | None,
    ) -> None:
        """Insert a revision of the draft with its nonce."""
        self._conn.execute(
            "INSERT INTO revisions (approval_id, revision, body, payload_hash, nonce, created_at,"
            " created_by) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (approval_id, revision, body, payload_hash, nonce, created_at, created_by),
        )

    def set_revision(self, approval_id: str, revision: int) -> None:
        """Make ``revision`` the approval's current revision."""
        self._conn.execute(
            "UPDATE approvals SET revision = ? WHERE approval_id = ?", (revision, approval_id)
        )

    def insert_decision(self, approval_id: str, row: DecisionRow) -> None:
        """Insert an accepted decision; UNIQUE(approval_id, revision, operator_id) guards
        recounts."""
        self._conn.execute(
            "INSERT INTO decisions (approval_id, revision, operator_id, identity, display,"
            " channel, decision, payload_hash, adjust_text, decided_at, recorded_at, reason,"
            " on_behalf_of, credential_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                approval_id,
                row.revision,
                row.operator_id,
                row.identity,
                row.display,
                row.channel,
                row.decision,
                row.payload_hash,
                row.adjust_text,
                row.decided_at,
                row.recorded_at,
                row.reason,
                row.on_behalf_of,
                row.credential_id,
            ),
        )

    def enqueue_dispatch(self, approval_id: str, revision: int, at_ms: int) -> None:
        """Add the outbox row for dispatching ``revision`` (due at ``at_ms``)."""
        self._conn.execute(
            "INSERT INTO outbox (approval_id, revision, next_attempt_at) VALUES (?, ?, ?)",
            (approval_id, revision, at_ms),
        )

    def dispatch_attempted(
        self,
        approval_id: str,
        revision: int,
        *,
        delivered_at: int | None,
        next_attempt_at: int,
        error: str | None,
    ) -> int:
        """Count one attempt; set delivered_at or the next attempt time and last error.

        Returns the attempts so far. Already-acked rows are left alone (returns -1).
        """
        cur = self._conn.execute(
            "UPDATE outbox SET attempts = attempts + 1, delivered_at = ?, next_attempt_at = ?,"
            " last_error = ? WHERE approval_id = ? AND revision = ? AND delivered_at IS NULL",
            (delivered_at, next_attempt_at, error, approval_id, revision),
        )
        if cur.rowcount != 1:
            return -1
        row = self._one(
            "SELECT attempts FROM outbox WHERE approval_id = ? AND revision = ?",
            (approval_id, revision),
        )
        return int(row["attempts"]) if row else -1

    def enqueue_followup(
        self, approval_id: str, kind: str, n: int, revision: int, at_ms: int, give_up_at_ms: int
    ) -> bool:
        """Queue a reminder, escalation or notice (``gate.store.followups.insert``); False
        when that (approval, kind, n) is queued already."""
        return followups.insert(self._conn, approval_id, kind, n, revision, at_ms, give_up_at_ms)

    def followup_attempted(
        self,
        key: tuple[str, str, int],
        now_ms: int,
        *,
        acked: bool,
        error: str | None,
        retry_at_ms: int | None,
    ) -> str | None:
        """Record one attempt of a follow-up send (``gate.store.followups.attempted``)."""
        return followups.attempted(
            self._conn, key, now_ms, acked=acked, error=error, retry_at_ms=retry_at_ms
        )

    def resolve(
        self,
        approval_id: str,
        outcome: str,
        at_ms: int,
        receipt: dict[str, Any],
        permit: str | None,
    ) -> bool:
        """Mark a pending approval resolved with ``outcome`` at ``at_ms`` (unix ms), with its
        resolution ``receipt`` and execution ``permit`` (compact JWS, or None), in one
        statement; return False (nothing changed) if it was not pending."""
        cur = self._conn.execute(
            "UPDATE approvals SET state = 'resolved', outcome = ?, resolved_at = ?, receipt = ?,"
            " permit = ? WHERE approval_id = ? AND state = 'pending'",
            (outcome, at_ms, json.dumps(receipt), permit, approval_id),
        )
        return cur.rowcount == 1

    def due_expiry_rows(self, now_ms: int, limit: int) -> list[Resolvable]:
        """Return what resolving a due approval needs, oldest deadline first, one query:
        pending approvals with ``expires_at <= now_ms`` (unix ms), at most ``limit``."""
        rows = self._conn.execute(
            "SELECT a.approval_id, a.revision, r.payload_hash, a.quorum_required"
            " FROM approvals a INDEXED BY approvals_pending_expiry JOIN revisions r"
            " ON r.approval_id = a.approval_id AND r.revision = a.revision"
            " WHERE a.state = 'pending' AND a.expires_at <= ?"
            " ORDER BY a.expires_at LIMIT ?",
            (now_ms, limit),
        ).fetchall()
        return [Resolvable(*row) for row in rows]

    def last_audit_row(self) -> audit.AuditRow | None:
        """Return the newest audit row (highest seq), or None when the log is empty."""
        row = self._conn.execute(
            "SELECT seq, approval_id, kind, entry, prev_hash, entry_hash, receipt, key_id,"
            " signature FROM audit_log ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        return None if row is None else audit.AuditRow(*row)

    def audit_span_starts(self, kind: str) -> list[tuple[int, str, str]]:
        """Return ``(seq, entry_hash, receipt)`` of entry 1 and of every entry of ``kind``
        (the receipt-key rotations: few), ascending. Scans the log once (no index on kind:
        run only at a start that rotates the receipt key)."""
        rows = self._conn.execute(
            "SELECT seq, entry_hash, receipt FROM audit_log WHERE seq = 1 OR kind = ? ORDER BY seq",
            (kind,),
        ).fetchall()
        return [(int(seq), str(digest), str(receipt)) for seq, digest, receipt in rows]

    def append_audit(
        self,
        kind: str,
        approval_id: str | None,
        at_ms: int,
        data: dict[str, Any],
        key: bytes,
        signer: audit.Signer | None = None,
    ) -> audit.AuditRow:
        """Append one hash-chained audit entry with its HMAC receipt and, with ``signer``,
        its Ed25519 signature and key id; return the stored row."""
        last = self._audit_tail
        if last is None:
            last = self._conn.execute(
                "SELECT seq, entry_hash FROM audit_log ORDER BY seq DESC LIMIT 1"
            ).fetchone()
        prev_hash = last[1] if last else audit.GENESIS_HASH
        seq = (int(last[0]) if last else 0) + 1
        entry = audit.make_entry(seq, kind, approval_id, at_ms, data)
        entry_json, digest, receipt = audit.seal(prev_hash, entry, key)
        key_id, signature = audit.sign(signer, digest) if signer is not None else (None, None)
        self._conn.execute(
            "INSERT INTO audit_log (seq, approval_id, kind, entry, prev_hash, entry_hash, receipt,"
            " key_id, signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (seq, approval_id, kind, entry_json, prev_hash, digest, receipt, key_id, signature),
        )
        self._audit_tail = self.appended_head = (seq, digest)  # set only once the row is in
        return audit.AuditRow(
            seq, approval_id, kind, entry_json, prev_hash, digest, receipt, key_id, signature
        )
