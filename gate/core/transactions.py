"""The gate's write transactions: what runs on the store's writer (a thread, or the writer
process on its forked copy), looked up in one explicit table. No HTTP, no SQL of its own."""

from __future__ import annotations

import dataclasses
import secrets as pysecrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ulid import ULID

from gate.audit.chain import AuditRow, receipt_object
from gate.audit.entries import (
    CreatedData,
    DecisionData,
    DispatchAckData,
    ResolvedData,
)
from gate.clock import Clock
from gate.config import Config
from gate.core import rules
from gate.core.delegation import check_decider
from gate.core.followup_tx import handle_due
from gate.core.followups import Plan, next_followup_at
from gate.core.model import Approval, DecisionRow, Resolvable, Revision
from gate.core.ratelimit import RateLimiter
from gate.core.receipt_key import Settled, settle
from gate.core.requests import CreateRequest
from gate.errors import Conflict, GateError, NotFound
from gate.protocol.canonical import payload_hash
from gate.protocol.envelope import Decision
from gate.store import Command, WriteTx
from gate.trust import permit
from gate.trust.keys import Signer

DAY_MS = 86_400_000
EXPIRE_BATCH = 500  # approvals resolved ``timeout`` per transaction
FOLLOWUP_BATCH = 500  # approvals whose due follow-ups one transaction handles
NOTICE_GIVE_UP_MS = 3_600_000  # a resolution notice is retried for an hour (issue 14 §4)


@dataclass(frozen=True, slots=True)
class Policy:
    """What the service needs of the config for one step, resolved at create time."""

    quorum: int
    scope: tuple[tuple[int, str], ...]
    timeout_s: float
    risk: str
    allow_self_approval: bool = False
    allow_empty_draft: bool = False
    followups: Plan | None = None  # reminders and escalation levels (issue 14)


@dataclass(frozen=True, slots=True)
class Resolution:
    """An approval a decision resolved: its pipeline and step, outcome, and creation and
    resolution times (unix ms, UTC, the gate's clock)."""

    pipeline: str
    step: str
    outcome: str
    created_at_ms: int
    resolved_at_ms: int

    def __reduce__(self) -> tuple[type[Resolution], tuple[str, str, str, int, int]]:
        # pickled back from the writer process: fields by position (cheaper than the
        # generic state of a slotted dataclass)
        return (
            Resolution,
            (self.pipeline, self.step, self.outcome, self.created_at_ms, self.resolved_at_ms),
        )


def new_nonce() -> str:
    """Return a fresh 128-bit nonce as 32 lowercase hex digits."""
    return pysecrets.token_hex(16)


