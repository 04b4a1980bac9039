"""Passkey registration done by the ``webauthn`` package: the creation options
an invite page hands the browser, and the verification of what the browser returns. Pure:
no I/O, no clock."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gate.protocol.approver_signature import b64url, unb64
from gate.protocol.errors import ProtocolError

# The ``webauthn`` package (~0.17 s to import) is imported by the two functions that use it,
# not with this module: a gate that registers no passkey never loads it.
TIMEOUT_MS = 300_000
ALGORITHMS = (-7, -8, -257)  # COSE: ECDSA_SHA_256, EDDSA, RSASSA_PKCS1_v1_5_SHA_256


def _algorithms() -> list[Any]:
    from webauthn.helpers.cose import COSEAlgorithmIdentifier

    return [COSEAlgorithmIdentifier(number) for number in ALGORITHMS]


@dataclass(frozen=True, slots=True)
class VerifiedPasskey:
    """A registration that verified: ``credential_id`` and ``public_key`` (the COSE key),
    both base64url unpadded; the authenticator's ``sign_count``; the client-data
    ``origin`` it was made on."""

    credential_id: str
    public_key: str
    sign_count: int
    origin: str


def creation_options(
    *,
    rp_id: str,
    rp_name: str,
    user_id: bytes,
    user_name: str,
    challenge: bytes,
    exclude: Sequence[bytes],
) -> dict[str, Any]:
    """The ``PublicKeyCredentialCreationOptions`` as JSON (binary parts base64url): ES256,
    EdDSA and RS256; user verification required, resident key preferred; attestation none;
    a 300 s timeout; ``exclude`` (raw credential ids) as ``excludeCredentials``."""
    from webauthn import generate_registration_options, options_to_json
    from webauthn.helpers.structs import (
        AttestationConveyancePreference,
        AuthenticatorSelectionCriteria,
        PublicKeyCredentialDescriptor,
        ResidentKeyRequirement,
        UserVerificationRequirement,
    )

    options = generate_registration_options(
        rp_id=rp_id,
        rp_name=rp_name,
        user_id=user_id,
        user_name=user_name,
        user_display_name=user_name,
        challenge=challenge,
        timeout=TIMEOUT_MS,
        attestation=AttestationConveyancePreference.NONE,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED,
            user_verification=UserVerificationRequirement.REQUIRED,
        ),
        exclude_credentials=[PublicKeyCredentialDescriptor(id=raw) for raw in exclude],
        supported_pub_key_algs=_algorithms(),
    )
    loaded: dict[str, Any] = json.loads(options_to_json(options))
    return loaded


REGISTRATION_REFUSED = "the passkey registration does not verify for this invite"


def registration_refused(message: str) -> ProtocolError:
    """400 ``invalid_registration``: the browser's answer did not verify (nothing stored)."""
    return ProtocolError(
        "invalid_registration", message, status=400, kind="invalid", extra={"message": message}
    )


def verify_passkey(
    credential: Any, challenge: bytes, rp_id: str, origins: Sequence[str]
) -> VerifiedPasskey:
    """Verify a registration (``PublicKeyCredential`` JSON, as ``enrol.js`` posts it) made
    over ``challenge`` for ``rp_id`` on one of ``origins``, user verification required.
    Raises 400 ``invalid_registration`` for anything that does not verify or parse, with
    one fixed message (``REGISTRATION_REFUSED``: never the library's text)."""
    from webauthn import verify_registration_response
    from webauthn.helpers import parse_client_data_json
    from webauthn.helpers.exceptions import InvalidRegistrationResponse, WebAuthnException

    if not isinstance(credential, dict):
        raise registration_refused("the body must be the credential as JSON")
    try:
        verified = verify_registration_response(
            credential=credential,
            expected_challenge=challenge,
            expected_rp_id=rp_id,
            expected_origin=list(origins),
            require_user_verification=True,
            supported_pub_key_algs=_algorithms(),
        )
        response = credential.get("response")
        assert isinstance(response, dict)
        client = parse_client_data_json(unb64(response["clientDataJSON"]))
    except (
        InvalidRegistrationResponse,
        WebAuthnException,
        ValueError,
        TypeError,
        KeyError,
        AssertionError,
    ):  # one fixed sentence: the library's text (e.g. "See __cause__ ...") is no answer
        raise registration_refused(REGISTRATION_REFUSED) from None
    return VerifiedPasskey(
        b64url(verified.credential_id),
        b64url(verified.credential_public_key),
        verified.sign_count,
        client.origin,
    )
