"""``hitl-gate verify --approver-public-key``: checks of a relay that signs each
decision with the approver's Ed25519 key, and probes that the gate refuses such a signature
moved to another approval, one whose batch does not list the decision, and none at all.

The ephemeral gate's step is ``approver_signature: required`` and the key is enrolled for the
approver's operator through the gate's own enrolment (``Credentials.enrol``,
audited like ``hitl-gate approvers add-key``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from gate.core.service import GateService
from gate.protocol.approver_signature import FIELD
from gate.store.approvals import APPROVALS
from gate.tools.conformance.callbacks import Probe, Run, run_probes
from gate.tools.conformance.checks import CheckResult, Observed, failed, not_run, passed
from gate.tools.conformance.probes import create_approval

SIGNATURE_CHECKS = (
    "relay.decision_signed_by_approver",
    "gate.assertion_replay_refused",
    "gate.assertion_not_in_batch_refused",
    "gate.unsigned_decision_refused",
)
INVALID = ("approver_signature_invalid",)
SIGN_FIX = (
    "sign each decision with the approver's key: approver_assertion {type ed25519, "
    "credential_id, signature over the decision digest} (docs/protocol.md, Approver signatures)"
)


async def enrol_key(service: GateService, operator_id: int, public_key_pem: str) -> str:
    """Enrol ``public_key_pem`` (an Ed25519 public key PEM) for ``operator_id`` in the
    ephemeral gate; return its credential id. Raises GateError 400 for a key that is not
    Ed25519 PEM (the CLI checks it first)."""
    view = await service.credentials.enrol(
        {"operator_id": operator_id, "type": "ed25519", "public_key": public_key_pem}
    )
    return str(view["credential_id"])


async def check_signatures(
    run: Run, decision: Observed | None, credential_id: str
) -> list[CheckResult]:
    """The checks, in ``SIGNATURE_CHECKS`` order: the relay's ``decision`` carried an
    Ed25519 ``approver_assertion`` with the enrolled ``credential_id`` and was recorded with
    it; then, posted by verify with the relay secret to a fresh pending approval of ``run``'s
    ephemeral gate, that assertion as is (403 ``approver_signature_invalid``: it signs
    another decision), with a ``batch`` listing only another digest (403
    ``approver_signature_invalid``, not_in_batch) and without it (403
    ``approver_signature_required``). Without a decision, all not run."""
    template = decision.body() if decision is not None else None
    if decision is None or template is None:
        return [
            not_run(name, "no decision arrived", "fix relay.decision_received first")
            for name in SIGNATURE_CHECKS
        ]
    checks = [await _judge_signed(run.service, template, decision, credential_id)]
    sent = template.get(FIELD)
    if not checks[0].ok or not isinstance(sent, dict):
        checks.extend(
            not_run(name, "the relay's decision is not an accepted signed one", SIGN_FIX)
            for name in SIGNATURE_CHECKS[1:]
        )
        return checks
    target = await create_approval(run.service, "conformance-signature")
    rev = target.revisions[0]
    moved = {
        "approval_id": target.approval_id,
        "nonce": rev.nonce,
        "payload_hash": rev.payload_hash,
    }
    other = hashlib.sha256(b"hitl-gate verify: a decision that is not this one").hexdigest()
    probes: list[Probe] = [
        (SIGNATURE_CHECKS[1], {**moved}, (), 403, INVALID),
        (SIGNATURE_CHECKS[2], {**moved, FIELD: {**sent, "batch": [other]}}, (), 403, INVALID),
        (SIGNATURE_CHECKS[3], {**moved}, (FIELD,), 403, ("approver_signature_required",)),
    ]
    return checks + await run_probes(run, template, probes)


async def _judge_signed(
    service: GateService, template: dict[str, Any], decision: Observed, credential_id: str
) -> CheckResult:
    """``relay.decision_signed_by_approver``: an Ed25519 assertion naming the enrolled
    credential, answered 200 and recorded with that credential."""
    name = SIGNATURE_CHECKS[0]
    sent = template.get(FIELD)
    if not isinstance(sent, dict):
        return failed(name, f"the decision has no {FIELD}", SIGN_FIX)
    if sent.get("type") != "ed25519" or sent.get("credential_id") != credential_id:
        return failed(
            name,
            f"{FIELD} is type {sent.get('type')!r}, credential {sent.get('credential_id')!r}",
            f"sign with the key given as --approver-public-key (credential {credential_id})",
        )
    if decision.status != 200:
        reason = decision.answer.get("reason") if isinstance(decision.answer, dict) else None
        detail = decision.answer.get("detail") if isinstance(decision.answer, dict) else None
        return failed(
            name,
            f"the gate refused it: {decision.status} {reason} {detail or ''}".rstrip(),
            SIGN_FIX + "; the digest takes the dispatch's approval_id, revision, "
            "callback.nonce and payload_hash and the texts exactly as sent",
        )
    full = await service.store.reads.fetch(APPROVALS, str(template.get("approval_id")))
    recorded = [d.credential_id for d in full.decisions] if full is not None else []
    if credential_id not in recorded:
        return failed(name, "accepted, but recorded without its credential", "a gate bug")
    return passed(name, f"accepted and recorded with credential {credential_id}")
