"""Delegation (out of office): SPEC §2 check 11 with the config's
``delegations``, and the delegates a dispatch names. Pure: the config and the gate's time
(unix ms) are passed in; no I/O, no clock of its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gate.config import Config
from gate.config.followups import Delegation
from gate.core.approvals.rules import check_approver, forbidden
from gate.errors import GateError
from gate.model import Approval


@dataclass(frozen=True, slots=True)
class Decider:
    """Who an accepted decision counts for: the decider's own ``operator_id`` (the quorum
    counts distinct deciders) and ``on_behalf_of``, the principal's operator id when the
    decider is in only through a delegation (None when they decide as themselves)."""

    operator_id: int
    on_behalf_of: int | None = None


def in_force(delegations: Sequence[Delegation], now_ms: int) -> list[Delegation]:
    """The delegations whose ``until`` is still ahead of ``now_ms`` (the gate's clock, unix
    ms), in config order."""
    return [item for item in delegations if item.until_ms > now_ms]


def check_decider(approval: Approval, identity: str, config: Config, now_ms: int) -> Decider:
    """SPEC §2 check 11 with delegations, after ``rules.check_not_requester``.

    The identity in the approval's scope decides as themselves. Otherwise the operator it
    maps to (``config.operator_by_identity``, in ``allowed_users``) decides on behalf of the
    first operator in scope order with a delegation to them in force at ``now_ms``. Not
    transitive. Raises 403 ``approver_not_allowed`` as without delegations, and 403
    ``forbidden``/``self_approval`` (unless the approval allows self-approval) when a
    delegation the decider holds comes from the operator who requested the approval: a
    stand-in of the requester does not decide their request.
    """
    try:
        return Decider(check_approver(approval, identity))
    except GateError as exc:
        not_allowed = exc
    op = config.operator_by_identity(identity)
    if op is None or op.id not in config.relay.security.allowed_users:
        raise not_allowed
    held = [item for item in in_force(config.delegations, now_ms) if item.to == op.id]
    if not held:
        raise not_allowed
    requester = approval.requested_by_id
    if (
        requester is not None
        and not approval.allow_self_approval
        and any(item.from_ == requester for item in held)
    ):
        message = "a delegate of the operator who requested this approval may not decide it"
        raise forbidden("self_approval", message)
    principals = {item.from_ for item in held}
    for op_id, _ in approval.scope:
        if op_id in principals:
            return Decider(op.id, op_id)
    raise not_allowed


def delegates_for(approval: Approval, config: Config, now_ms: int) -> tuple[tuple[str, str], ...]:
    """The ``(delegate identity, principal identity)`` pairs a dispatch of ``approval`` names
    (``gate.protocol.followup.FollowUp.delegates``): one per delegate that ``check_decider``
    would let in at ``now_ms`` through a delegation, with the principal it would record.
    Delegates already in scope (they decide as themselves) and delegates refused as the
    requester or the requester's stand-in are not named. Empty with no delegation in force."""
    active = in_force(config.delegations, now_ms)
    if not active:
        return ()
    by_id = {op.id: op for op in config.relay.operators}
    in_scope = {op_id for op_id, _ in approval.scope}
    pairs: list[tuple[str, str]] = []
    for delegate_id in dict.fromkeys(item.to for item in active):
        op = by_id.get(delegate_id)
        if op is None or delegate_id in in_scope:
            continue
        try:
            decider = check_decider(approval, op.identity, config, now_ms)
        except GateError:
            continue
        if approval.requested_by_id == delegate_id and not approval.allow_self_approval:
            continue
        principal = next(
            identity for op_id, identity in approval.scope if op_id == decider.on_behalf_of
        )
        pairs.append((op.identity, principal))
    return tuple(pairs)
