"""How an approval resolves (SPEC §2 "Quorum and outcomes"): the ``resolved`` audit entry,
the permit of an outcome that fires, the guarded state change and the resolution notice,
all in the caller's write transaction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gate.audit.entries import ResolvedData
from gate.audit.receipts import receipt_object
from gate.core.requests.lifecycle_tx import NOTICE_GIVE_UP_MS
from gate.errors import Conflict
from gate.model import Approval, Resolvable
from gate.store import WriteTx
from gate.store.outbox import FOLLOWUPS
from gate.trust import permit

if TYPE_CHECKING:
    from gate.core.transactions import Transactions


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


def resolve(
    t: Transactions,
    tx: WriteTx,
    target: Resolvable,
    outcome: str,
    now: int,
    approved_by: Sequence[int] = (),
    approval: Approval | None = None,
    notice: bool = True,
) -> None:
    """Resolve ``target`` as ``outcome`` at ``now`` with its ``resolved`` audit entry
    (``t.audit``, the writer's keys); ``approved_by`` are the operator ids it names, and
    an outcome that fires gets a permit (from the loaded ``approval``) on a gate with a
    signing key; ``notice`` False queues no resolution notice (a policy decided
    an approval the relay never saw). Raises Conflict ``already_resolved`` (rolling the job
    back) when the approval is no longer pending."""
    fires = outcome in permit.FIRING_OUTCOMES
    resolved = ResolvedData(
        outcome=outcome,
        revision=target.revision,
        payload_hash=target.payload_hash,
        approved_by=list(approved_by) if fires else [],
        quorum=target.quorum_required,
    )
    row = t.audit(tx, resolved.kind, target.approval_id, now, resolved.to_data())
    issued = None
    if fires and t.signer is not None:
        assert approval is not None  # only a decision fires
        claims = permit.claims_for(
            approval,
            outcome,
            approved_by,
            row.seq,
            row.entry_hash,
            now,
            t.config.receipts.permit_lifetime,
        )
        issued = permit.issue(t.signer, claims)
    # one UPDATE, guarded on state: when it finds the approval no longer pending, the
    # Conflict rolls this job back, the audit entry above included
    if not tx.approvals.resolve(target.approval_id, outcome, now, receipt_object(row), issued):
        raise Conflict("already_resolved", "approval was resolved concurrently")
    if notice and t.config.relay.notice_target is not None:  # in this transaction
        notice_row = (target.approval_id, "notice", 1, target.revision)
        tx.outbox.queue(FOLLOWUPS, notice_row, now, now + NOTICE_GIVE_UP_MS, once=True)
