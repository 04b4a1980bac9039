"""The approvals of a gate (``GateService.approvals``): the shared lifecycle
(``RequestService``) with create (policy, requester, a policy's decision at once), decide
and the follow-ups. Reads the injectable clock only in the writer; no HTTP, no SQL."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gate.config.webauthn import WebAuthnSettings
from gate.core.approvals import policy_tx
from gate.core.approvals.create import CreateRequest, check_draft, quorum_unreachable_message
from gate.core.approvals.decide_tx import Decide
from gate.core.approvals.followup_tx import FOLLOWUP_BATCH, FollowupResult, Followups
from gate.core.approvals.followups import followup_plan
from gate.core.approvals.kind import APPROVALS
from gate.core.approvals.resolve_tx import Resolution
from gate.core.requests.lifecycle_tx import Create
from gate.core.requests.service import RequestService, Shared
from gate.core.transactions import Policy
from gate.errors import GateError
from gate.model import Approval
from gate.protocol.canonical import payload_hash
from gate.protocol.envelope import Decision


@dataclass(frozen=True, slots=True)
class DecisionResult:
    """``Approvals.record_decision``: the 200 body (SPEC §2), the resolution, if any, and
    ``delegated``: ``(pipeline, step)`` of a delegate's decision, else None."""

    answer: dict[str, Any]
    resolution: Resolution | None
    delegated: tuple[str, str] | None = None


class Approvals(RequestService[Approval]):
    """Approvals over the gate's ``Shared`` state. ``webauthn`` gives the passkeys' relying
    party a decision's approver signature is checked against (``Invites.webauthn``)."""

    def __init__(self, shared: Shared, webauthn: Callable[[], WebAuthnSettings | None]) -> None:
        super().__init__(APPROVALS, shared)
        self.webauthn = webauthn

    # ---- create ----------------------------------------------------------------

    def policy(self, pipeline: str, step: str) -> Policy:
        """Return the step's policy; raises NotFound ``unknown_pipeline``/``unknown_step``
        (404), 400 ``step_is_question`` for a question step."""
        step_cfg = self.step(pipeline, step)
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

    def requester_policy(
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
        found = self.requester(req.requested_by)
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
        ``step_is_question``, ``draft_empty`` (a blank draft on a step without
        ``allow_empty_draft``), Conflict 409 ``idempotency_key_reused`` (SPEC §3).
        """
        policy = self.policy(req.pipeline, req.step)
        check_draft(req, policy.allow_empty_draft)
        requester, policy = self.requester_policy(req, policy)
        policy = policy_tx.plan(self.config, req, policy)  # rules, remembered
        digest = payload_hash(req.body)
        full, created_now = await self.store.transact(
            Create(APPROVALS, req, idempotency_key, requester, policy, req.request_hash(), digest)
        )
        if not created_now:
            return self.kind.view(full), False
        view = self.opened(full, "payload_hash=%s quorum=%d", digest, policy.quorum)
        if full.state == "resolved":  # a policy decided it at once, no dispatch
            self.log.info(
                "event=resolved approval_id=%s outcome=%s revision=1 by=%s",
                full.approval_id,
                full.outcome,
                full.decisions[0].identity if full.decisions else "",
            )
        return view, True

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
        decided = await self.store.transact(Decide(decision, self.webauthn()))
        operator_id, revision, outcome, new_revision, resolution, delegated = decided
        self.log.info(
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
            self.log.info(
                "event=resolved approval_id=%s outcome=%s revision=%d",
                decision.approval_id,
                outcome,
                new_revision or revision,
            )
            self.wake(decision.approval_id)
            return DecisionResult(
                {"status": "recorded", "resolved": True, "outcome": outcome}, resolution, step
            )
        if new_revision is not None:
            self.shared.dispatch_wakeup.set()
        return DecisionResult({"status": "recorded", "resolved": False}, None, step)

    # ---- follow-ups --------------------------------------------------------------

    async def followups_due(self) -> tuple[int, int]:
        """Apply the due escalation levels and queue the due reminders of pending approvals
        (``followup_tx.Followups``), in batches of 500 per transaction.
        Returns ``(levels applied, reminders queued)``; wakes the dispatcher when anything
        was queued."""
        levels = reminders = 0
        while True:
            done = await self.store.transact(Followups())
            for approval_id, applied, reminder in done:
                for level in applied:
                    self.log.info("event=escalated approval_id=%s level=%d", approval_id, level)
                if reminder:
                    self.log.info(
                        "event=reminder_queued approval_id=%s n=%d", approval_id, reminder
                    )
                levels += len(applied)
                reminders += 1 if reminder else 0
            if len(done) < FOLLOWUP_BATCH:
                break
        if levels or reminders:
            self.shared.dispatch_wakeup.set()
        return levels, reminders

    async def followup_result(
        self,
        key: tuple[str, str, int],
        *,
        acked: bool,
        error: str | None,
        retry_at_ms: int | None,
    ) -> str | None:
        """Record one attempt of the reminder, escalation or notice ``key`` = (approval_id,
        kind, n) (``followup_tx.FollowupResult``): ``retry_at_ms`` None drops it
        unsent as failed. Returns ``"delivered"``, ``"retry"``, ``"failed"`` or None."""
        return await self.store.transact(FollowupResult(key, acked, error, retry_at_ms))
