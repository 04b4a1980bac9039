"""A policy decides a new approval in its creation transaction: the rules'
verdict (``gate.core.approvals.policy``, evaluated before), else a remembered approval looked
up here; then the decision row, its ``decision`` entry (``by: policy:<rule id>``) and the resolution
through ``Transactions.resolve``, as any decision resolves (receipt, permit)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gate.audit.entries import POLICY_OPERATOR, DecisionData
from gate.config import Config
from gate.config.policy import HIGH_RISKS
from gate.core.approvals import policy as rules
from gate.core.approvals.create import CreateRequest
from gate.core.approvals.resolve_tx import resolve
from gate.core.approvals.rules import resolvable
from gate.model import DecisionRow
from gate.protocol.times import rfc3339
from gate.store import WriteTx

if TYPE_CHECKING:
    from gate.core.transactions import Policy, Transactions


def plan(config: Config, req: CreateRequest, policy: Policy) -> Policy:
    """``policy`` with what its step's rules decide on ``req`` (``verdict``) and its
    ``remember_approval`` window (``remember_ms``). The same object, untouched, for a step
    with neither (the creation path of policy-free steps costs nothing more)."""
    found = config.find_step(req.pipeline, req.step)
    if found is None:
        return policy
    step = found[1]
    if not step.policy and step.remember_approval is None:
        return policy
    facts = rules.Facts(req.content_type, req.body, req.spend)
    verdict = rules.evaluate(step.policy, facts, policy.risk, policy.quorum)
    window = step.remember_approval
    return dataclasses.replace(
        policy,
        verdict=verdict,
        remember_ms=None if window is None else int(window * 1000),
    )


def verdict(
    tx: WriteTx,
    req: CreateRequest,
    policy: Policy,
    digest: str,
    now: int,
    budget: Mapping[str, Any] | None = None,
) -> rules.Verdict | None:
    """The policy decision on a new approval, or None (a person decides): the rules'
    verdict, else a remembered approval (``WriteTx.remembered_approval`` within the window;
    a query only on a step with ``remember_approval``; the same ``spend``, its approvers all
    ``in_scope``). Enforced again here, whatever the config said: nothing approves a step of
    risk high/critical or with ``approver_signature: required`` (a policy cannot sign),
    nothing remembered approves a quorum > 1, and nothing approves a request whose
    ``spend`` takes the day's ``budget`` (the context ``Transactions`` sends the relay)
    over a cap: a person sees that."""
    found = policy.verdict
    if found is None and policy.remember_ms is not None:
        since = now - policy.remember_ms
        earlier = tx.approvals.remembered(
            req.pipeline, req.step, req.content_type, digest, since, req.spend
        )
        if earlier is not None and in_scope(earlier[1], policy.scope):
            found = rules.remembered(earlier[0], policy.risk, policy.quorum)
    if found is not None and found.decide == "approve":
        if policy.risk in HIGH_RISKS or policy.approver_signature == "required":
            return None
        if over_cap(budget):
            return None
    return found


def in_scope(approvers: tuple[int, ...], scope: tuple[tuple[int, str], ...]) -> bool:
    """May a remembered approval by ``approvers`` (operator ids) stand for a new request whose
    ``scope`` (allowed_users ∩ the step's approvers now, without the requester unless the
    step allows self-approval: SPEC check 11) is given? Only when every one of them is in
    it (review H2: an approver a reload removed; M1: the requester's own approval) and
    there is at least one."""
    allowed = {operator_id for operator_id, _ in scope}
    return bool(approvers) and all(operator_id in allowed for operator_id in approvers)


def over_cap(budget: Mapping[str, Any] | None) -> bool:
    """True when the request's spend (``this_request``) would take the day's spending over
    ``cap_today`` or the pipeline's over ``cap_pipeline`` (budget context: units of
    ``budget.unit``, SPEC §5 budget)."""
    if budget is None or budget.get("this_request") is None:
        return False
    spend = float(budget["this_request"])
    for spent, cap in (("spent_today", "cap_today"), ("spent_pipeline", "cap_pipeline")):
        if budget.get(cap) is not None and float(budget[spent]) + spend > float(budget[cap]):
            return True
    return False


def apply(
    t: Transactions,
    tx: WriteTx,
    approval_id: str,
    found: rules.Verdict,
    nonce: str,
    digest: str,
    now: int,
) -> None:
    """Record ``found`` on the new approval's revision 1 (``nonce``, ``digest``) as operator
    ``POLICY_OPERATOR`` named ``policy:<rule id>`` (channel ``policy``; a deny's reason as
    the skip's), log its ``decision`` entry and resolve ``approved``/``skipped`` at once
    (receipt, and a permit naming the policy on a gate with a signing key; no resolution
    notice: the relay never saw it)."""
    row = DecisionRow(
        revision=1,
        operator_id=POLICY_OPERATOR,
        identity=found.by,
        display=None,
        channel="policy",
        decision=found.decision,
        payload_hash=digest,
        adjust_text=None,
        decided_at=rfc3339(now),
        recorded_at=now,
        reason=found.reason,
    )
    tx.approvals.insert_decision(approval_id, row)
    entry = DecisionData.of(
        row,
        nonce,
        found.decision,
        by=found.by,
        rule=found.rule_id,
        remembered_from=found.remembered_from,
    )
    t.audit(tx, entry.kind, approval_id, now, entry.to_data())
    approval = tx.approvals.load(approval_id, outbox=False, created_receipt=False)
    assert approval is not None
    approved_by = (POLICY_OPERATOR,) if found.decide == "approve" else ()
    target = resolvable(approval)  # revision 1, hashing to ``digest``
    resolve(t, tx, target, found.outcome, now, approved_by, approval, notice=False)
