"""The reference relay's approver key (``hitl-gate relay --approver-key``): an
Ed25519 private key that signs every decision the relay posts, as its ``approver_assertion``.

The relay is an untrusted peer: it loads the key with ``cryptography`` itself and builds the
digest with the pure protocol layer (docs/protocol.md "Approver signatures"), never the
gate's own key code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from gate.protocol.approver_signature import b64url, decision_digest, ed25519_credential_id
from gate.tools.reference_relay.state import revision_of

MAX_KEY_FILE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ApproverKey:
    """An approver's Ed25519 private key (never shown by ``repr``) and its credential id
    (``ed25519_credential_id`` of the raw public key: what the gate enrols it as)."""

    private_key: Ed25519PrivateKey = field(repr=False)
    credential_id: str

    @classmethod
    def load(cls, path: Path) -> ApproverKey:
        """Read an unencrypted Ed25519 private key PEM (``hitl-gate keygen --out DIR`` writes
        one: DIR/hitl-gate-ed25519.key). Raises ValueError with a one-line reason naming
        ``path`` when it cannot be read or is not such a key (a public key PEM is named as
        one: the new-user slip of giving the .pub). The file's mode is the caller's check
        (``hitl-gate relay`` refuses one others can read, as the gate does its own key)."""
        try:
            with path.open("rb") as handle:
                pem = handle.read(MAX_KEY_FILE_BYTES + 1)
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        if b"PUBLIC KEY-----" in pem and b"PRIVATE KEY-----" not in pem:
            raise ValueError(f"{path}: this is a public key: give the private .key file")
        try:
            key = load_pem_private_key(pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            raise ValueError(f"{path} is not an unencrypted private key in PEM") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} is not an Ed25519 private key")
        return cls(key, ed25519_credential_id(key.public_key().public_bytes_raw()))

    def assertion(
        self,
        envelope: dict[str, Any],
        verb: str,
        adjust_text: str | None,
        reason: str | None,
    ) -> dict[str, Any]:
        """The ``approver_assertion`` for one decision on the dispatch ``envelope``:
        ``{"type": "ed25519", "credential_id", "signature"}``, the signature
        over ``decision_digest`` of the dispatch's approval_id, revision (1 when absent),
        callback nonce and payload_hash with the ``verb`` and texts exactly as posted."""
        digest = decision_digest(
            approval_id=envelope["approval_id"],
            revision=revision_of(envelope),
            nonce=envelope["callback"]["nonce"],
            payload_hash=envelope["payload_hash"],
            decision=verb,
            adjust_text=adjust_text,
            reason=reason,
        )
        return {
            "type": "ed25519",
            "credential_id": self.credential_id,
            "signature": b64url(self.private_key.sign(digest)),
        }