class Transactions:
    """The write transactions of one gate and exactly the state the writer owns.

    ``config`` (budgets, limits), the decision ``rate`` limiter (SPEC §2 check 13: its
    memory lives here), the HMAC ``receipt_key`` (and ``previous_receipt_key``, for a
    declared rotation) and the Ed25519 ``signer`` (or None) of the audit entries and
    permits. With a writer process, the process runs its forked copy of this object
    (``Store.bind``, forked at ``Store.open``): state changed afterwards reaches that copy
    only through a ``configure`` command (``Store.apply``). Every transaction reads the
    gate's ``clock`` inside the transaction.
    """

    def __init__(
        self,
        config: Config,
        clock: Clock,
        receipt_key: bytes,
        signer: Signer | None,
        *,
        previous_receipt_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.rate = RateLimiter(config.relay.security.rate_limit)
        self._receipt_key = receipt_key
        self._previous_receipt_key = previous_receipt_key
        self._signer = signer

    def run(self, tx: WriteTx, command: Command) -> Any:
        """Run the transaction ``command`` names (a key of ``TABLE``) in ``tx``; the store's
        writer calls this (``Store.bind``). Returns what that transaction returns; raises
        what it raises (GateError for a refusal), ValueError for an unknown name."""
        body = TABLE.get(command.name)
        if body is None:
            raise ValueError(f"unknown write transaction {command.name!r}")
        return body(self, tx, *command.args)

    def configure(self, tx: WriteTx | None, config: Config) -> None:
        """Use ``config`` from now on (SIGHUP reload): budgets, limits, the rate limit.
        Runs outside any transaction (``tx`` None, sent with ``Store.apply``)."""
        self.config = config
        self.rate.per_minute = config.relay.security.rate_limit

    def _audit(
        self, tx: WriteTx, kind: str, approval_id: str | None, now: int, data: dict[str, Any]
    ) -> AuditRow:
        return tx.append_audit(kind, approval_id, now, data, self._receipt_key, self._signer)

    def _budget(
        self, tx: WriteTx, pipeline: str, now_ms: int, spend: float | None
    ) -> dict[str, Any] | None:
        budget = self.config.budget
        found = next(p for p in self.config.pipelines if p.name == pipeline)
        if budget.cap_today is None and found.budget_cap is None:
            return None
        day_start = now_ms - now_ms % DAY_MS
        return {
            "unit": budget.unit,
            "spent_today": tx.spent(day_start, None),
            "cap_today": budget.cap_today,
            "spent_pipeline": tx.spent(day_start, pipeline),
            "cap_pipeline": found.budget_cap,
            "this_request": spend,
        }

    # ---- create ----------------------------------------------------------------

    def create(
        self,
        tx: WriteTx,
        req: CreateRequest,
        idempotency_key: str | None,
        requester: tuple[int, str] | None,
        policy: Policy,
        request_hash: str,
        digest: str,
    ) -> tuple[Approval, bool]:
        """Insert the approval, its first revision, its dispatch and its ``created`` entry
        (outbox: nothing waits on the relay). Returns ``(loaded approval, created)``;
        ``created`` is False for an Idempotency-Key seen before with the same body. Raises
        Conflict 409 ``idempotency_key_reused`` for the key with another body (SPEC §3)."""
        if idempotency_key is not None:
            seen = tx.approval_by_idempotency_key(idempotency_key)
            if seen is not None:
                if seen["request_hash"] != request_hash:
                    raise Conflict(
                        "idempotency_key_reused",
                        "Idempotency-Key was used before with a different body",
                    )
                found = tx.load_approval(seen["approval_id"])
                assert found is not None
                return found, False
        now = self.clock.now_ms()
        approval_id = str(ULID())
        expires_at = now + int(policy.timeout_s * 1000)
        tx.insert_approval(
            {
                "approval_id": approval_id,
                "run_id": req.run_id or str(ULID()),
                "pipeline": req.pipeline,
                "step": req.step,
                "risk": policy.risk,
                "content_type": req.content_type,
                "quorum_required": policy.quorum,
                "scope": [list(pair) for pair in policy.scope],
                "budget": self._budget(tx, req.pipeline, now, req.spend),
                "spend": req.spend,
                "revision": 1,
                "state": "pending",
                "created_at": now,
                "expires_at": expires_at,
                "idempotency_key": idempotency_key,
                "request_hash": request_hash,
                "requested_by": requester[1] if requester else None,
                "requested_by_id": requester[0] if requester else None,
                "allow_self_approval": int(policy.allow_self_approval),
                **self._followup_columns(policy.followups, now, expires_at),
            }
        )
        tx.insert_revision(approval_id, 1, req.body, digest, new_nonce(), now, None)
        tx.enqueue_dispatch(approval_id, 1, now)
        created = CreatedData(
            pipeline=req.pipeline,
            step=req.step,
            revision=1,
            payload_hash=digest,
            quorum=policy.quorum,
            approvers=[op_id for op_id, _ in policy.scope],
            expires_at=expires_at,
            requested_by=requester[0] if requester is not None else None,
            allow_self_approval=policy.allow_self_approval if requester is not None else None,
        )
        self._audit(tx, created.kind, approval_id, now, created.to_data())
        full = tx.load_approval(approval_id)
        assert full is not None
        return full, True

    @staticmethod
    def _followup_columns(plan: Plan | None, now: int, expires_at: int) -> dict[str, Any]:
        """The frozen follow-up plan and its first due time (issue 14); nothing for a step
        without reminders or levels, so its approvals row is written as before."""
        if plan is None:
            return {}
        return {
            "followups": plan.to_json(),
            "next_followup_at": next_followup_at(plan, now, expires_at, 0, 0),
        }

    # ---- receipt key -------------------------------------------------------------

    def receipt_key(self, tx: WriteTx) -> Settled:
        """``GateService.settle_receipt_key``'s transaction (``gate.core.receipt_key.settle``
        with this gate's keys, at the gate's time)."""
        return settle(
            tx,
            self._receipt_key,
            self._previous_receipt_key,
            self.config.receipts,
            self.clock.now_ms(),
            self._signer,
        )

    # ---- decide ----------------------------------------------------------------

    def decide(
        self, tx: WriteTx, decision: Decision
    ) -> tuple[int, int, str | None, int | None, Resolution | None, tuple[int, str, str] | None]:
        """SPEC §2 checks 6-14 and the recording of an accepted decision. Returns
        ``(operator id, revision decided, outcome or None, new revision or None,
        resolution or None, delegated)``; ``delegated`` is ``(principal's operator id,
        pipeline, step)`` for a delegate's decision (check 11 with ``config.delegations``,
        issue 14 §3), else None. Raises GateError with the SPEC §2 status and reason."""
        now = self.clock.now_ms()
        approval = tx.load_approval(decision.approval_id, outbox=False, created_receipt=False)
        if approval is None:
            raise GateError(
                "unknown_approval",
                "no approval with this approval_id",
                status=404,
                kind="unknown_approval",
            )
        nonce_revision = next(
            (r.revision for r in approval.revisions if r.nonce == decision.nonce), None
        )
        if nonce_revision is None:
            raise rules.refuse(
                403, "forbidden", "nonce_mismatch", "nonce does not belong to this approval"
            )
        rules.check_state(approval, nonce_revision, decision, now)
        rules.check_not_requester(approval, decision.approver_id)
        decider = check_decider(approval, decision.approver_id, self.config, now)
        operator_id = decider.operator_id
        rules.check_adjust_text(decision, self.config.relay.security.max_input_length)
        reason = rules.check_reason(
            decision,
            self.config.relay.security.max_input_length,
            rules.skip_reason_required(self.config, approval.pipeline, approval.step),
        )
        decision = dataclasses.replace(decision, reason=reason)  # blank: recorded as None
        self.rate.check(operator_id, now)
        rules.check_not_decided(approval, operator_id, decision)
        verdict = rules.verdict(approval, operator_id, decision)
        revision = approval.revision
        outcome, new_revision = self._record(
            tx, approval, decision, verdict, now, decider.on_behalf_of
        )
        resolution = (
            None
            if outcome is None
            else Resolution(approval.pipeline, approval.step, outcome, approval.created_at, now)
        )
        delegated = (
            None
            if decider.on_behalf_of is None
            else (decider.on_behalf_of, approval.pipeline, approval.step)
        )
        return operator_id, revision, outcome, new_revision, resolution, delegated

    def _record(
        self,
        tx: WriteTx,
        approval: Approval,
        decision: Decision,
        verdict: rules.Verdict,
        now: int,
        on_behalf_of: int | None = None,
    ) -> tuple[str | None, int | None]:
        revision = approval.revision
        row = DecisionRow(
            revision=revision,
            operator_id=verdict.operator_id,
            identity=decision.approver_id,
            display=decision.approver_display,
            channel=decision.approver_channel,
            decision=decision.decision,
            payload_hash=decision.payload_hash,
            adjust_text=decision.adjust_text,
            decided_at=decision.decided_at,
            recorded_at=now,
            reason=decision.reason,
            on_behalf_of=on_behalf_of,
        )
        tx.insert_decision(approval.approval_id, row)
        approval = dataclasses.replace(approval, decisions=approval.decisions + (row,))
        audit_data = DecisionData(
            operator_id=verdict.operator_id,
            decision=decision.decision,
            revision=revision,
            payload_hash=decision.payload_hash,
            nonce=decision.nonce,
            effect=verdict.effect,
            reason=decision.reason,
            on_behalf_of=on_behalf_of,
        )
        new_revision = None
        if verdict.effect == "adjust":
            assert verdict.new_body is not None
            new_revision = revision + 1
            added = Revision(
                revision=new_revision,
                body=verdict.new_body,
                payload_hash=payload_hash(verdict.new_body),
                nonce=new_nonce(),
                created_at=now,
                created_by=verdict.operator_id,
            )
            tx.insert_revision(
                approval.approval_id,
                added.revision,
                added.body,
                added.payload_hash,
                added.nonce,
                added.created_at,
                added.created_by,
            )
            tx.set_revision(approval.approval_id, new_revision)
            approval = dataclasses.replace(
                approval, revision=new_revision, revisions=approval.revisions + (added,)
            )
            audit_data = dataclasses.replace(
                audit_data, new_revision=new_revision, new_payload_hash=added.payload_hash
            )
        self._audit(tx, audit_data.kind, approval.approval_id, now, audit_data.to_data())
        collected = rules.approvers_of(approval, approval.revision)
        outcome = rules.outcome_after(
            approval.quorum_required, len(collected), approval.revision, [verdict.effect]
        )
        if outcome is not None:
            target = Resolvable(
                approval.approval_id,
                approval.revision,
                rules.current_revision(approval).payload_hash,
                approval.quorum_required,
            )
            self._resolve(tx, target, outcome, now, collected, approval)
        elif new_revision is not None:
            tx.enqueue_dispatch(approval.approval_id, new_revision, now)
        return outcome, new_revision

    def _resolve(
        self,
        tx: WriteTx,
        target: Resolvable,
        outcome: str,
        now: int,
        approved_by: Sequence[int] = (),
        approval: Approval | None = None,
    ) -> None:
        """Resolve ``target`` as ``outcome`` at ``now`` with its ``resolved`` audit entry;
        an outcome that fires gets a permit (from the loaded ``approval``) on a gate with a
        signing key. Raises Conflict ``already_resolved`` (rolling the job back) when the
        approval is no longer pending."""
        fires = outcome in permit.FIRING_OUTCOMES
        resolved = ResolvedData(
            outcome=outcome,
            revision=target.revision,
            payload_hash=target.payload_hash,
            approved_by=list(approved_by) if fires else [],
            quorum=target.quorum_required,
        )
        row = self._audit(tx, resolved.kind, target.approval_id, now, resolved.to_data())
        issued = None
        if fires and self._signer is not None:
            assert approval is not None  # only a decision fires
            claims = permit.claims_for(
                approval,
                outcome,
                approved_by,
                row.seq,
                row.entry_hash,
                now,
                self.config.receipts.permit_lifetime,
            )
            issued = permit.issue(self._signer, claims)
        # one UPDATE, guarded on state: when it finds the approval no longer pending, the
        # Conflict rolls this job back, the audit entry above included
        if not tx.resolve(target.approval_id, outcome, now, receipt_object(row), issued):
            raise Conflict("already_resolved", "approval was resolved concurrently")
        if self.config.relay.notice_target is not None:  # issue 14 §4: in this transaction
            tx.enqueue_followup(
                target.approval_id, "notice", 1, target.revision, now, now + NOTICE_GIVE_UP_MS
            )

    # ---- expire / cancel / dispatch bookkeeping --------------------------------------

    def expire(self, tx: WriteTx) -> list[str]:
        """Resolve up to ``EXPIRE_BATCH`` pending approvals past ``expires_at`` as
        ``timeout``, oldest deadline first; return their ids."""
        now = self.clock.now_ms()
        due = tx.due_expiry_rows(now, EXPIRE_BATCH)
        for target in due:  # a timeout fires nothing: no permit, so no full load
            self._resolve(tx, target, "timeout", now)
        return [target.approval_id for target in due]

    def cancel(self, tx: WriteTx, approval_id: str) -> tuple[str, Approval]:
        """Resolve a pending approval ``cancelled`` (``timeout`` when past ``expires_at``);
        return ``(outcome, loaded approval)``. Raises NotFound 404 ``unknown_approval``,
        Conflict 409 ``already_resolved`` (with its ``outcome``)."""
        now = self.clock.now_ms()
        approval = tx.load_approval(approval_id)
        if approval is None:
            raise NotFound("unknown_approval", "no approval with this approval_id")
        if approval.state == "resolved":
            raise Conflict(
                "already_resolved",
                "the approval is already resolved",
                extra={"outcome": approval.outcome},
            )
        outcome = "timeout" if now >= approval.expires_at else "cancelled"
        current = rules.current_revision(approval)
        target = Resolvable(
            approval_id, approval.revision, current.payload_hash, approval.quorum_required
        )
        self._resolve(tx, target, outcome, now)
        full = tx.load_approval(approval_id)
        assert full is not None
        return outcome, full

    def dispatch_result(
        self,
        tx: WriteTx,
        approval_id: str,
        revision: int,
        acked: bool,
        error: str | None,
        retry_at_ms: int,
    ) -> None:
        """Count one dispatch attempt of ``revision``; the first ack (unix ms now) writes a
        ``dispatch_ack`` audit entry, a failure sets the next attempt at ``retry_at_ms``."""
        now = self.clock.now_ms()
        attempts = tx.dispatch_attempted(
            approval_id,
            revision,
            delivered_at=now if acked else None,
            next_attempt_at=now if acked else retry_at_ms,
            error=error,
        )
        if acked and attempts > 0:
            ack = DispatchAckData(revision, attempts)
            self._audit(tx, ack.kind, approval_id, now, ack.to_data())

    def followups(self, tx: WriteTx) -> list[tuple[str, tuple[int, ...], int]]:
        """Handle the due reminders and escalation levels of up to ``FOLLOWUP_BATCH`` pending
        approvals at the gate's time (``gate.core.followup_tx.handle_due``, issue 14 §2)."""
        return handle_due(tx, self.clock.now_ms(), FOLLOWUP_BATCH, self._audit)

    def followup_result(
        self,
        tx: WriteTx,
        key: tuple[str, str, int],
        acked: bool,
        error: str | None,
        retry_at_ms: int | None,
    ) -> str | None:
        """Record one attempt of the follow-up send ``key`` = (approval_id, kind, n) at the
        gate's now (issue 14): delivered, retried at ``retry_at_ms``, or failed once that is
        None (dropped unsent, ``error`` says why) or not before the row's ``give_up_at``.
        Returns ``"delivered"``/``"retry"``/``"failed"``, None when nothing changed."""
        return tx.followup_attempted(
            key, self.clock.now_ms(), acked=acked, error=error, retry_at_ms=retry_at_ms
        )


# The write transactions by name (``Command.name``): the one table ``Transactions.run`` reads.
# "configure" runs outside a transaction (``Store.apply``), "receipt_key" once at start.
TABLE: dict[str, Callable[..., Any]] = {
    "create": Transactions.create,
    "decide": Transactions.decide,
    "expire": Transactions.expire,
    "cancel": Transactions.cancel,
    "dispatch_result": Transactions.dispatch_result,
    "followups": Transactions.followups,
    "followup_result": Transactions.followup_result,
    "configure": Transactions.configure,
    "receipt_key": Transactions.receipt_key,
}
