"""Pure hitl/v0: signing, payload hash, envelopes, approver signatures. No I/O, no
clock reads (``now`` is an argument)."""

PROTOCOL = "hitl/v0"
SIGNATURE_HEADER = "X-Draftcat-Signature"
PROTOCOL_HEADER = "X-Hitl-Protocol"
DECISIONS_PATH = "/hitl/v0/decisions"
MAX_DECISION_BYTES = 64 * 1024
