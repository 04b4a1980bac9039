"""Settling the receipt key at start: go on with the audit log only with the key its newest
entry is receipted with, or after a declared rotation (docs/auditing.md section 5)."""

from __future__ import annotations

from gate.audit.entries import ReceiptKeyRotatedData
from gate.audit.spans import ROTATED, matches
from gate.config.model import ReceiptsConfig
from gate.errors import ConfigError, GateError
from gate.store import WriteTx
from gate.trust.keys import Signer

# what ``settle`` found: "empty", "current", "mismatch", "forged" or "rotated"
Settled = tuple[str, int, int | None]


def settle(
    tx: WriteTx,
    key: bytes,
    previous_key: bytes | None,
    receipts: ReceiptsConfig,
    now_ms: int,
    signer: Signer | None,
) -> Settled:
    """Return ``(outcome, seq, since)`` for the log in ``tx`` and the HMAC receipt ``key``
    (``previous_key``: the one before a declared rotation, or None); outcome "empty",
    "current" (the newest receipt verifies with ``key``), "mismatch" (with neither key),
    "forged" (with ``previous_key`` although the log went over to ``key`` at entry
    ``since``) or "rotated": one ``receipt_key_rotated`` entry appended at ``now_ms`` (unix
    ms), receipted with ``key`` and signed with ``signer`` (``seq``: that entry's)."""
    last = tx.last_audit_row()
    if last is None:
        return "empty", 0, None
    if matches(key, last.entry_hash, last.receipt):
        return "current", last.seq, None
    if previous_key is None or not matches(previous_key, last.entry_hash, last.receipt):
        return "mismatch", last.seq, None
    since = next(
        (
            seq
            for seq, digest, receipt in tx.audit_span_starts(ROTATED)
            if matches(key, digest, receipt)
        ),
        None,
    )
    if since is not None:
        return "forged", last.seq, since
    rotated = ReceiptKeyRotatedData(last.seq, receipts.key_env, receipts.previous_key_env)
    row = tx.append_audit(rotated.kind, None, now_ms, rotated.to_data(), key, signer)
    return "rotated", row.seq, None


def refusal(settled: Settled, receipts: ReceiptsConfig) -> GateError | None:
    """Return the error that stops the start for a ``settle`` outcome, or None: ConfigError
    (``receipts.key_env: ...``, nothing written) for "mismatch" (a typo is likelier than a
    rotation), GateError ``audit_tampered`` for "forged" (an entry forged with a retired
    key). Never names a key, only the variables holding them."""
    outcome, seq, since = settled
    if outcome == "mismatch" and receipts.previous_key_env is None:
        return ConfigError(
            [
                f"receipts.key_env: {receipts.key_env} does not verify the "
                f"newest audit entry's receipt (seq {seq}); a typo? To rotate "
                "the key, set receipts.previous_key_env to the variable "
                "holding the old key"
            ]
        )
    if outcome == "mismatch":
        return ConfigError(
            [
                f"receipts.key_env: neither {receipts.key_env} nor "
                f"receipts.previous_key_env ({receipts.previous_key_env}) "
                f"verifies the newest audit entry's receipt (seq {seq}); a "
                "typo? receipts.previous_key_env must hold the key the log "
                "was written with"
            ]
        )
    if outcome == "forged":
        return GateError(
            "audit_tampered",
            (
                f"receipts.previous_key_env: the newest audit entry (seq {seq}) is receipted "
                f"with {receipts.previous_key_env}'s key, but this log went over to "
                f"{receipts.key_env}'s key at entry {since}: an entry after that receipted "
                "with the retired key is forged; nothing was written (hitl-gate audit verify "
                "-c names it)"
            ),
        )
    return None
