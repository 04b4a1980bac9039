"""The pipeline's create request (SPEC §3 POST /v1/approvals): parsing and validation."""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any

from gate.core.requests.fields import bad_field, has_control_characters, invalid, opened
from gate.protocol.canonical import canonical_json
from gate.protocol.envelope import is_unicode
from gate.protocol.whitespace import is_blank

# the largest ``spend`` accepted, in budget units: far above any real budget, and a day's sum
# of such values stays a finite float (sums of 1.7e308 overflowed to infinity, which no
# dispatch can carry as JSON)
MAX_SPEND = 1e15


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """A validated create request. ``spend`` is in ``budget.unit``; ``run_id`` may be None;
    ``requested_by`` is the identity of the operator asking (no self-approval), or None."""

    pipeline: str
    step: str
    run_id: str | None
    content_type: str
    body: str
    spend: float | None
    requested_by: str | None = None

    def request_hash(self) -> str:
        """Return the SHA-256 hex of this request's canonical JSON (Idempotency-Key comparison).

        ``requested_by`` counts only when given, so hashes of requests without it are
        unchanged from before the field existed.
        """
        fields = asdict(self)
        if fields["requested_by"] is None:
            del fields["requested_by"]
        return hashlib.sha256(canonical_json(fields)).hexdigest()

    def draft_bytes(self) -> int:
        """Return the draft body's size in bytes (UTF-8)."""
        return len(self.body.encode("utf-8"))


def spend_problem(spend: float) -> str | None:
    """What is wrong with a ``spend`` (in ``budget.unit``), or None when it is in bounds: a
    finite number >= 0 and <= ``MAX_SPEND``. The API (``parse_create``) answers with it;
    ``hitl-gate request --spend`` refuses the same values."""
    if math.isnan(spend) or spend < 0:
        return "must be a number >= 0"
    if spend > MAX_SPEND:  # infinity too: the float of a number too large to hold
        return f"is too large (at most {MAX_SPEND:g})"
    return None


def quorum_unreachable_message(requester: str, approvers_left: int, quorum: int) -> str:
    """The human line for 422 ``quorum_unreachable`` (the gate's error, and what ``hitl-gate
    request`` prints from the answer's ``requested_by``/``approvers_left``/``quorum_required``)."""
    noun = "approver remains" if approvers_left == 1 else "approvers remain"
    return (
        f"quorum {quorum} cannot be met without the requester {requester}: "
        f"{approvers_left} other {noun} in scope (a requester may not approve their own "
        "request unless the step sets allow_self_approval: true)"
    )


def check_draft(req: CreateRequest, allow_empty_draft: bool) -> None:
    """Refuse a draft whose body is empty or only Unicode White_Space, unless the step allows
    it (``allow_empty_draft``): a person would be shown nothing to approve. Raises GateError
    400 ``draft_empty`` with ``field`` ``draft.body`` (the body itself is never changed)."""
    if not allow_empty_draft and is_blank(req.body):
        what = "empty" if req.body == "" else "only white space"
        raise invalid("draft_empty", "draft.body", f"draft.body is {what}: nothing to approve")


def parse_create(obj: Any) -> CreateRequest:
    """Validate a decoded JSON create body; raises GateError 400 ``invalid_<field>``.

    Shape: ``{pipeline, step, run_id?, draft: {content_type?, body}, spend?, requested_by?}``;
    ``content_type`` defaults to ``text/plain``; ``requested_by`` is an operator identity
    (checked against the config by the service). Unknown fields are ignored.
    """
    obj, pipeline, step, run_id, requested_by = opened(obj)
    draft = obj.get("draft")
    if not isinstance(draft, dict):
        raise bad_field("draft", "draft must be an object with a body")
    body = draft.get("body")
    if not isinstance(body, str):
        raise bad_field("draft.body", "draft.body must be a string")
    if not is_unicode(body):
        raise bad_field("draft.body", "draft.body is not valid Unicode (lone surrogate)")
    content_type = draft.get("content_type", "text/plain")
    if content_type is None:
        content_type = "text/plain"
    if not isinstance(content_type, str) or not content_type.strip() or len(content_type) > 200:
        raise bad_field("draft.content_type", "draft.content_type must be a short non-empty string")
    if has_control_characters(content_type):
        # relays may put it in a header or a card: no CR/LF (header injection), no escapes
        raise bad_field(
            "draft.content_type", "draft.content_type must not contain control characters"
        )
    if not is_unicode(content_type):
        raise bad_field("draft.content_type", "draft.content_type is not valid Unicode")
    spend = obj.get("spend")
    if spend is not None:
        if isinstance(spend, bool) or not isinstance(spend, int | float):
            raise bad_field("spend", "spend must be a number >= 0")
        try:
            spend = float(spend)  # an integer literal of 309+ digits does not fit a float
        except OverflowError:
            raise bad_field("spend", "spend is too large") from None
        problem = spend_problem(spend)
        if problem is not None:
            raise bad_field("spend", f"spend {problem}")
    return CreateRequest(pipeline, step, run_id, content_type, body, spend, requested_by)
