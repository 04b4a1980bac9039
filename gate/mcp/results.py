"""What the MCP tools answer: an approval or a question as a small JSON object an
agent reads at a glance, the idempotency key derived from a call, and the argument a gate
refusal is about. Pure: no I/O, no clock."""

from __future__ import annotations

from typing import Any

from gate.sdk import Approval, Question

MAX_WAIT_S = 50
"""The longest a tool call blocks, in seconds: well under common MCP client tool timeouts
(60 s and more), so a human thinking never makes the host give up on the call."""
DEFAULT_WAIT_S = 45
ASK_AGAIN_AFTER_S = 1
"""A pending answer's ``ask_again_after_seconds``: get_approval/get_question long-poll on
their own (up to ``wait_seconds``), so asking again at once costs nothing."""

GRANTED = ("approved", "adjusted")

# the gate's reason code -> the tool argument it is about (its own ``field`` wins)
REASON_ARGUMENT = {
    "unknown_pipeline": "pipeline",
    "unknown_step": "step",
    "idempotency_key_reused": "idempotency_key",
    "draft_too_large": "draft",
    "question_too_large": "text",
}
# the gate's field (a JSON path of the request body) -> the tool argument
FIELD_ARGUMENT = {
    "draft.body": "draft",
    "draft.content_type": "content_type",
    "draft": "draft",
    "body": "draft",
}


def approval_result(approval: Approval) -> dict[str, Any]:
    """The answer of request_approval/get_approval/cancel_approval.

    Resolved: ``{approval_id, state: "resolved", outcome, allowed, body, content_type,
    payload_hash, reason, decided_by, receipt, permit}`` where ``allowed`` is true only for
    approved/adjusted and ``body`` (the final body; on adjust the edited text, the one to act
    on) is set only then. Pending: ``{approval_id, state: "pending", outcome: null, allowed:
    false, ask_again_after_seconds}``: "not yet", never "yes"."""
    if approval.state != "resolved":
        return _pending("approval_id", approval.id, allowed=False)
    allowed = approval.outcome in GRANTED
    return {
        "approval_id": approval.id,
        "state": "resolved",
        "outcome": approval.outcome,
        "allowed": allowed,
        "body": approval.body if allowed else None,
        "content_type": approval.content_type,
        "payload_hash": approval.payload_hash,
        "reason": approval.reason,
        "decided_by": list(approval.decided_by),
        "receipt": approval.receipt,
        "permit": approval.permit,
    }


def question_result(question: Question) -> dict[str, Any]:
    """The answer of ask_human/get_question: resolved ``{question_id, state: "resolved",
    outcome, answer, answered_by, receipt}`` (``answer`` a string, a list or an object by the
    response type; null unless ``outcome`` is ``answered``), or pending ``{question_id,
    state: "pending", outcome: null, ask_again_after_seconds}``."""
    if question.state != "resolved":
        return _pending("question_id", question.id)
    answered = question.outcome == "answered"
    return {
        "question_id": question.id,
        "state": "resolved",
        "outcome": question.outcome,
        "answer": question.answer if answered else None,
        "answered_by": question.answered_by if answered else None,
        "receipt": question.receipt,
    }


def _pending(id_key: str, item_id: str, **extra: Any) -> dict[str, Any]:
    """A pending answer of either kind: "not yet", with ``extra`` before the advice to ask
    again after ``ASK_AGAIN_AFTER_S``."""
    return {
        id_key: item_id,
        "state": "pending",
        "outcome": None,
        **extra,
        "ask_again_after_seconds": ASK_AGAIN_AFTER_S,
    }


def pending_summary(item: Approval | Question) -> dict[str, Any]:
    """One item of list_pending: its ``kind`` (``approval``, ``question``), id, where it
    waits, what tells items of that kind apart (an approval's ``payload_hash``, never the
    draft; a question's ``response_type``, the kind of answer it takes, never its text) and
    its expiry."""
    if isinstance(item, Approval):
        kind, key, value = "approval", "payload_hash", item.payload_hash
    else:
        kind, key, value = "question", "response_type", item.response_type
    return {
        "kind": kind,
        f"{kind}_id": item.id,
        "pipeline": item.pipeline,
        "step": item.step,
        "run_id": item.run_id,
        key: value,
        "expires_at": item.raw.get("expires_at"),
    }


def refused_argument(reason: str, field: str | None, default: str) -> str:
    """The tool argument a gate refusal (``reason``, ``field``) is about, ``default`` when the
    gate names none this tool has."""
    if field:
        return FIELD_ARGUMENT.get(field, field.split(".")[0])
    return REASON_ARGUMENT.get(reason, default)


# a refusal that is no argument's fault, or whose gate message names a CLI command
TOKEN_REFUSED = (
    "the gate refused this MCP server's token (HTTP {status}): not an argument's fault; "
    "the operator must set the token hitl-gate mcp uses (api.token_env)"
)
WRONG_KIND = {
    "step_is_question": "step: this step asks a question: use the ask_human tool",
    "step_is_approval": "step: this step is an approval step: use the request_approval tool",
}


def refusal_text(status: int, reason: str) -> str | None:
    """The tool error for a gate refusal that no argument name explains:
    401/403 (this server's gate token is refused) or a step of the other kind (the gate's
    message names ``hitl-gate ask``; an agent needs the tool's name); None otherwise."""
    if status in (401, 403):
        return TOKEN_REFUSED.format(status=status)
    return WRONG_KIND.get(reason)
