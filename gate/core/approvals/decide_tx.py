"""The ``decide`` write transaction (SPEC §2 checks 6-14): refuse, or record the decision,
make the adjust's revision, and resolve at quorum or on a veto. Runs on the store's writer
with the state ``Transactions`` owns (``t``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gate.audit.entries import DecisionData
from gate.core.approvals import rules
from gate.core.approvals.approver_signature_check import Signed, check_approver_signature
from gate.core.approvals.delegation import check_decider
from gate.core.approvals.resolve_tx import Resolution, resolve
from gate.core.commands import Transaction
from gate.core.requests.lifecycle_tx import new_nonce, said_by
from gate.errors import Conflict
from gate.model import Approval, DecisionRow, Revision
from gate.protocol.canonical import payload_hash
from gate.protocol.envelope import Decision
from gate.store import WriteTx
from gate.store.outbox import DISPATCHES

if TYPE_CHECKING:
    from gate.config.webauthn import WebAuthnSettings
    from gate.core.transactions import Transactions


# ``decide``'s result: (operator id, revision decided, outcome or None, new revision or
# None, resolution or None, delegated)
Decided = tuple[int, int, str | None, int | None, Resolution | None, tuple[int, str, str] | None]


def decide(
    t: Transactions, tx: WriteTx, decision: Decision, webauthn: WebAuthnSettings | None = None
) -> Decided:
    """SPEC §2 checks 6-14 and the recording of an accepted decision. Returns
    ``(operator id, revision decided, outcome or None, new revision or None,
    resolution or None, delegated)``; ``delegated`` is ``(principal's operator id,
    pipeline, step)`` for a delegate's decision (check 11 with ``config.delegations``),
    else None. ``webauthn``: the passkeys' relying party (None:
    unavailable). Raises GateError with the SPEC §2 status and reason."""
    now = t.clock.now_ms()
    if tx.rate_events is not None:  # the backend keeps check 13's attempts: read its window
        decider_op = t.config.operator_by_identity(decision.approver_id)  # with the approval
        if decider_op is not None:
            t.rate.expect(decider_op.id, now, tx.rate_events)
    approval = tx.approvals.load(decision.approval_id, outbox=False, created_receipt=False)
    if approval is None:
        if tx.questions.load(decision.approval_id, outbox=False) is not None:
            message = "approve, skip and adjust are for approvals; a question takes decision answer"
            raise Conflict("wrong_kind", message)
        message = "no approval with this approval_id"
        raise rules.refuse(404, "unknown_approval", "unknown_approval", message)
    nonce_revision = next(
        (r.revision for r in approval.revisions if r.nonce == decision.nonce), None
    )
    if nonce_revision is None:
        raise rules.forbidden("nonce_mismatch", "nonce does not belong to this approval")
    rules.check_state(approval, nonce_revision, decision, now)
    rules.check_not_requester(approval, decision.approver_id)
    decider = check_decider(approval, decision.approver_id, t.config, now)
    operator_id = decider.operator_id
    # the approver's own signature, after check 11, before anything is recorded
    signed = check_approver_signature(
        tx, t.config, approval, decision, nonce_revision, operator_id, webauthn
    )
    rules.check_adjust_text(decision, t.config.relay.security.max_input_length)
    reason = rules.check_reason(
        decision,
        t.config.relay.security.max_input_length,
        rules.skip_reason_required(t.config, approval.pipeline, approval.step),
    )
    decision = dataclasses.replace(decision, reason=reason)  # blank: recorded as None
    t.rate.check(operator_id, now, tx.rate_events)
    rules.check_not_decided(approval, operator_id, decision)
    verdict = rules.verdict(approval, operator_id, decision)
    revision = approval.revision
    outcome, new_revision = _record(
        t, tx, approval, decision, verdict, now, decider.on_behalf_of, signed
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
    t: Transactions,
    tx: WriteTx,
    approval: Approval,
    decision: Decision,
    verdict: rules.Verdict,
    now: int,
    on_behalf_of: int | None = None,
    signed: Signed | None = None,
) -> tuple[str | None, int | None]:
    revision = approval.revision
    row = DecisionRow(
        revision=revision,
        operator_id=verdict.operator_id,
        decision=decision.decision,
        payload_hash=decision.payload_hash,
        adjust_text=decision.adjust_text,
        recorded_at=now,
        reason=decision.reason,
        on_behalf_of=on_behalf_of,
        credential_id=None if signed is None else signed.credential_id,
        **said_by(decision),
    )
    tx.approvals.insert_decision(approval.approval_id, row)
    approval = dataclasses.replace(approval, decisions=approval.decisions + (row,))
    audit_data = DecisionData.of(
        row,
        decision.nonce,
        verdict.effect,
        assertion=None if signed is None else signed.assertion,
        adjust_text_sha256=None if signed is None else signed.adjust_text_sha256,
        reason_sha256=None if signed is None else signed.reason_sha256,
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
        tx.approvals.insert_revision(approval.approval_id, added)
        tx.approvals.set_version(approval.approval_id, new_revision)
        approval = dataclasses.replace(
            approval, revision=new_revision, revisions=approval.revisions + (added,)
        )
        audit_data = dataclasses.replace(
            audit_data, new_revision=new_revision, new_payload_hash=added.payload_hash
        )
    t.audit(tx, audit_data.kind, approval.approval_id, now, audit_data.to_data())
    collected = rules.approvers_of(approval, approval.revision)
    outcome = rules.outcome_after(
        approval.quorum_required, len(collected), approval.revision, [verdict.effect]
    )
    if outcome is not None:
        resolve(t, tx, rules.resolvable(approval), outcome, now, collected, approval)
    elif new_revision is not None:
        tx.outbox.queue(DISPATCHES, (approval.approval_id, new_revision), now)
    return outcome, new_revision


@dataclasses.dataclass(frozen=True, slots=True)
class Decide(Transaction[Decided]):
    """Check and record a decision (``decide``), with the passkeys' relying party."""

    decision: Decision
    webauthn: WebAuthnSettings | None

    def run(self, t: Transactions, tx: WriteTx) -> Decided:
        return decide(t, tx, self.decision, self.webauthn)
