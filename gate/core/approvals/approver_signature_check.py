"""The approver-signature check of a decision: a step's ``approver_signature``
(off | optional | required) against the decision's ``approver_assertion``, run inside the
``decide`` transaction after SPEC §2 check 11 (scope) and before anything is recorded.

Ed25519 credentials are verified with ``verify_ed25519``; passkeys with ``verify_webauthn``
against the relying party in force (``gate.config.webauthn.resolve_webauthn``), their new
signature counter stored in the same transaction. No I/O of its own: the credential is read
and written through the transaction it is given.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gate.config import Config
from gate.config.webauthn import WebAuthnSettings
from gate.core.approvals.rules import forbidden
from gate.model import Approval, Credential
from gate.protocol.approver_signature import (
    ApproverAssertion,
    challenge_for,
    decision_digest,
    parse_approver_assertion,
    sha256_hex,
    signature_invalid,
    unb64,
    verify_ed25519,
)
from gate.protocol.approver_webauthn import (
    assertion_sha256,
    counter_refused,
    verify_webauthn,
)
from gate.protocol.envelope import Decision
from gate.protocol.whitespace import is_blank

if TYPE_CHECKING:
    from gate.store import WriteTx

log = logging.getLogger(__name__)

# the parts of an assertion the audit entry keeps, as received (what re-verification needs)
_LOGGED_PARTS = (
    "type",
    "credential_id",
    "signature",
    "authenticator_data",
    "client_data_json",
    "user_handle",
    "batch",
)


@dataclass(frozen=True, slots=True)
class Signed:
    """A decision whose assertion verified: the ``credential_id`` that signed it and the
    ``assertion`` as logged (its known parts as received); ``adjust_text_sha256`` and
    ``reason_sha256`` the digest's text hashes the decision entry would not hold otherwise
    (an adjust's text; a reason sent blank, recorded as none), else None."""

    credential_id: str
    assertion: dict[str, Any]
    adjust_text_sha256: str | None = None
    reason_sha256: str | None = None


def step_mode(config: Config, approval: Approval) -> str:
    """The approval's ``approver_signature``: off | optional | required, as frozen when it
    was created (a reload changes it for new approvals only, like the scope); for one
    created before migration 7, the step's in the config in force (``off`` for a step no
    longer configured)."""
    if approval.approver_signature is not None:
        return approval.approver_signature
    found = config.find_step(approval.pipeline, approval.step)
    return "off" if found is None else found[1].approver_signature


def check_approver_signature(
    tx: WriteTx,
    config: Config,
    approval: Approval,
    decision: Decision,
    revision: int,
    operator_id: int,
    webauthn: WebAuthnSettings | None = None,
) -> Signed | None:
    """After SPEC §2 check 11: None when the step's mode is ``off`` (the field
    is ignored entirely) or the mode is ``optional`` and no assertion came; else the
    verified ``Signed``.

    ``revision`` is the revision the decision's nonce belongs to; ``operator_id`` the
    operator who actually decided (a delegate's own id, not the principal's); ``webauthn``
    the relying party passkeys are checked against (None: passkeys unavailable, a passkey's
    assertion is refused ``rp_unavailable``). The digest
    covers the texts as sent (``decision.reason`` before check 12 normalizes it). Raises
    400 ``invalid_approver_assertion`` for a malformed assertion, 403 ``forbidden`` with
    ``approver_signature_required`` (required, none sent) or ``approver_signature_invalid``
    and a ``detail``: ``unknown_credential``, ``revoked``, ``wrong_operator``,
    ``wrong_type``, ``not_in_batch``, ``bad_signature``, a passkey's
    ``verify_webauthn`` details, ``counter_regressed`` (a passkey whose counter did not
    increase: logged as ``event=approver_counter_regressed``) or ``rp_unavailable``.
    """
    mode = step_mode(config, approval)
    if mode == "off":
        return None
    assertion = parse_approver_assertion(decision.approver_assertion)
    if assertion is None:
        if mode == "required":
            message = "this step requires the approver's own signature (approver_assertion)"
            raise forbidden("approver_signature_required", message)
        return None
    credential_id = assertion.credential_id_b64
    credential = tx.credentials.load(credential_id)
    if credential is None:
        raise signature_invalid("unknown_credential", "no approver credential with this id")
    if credential.revoked_at is not None:
        raise signature_invalid("revoked", "this approver credential is revoked")
    if credential.operator_id != operator_id:
        raise signature_invalid(
            "wrong_operator", "this approver credential belongs to another operator"
        )
    digest = decision_digest(
        approval_id=approval.approval_id,
        revision=revision,
        nonce=decision.nonce,
        payload_hash=decision.payload_hash,
        decision=decision.decision,
        adjust_text=decision.adjust_text,
        reason=decision.reason,
    )
    challenge = challenge_for(assertion, digest)
    if credential.type == "webauthn":
        _check_passkey(tx, credential, assertion, challenge, webauthn)
    elif credential.type == "ed25519":
        verify_ed25519(unb64(credential.public_key), assertion, challenge)
    else:
        raise signature_invalid("wrong_type", f"unknown credential type {credential.type!r}")
    raw = decision.approver_assertion
    assert isinstance(raw, dict)
    logged = {part: raw[part] for part in _LOGGED_PARTS if raw.get(part) is not None}
    return Signed(credential_id, logged, *_unlogged_hashes(decision))


def _unlogged_hashes(decision: Decision) -> tuple[str | None, str | None]:
    """What the digest covered that the decision entry does not log as signed, for offline
    re-verification (``gate.audit.signature_checks``): the adjust text's SHA-256, and the
    reason's when it was sent blank (check 12 records it as none)."""
    text = decision.adjust_text if decision.decision == "adjust" else None
    reason = decision.reason if decision.reason is not None and is_blank(decision.reason) else None
    return (
        None if text is None else sha256_hex(text),
        None if reason is None else sha256_hex(reason),
    )


def _check_passkey(
    tx: WriteTx,
    credential: Credential,
    assertion: ApproverAssertion,
    challenge: bytes,
    webauthn: WebAuthnSettings | None,
) -> None:
    """Verify a passkey's assertion and store its new counter. The counter
    must increase unless both it and the stored one are zero (authenticators without a
    counter); a regression means a cloned authenticator: refused ``counter_regressed``.
    An equal counter is accepted for the very batch assertion that set it (its
    ``assertion_sha256`` stored with the counter, in this transaction), so one tap decides
    each item of a batch; anything else with that counter is still ``counter_regressed``."""
    if webauthn is None:
        raise signature_invalid(
            "rp_unavailable", "passkeys are unavailable: no relying party is configured"
        )
    # the stored counter is compared here, after the signature verified (detail name of
    # the contract: counter_regressed); the protocol layer is given 0 so it never refuses
    new = verify_webauthn(
        unb64(credential.public_key),
        0,
        assertion,
        challenge,
        webauthn.rp_id,
        webauthn.origins,
    )
    stored = credential.sign_count
    known = functools.partial(tx.credentials.counter_assertion, credential.credential_id)
    if counter_refused(assertion, stored, new, known):
        log.warning(
            "event=approver_counter_regressed credential_id=%s operator_id=%d",
            credential.credential_id,
            credential.operator_id,
        )
        raise signature_invalid(
            "counter_regressed",
            "the authenticator's signature counter did not increase: a cloned authenticator?",
        )
    if new != stored:
        tx.credentials.set_sign_count(credential.credential_id, new, assertion_sha256(assertion))
