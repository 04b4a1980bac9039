"""The ``decisions signed`` rows of the decisions section: the same decision load
where every decision carries an Ed25519 ``approver_assertion`` on a step with
``approver_signature: required``, so the gate also looks the credential up and verifies the
signature. Measured in the same run and daemon as the unsigned rows, reported with their ratio.

One Ed25519 key per bench operator, enrolled through the admin API (``POST
/v1/admin/approvers`` with the admin token) as ``hitl-gate approvers add-key`` does; the
signatures are made before the clock starts, as the HMACs of the unsigned bodies are.
"""

from __future__ import annotations

import json
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bench.common import ADMIN_TOKEN, IDENTITIES, OPERATOR_IDS, HttpClient, decision_bytes
from gate.protocol.approver_signature import b64url, decision_digest, ed25519_credential_id

SIGNED_LEVELS = (16, 64)  # the concurrencies that get a signed row


class Keys:
    """One Ed25519 approver key per bench identity, with its credential id."""

    def __init__(self) -> None:
        self.by_identity: dict[str, tuple[Ed25519PrivateKey, str]] = {}
        for identity in IDENTITIES:
            key = Ed25519PrivateKey.generate()
            credential = ed25519_credential_id(key.public_key().public_bytes_raw())
            self.by_identity[identity] = (key, credential)

    def enrolments(self) -> list[dict[str, Any]]:
        """The ``POST /v1/admin/approvers`` bodies, one per operator."""
        out = []
        for operator_id, identity in zip(OPERATOR_IDS, IDENTITIES, strict=True):
            key, _ = self.by_identity[identity]
            pem = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            out.append(
                {"operator_id": operator_id, "type": "ed25519", "public_key": pem.decode("ascii")}
            )
        return out

    def decision(self, captured: dict[str, Any], identity: str) -> bytes:
        """The bytes of an approve by ``identity`` on a captured dispatch, signed by that
        identity's key over the decision digest (docs/protocol.md, Approver signatures)."""
        key, credential = self.by_identity[identity]
        digest = decision_digest(
            approval_id=captured["approval_id"],
            revision=captured["revision"],
            nonce=captured["nonce"],
            payload_hash=captured["payload_hash"],
            decision="approve",
        )
        body = json.loads(
            decision_bytes(
                captured["approval_id"], captured["nonce"], captured["payload_hash"], identity
            )
        )
        body["approver_assertion"] = {
            "type": "ed25519",
            "credential_id": credential,
            "signature": b64url(key.sign(digest)),
        }
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def enrol(api_url: str, keys: Keys) -> None:
    """Enrol every key through the gate's admin API (``POST /v1/admin/approvers``, the
    admin token). Raises RuntimeError when the gate does not answer 201."""
    client = HttpClient(api_url, ADMIN_TOKEN)
    try:
        for body in keys.enrolments():
            status, answer, _ = client.request("POST", "/v1/admin/approvers", body)
            if status != 201:
                raise RuntimeError(f"enrolment answered {status}: {answer}")
    finally:
        client.close()
