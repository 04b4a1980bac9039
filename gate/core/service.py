"""GateService: create, decide, expire, cancel, wait. Reads the injectable clock; no HTTP, no
SQL."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from gate.clock import Clock
from gate.config import Config
from gate.core import policy_tx
from gate.core.credentials import CredentialMethods
from gate.core.followups import followup_plan
from gate.core.invites import InviteMethods
from gate.core.longpoll import long_poll
from gate.core.question_service import QuestionMethods
from gate.core.ratelimit import RateLimiter
from gate.core.receipt_key import refusal
from gate.core.requests import CreateRequest, check_draft, quorum_unreachable_message
from gate.core.resolve_tx import Resolution
from gate.core.transactions import EXPIRE_BATCH, FOLLOWUP_BATCH, Policy, Transactions
from gate.core.views import approval_view
from gate.errors import Conflict, GateError, NotFound
from gate.model import Approval
from gate.protocol.canonical import payload_hash
from gate.protocol.envelope import Decision
from gate.store import Command, Store
from gate.store.approvals import APPROVALS
from gate.trust.keys import ReceiptKeys, load_receipt_keys

__all__ = ["DecisionResult", "GateService", "Policy", "Resolution"]

log = logging.getLogger(__name__)

# (pipeline, step, oldest pending created_at in unix ms) per step: ``oldest_pending_by_step``
StepAges = list[tuple[str, str, int]]


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """``GateService.record_decision``: the 200 body (SPEC §2), the resolution, if any, and
    ``delegated``: ``(pipeline, step)`` of a delegate's decision, else None."""

    answer: dict[str, Any]
    resolution: Resolution | None
    delegated: tuple[str, str] | None = None


