"""Pure decision rules: SPEC §2 checks 8-12 and 14, no self-approval, and the quorum tally.
No I/O, no clock."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gate.config import Config
from gate.errors import GateError
from gate.model import Approval, Resolvable, Revision
from gate.protocol.envelope import Decision
from gate.protocol.whitespace import identity_key, is_blank

__all__ = ["identity_key"]  # the one comparison form of identities (gate.protocol.whitespace)


def refuse(status: int, kind: str, reason: str, message: str, **extra: Any) -> GateError:
    """Return a GateError for a refused decision with the SPEC §2 status/kind/reason."""
    return GateError(reason, message, status=status, kind=kind, extra=extra or None)


def forbidden(reason: str, message: str) -> GateError:
    """403 ``forbidden`` with the SPEC §2 ``reason`` (a check the decider or the envelope
    fails) and ``message``."""
    return refuse(403, "forbidden", reason, message)


def resolved_refusal(noun: str, outcome: str | None) -> GateError:
    """Check 8 for an approval (SPEC §2) or a question: 409 ``already_resolved`` naming its
    ``outcome``; ``noun`` is ``approval`` or ``question``."""
    message = f"the {noun} is resolved"
    return refuse(409, "already_resolved", "already_resolved", message, outcome=outcome)


def superseded(unit: str, nonce_version: int, current: int) -> GateError:
    """Check 9 for an approval (SPEC §2) or a question: 409 ``superseded``, the nonce being
    for ``unit`` (``revision``, ``version``) ``nonce_version``, not the ``current`` one."""
    message = f"nonce is for {unit} {nonce_version}; the current {unit} is {current}"
    return refuse(409, "superseded", "superseded", message)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an accepted decision does: the operator it counts for and its effect.

    ``effect`` is ``approve`` (counts on the current revision), ``skip`` (veto) or
    ``adjust`` (new revision with ``new_body``).
    """

    operator_id: int
    effect: str
    new_body: str | None = None


def check_state(approval: Approval, nonce_revision: int, decision: Decision, now_ms: int) -> None:
    """SPEC §2 checks 8, 9, 10 against a loaded approval (see ``Store.fetch_approval``).

    Raises 409 ``already_resolved`` (+ outcome), 410 ``expired`` (resolved as timeout or
    past ``expires_at`` on the gate's clock), 409 ``superseded``, 403 ``payload_hash_mismatch``.
    """
    if approval.state == "resolved":
        if approval.outcome == "timeout":
            raise refuse(410, "expired", "expired", "the approval expired before this decision")
        raise resolved_refusal("approval", approval.outcome)
    if now_ms >= approval.expires_at:
        raise refuse(410, "expired", "expired", "the approval is past its expires_at")
    if nonce_revision != approval.revision:
        raise superseded("revision", nonce_revision, approval.revision)
    if decision.payload_hash != current_revision(approval).payload_hash:
        message = "payload_hash does not match the current revision's hash"
        raise forbidden("payload_hash_mismatch", message)


def current_revision(approval: Approval) -> Revision:
    """Return the revision that is current on ``approval``; raises LookupError when its row
    is missing."""
    found = approval.revision_row(approval.revision)
    if found is None:
        raise LookupError(f"approval {approval.approval_id} has no current revision row")
    return found


def resolvable(approval: Approval) -> Resolvable:
    """What resolving ``approval`` needs (``gate.model.Resolvable``): its id, current revision
    with that revision's ``payload_hash``, and ``quorum_required``."""
    current = current_revision(approval)
    return Resolvable(
        approval.approval_id, current.revision, current.payload_hash, approval.quorum_required
    )


def check_not_requester(approval: Approval, identity: str) -> None:
    """No self-approval: refuse every decision by the operator named as ``requested_by``.

    Runs just before check 11 unless the step allowed self-approval when the approval was
    created. Raises 403 ``forbidden`` / ``self_approval``.
    """
    requester = approval.requested_by
    if not requester or approval.allow_self_approval:
        return
    if identity_key(identity) == identity_key(requester):
        raise forbidden(
            "self_approval", "the operator who requested this approval may not decide it"
        )


def check_approver(approval: Approval, identity: str) -> int:
    """SPEC §2 check 11: map the identity to an operator in the approval's frozen scope.

    The scope (allowed_users ∩ step approvers) was fixed when the approval was created.
    Returns the operator id; raises 403 ``approver_not_allowed``.
    """
    return operator_in_scope(approval.scope, identity)


def operator_in_scope(scope: Iterable[tuple[int, str]], identity: str) -> int:
    """Check 11 for an approval (SPEC §2) or a question: the operator id of
    ``identity`` in a frozen ``(operator id, identity)`` scope, matched trimmed and casefolded
    (``identity_key``). Raises 403 ``approver_not_allowed``."""
    key = identity_key(identity)
    for operator_id, scoped_identity in scope:
        if identity_key(scoped_identity) == key:
            return int(operator_id)
    raise forbidden("approver_not_allowed", "approver is not an operator in scope for this step")


