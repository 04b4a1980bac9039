"""The answer envelope: a relay's ``decision: "answer"`` to a question (check 5), its
builder for relays and tests, and ``parse_callback``, which routes what arrives at
``/hitl/v0/decisions`` (decoded once) to it or to the decision parse. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gate.protocol import PROTOCOL
from gate.protocol.envelope import (
    Decision,
    _approver,
    _decided_at,
    _head,
    _invalid,
    _protocol,
    decision_from_obj,
    decode_text_json,
)
from gate.protocol.errors import ProtocolError
from gate.protocol.times import rfc3339

ANSWER = "answer"
"""The decision verb of an answer envelope."""
KIND = "question"
"""The ``kind`` of a question dispatch and of its answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    """An answer envelope that passed check 5 (shape only; nothing about state or type)."""

    question_id: str
    nonce: str
    request_hash: str
    value: Any
    approver_id: str
    approver_display: str | None
    approver_channel: str | None
    decided_at: str


def is_answer(obj: Mapping[str, Any]) -> bool:
    """True when a decoded callback body is an answer (``decision == "answer"``)."""
    return obj.get("decision") == ANSWER


def parse_answer(obj: Mapping[str, Any]) -> Answer:
    """Check 5 for an answer: ``protocol`` hitl/v0; ``kind`` absent or
    ``question``; required strings ``question_id``, ``nonce``, ``decision`` (``answer``),
    ``request_hash``, ``approver.id``, ``decided_at`` (RFC 3339); ``value`` present (typed at
    check 12). Unknown fields are ignored. An answer naming an ``approval_id`` but no
    ``question_id`` is 400 ``invalid_question_id`` (answers are for questions). Raises
    ProtocolError 400 ``invalid_<field>``.
    """
    body = dict(obj)
    _protocol(body)
    if body.get("kind", KIND) != KIND:
        raise _invalid("kind", f"kind must be {KIND!r} for an answer")
    if body.get("question_id") is None and body.get("approval_id") is not None:
        raise _invalid(
            "question_id",
            "an answer names a question_id; approvals take approve, skip or adjust",
        )
    question_id, nonce, _, hash_ = _head(body, "question_id", "request_hash", _answer_verb)
    if "value" not in body:
        raise _invalid("value", "value is required")
    approver_id, display, channel = _approver(body)
    decided_at = _decided_at(body)
    return Answer(
        question_id=question_id,
        nonce=nonce,
        request_hash=hash_,
        value=body["value"],
        approver_id=approver_id,
        approver_display=display,
        approver_channel=channel,
        decided_at=decided_at,
    )


def parse_callback(raw: bytes) -> Decision | Answer:
    """Parse a callback body (SPEC §2 check 5): an answer goes to ``parse_answer``,
    anything else to the decision parse, unchanged. An approve,
    skip or adjust naming a ``question_id`` but no ``approval_id`` is 400
    ``invalid_approval_id`` saying a question takes ``decision: answer``. Raises
    ProtocolError 400 ``invalid_<field>`` (``invalid_json`` for a body that is no object).
    """
    obj = decode_text_json(raw)
    if not isinstance(obj, dict):
        raise _invalid("json", "body must be a JSON object")
    if is_answer(obj):
        return parse_answer(obj)
    try:
        return decision_from_obj(obj)
    except ProtocolError as exc:
        if exc.code != "invalid_approval_id" or obj.get("approval_id") is not None:
            raise
        if obj.get("question_id") is None:
            raise
        raise _invalid(
            "approval_id",
            "approve, skip and adjust name an approval_id; a question takes decision answer",
        ) from None


def _answer_verb(decision: str) -> None:
    if decision != ANSWER:
        raise _invalid("decision", "decision must be answer")


def build_answer(
    *,
    question_id: str,
    nonce: str,
    request_hash: str,
    value: Any,
    approver_id: str,
    decided_at_ms: int,
    display: str | None = None,
    channel: str | None = None,
) -> dict[str, Any]:
    """Return an answer envelope as a dict; for relays and tests."""
    return {
        "protocol": PROTOCOL,
        "kind": KIND,
        "question_id": question_id,
        "nonce": nonce,
        "decision": ANSWER,
        "request_hash": request_hash,
        "value": value,
        "approver": {"id": approver_id, "display": display, "channel": channel},
        "decided_at": rfc3339(decided_at_ms),
    }
