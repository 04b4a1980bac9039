"""The approval kind of request (``gate.core.requests.kind.Kind``): its rows and audit
entries in the writer's transaction (``approvals``, ``revisions``, ``outbox``), the budget
context and follow-up plan frozen at creation, a policy's decision at once, and the approval
object of the pipeline API."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gate.audit.entries import CreatedData, DispatchAckData
from gate.core.approvals import policy_tx
from gate.core.approvals.create import CreateRequest
from gate.core.approvals.followups import Plan, next_followup_at
from gate.core.approvals.resolve_tx import resolve
from gate.core.approvals.rules import resolvable
from gate.core.requests.kind import Kind
from gate.core.requests.lifecycle_tx import new_nonce
from gate.core.views import approval_view
from gate.model import Approval, Resolvable, Revision
from gate.store import WriteTx
from gate.store.approvals import APPROVALS as TABLES
from gate.store.outbox import DISPATCHES

if TYPE_CHECKING:
    from gate.core.transactions import Policy, Transactions

DAY_MS = 86_400_000


def budget_context(
    t: Transactions, tx: WriteTx, pipeline: str, now_ms: int, spend: float | None
) -> dict[str, Any] | None:
    """The budget context frozen on a new approval and sent to the relay (SPEC §5 budget):
    the day's spending (UTC day of ``now_ms``) in all and in ``pipeline``, their caps and
    ``this_request``'s ``spend``, in ``budget.unit``; None when no cap is configured."""
    budget = t.config.budget
    found = next(p for p in t.config.pipelines if p.name == pipeline)
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


def followup_columns(plan: Plan | None, now: int, expires_at: int) -> dict[str, Any]:
    """The frozen follow-up plan and its first due time; nothing for a step without
    reminders or levels, so its approvals row is written as before."""
    if plan is None:
        return {}
    return {
        "followups": plan.to_json(),
        "next_followup_at": next_followup_at(plan, now, expires_at, 0, 0),
    }


def insert_approval(
    t: Transactions,
    tx: WriteTx,
    row: dict[str, Any],
    req: CreateRequest,
    policy: Policy,
    now: int,
    body_hash: str,
    digest: str | None,
) -> None:
    """The approvals row with its budget context and follow-up plan, revision 1, then
    either a policy's decision and resolution (``gate.core.approvals.policy_tx``: no
    dispatch) or the dispatch; the ``created`` entry between them."""
    assert digest is not None  # the payload hash, computed before the transaction
    approval_id, expires_at = row["approval_id"], row["expires_at"]
    budget = budget_context(t, tx, req.pipeline, now, req.spend)
    tx.approvals.insert(
        {
            **row,
            "content_type": req.content_type,
            "quorum_required": policy.quorum,
            "budget": budget,
            "spend": req.spend,
            "revision": 1,
            "request_hash": body_hash,
            "allow_self_approval": int(policy.allow_self_approval),
            "approver_signature": policy.approver_signature,
            **followup_columns(policy.followups, now, expires_at),
        }
    )
    nonce = new_nonce()
    tx.approvals.insert_revision(approval_id, Revision(1, req.body, digest, nonce, now, None))
    decided = None  # a policy decides (no dispatch), or a person does
    if policy.verdict is not None or policy.remember_ms is not None:
        decided = policy_tx.verdict(tx, req, policy, digest, now, budget)
    if decided is None:
        tx.outbox.queue(DISPATCHES, (approval_id, 1), now)
    requester = row["requested_by_id"]
    created = CreatedData(
        pipeline=req.pipeline,
        step=req.step,
        revision=1,
        payload_hash=digest,
        quorum=policy.quorum,
        approvers=[op_id for op_id, _ in policy.scope],
        expires_at=expires_at,
        requested_by=requester,
        allow_self_approval=policy.allow_self_approval if requester is not None else None,
        approver_signature=None  # only a signed step's entry says so
        if policy.approver_signature == "off"
        else policy.approver_signature,
    )
    t.audit(tx, created.kind, approval_id, now, created.to_data())
    if decided is not None:
        policy_tx.apply(t, tx, approval_id, decided, nonce, digest, now)


APPROVALS: Kind[Approval, Resolvable] = Kind(
    name="approval",
    tables=TABLES,
    event="",
    already_resolved="the approval is already resolved",
    logger="gate.core.service",
    insert=insert_approval,
    target=resolvable,
    resolve=resolve,
    dispatches=DISPATCHES,
    dispatch_ack=DispatchAckData,
    notices_on=lambda config: config.relay.notice_target is not None,
    view=approval_view,
)
"""Approvals: a draft decided by a quorum of people (or a policy) with skip veto and adjust
(``gate.core.approvals.decide_tx``)."""