def check_adjust_text(decision: Decision, max_input_length: int) -> None:
    """SPEC §2 check 12: adjust needs non-blank text (not only Unicode White_Space, as a
    draft: ``gate.protocol.whitespace``) of at most ``max_input_length`` characters."""
    if decision.decision != "adjust":
        return
    text = decision.adjust_text
    if text is None or is_blank(text):
        raise refuse(422, "invalid", "adjust_text_required", "adjust needs a non-blank adjust_text")
    if len(text) > max_input_length:
        raise too_long("adjust_text", max_input_length)


def too_long(field: str, limit: int) -> GateError:
    """Check 12's bound: 422 ``invalid`` / ``<field>_too_long`` for a ``field`` (adjust_text,
    reason) longer than ``limit`` characters."""
    message = f"{field} is longer than {limit} characters"
    return refuse(422, "invalid", f"{field}_too_long", message)


def skip_reason_required(config: Config, pipeline: str, step: str) -> bool:
    """Whether the step's config in force says ``skip_reason: required``. Read at
    the decision and at each dispatch, not frozen at creation (docs/design.md, "Reasons"); a
    step no longer configured requires none."""
    found = config.find_step(pipeline, step)
    return found is not None and found[1].skip_reason == "required"


def check_reason(decision: Decision, max_input_length: int, required: bool) -> str | None:
    """SPEC §2 check 12, after ``check_adjust_text``: return the decision's reason
    as it is recorded: None when absent or only Unicode White_Space (``is_blank``, the
    adjust_text rule), else the text as sent. Raises 422 ``invalid`` / ``reason_too_long``
    beyond ``max_input_length`` characters, and ``reason_required`` for a skip without one
    when ``required`` (the step's ``skip_reason: required``)."""
    reason = decision.reason
    if reason is not None and is_blank(reason):
        reason = None
    if reason is not None and len(reason) > max_input_length:
        raise too_long("reason", max_input_length)
    if reason is None and required and decision.decision == "skip":
        raise refuse(
            422, "invalid", "reason_required", "this step needs a non-blank reason on a skip"
        )
    return reason


def _prior(approval: Approval, operator_id: int) -> tuple[str, str | None] | None:
    """Return what ``operator_id`` already decided on the current revision, or None."""
    for row in approval.decisions:
        if row.revision == approval.revision and row.operator_id == operator_id:
            return row.decision, row.adjust_text
    if current_revision(approval).created_by == operator_id:
        return "approve", None  # their adjust counts as their approval of this revision
    return None


def check_not_decided(approval: Approval, operator_id: int, decision: Decision) -> None:
    """SPEC §2 check 14: 409 ``duplicate`` for the same decision again, else ``already_decided``."""
    prior = _prior(approval, operator_id)
    if prior is None:
        return
    if prior == (decision.decision, decision.adjust_text):
        raise refuse(409, "duplicate", "duplicate", "this decision was already recorded")
    raise refuse(
        409, "already_decided", "already_decided", "this approver already decided this revision"
    )


def verdict(approval: Approval, operator_id: int, decision: Decision) -> Verdict:
    """Return the effect of an accepted decision (an adjust to the same body is an approve)."""
    if decision.decision == "skip":
        return Verdict(operator_id, "skip")
    if decision.decision == "adjust":
        assert decision.adjust_text is not None
        if decision.adjust_text != current_revision(approval).body:
            return Verdict(operator_id, "adjust", decision.adjust_text)
    return Verdict(operator_id, "approve")


def approvers_of(approval: Approval, revision: int) -> list[int]:
    """Return the distinct operators whose approval counts on ``revision``, in order.

    Counted: ``approve`` decisions and same-body ``adjust`` decisions on the revision,
    plus the operator whose adjust created it (SPEC §2 "Quorum and outcomes").
    """
    out: list[int] = []
    rev_row = approval.revision_row(revision)
    if rev_row is not None and rev_row.created_by is not None:
        out.append(rev_row.created_by)
    for row in approval.decisions:
        if row.revision != revision or row.operator_id in out:
            continue
        if row.decision == "approve" or (
            row.decision == "adjust" and rev_row is not None and row.adjust_text == rev_row.body
        ):
            out.append(row.operator_id)
    return out


def outcome_after(
    quorum_required: int, collected: int, revision: int, effects: Sequence[str]
) -> str | None:
    """Return the outcome once a decision is counted, or None while quorum is not met.

    ``effects`` are the effects applied (``skip`` vetoes). Reaching quorum on revision 1
    is ``approved``; on an operator-edited revision it is ``adjusted``.
    """
    if "skip" in effects:
        return "skipped"
    if collected >= quorum_required:
        return "approved" if revision == 1 else "adjusted"
    return None
