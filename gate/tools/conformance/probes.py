"""``hitl-gate verify``'s approvals and gate probes (SPEC §6): the synthetic approvals the run
creates, and the probes that check the gate refuses a replay, a mutated payload hash and an
approver out of scope."""

from __future__ import annotations

from typing import Any

from gate.core.approvals.create import CreateRequest
from gate.core.service import GateService
from gate.model import Approval
from gate.store.approvals import APPROVALS
from gate.tools.conformance.callbacks import Probe, Run, mutated, probe_gate
from gate.tools.conformance.checks import DECISION, CheckResult, Observed
from gate.tools.conformance.ephemeral import OUTSIDER, PIPELINE

MISMATCH = ("payload_hash_mismatch",)
DRAFT = (
    "hitl-gate conformance check — not a real request.\n"
    "Grüße, Zoë · 1.240,00 € · ✅\r\nPlease approve so the check can finish.\n"
)


async def create_approval(service: GateService, run_id: str) -> Approval:
    """A pending approval of the ephemeral gate's one step with ``DRAFT``, loaded whole
    (its revisions, nonces, hashes)."""
    view, _ = await service.approvals.create(
        CreateRequest(PIPELINE, "verify", run_id, "text/plain", DRAFT, None), None
    )
    full = await service.store.reads.fetch(APPROVALS, view["approval_id"])
    assert full is not None
    return full


async def gate_side(run: Run, decision: Observed | None) -> list[CheckResult]:
    """The gate-side checks, POSTed to ``run``'s gate: the relay's accepted ``decision``
    replayed as received, then re-signed copies aimed at a second, pending approval with a
    mutated payload hash and with an approver out of scope; each must be refused with its
    reason (SPEC §6). Without an accepted decision they are reported not run."""
    names = ("gate.replay_refused", "gate.mutated_hash_refused", "gate.out_of_scope_refused")

    async def aim(template: dict[str, Any]) -> list[Probe]:
        target = await create_approval(run.service, "conformance-probe")
        rev = target.revisions[0]
        aimed = {"approval_id": target.approval_id, "nonce": rev.nonce}
        outsider = {**(template.get("approver") or {}), "id": OUTSIDER}
        out_of_scope = {**aimed, "payload_hash": rev.payload_hash, "approver": outsider}
        return [
            (names[1], {**aimed, "payload_hash": mutated(rev.payload_hash)}, (), 403, MISMATCH),
            (names[2], out_of_scope, (), 403, ("approver_not_allowed",)),
        ]

    replayed = ("already_resolved", "duplicate")
    return await probe_gate(run, decision, DECISION, names, replayed, aim)
