"""The gate's write transactions: what runs on the store's writer (a thread, or the writer
process on its forked copy), looked up in one explicit table. No HTTP, no SQL of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ulid import ULID

from gate.audit.chain import AuditRow
from gate.audit.entries import (
    CreatedData,
    DispatchAckData,
)
from gate.clock import Clock
from gate.config import Config
from gate.core import credentials, invites, policy_tx, rules
from gate.core.decide_tx import decide, new_nonce
from gate.core.followup_tx import handle_due
from gate.core.followups import Plan, next_followup_at
from gate.core.policy import Verdict as PolicyVerdict
from gate.core.question_answer_tx import answer_question
from gate.core.question_tx import (
    cancel_question,
    create_question,
    expire_questions,
    question_dispatch_result,
    question_notice_result,
    revise_question,
)
from gate.core.ratelimit import RateLimiter
from gate.core.receipt_key import Settled, settle
from gate.core.requests import CreateRequest
from gate.core.resolve_tx import resolve
from gate.errors import Conflict, NotFound
from gate.model import Approval, Resolvable
from gate.store import Command, WriteTx
from gate.store.outbox import DISPATCHES, FOLLOWUPS
from gate.trust.keys import Signer

DAY_MS = 86_400_000
EXPIRE_BATCH = 500  # approvals resolved ``timeout`` per transaction
FOLLOWUP_BATCH = 500  # approvals whose due follow-ups one transaction handles


@dataclass(frozen=True, slots=True)
class Policy:
    """What the service needs of the config for one step, resolved at create time."""

    quorum: int
    scope: tuple[tuple[int, str], ...]
    timeout_s: float
    risk: str
    allow_self_approval: bool = False
    allow_empty_draft: bool = False
    followups: Plan | None = None  # reminders and escalation levels
    approver_signature: str = "off"  # off | optional | required, frozen here
    verdict: PolicyVerdict | None = None  # what the step's rules decided
    remember_ms: int | None = None  # the step's remember_approval window


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

    def audit(
        self, tx: WriteTx, kind: str, approval_id: str | None, now: int, data: dict[str, Any]
    ) -> AuditRow:
        """Append one audit entry (``kind``, ``data``) at ``now``, receipted with the receipt
        key and signed with the signer the writer owns; return its row."""
        return tx.append_audit(kind, approval_id, now, data, self._receipt_key, self._signer)

    def resolve(
        self,
        tx: WriteTx,
        target: Resolvable,
        outcome: str,
        now: int,
        approved_by: Sequence[int] = (),
        approval: Approval | None = None,
        notice: bool = True,
    ) -> None:
        """``gate.core.resolve_tx.resolve`` with this writer's keys and config."""
        resolve(
            tx,
            target,
            outcome,
            now,
            audit=self.audit,
            signer=self._signer,
            config=self.config,
            approved_by=approved_by,
            approval=approval,
            notice=notice,
        )

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
            "spent_today": tx.approvals.spent(day_start, None),
            "cap_today": budget.cap_today,
            "spent_pipeline": tx.approvals.spent(day_start, pipeline),
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
        (outbox: nothing waits on the relay); when a policy decides it
        (``gate.core.policy_tx``), no dispatch but the decision and the resolution. Returns
        ``(loaded approval, created)``; ``created`` is False for an Idempotency-Key seen
        before with the same body. Raises
        Conflict 409 ``idempotency_key_reused`` for the key with another body (SPEC §3)."""
        if idempotency_key is not None:
            seen = tx.approvals.by_idempotency_key(idempotency_key)
            if seen is not None:
                if seen[1] != request_hash:
                    raise Conflict(
                        "idempotency_key_reused",
                        "Idempotency-Key was used before with a different body",
                    )
                found = tx.approvals.load(seen[0])
                assert found is not None
                return found, False
        now = self.clock.now_ms()
        approval_id = str(ULID())
        expires_at = now + int(policy.timeout_s * 1000)
        budget = self._budget(tx, req.pipeline, now, req.spend)
        tx.approvals.insert(
            {
                "approval_id": approval_id,
                "run_id": req.run_id or str(ULID()),
                "pipeline": req.pipeline,
                "step": req.step,
                "risk": policy.risk,
                "content_type": req.content_type,
                "quorum_required": policy.quorum,
                "scope": [list(pair) for pair in policy.scope],
                "budget": budget,
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
                "approver_signature": policy.approver_signature,
                **self._followup_columns(policy.followups, now, expires_at),
            }
        )
        nonce = new_nonce()
        tx.approvals.insert_revision(approval_id, 1, req.body, digest, nonce, now, None)
        decided = None  # a policy decides (no dispatch), or a person does
        if policy.verdict is not None or policy.remember_ms is not None:
            decided = policy_tx.verdict(tx, req, policy, digest, now, budget)
        if decided is None:
            tx.outbox.queue(DISPATCHES, (approval_id, 1), now)
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
            approver_signature=None  # only a signed step's entry says so
            if policy.approver_signature == "off"
            else policy.approver_signature,
        )
        self.audit(tx, created.kind, approval_id, now, created.to_data())
        if decided is not None:
            policy_tx.apply(self, tx, approval_id, decided, nonce, digest, now)
        full = tx.approvals.load(approval_id)
        assert full is not None
        return full, True

    @staticmethod
    def _followup_columns(plan: Plan | None, now: int, expires_at: int) -> dict[str, Any]:
        """The frozen follow-up plan and its first due time; nothing for a step
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

    # ---- expire / cancel / dispatch bookkeeping --------------------------------------

    def expire(self, tx: WriteTx) -> list[str]:
        """Resolve up to ``EXPIRE_BATCH`` pending approvals past ``expires_at`` as
        ``timeout``, oldest deadline first; return their ids."""
        now = self.clock.now_ms()
        due = tx.approvals.due(now, EXPIRE_BATCH)
        for target in due:  # a timeout fires nothing: no permit, so no full load
            self.resolve(tx, target, "timeout", now)
        return [target.approval_id for target in due]

    def cancel(self, tx: WriteTx, approval_id: str) -> tuple[str, Approval]:
        """Resolve a pending approval ``cancelled`` (``timeout`` when past ``expires_at``);
        return ``(outcome, loaded approval)``. Raises NotFound 404 ``unknown_approval``,
        Conflict 409 ``already_resolved`` (with its ``outcome``)."""
        now = self.clock.now_ms()
        approval = tx.approvals.load(approval_id)
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
        self.resolve(tx, target, outcome, now)
        full = tx.approvals.load(approval_id)
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
        attempt = tx.outbox.attempted(
            DISPATCHES,
            (approval_id, revision),
            now,
            acked=acked,
            error=error,
            retry_at_ms=retry_at_ms,
        )
        if acked and attempt is not None:
            ack = DispatchAckData(revision, attempt.attempts)
            self.audit(tx, ack.kind, approval_id, now, ack.to_data())

    def followups(self, tx: WriteTx) -> list[tuple[str, tuple[int, ...], int]]:
        """Handle the due reminders and escalation levels of up to ``FOLLOWUP_BATCH`` pending
        approvals at the gate's time (``gate.core.followup_tx.handle_due``)."""
        return handle_due(tx, self.clock.now_ms(), FOLLOWUP_BATCH, self.audit)

    def followup_result(
        self,
        tx: WriteTx,
        key: tuple[str, str, int],
        acked: bool,
        error: str | None,
        retry_at_ms: int | None,
    ) -> str | None:
        """Record one attempt of the follow-up send ``key`` = (approval_id, kind, n) at the
        gate's now: delivered, retried at ``retry_at_ms``, or failed once that is
        None (dropped unsent, ``error`` says why) or not before the row's ``give_up_at``.
        Returns ``"delivered"``/``"retry"``/``"failed"``, None when nothing changed."""
        attempt = tx.outbox.attempted(
            FOLLOWUPS, key, self.clock.now_ms(), acked=acked, error=error, retry_at_ms=retry_at_ms
        )
        return None if attempt is None else attempt.state


# The write transactions by name (``Command.name``): the one table ``Transactions.run`` reads.
# "configure" runs outside a transaction (``Store.apply``), "receipt_key" once at start.
TABLE: dict[str, Callable[..., Any]] = {
    "create": Transactions.create,
    "decide": decide,
    "expire": Transactions.expire,
    "cancel": Transactions.cancel,
    "dispatch_result": Transactions.dispatch_result,
    "followups": Transactions.followups,
    "followup_result": Transactions.followup_result,
    "create_question": create_question,  # gate.core.question_tx
    "revise_question": revise_question,
    "cancel_question": cancel_question,
    "expire_questions": expire_questions,
    "answer_question": answer_question,
    "question_dispatch_result": question_dispatch_result,
    "question_notice_result": question_notice_result,
    "enrol_credential": credentials.enrol,  # gate.core.credentials
    "revoke_credential": credentials.revoke,
    "list_credentials": credentials.list_all,
    "create_invite": invites.create_invite,  # passkeys, gate.core.invites
    "invite_page": invites.invite_page,
    "register_passkey": invites.register,
    "configure": Transactions.configure,
    "receipt_key": Transactions.receipt_key,
}
