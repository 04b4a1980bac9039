"""GateService: create, decide, expire, cancel, wait. Reads the injectable clock; no HTTP, no
SQL."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets as pysecrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ulid import ULID

from gate.audit.chain import AuditRow, receipt_object
from gate.audit.entries import (
    CreatedData,
    DecisionData,
    DispatchAckData,
    ReceiptKeyRotatedData,
    ResolvedData,
)
from gate.audit.spans import ROTATED, matches
from gate.core import rules
from gate.core.ratelimit import RateLimiter
from gate.core.requests import CreateRequest, check_draft, quorum_unreachable_message
from gate.core.views import approval_view
from gate.errors import ConfigError, Conflict, GateError, NotFound
from gate.protocol.canonical import payload_hash
from gate.protocol.envelope import Decision
from gate.store import Command, Store, WriteTx
from gate.trust import permit
from gate.trust.keys import ReceiptKeys, load_receipt_keys

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
EXPIRE_BATCH = 500
# the write transactions of the gate, by name (``GateService.run_command``)
TRANSACTIONS = frozenset(
    {"create", "decide", "expire", "cancel", "dispatch_result", "configure", "receipt_key"}
)  # "configure": outside a transaction


@dataclass(frozen=True, slots=True)
class Policy:
    """What the service needs of the config for one step, resolved at create time."""

    quorum: int
    scope: tuple[tuple[int, str], ...]
    timeout_s: float
    risk: str
    allow_self_approval: bool = False
    allow_empty_draft: bool = False


@dataclass(frozen=True, slots=True)
class Resolution:
    """An approval a decision resolved: its pipeline and step, outcome, and creation and
    resolution times (unix ms, UTC, the gate's clock)."""

    pipeline: str
    step: str
    outcome: str
    created_at_ms: int
    resolved_at_ms: int

    def __reduce__(self) -> tuple[type[Resolution], tuple[Any, ...]]:
        # pickled back from the writer process: fields by position (cheaper than the
        # generic state of a slotted dataclass)
        return (
            Resolution,
            (self.pipeline, self.step, self.outcome, self.created_at_ms, self.resolved_at_ms),
        )


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """``GateService.record_decision``: the 200 body (SPEC §2) and the resolution, if any."""

    answer: dict[str, Any]
    resolution: Resolution | None


def new_nonce() -> str:
    """Return a fresh 128-bit nonce as 32 lowercase hex digits."""
    return pysecrets.token_hex(16)


class GateService:
    """The gate's rules over a Store.

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
        config: Any,
        receipt_key: bytes,
        store: Store,
        clock: Any,
        *,
        receipt_keys: ReceiptKeys | None = None,
        previous_receipt_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.clock = clock
        self._receipt_key = receipt_key
        self._previous_receipt_key = previous_receipt_key
        self.receipt_keys = receipt_keys or load_receipt_keys(config.receipts)
        self._signer = self.receipt_keys.signer
        self.rate = RateLimiter(config.relay.security.rate_limit)
        self.dispatch_wakeup = asyncio.Event()
        self.expiry_wakeup = asyncio.Event()
        self._waiters: dict[str, tuple[asyncio.Event, int]] = {}
        store.bind(self.run_command)

    def run_command(self, tx: WriteTx, command: Command) -> Any:
        """Run the write transaction ``command`` names (one of ``TRANSACTIONS``) in ``tx``;
        called by the store's writer (a thread, or the writer process: there this object is
        the writer's copy, forked at ``Store.open``). Returns what that transaction returns;
        raises what it raises (GateError for a refusal), ValueError for an unknown name."""
        if command.name not in TRANSACTIONS:
            raise ValueError(f"unknown write transaction {command.name!r}")
        return getattr(self, "_tx_" + command.name)(tx, *command.args)

    def reconfigure(self, config: Any) -> None:
        """Use ``config`` from now on (SIGHUP reload): budgets, limits, the rate limit.

        With a writer process, its copy of this service takes it too, after the
        transactions sent before and before those sent after (``Store.apply``).
        """
        self._tx_configure(None, config)
        self.store.apply(Command("configure", (config,)))

    def _tx_configure(self, tx: WriteTx | None, config: Any) -> None:
        self.config = config
        self.rate.per_minute = config.relay.security.rate_limit

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
        if req.requested_by is None:
            return None, policy
        op = self.config.operator_by_identity(req.requested_by)
        if op is None:
            raise GateError(
                "invalid_requested_by",
                "requested_by is not the identity of a configured operator",
                status=400,
                kind="invalid",
                extra={"field": "requested_by"},
            )
        if policy.allow_self_approval:
            return (op.id, op.identity), policy
        others = tuple(pair for pair in policy.scope if pair[0] != op.id)
        if len(others) < policy.quorum:
            raise GateError(
                "quorum_unreachable",
                quorum_unreachable_message(op.identity, len(others), policy.quorum),
                status=422,
                kind="invalid",
                extra={
                    "field": "requested_by",
                    "requested_by": op.identity,
                    "approvers_left": len(others),
                    "quorum_required": policy.quorum,
                },
            )
        return (op.id, op.identity), dataclasses.replace(policy, scope=others)

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
        policy = self.policy(req.pipeline, req.step)
        check_draft(req, policy.allow_empty_draft)
        requester, policy = self.requester(req, policy)
        digest = payload_hash(req.body)
        full, created_now = await self.store.transact(
            Command("create", (req, idempotency_key, requester, policy, req.request_hash(), digest))
        )
        if not created_now:
            return approval_view(full), False
        log.info(
            "event=created approval_id=%s pipeline=%s step=%s payload_hash=%s quorum=%d",
            full["approval_id"],
            req.pipeline,
            req.step,
            digest,
            policy.quorum,
        )
        self.dispatch_wakeup.set()
        self.expiry_wakeup.set()
        return approval_view(full), True

    def _tx_create(
        self,
        tx: WriteTx,
        req: CreateRequest,
        idempotency_key: str | None,
        requester: tuple[int, str] | None,
        policy: Policy,
        request_hash: str,
        digest: str,
    ) -> tuple[dict[str, Any], bool]:
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
        outcome, seq, since = await self.store.transact(Command("receipt_key"))
        receipts = self.config.receipts
        if outcome == "mismatch" and receipts.previous_key_env is None:
            raise ConfigError(
                [
                    f"receipts.key_env: {receipts.key_env} does not verify the "
                    f"newest audit entry's receipt (seq {seq}); a typo? To rotate "
                    "the key, set receipts.previous_key_env to the variable "
                    "holding the old key"
                ]
            )
        if outcome == "mismatch":
            raise ConfigError(
                [
                    f"receipts.key_env: neither {receipts.key_env} nor "
                    f"receipts.previous_key_env ({receipts.previous_key_env}) "
                    f"verifies the newest audit entry's receipt (seq {seq}); a "
                    "typo? receipts.previous_key_env must hold the key the log "
                    "was written with"
                ]
            )
        if outcome == "forged":
            raise GateError(
                "audit_tampered",
                (
                    f"receipts.previous_key_env: the newest audit entry (seq {seq}) is receipted "
                    f"with {receipts.previous_key_env}'s key, but this log went over to "
                    f"{receipts.key_env}'s key at entry {since}: an entry after that receipted "
                    "with the retired key is forged; nothing was written (hitl-gate audit verify "
                    "-c names it)"
                ),
            )
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

    def _tx_receipt_key(self, tx: WriteTx) -> tuple[str, int, int | None]:
        """``settle_receipt_key``'s transaction: ``(outcome, seq, since)``; outcome "empty",
        "current", "mismatch", "forged" (``since``: the first entry of the current key's
        span) or "rotated" (``seq``: the rotation entry's)."""
        last = tx.last_audit_row()
        if last is None:
            return "empty", 0, None
        if matches(self._receipt_key, last.entry_hash, last.receipt):
            return "current", last.seq, None
        previous = self._previous_receipt_key
        if previous is None or not matches(previous, last.entry_hash, last.receipt):
            return "mismatch", last.seq, None
        since = next(
            (
                seq
                for seq, digest, receipt in tx.audit_span_starts(ROTATED)
                if matches(self._receipt_key, digest, receipt)
            ),
            None,
        )
        if since is not None:
            return "forged", last.seq, since
        receipts = self.config.receipts
        rotated = ReceiptKeyRotatedData(last.seq, receipts.key_env, receipts.previous_key_env)
        row = self._audit(tx, rotated.kind, None, self.clock.now_ms(), rotated.to_data())
        return "rotated", row.seq, None

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
        operator_id, revision, outcome, new_revision, resolution = await self.store.transact(
            Command("decide", (decision,))
        )
        log.info(
            "event=decision approval_id=%s operator_id=%d decision=%s revision=%d payload_hash=%s",
            decision.approval_id,
            operator_id,
            decision.decision,
            revision,
            decision.payload_hash,
        )
        if outcome is not None:
            log.info(
                "event=resolved approval_id=%s outcome=%s revision=%d",
                decision.approval_id,
                outcome,
                new_revision or revision,
            )
            self._notify(decision.approval_id)
            return DecisionResult(
                {"status": "recorded", "resolved": True, "outcome": outcome}, resolution
            )
        if new_revision is not None:
            self.dispatch_wakeup.set()
        return DecisionResult({"status": "recorded", "resolved": False}, None)

    def _tx_decide(
        self, tx: WriteTx, decision: Decision
    ) -> tuple[int, int, str | None, int | None, Resolution | None]:
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
            (int(r["revision"]) for r in approval["revisions"] if r["nonce"] == decision.nonce),
            None,
        )
        if nonce_revision is None:
            raise rules.refuse(
                403, "forbidden", "nonce_mismatch", "nonce does not belong to this approval"
            )
        rules.check_state(approval, nonce_revision, decision, now)
        rules.check_not_requester(approval, decision.approver_id)
        operator_id = rules.check_approver(approval, decision.approver_id)
        rules.check_adjust_text(decision, self.config.relay.security.max_input_length)
        self.rate.check(operator_id, now)
        rules.check_not_decided(approval, operator_id, decision)
        verdict = rules.verdict(approval, operator_id, decision)
        revision = approval["revision"]
        outcome, new_revision = self._record(tx, approval, decision, verdict, now)
        resolution = (
            None
            if outcome is None
            else Resolution(
                approval["pipeline"], approval["step"], outcome, int(approval["created_at"]), now
            )
        )
        return operator_id, revision, outcome, new_revision, resolution

    def _record(
        self,
        tx: WriteTx,
        approval: dict[str, Any],
        decision: Decision,
        verdict: rules.Verdict,
        now: int,
    ) -> tuple[str | None, int | None]:
        revision = approval["revision"]
        row = {
            "approval_id": approval["approval_id"],
            "revision": revision,
            "operator_id": verdict.operator_id,
            "identity": decision.approver_id,
            "display": decision.approver_display,
            "channel": decision.approver_channel,
            "decision": decision.decision,
            "payload_hash": decision.payload_hash,
            "adjust_text": decision.adjust_text,
            "decided_at": decision.decided_at,
            "recorded_at": now,
        }
        tx.insert_decision(row)
        approval["decisions"].append(row)
        audit_data = DecisionData(
            operator_id=verdict.operator_id,
            decision=decision.decision,
            revision=revision,
            payload_hash=decision.payload_hash,
            nonce=decision.nonce,
            effect=verdict.effect,
        )
        new_revision = None
        if verdict.effect == "adjust":
            assert verdict.new_body is not None
            new_revision = revision + 1
            new_hash = payload_hash(verdict.new_body)
            tx.insert_revision(
                approval["approval_id"],
                new_revision,
                verdict.new_body,
                new_hash,
                new_nonce(),
                now,
                verdict.operator_id,
            )
            tx.set_revision(approval["approval_id"], new_revision)
            approval["revision"] = new_revision
            approval["revisions"].append(
                {
                    "revision": new_revision,
                    "body": verdict.new_body,
                    "payload_hash": new_hash,
                    "created_by": verdict.operator_id,
                }
            )
            audit_data = dataclasses.replace(
                audit_data, new_revision=new_revision, new_payload_hash=new_hash
            )
        self._audit(tx, audit_data.kind, approval["approval_id"], now, audit_data.to_data())
        collected = rules.approvers_of(approval, approval["revision"])
        outcome = rules.outcome_after(
            approval["quorum_required"], len(collected), approval["revision"], [verdict.effect]
        )
        if outcome is not None:
            self._resolve(tx, approval, outcome, now, collected)
        elif new_revision is not None:
            tx.enqueue_dispatch(approval["approval_id"], new_revision, now)
        return outcome, new_revision

    def _resolve(
        self,
        tx: WriteTx,
        approval: dict[str, Any],
        outcome: str,
        now: int,
        approved_by: Sequence[int],
    ) -> None:
        current = rules.current_revision(approval)
        fires = outcome in permit.FIRING_OUTCOMES
        resolved = ResolvedData(
            outcome=outcome,
            revision=approval["revision"],
            payload_hash=current["payload_hash"],
            approved_by=list(approved_by) if fires else [],
            quorum=approval["quorum_required"],
        )
        row = self._audit(tx, resolved.kind, approval["approval_id"], now, resolved.to_data())
        issued = None
        if fires and self._signer is not None:
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
        if not tx.resolve(approval["approval_id"], outcome, now, receipt_object(row), issued):
            raise Conflict("already_resolved", "approval was resolved concurrently")

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

    def _tx_expire(self, tx: WriteTx) -> list[str]:
        now = self.clock.now_ms()
        due = tx.due_expiry_rows(now, EXPIRE_BATCH)
        for approval in due:  # a timeout fires nothing: no permit, so no full load
            self._resolve(tx, approval, "timeout", now, [])
        return [approval["approval_id"] for approval in due]

    async def cancel(self, approval_id: str) -> dict[str, Any]:
        """Resolve a pending approval as ``cancelled`` (the pipeline withdrew).

        An approval already past its ``expires_at`` on the gate's clock is resolved
        ``timeout`` instead, and the answer is 409 ``already_resolved`` with that outcome.
        Raises NotFound 404 ``unknown_approval``; Conflict 409 ``already_resolved``.
        """

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

    def _tx_cancel(self, tx: WriteTx, approval_id: str) -> tuple[str, dict[str, Any]]:
        now = self.clock.now_ms()
        approval = tx.load_approval(approval_id)
        if approval is None:
            raise NotFound("unknown_approval", "no approval with this approval_id")
        if approval["state"] == "resolved":
            raise Conflict(
                "already_resolved",
                "the approval is already resolved",
                extra={"outcome": approval["outcome"]},
            )
        outcome = "timeout" if now >= approval["expires_at"] else "cancelled"
        self._resolve(tx, approval, outcome, now, [])
        full = tx.load_approval(approval_id)
        assert full is not None
        return outcome, full

    # ---- dispatch bookkeeping ------------------------------------------------------

    async def dispatch_result(
        self, approval_id: str, revision: int, *, acked: bool, error: str | None, retry_at_ms: int
    ) -> None:
        """Record one dispatch attempt; an ack writes a ``dispatch_ack`` audit entry."""

        await self.store.transact(
            Command("dispatch_result", (approval_id, revision, acked, error, retry_at_ms))
        )

    def _tx_dispatch_result(
        self,
        tx: WriteTx,
        approval_id: str,
        revision: int,
        acked: bool,
        error: str | None,
        retry_at_ms: int,
    ) -> None:
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

    # ---- reads -----------------------------------------------------------------

    async def get(self, approval_id: str) -> dict[str, Any]:
        """Return the approval object; raises NotFound 404 ``unknown_approval``."""
        full = await self.store.fetch_approval(approval_id)
        if full is None:
            raise NotFound("unknown_approval", "no approval with this approval_id")
        return approval_view(full)

    async def wait(self, approval_id: str, seconds: float) -> dict[str, Any]:
        """Return the approval once resolved or after ``seconds``, whichever comes first."""
        event, count = self._waiters.get(approval_id, (asyncio.Event(), 0))
        self._waiters[approval_id] = (event, count + 1)
        try:
            view = await self.get(approval_id)
            if view["state"] == "resolved" or seconds <= 0:
                return view
            try:
                await asyncio.wait_for(event.wait(), timeout=seconds)
            except TimeoutError:
                pass
            return await self.get(approval_id)
        finally:
            event, count = self._waiters.get(approval_id, (event, 1))
            if count <= 1:
                self._waiters.pop(approval_id, None)
            else:
                self._waiters[approval_id] = (event, count - 1)

    async def list(
        self, state: str, pipeline: str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """Return ``{items, next_cursor}``; ``next_cursor`` is None on the last page."""
        rows = await self.store.list_approvals(state, pipeline, limit + 1, cursor)
        more = len(rows) > limit
        rows = rows[:limit]
        return {
            "items": [approval_view(r) for r in rows],
            "next_cursor": rows[-1]["approval_id"] if more and rows else None,
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
        return await self.store.pending_summary()

    @property
    def writer_unanswered_s(self) -> float:
        """Seconds the oldest write sent to the writer process has waited for its answer
        (0.0 when none waits, and always with a writer thread)."""
        return self.store.writer_unanswered_s

    def _notify(self, approval_id: str) -> None:
        waiter = self._waiters.get(approval_id)
        if waiter is not None:
            waiter[0].set()
