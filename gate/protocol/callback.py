"""What arrives at ``/hitl/v0/decisions``: a decision (approve, skip, adjust) or a
question's answer. Decoded once, routed on ``decision == "answer"``. Pure."""

from __future__ import annotations

from gate.protocol.envelope import Decision, _invalid, decision_from_obj, decode_text_json
from gate.protocol.errors import ProtocolError
from gate.protocol.question import Answer, is_answer, parse_answer


def parse_callback(raw: bytes) -> Decision | Answer:
    """Parse a callback body (SPEC §2 check 5): an answer goes to
    ``question.parse_answer``, anything else to the decision parse, unchanged. An approve,
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
