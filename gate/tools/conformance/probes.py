"""``hitl-gate verify``'s approvals and gate probes (SPEC §6): the synthetic approvals the run
creates, and the probes that check the gate refuses a replay, a mutated payload hash and an
approver out of scope."""

from __future__ import annotations

from typing import Any

import aiohttp

from gate.core.requests import CreateRequest
from gate.core.service import GateService
from gate.model import Approval
from gate.protocol import PROTOCOL_HEADER, SIGNATURE_HEADER
from gate.protocol.envelope import decode_json
from gate.store.approvals import APPROVALS
from gate.tools.conformance.callbacks import resign
from gate.tools.conformance.checks import CheckResult, Observed, not_run, probe
from gate.tools.conformance.ephemeral import OUTSIDER, PIPELINE

DRAFT = (
    "hitl-gate conformance check — not a real request.\n"
    "Grüße, Zoë · 1.240,00 € · ✅\r\nPlease approve so the check can finish.\n"
)


async def create_approval(service: GateService, run_id: str) -> Approval:
    """A pending approval of the ephemeral gate's one step with ``DRAFT``, loaded whole
    (its revisions, nonces, hashes)."""
    view, _ = await service.create(
        CreateRequest(PIPELINE, "verify", run_id, "text/plain", DRAFT, None), None
    )
    full = await service.store.reads.fetch(APPROVALS, view["approval_id"])
    assert full is not None
    return full


async def gate_side(
    checks: list[CheckResult],
    service: GateService,
    session: aiohttp.ClientSession,
    secret: str,
    local_url: str,
    decision: Observed | None,
) -> None:
    """The gate-side checks: the relay's accepted ``decision`` replayed as received, then
    re-signed copies aimed at a second, pending approval with a mutated payload hash and with
    an approver out of scope; each must be refused with its reason (SPEC §6). Without an
    accepted decision they are reported not run."""
    names = ("gate.replay_refused", "gate.mutated_hash_refused", "gate.out_of_scope_refused")
    template: Any = None
    if decision is not None and decision.status == 200:
        try:
            template = decode_json(decision.raw)
        except Exception:  # noqa: BLE001 - an accepted decision always decodes
            template = None
    if decision is None or not isinstance(template, dict):
        checks.extend(
            not_run(
                name,
                "no accepted decision to use as a template",
                "make the relay's decision acceptable first (relay.decision_accepted)",
            )
            for name in names
        )
        return
    replay_headers = {
        k: v
        for k, v in decision.headers.items()
        if k in (SIGNATURE_HEADER.lower(), PROTOCOL_HEADER.lower(), "content-type")
    }
    checks.append(
        await probe(
            session,
            local_url,
            decision.raw,
            replay_headers,
            names[0],
            409,
            ("already_resolved", "duplicate"),
        )
    )
    target = await create_approval(service, "conformance-probe")
    rev = target.revisions[0]
    digest = rev.payload_hash
    mutated = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    raw, headers = resign(
        template,
        secret,
        {"approval_id": target.approval_id, "nonce": rev.nonce, "payload_hash": mutated},
    )
    checks.append(
        await probe(session, local_url, raw, headers, names[1], 403, ("payload_hash_mismatch",))
    )
    approver_obj = dict(template.get("approver") or {})
    approver_obj["id"] = OUTSIDER
    raw, headers = resign(
        template,
        secret,
        {
            "approval_id": target.approval_id,
            "nonce": rev.nonce,
            "payload_hash": digest,
            "approver": approver_obj,
        },
    )
    checks.append(
        await probe(session, local_url, raw, headers, names[2], 403, ("approver_not_allowed",))
    )
