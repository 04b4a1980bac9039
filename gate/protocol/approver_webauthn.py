"""Approver signatures: verify a WebAuthn (passkey) assertion with the ``webauthn``
package, every refusal mapped to a stable detail code. Pure: no I/O, no clock."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gate.protocol.approver_signature import ApproverAssertion, b64url, signature_invalid

if TYPE_CHECKING:
    from webauthn.helpers.structs import AuthenticatorData, CollectedClientData

# The ``webauthn`` package (and its ASN.1, CBOR and X.509 imports, ~0.17 s) is imported by the
# functions that verify, not with this module: a gate or CLI call that verifies no passkey
# never loads it.


def _client_data(raw: bytes) -> CollectedClientData:
    from webauthn.helpers import parse_client_data_json
    from webauthn.helpers.exceptions import WebAuthnException

    try:
        data = parse_client_data_json(raw)
    except (WebAuthnException, ValueError, TypeError):
        raise signature_invalid(
            "malformed", "client_data_json is not WebAuthn client data"
        ) from None
    if not isinstance(data.origin, str) or not isinstance(data.type, str):
        raise signature_invalid("malformed", "client_data_json type and origin must be strings")
    return data


def _authenticator_data(raw: bytes) -> AuthenticatorData:
    from webauthn.helpers import parse_authenticator_data
    from webauthn.helpers.exceptions import WebAuthnException

    try:
        return parse_authenticator_data(raw)
    except (WebAuthnException, ValueError, TypeError, IndexError):
        raise signature_invalid("malformed", "authenticator_data cannot be parsed") from None


def _check_unsigned_claims(
    assertion: ApproverAssertion, challenge: bytes, rp_id: str, origins: Sequence[str]
) -> None:
    """The checks before the signature, in order: type, challenge, origin, RP ID hash, UP, UV."""
    from webauthn.helpers.structs import ClientDataType, TokenBindingStatus

    client = _client_data(assertion.client_data_json)
    if client.type != ClientDataType.WEBAUTHN_GET:
        raise signature_invalid("wrong_type", "client data type is not webauthn.get")
    if not hmac.compare_digest(client.challenge, challenge):
        raise signature_invalid("challenge_mismatch", "the signed challenge is not this decision's")
    if client.origin not in origins:
        raise signature_invalid("origin_mismatch", "the assertion comes from an origin not allowed")
    binding = client.token_binding
    if binding is not None and binding.status not in (
        TokenBindingStatus.SUPPORTED,
        TokenBindingStatus.PRESENT,
    ):
        raise signature_invalid("malformed", "client data token binding status is not allowed")
    auth = _authenticator_data(assertion.authenticator_data)
    if not hmac.compare_digest(auth.rp_id_hash, hashlib.sha256(rp_id.encode("utf-8")).digest()):
        raise signature_invalid("rp_id_mismatch", "the assertion is for another relying party")
    if not auth.flags.up:
        raise signature_invalid("user_not_present", "the authenticator saw no user presence")
    if not auth.flags.uv:
        raise signature_invalid("user_not_verified", "the authenticator did not verify the user")


def verify_webauthn(
    credential_public_key: bytes,
    sign_count: int,
    assertion: ApproverAssertion,
    challenge: bytes,
    rp_id: str,
    origins: Sequence[str],
) -> int:
    """Verify a WebAuthn assertion over ``challenge`` (32 bytes, ``challenge_for``) and return
    the authenticator's new signature counter.

    ``credential_public_key`` is the COSE key as the ``webauthn`` package's registration
    returns it; ``sign_count`` the counter stored for the credential; ``rp_id`` the relying
    party id; ``origins`` the allowed origins (e.g. ``https://gate.example.com``). User
    presence and user verification are both required. The signature is checked by
    ``webauthn.verify_authentication_response``; the counter rule is applied after it, so only
    a genuinely signed assertion is reported as ``counter_went_backwards``: a new counter
    <= the stored one, when either is non-zero, means a cloned authenticator.

    Raises 403 ``approver_signature_invalid`` with detail ``wrong_type``, ``malformed``,
    ``challenge_mismatch``, ``origin_mismatch``, ``rp_id_mismatch``, ``user_not_present``,
    ``user_not_verified``, ``bad_signature`` or ``counter_went_backwards`` (first failing,
    in that order); ValueError for a stored key the package cannot use.
    """
    from webauthn import verify_authentication_response
    from webauthn.helpers import decode_credential_public_key, decoded_public_key_to_cryptography
    from webauthn.helpers.exceptions import InvalidAuthenticationResponse, WebAuthnException
    from webauthn.helpers.structs import AuthenticationCredential, AuthenticatorAssertionResponse

    try:
        decoded = decode_credential_public_key(credential_public_key)
        decoded_public_key_to_cryptography(decoded)
    except (WebAuthnException, ValueError, TypeError, KeyError, IndexError) as exc:
        raise ValueError("the stored credential public key is not a usable COSE key") from exc
    if assertion.type != "webauthn":
        raise signature_invalid("wrong_type", "the credential is a passkey (WebAuthn)")
    _check_unsigned_claims(assertion, challenge, rp_id, origins)
    credential = AuthenticationCredential(
        id=b64url(assertion.credential_id),
        raw_id=assertion.credential_id,
        response=AuthenticatorAssertionResponse(
            client_data_json=assertion.client_data_json,
            authenticator_data=assertion.authenticator_data,
            signature=assertion.signature,
            user_handle=assertion.user_handle,
        ),
    )
    try:
        verified = verify_authentication_response(
            credential=credential,
            expected_challenge=challenge,
            expected_rp_id=rp_id,
            expected_origin=list(origins),
            credential_public_key=credential_public_key,
            credential_current_sign_count=0,  # the counter rule is ours, after the signature
            require_user_verification=True,
        )
    except (InvalidAuthenticationResponse, WebAuthnException, ValueError):
        # every claim the package checks besides the signature passed above
        raise signature_invalid("bad_signature", "the passkey signature does not verify") from None
    new = verified.new_sign_count
    if (new > 0 or sign_count > 0) and new <= sign_count:
        raise signature_invalid(
            "counter_went_backwards",
            "the authenticator's counter did not increase: a cloned authenticator?",
        )
    return new


def assertion_sha256(assertion: ApproverAssertion) -> str | None:
    """The SHA-256 (lowercase hex) that identifies one batch assertion (a batch's one
    assertion decides each of its items), None for a single decision's: over
    ``authenticator_data`` (which holds the counter), ``client_data_json`` (the challenge)
    and ``signature``, each prefixed by its length as 4 big-endian bytes."""
    if assertion.batch is None:
        return None
    digest = hashlib.sha256()
    for part in (assertion.authenticator_data, assertion.client_data_json, assertion.signature):
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    return digest.hexdigest()


def counter_refused(
    assertion: ApproverAssertion,
    stored: int,
    new: int,
    counter_assertion: Callable[[], str | None],
) -> bool:
    """The counter rule, once the signature verified (True: refused, a cloned
    authenticator?): the authenticator's ``new`` counter must be above the ``stored`` one,
    or both zero (authenticators without a counter). One equal to the stored one is accepted
    only for the very batch assertion that set it: its ``assertion_sha256`` is
    ``counter_assertion()``, the hash stored with the counter (read only then; None: set by
    a single decision). The caller checked that this decision's digest is in the batch
    (``challenge_for``)."""
    if new > stored or new == stored == 0:
        return False
    held = assertion_sha256(assertion) if new == stored else None
    known = counter_assertion() if held is not None else None
    return held is None or known is None or not hmac.compare_digest(known, held)
