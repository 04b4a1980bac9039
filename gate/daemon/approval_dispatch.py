"""The channel of ``outbox``: each pending approval's current revision POSTed to the relay's
URL as its dispatch envelope (``dispatch_envelope``), retried until the approval resolves;
drained by ``gate.daemon.delivery.OutboxSender``."""

from __future__ import annotations

import logging
from typing import Any

from gate.core.approvals.rules import approvers_of
from gate.core.requests.service import RequestService
from gate.daemon.delivery import RequestDispatch
from gate.model import Approval
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import build_dispatch
from gate.protocol.followup import FollowUp
from gate.store.outbox import DISPATCHES, DueDispatch

# its lines keep the logger they always had
log = logging.getLogger("gate.daemon.dispatch")


class ApprovalDispatch(RequestDispatch):
    """Approvals' dispatches for ``dispatcher`` (its relay URL, callback URL and metrics).
    None is sent for an approval resolved, revised, acked or expired since the plan was read:
    the expiry scheduler resolves it as timeout, and nothing is dispatched after."""

    table = DISPATCHES
    event = "dispatch"
    retry_in_log = True
    log = log

    def log_id(self, row: DueDispatch) -> str:
        return f"approval_id={row.request_id}"  # its revision only on the POST's lines

    def post_id(self, row: DueDispatch) -> str:
        return super().log_id(row)

    def url(self) -> str:
        return self.dispatcher.relay_url

    def envelope(self, full: Approval, version: int) -> bytes:
        return wire_json(self.dispatcher.envelope_for(full, version))

    def requests(self) -> RequestService[Any]:
        return self.dispatcher.service.approvals


def dispatch_envelope(
    full: Approval,
    revision: int,
    callback_url: str,
    skip_reason_required: bool = False,
    delegates: tuple[tuple[str, str], ...] = (),
    approver_signature: str = "off",
) -> dict[str, Any]:
    """Return the SPEC §2 dispatch envelope for ``revision`` of a loaded approval.

    With ``skip_reason_required`` (the step's ``skip_reason: required``) its skip
    action says so; ``delegates`` are the (delegate identity, principal identity) pairs in
    force (``gate.core.approvals.delegation.delegates_for``): the delegates join ``approvers``
    and the pairs go out as ``delegates``. With neither the envelope is byte-for-byte
    as before (``gate.protocol.followup.FollowUp``). ``approver_signature`` (the step's)
    other than ``off`` goes out as the additive ``"approver_signature"`` (optional
    | required), so a relay knows to have the approver sign; ``off`` adds nothing.
    """
    rev = next(r for r in full.revisions if r.revision == revision)
    envelope = build_dispatch(
        approval_id=full.approval_id,
        run_id=full.run_id,
        pipeline=full.pipeline,
        step=full.step,
        issued_at_ms=full.created_at,
        expires_at_ms=full.expires_at,
        risk=full.risk,
        quorum_required=full.quorum_required,
        quorum_collected=len(approvers_of(full, revision)),
        approvers=[identity for _, identity in full.scope],
        payload_hash=rev.payload_hash,
        content_type=full.content_type,
        body=rev.body,
        callback_url=callback_url,
        nonce=rev.nonce,
        revision=revision,
        budget=full.budget,
        followup=FollowUp(delegates=delegates, skip_reason_required=skip_reason_required),
        requested_by=full.requested_by,
    )
    if approver_signature != "off":
        envelope["approver_signature"] = approver_signature
    return envelope
