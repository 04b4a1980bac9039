"""A software WebAuthn authenticator for HTTP-level tests: a P-256 key, ``none``
attestation, user present and verified, a signature counter that increases with every
assertion. It answers exactly what a browser's ``navigator.credentials.create`` / ``get``
would hand the page's script (base64url JSON), so tests post real registrations to the
gate's enrol page and real assertions to the inbox and the gate."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

FLAGS_CREATE = 0x45  # UP, UV, attested credential data
FLAGS_GET = 0x05  # UP, UV


def b64url(raw: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    """Decode base64url with or without padding."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SoftAuthenticator:
    """One passkey: ``register`` creates it (once), ``assert_`` signs challenges with it.
    ``credential_id`` is its base64url id once registered."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        numbers = self.key.public_key().public_numbers()
        self.cose = {1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32), -3: numbers.y.to_bytes(32)}
        self.raw_id = hashlib.sha256(cbor2.dumps(self.cose)).digest()[:16]
        self.credential_id = b64url(self.raw_id)
        self.counter = 0

    def register(self, challenge_b64: str, rp_id: str, origin: str) -> dict[str, Any]:
        """The ``PublicKeyCredential`` JSON of ``navigator.credentials.create`` for the
        enrol page's options (``challenge`` base64url, ``rp.id``) opened at ``origin``."""
        auth_data = (
            hashlib.sha256(rp_id.encode()).digest()
            + bytes([FLAGS_CREATE])
            + (0).to_bytes(4)
            + bytes(16)
            + len(self.raw_id).to_bytes(2)
            + self.raw_id
            + cbor2.dumps(self.cose)
        )
        client = {"type": "webauthn.create", "challenge": challenge_b64, "origin": origin}
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {
            "id": self.credential_id,
            "rawId": self.credential_id,
            "type": "public-key",
            "response": {
                "clientDataJSON": b64url(json.dumps(client).encode()),
                "attestationObject": b64url(attestation),
                "transports": ["internal"],
            },
            "clientExtensionResults": {},
        }

    def assert_(
        self,
        challenge_b64: str,
        rp_id: str,
        origin: str,
        user_handle: str | None = None,
        *,
        kind: str = "webauthn.get",
    ) -> dict[str, Any]:
        """The assertion dict the inbox's script posts: ``{type: "webauthn",
        credential_id, authenticator_data, client_data_json, signature, user_handle}``,
        signed over ``challenge_b64`` for ``rp_id`` at ``origin``; the counter goes up."""
        self.counter += 1
        auth_data = (
            hashlib.sha256(rp_id.encode()).digest() + bytes([FLAGS_GET]) + self.counter.to_bytes(4)
        )
        client = json.dumps(
            {"type": kind, "challenge": challenge_b64, "origin": origin, "crossOrigin": False}
        ).encode()
        signature = self.key.sign(
            auth_data + hashlib.sha256(client).digest(), ec.ECDSA(hashes.SHA256())
        )
        return {
            "type": "webauthn",
            "credential_id": self.credential_id,
            "authenticator_data": b64url(auth_data),
            "client_data_json": b64url(client),
            "signature": b64url(signature),
            "user_handle": user_handle,
        }
