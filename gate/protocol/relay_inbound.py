"""What a relay checks of a signed POST from the gate (a dispatch or a resolution notice)
before it reads any field of it: the signature, its window, the JSON and the protocol; and the
subject a notice names. Shared by the reference relay and the inbox (one set of answers).
Pure: the caller reads the body whole and passes the clock in (``now``)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from gate.protocol import PROTOCOL, signing
from gate.protocol.canonical import canonical_json
from gate.protocol.envelope import decode_json, lone_surrogate_field
from gate.protocol.errors import ProtocolError

MAX_DISPATCH_BYTES = 4 * 1024 * 1024  # a 256 KiB draft, JSON-escaped, with room to spare
INVALID_PROTOCOL = "invalid_protocol"


def open_signed(
    header: str | None, raw: bytes, secrets: Sequence[str], now: float, max_skew: float
) -> dict[str, Any]:
    """The envelope a signed POST carries: ``header`` is the ``X-Draftcat-Signature`` value
    (None when absent), ``raw`` the whole body (bytes, as received), ``secrets`` the relay
    secrets (current first), ``now`` unix seconds, ``max_skew`` the window in seconds.

    Runs SPEC §2 checks 2-4 (``signing.verify``: 401 ``signature_missing``,
    ``signature_malformed``, ``timestamp_out_of_window``, ``signature_mismatch``), then
    decodes the body (``decode_json``: 400 ``invalid_json``, also when any key or string
    holds a lone surrogate such as ``\\ud800``: no UTF-8 text, it could not be hashed),
    then check 5's body part: a JSON object whose ``protocol`` is ``hitl/v0`` (400
    ``invalid_protocol``, answered ``{"status": "invalid", "reason": "invalid_protocol"}``).
    Raises ProtocolError with the first failing reason; returns the decoded object.
    """
    signing.verify(header, raw, secrets, now, max_skew)
    envelope = decode_json(raw)
    if lone_surrogate_field(envelope) is not None:
        raise ProtocolError(
            "invalid_json",
            "body is not valid JSON text: a string holds a lone surrogate",
            status=400,
            kind="invalid",
            extra={"field": "json"},  # as decode_json's own invalid_json
        )
    if not isinstance(envelope, dict) or envelope.get("protocol") != PROTOCOL:
        raise ProtocolError(
            INVALID_PROTOCOL, f"the body is no {PROTOCOL} object", status=400, kind="invalid"
        )
    return envelope


def is_notice(envelope: dict[str, Any]) -> bool:
    """Whether an opened envelope is a resolution notice (``type: "notice"``;
    docs/protocol.md "Notices"): never to be read or shown as a request."""
    return envelope.get("type") == "notice"


def notice_subject(notice: dict[str, Any]) -> tuple[str, str, str] | None:
    """``(key, subject, outcome)`` of a resolution notice (docs/protocol.md "Notices"): ``key``
    is ``question_id`` for a question's notice (``kind: "question"``), else
    ``approval_id``; ``subject`` its value and ``outcome`` the notice's, both strings. None
    when either is missing or no string: the relay answers 400 ``invalid_notice``."""
    key = "question_id" if notice.get("kind") == "question" else "approval_id"
    subject, outcome = notice.get(key), notice.get("outcome")
    if not isinstance(subject, str) or not isinstance(outcome, str):
        return None
    return key, subject, outcome


def question_request_hash(envelope: dict[str, Any]) -> str:
    """The ``request_hash`` a question dispatch's own fields give
    (docs/protocol.md "Questions"): ``"sha256:"`` + hex SHA-256 of the canonical JSON of
    ``{question_id, version, question}`` as received. A relay refuses the dispatch (400
    ``request_hash_mismatch``) when it differs from the dispatch's ``request_hash``: what it
    shows is then what the answer's echoed hash covers."""
    body = {
        "question_id": envelope.get("question_id"),
        "version": envelope.get("version"),
        "question": envelope.get("question"),
    }
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()