class GateService(QuestionMethods, CredentialMethods, InviteMethods):
    """The gate's rules over a Store (the questions' methods: ``QuestionMethods``).

    ``config`` is a ``gate.config.Config``; ``receipt_key`` the HMAC receipt key (bytes);
    ``previous_receipt_key`` the one before a declared rotation (``receipts.previous_key_env``,
    used only by ``settle_receipt_key``); ``clock`` anything with ``now_ms()``;
    ``receipt_keys`` the Ed25519 signing key and
    trusted keys (default: loaded from ``config.receipts``, which raises ConfigError for a
    bad key file). With a signing key every audit entry is signed and every approved or
    adjusted approval gets a permit. Events ``dispatch_wakeup`` and ``expiry_wakeup`` tell
    the workers there is new work.
    """

    def __init__(
        self,
        config: Config,
        receipt_key: bytes,
        store: Store,
        clock: Clock,
        *,
        receipt_keys: ReceiptKeys | None = None,
        previous_receipt_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self.receipt_keys = receipt_keys or load_receipt_keys(config.receipts)
        # what the writer runs, and the state it owns (a writer process: its forked copy)
        self.transactions = Transactions(
            config,
            clock,
            receipt_key,
            self.receipt_keys.signer,
            previous_receipt_key=previous_receipt_key,
        )
        self.dispatch_wakeup = asyncio.Event()
        self.expiry_wakeup = asyncio.Event()
        self._waiters: dict[str, tuple[asyncio.Event, int]] = {}
        store.bind(self.transactions.run)

    @property
    def rate(self) -> RateLimiter:
        """The decision rate limiter (SPEC §2 check 13) of this process's ``Transactions``
        (with a writer process, the one that counts is the writer's copy)."""
        return self.transactions.rate

    def reconfigure(self, config: Config) -> None:
        """Use ``config`` from now on (SIGHUP reload): budgets, limits, the rate limit.

        With a writer process, its copy of ``Transactions`` takes it too, after the
        transactions sent before and before those sent after (``Store.apply``).
        """
        self.config = config
        self.transactions.configure(None, config)
        self.store.apply(Command("configure", (config,)))

    # ---- create ----------------------------------------------------------------

    def policy(self, pipeline: str, step: str) -> Policy:
        """Return the step's policy; raises NotFound ``unknown_pipeline``/``unknown_step`` (404)."""
        if not any(p.name == pipeline for p in self.config.pipelines):
            raise NotFound("unknown_pipeline", f"pipeline {pipeline!r} is not configured")
        found = self.config.find_step(pipeline, step)
        if found is None:
            raise NotFound("unknown_step", f"step {step!r} is not configured in {pipeline!r}")
        _, step_cfg = found
        scope = tuple((op.id, op.identity) for op in self.config.scope(step_cfg))
        return Policy(
            step_cfg.quorum,
            scope,
            step_cfg.timeout,
            step_cfg.risk,
            step_cfg.allow_self_approval,
            step_cfg.allow_empty_draft,
            followup_plan(self.config, step_cfg),
            step_cfg.approver_signature,
        )

    def requester(
        self, req: CreateRequest, policy: Policy
    ) -> tuple[tuple[int, str] | None, Policy]:
        """Resolve ``requested_by`` to ``(operator id, identity)`` and the policy it leaves.

        Without self-approval the requester leaves the frozen scope (the relay does not ask
        them; their decisions are refused ``self_approval``). Raises 400
        ``invalid_requested_by`` for an identity that is no operator, 422
        ``quorum_unreachable`` when the others in scope are fewer than the quorum (the
        answer names the requester's configured identity, ``approvers_left`` and
        ``quorum_required``).
        """
        found = self._requester(req.requested_by)
        if found is None:
            return None, policy
        op_id, identity = found
        if policy.allow_self_approval:
            return found, policy
        others = tuple(pair for pair in policy.scope if pair[0] != op_id)
        if len(others) < policy.quorum:
            raise GateError(
                "quorum_unreachable",
                quorum_unreachable_message(identity, len(others), policy.quorum),
                status=422,
                kind="invalid",
                extra={
                    "field": "requested_by",
                    "requested_by": identity,
                    "approvers_left": len(others),
                    "quorum_required": policy.quorum,
                },
            )
        plan = policy.followups.without(op_id) if policy.followups is not None else None
        return found, dataclasses.replace(policy, scope=others, followups=plan)

    async def create(
        self, req: CreateRequest, idempotency_key: str | None
    ) -> tuple[dict[str, Any], bool]:
        """Record a new approval and its dispatch in one transaction (outbox); never waits on the
        relay.

        Returns ``(approval object, created)``; ``created`` is False when the same
        Idempotency-Key and body were seen before. Raises NotFound (404), GateError 400
        ``draft_empty`` (a blank draft on a step without ``allow_empty_draft``), Conflict 409
        ``idempotency_key_reused`` (SPEC §3).
        """
        self.check_approval_step(req.pipeline, req.step)
        policy = self.policy(req.pipeline, req.step)
        check_draft(req, policy.allow_empty_draft)
        requester, policy = self.requester(req, policy)
        policy = policy_tx.plan(self.config, req, policy)  # rules, remembered
        digest = payload_hash(req.body)
        full: Approval
        created_now: bool
        full, created_now = await self.store.transact(
            Command("create", (req, idempotency_key, requester, policy, req.request_hash(), digest))
        )
        if not created_now:
            return approval_view(full), False
        log.info(
            "event=created approval_id=%s pipeline=%s step=%s payload_hash=%s quorum=%d",
            full.approval_id,
            req.pipeline,
            req.step,
            digest,
            policy.quorum,
        )
        if full.state == "resolved":  # a policy decided it at once, no dispatch
            log.info(
                "event=resolved approval_id=%s outcome=%s revision=1 by=%s",
                full.approval_id,
                full.outcome,
                full.decisions[0].identity if full.decisions else "",
            )
            return approval_view(full), True
        self.dispatch_wakeup.set()
        self.expiry_wakeup.set()
        return approval_view(full), True

    async def settle_receipt_key(self) -> int | None:
        """At start (``gate serve``), before anything else is written: go on with the audit
        log only with the key its newest entry is receipted with, or after a declared
        rotation (docs/auditing.md section 5; ``gate.audit.spans``).

        Nothing happens when the log is empty or its newest receipt verifies with
        ``receipts.key_env``'s key (restarts are idempotent). When it verifies with
        ``receipts.previous_key_env``'s instead, one ``receipt_key_rotated`` entry is
        appended, receipted (and signed) with the new key, holding the seq boundary and the
        variable names, nothing secret; returns its seq (else None). Raises ConfigError
        (``receipts.key_env: ...``, nothing written) when neither key verifies it (a typo is
        likelier than a rotation), GateError ``audit_tampered`` when the previous key
        verifies it but the log already went over to the current key (an entry forged with
        a retired key). Never logs a key.
        """
        settled = await self.store.transact(Command("receipt_key"))
        receipts = self.config.receipts
        problem = refusal(settled, receipts)
        if problem is not None:
            raise problem
        outcome, seq, _ = settled
        if outcome == "rotated":
            log.info(
                "event=receipt_key_rotated seq=%d previous_key_last_seq=%d key_env=%s "
                "previous_key_env=%s",
                seq,
                seq - 1,
                receipts.key_env,
                receipts.previous_key_env,
            )
            return int(seq)
        return None

    # ---- decide ----------------------------------------------------------------

    async def decide(self, decision: Decision) -> dict[str, Any]:
        """Apply SPEC §2 checks 6-14 and record an accepted decision, all in one transaction.

        The gate's clock is read inside the transaction. Returns the 200 body
        ``{"status": "recorded", "resolved": bool, "outcome"?}``. Raises GateError with the
        SPEC §2 status and reason for a refusal (nothing changes).
        """
        return (await self.record_decision(decision)).answer

    async def record_decision(self, decision: Decision) -> DecisionResult:
        """``decide`` that also returns what was resolved (for metrics), read in the same
        transaction: no second read of the approval. Raises as ``decide``."""
        (
            operator_id,
            revision,
            outcome,
            new_revision,
            resolution,
            delegated,
        ) = await self.store.transact(Command("decide", (decision, self.webauthn())))
        log.info(
            "event=decision approval_id=%s operator_id=%d decision=%s revision=%d payload_hash=%s"
            + ("" if delegated is None else f" on_behalf_of={int(delegated[0])}"),
            decision.approval_id,
            operator_id,
            decision.decision,
            revision,
            decision.payload_hash,
        )
        step = None if delegated is None else (delegated[1], delegated[2])
        if outcome is not None:
            log.info(
                "event=resolved approval_id=%s outcome=%s revision=%d",
                decision.approval_id,
                outcome,
                new_revision or revision,
            )
            self._notify(decision.approval_id)
            return DecisionResult(
                {"status": "recorded", "resolved": True, "outcome": outcome}, resolution, step
            )
        if new_revision is not None:
            self.dispatch_wakeup.set()
        return DecisionResult({"status": "recorded", "resolved": False}, None, step)

    # ---- expire / cancel -------------------------------------------------------

    async def expire_due(self) -> int:
        """Resolve every pending approval whose ``expires_at`` has passed as ``timeout``.

        Runs in batches of 500 per transaction; returns how many were resolved.
        """

        total = 0
        while True:
            ids = await self.store.transact(Command("expire", ()))
            for approval_id in ids:
                log.info("event=resolved approval_id=%s outcome=timeout", approval_id)
                self._notify(approval_id)
            total += len(ids)
            if len(ids) < EXPIRE_BATCH:
                return total

    async def followups_due(self) -> tuple[int, int]:
        """Apply the due escalation levels and queue the due reminders of pending approvals
        (``Transactions.followups``), in batches of 500 per transaction.
        Returns ``(levels applied, reminders queued)``; wakes the dispatcher when anything
        was queued."""
        levels = reminders = 0
        while True:
            done = await self.store.transact(Command("followups", ()))
            for approval_id, applied, reminder in done:
                for level in applied:
                    log.info("event=escalated approval_id=%s level=%d", approval_id, level)
                if reminder:
                    log.info("event=reminder_queued approval_id=%s n=%d", approval_id, reminder)
                levels += len(applied)
                reminders += 1 if reminder else 0
            if len(done) < FOLLOWUP_BATCH:
                break
        if levels or reminders:
            self.dispatch_wakeup.set()
        return levels, reminders

    async def cancel(self, approval_id: str) -> dict[str, Any]:
        """Resolve a pending approval as ``cancelled`` (the pipeline withdrew).

        An approval already past its ``expires_at`` on the gate's clock is resolved
        ``timeout`` instead, and the answer is 409 ``already_resolved`` with that outcome.
        Raises NotFound 404 ``unknown_approval``; Conflict 409 ``already_resolved``.
        """

        full: Approval
        outcome, full = await self.store.transact(Command("cancel", (approval_id,)))
        log.info("event=resolved approval_id=%s outcome=%s", approval_id, outcome)
        self._notify(approval_id)
        if outcome == "timeout":
            raise Conflict(
                "already_resolved",
                "the approval expired before it was cancelled",
                extra={"outcome": "timeout"},
            )
        return approval_view(full)

    # ---- dispatch bookkeeping ------------------------------------------------------

    async def dispatch_result(
        self, approval_id: str, revision: int, *, acked: bool, error: str | None, retry_at_ms: int
    ) -> None:
        """Record one dispatch attempt; an ack writes a ``dispatch_ack`` audit entry."""

        await self.store.transact(
            Command("dispatch_result", (approval_id, revision, acked, error, retry_at_ms))
        )

    async def followup_result(
        self,
        key: tuple[str, str, int],
        *,
        acked: bool,
        error: str | None,
        retry_at_ms: int | None,
    ) -> str | None:
        """Record one attempt of the reminder, escalation or notice ``key`` = (approval_id,
        kind, n) (``Transactions.followup_result``): ``retry_at_ms`` None drops it
        unsent as failed. Returns ``"delivered"``, ``"retry"``, ``"failed"`` or None."""
        result: str | None = await self.store.transact(
            Command("followup_result", (key, acked, error, retry_at_ms))
        )
        return result

    # ---- reads -----------------------------------------------------------------

    async def get(self, approval_id: str) -> dict[str, Any]:
        """Return the approval object; raises NotFound 404 ``unknown_approval``."""
        full = await self.store.reads.fetch(APPROVALS, approval_id)
        if full is None:
            raise NotFound("unknown_approval", "no approval with this approval_id")
        return approval_view(full)

    async def wait(self, approval_id: str, seconds: float) -> dict[str, Any]:
        """Return the approval once resolved or after ``seconds``, whichever comes first."""
        return await long_poll(self._waiters, approval_id, self.get, seconds)

    async def list(
        self, state: str, pipeline: str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """Return ``{items, next_cursor}``; ``next_cursor`` is None on the last page."""
        rows = await self.store.reads.page(APPROVALS, state, pipeline, limit + 1, cursor)
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "items": [approval_view(r) for r in rows],
            "next_cursor": rows[-1].approval_id if more and rows else None,
        }

    # ---- health (for /healthz and the /metrics scrape: neither reaches the store) ----

    async def health(self) -> int:
        """Return the database's schema version (``PRAGMA user_version``), what ``/healthz``
        reports. Raises Unavailable 503 ``storage_unavailable`` while the database refuses
        writes or the writer process has left a write unanswered too long
        (``Store.schema_version``)."""
        return await self.store.schema_version()

    async def pending_summary(self) -> tuple[int, int | None]:
        """Return ``(number of pending approvals, earliest created_at in unix ms or None)``:
        one statement over the pending partial index (``Store.pending_summary``). Raises
        GateError when the database cannot be read."""
        return await self.store.reads.pending_summary(APPROVALS)

    async def oldest_pending_by_step(self) -> StepAges:
        """Return ``(pipeline, step, oldest pending created_at in unix ms)`` per step with a
        pending approval (``Store.oldest_pending_by_step``). Raises GateError
        when the database cannot be read."""
        return await self.store.reads.oldest_pending_by_step()

    @property
    def writer_unanswered_s(self) -> float:
        """Seconds the oldest write sent to the writer process has waited for its answer
        (0.0 when none waits, and always with a writer thread)."""
        return self.store.writer_unanswered_s

    def _notify(self, approval_id: str) -> None:
        if self.config.relay.notice_target is not None:
            self.dispatch_wakeup.set()  # its notice was queued with the resolution
        waiter = self._waiters.get(approval_id)
        if waiter is not None:
            waiter[0].set()
