"""The pipeline's create request (SPEC §3 POST /v1/approvals): parsing and validation."""

from __future__ import annotations

import difflib
import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gate.errors import GateError, refused
from gate.protocol.canonical import canonical_json
from gate.protocol.display import marked
from gate.protocol.envelope import is_unicode
from gate.protocol.whitespace import is_blank

MAX_NAME_CHARS = 200
# the largest ``spend`` accepted, in budget units: far above any real budget, and a day's sum
# of such values stays a finite float (sums of 1.7e308 overflowed to infinity, which no
# dispatch can carry as JSON)
MAX_SPEND = 1e15
# the longest Idempotency-Key accepted, in characters (docs/openapi.yaml IdempotencyKey)
MAX_IDEMPOTENCY_KEY_CHARS = 200


def _bad(field: str, message: str) -> GateError:
    return GateError(
        f"invalid_{field}", message, status=400, kind="invalid", extra={"field": field}
    )


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


def has_control_characters(text: str) -> bool:
    """True when ``text`` holds a C0 control character (U+0000-U+001F) or DEL (U+007F):
    text a relay may put in a header or a card (CR/LF would inject a header)."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)


def idempotency_key_fits(key: str) -> bool:
    """The shape every ``Idempotency-Key`` must have (SPEC §3, docs/openapi.yaml): 1 to
    ``MAX_IDEMPOTENCY_KEY_CHARS`` characters, not blank (not only White_Space). ``hitl-gate
    request --idempotency-key`` applies it too, and also refuses control characters."""
    return not is_blank(key) and len(key) <= MAX_IDEMPOTENCY_KEY_CHARS


def check_idempotency_key(key: str | None) -> str | None:
    """Return the API's ``Idempotency-Key`` header (None when absent) once it fits
    (``idempotency_key_fits``) and is valid UTF-8 (aiohttp keeps header bytes that are not
    UTF-8 as lone surrogates, which SQLite cannot bind). Raises GateError 400
    ``invalid_idempotency_key`` (field ``idempotency_key``)."""
    if key is not None and not (idempotency_key_fits(key) and is_unicode(key)):
        raise _bad(
            "idempotency_key",
            f"Idempotency-Key must be 1-{MAX_IDEMPOTENCY_KEY_CHARS} UTF-8 characters",
        )
    return key


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


def not_an_operator(given: str, operators: Sequence[tuple[int, str]]) -> GateError:
    """400 ``invalid_requested_by`` for a ``requested_by`` that names none of ``operators``
    (``(id, identity)`` pairs), echoing ``given`` (``_echoed``) and saying what it must be:
    for an operator's numeric id, that operator's identity; else the configured identity
    closest to ``given`` (a typo, or the part before ``@``) when one is close, else the
    first identity as an example."""
    identities = [identity for _, identity in operators]
    by_id = {str(op_id): identity for op_id, identity in operators}
    key = given.strip().casefold()
    if key in by_id:
        message = (
            f"{key} is an operator id; requested_by takes the operator's identity: {by_id[key]}"
        )
        return refused("invalid_requested_by", "requested_by", message)
    folded = {identity.casefold(): identity for identity in identities}
    local = {identity.casefold().split("@")[0]: identity for identity in identities}
    close = difflib.get_close_matches(key, folded, n=1, cutoff=0.85)
    near = folded[close[0]] if close else None
    if near is None:
        close = difflib.get_close_matches(key, local, n=1, cutoff=0.85)
        near = local[close[0]] if close else None
    said = f'requested_by "{_echoed(given, identities)}" is not the identity of an operator'
    said += " in relay.operators"
    message = f"{said}; did you mean {near}?" if near else f"{said}, e.g. {identities[0]}"
    return refused("invalid_requested_by", "requested_by", message)


def _echoed(given: str, identities: Sequence[str]) -> str:
    """``given`` (an identity that matched none of ``identities``) as an error message echoes
    it: on one line, each hidden character and each non-ASCII one that no configured identity
    has (a Cyrillic ``о`` in a Latin address) shown as ``<U+XXXX>``."""
    known = {c for identity in identities for c in identity}
    suspect = {c for c in given if not c.isascii() and c not in known}
    return marked(given, keep="", suspect=suspect)


def check_draft(req: CreateRequest, allow_empty_draft: bool) -> None:
    """Refuse a draft whose body is empty or only Unicode White_Space, unless the step allows
    it (``allow_empty_draft``): a person would be shown nothing to approve. Raises GateError
    400 ``draft_empty`` with ``field`` ``draft.body`` (the body itself is never changed)."""
    if not allow_empty_draft and is_blank(req.body):
        what = "empty" if req.body == "" else "only white space"
        raise GateError(
            "draft_empty",
            f"draft.body is {what}: nothing to approve",
            status=400,
            kind="invalid",
            extra={"field": "draft.body"},
        )


def _name(obj: dict[str, Any], key: str, *, required: bool) -> str | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise _bad(key, f"{key} is required")
        return None
    if not isinstance(value, str) or is_blank(value):
        raise _bad(key, f"{key} must be a non-empty string")
    if len(value) > MAX_NAME_CHARS:
        raise _bad(key, f"{key} is longer than {MAX_NAME_CHARS} characters")
    if not is_unicode(value):
        raise _bad(key, f"{key} is not valid Unicode (lone surrogate)")
    return value


def parse_create(obj: Any) -> CreateRequest:
    """Validate a decoded JSON create body; raises GateError 400 ``invalid_<field>``.

    Shape: ``{pipeline, step, run_id?, draft: {content_type?, body}, spend?, requested_by?}``;
    ``content_type`` defaults to ``text/plain``; ``requested_by`` is an operator identity
    (checked against the config by the service). Unknown fields are ignored.
    """
    if not isinstance(obj, dict):
        raise _bad("json", "body must be a JSON object")
    pipeline = _name(obj, "pipeline", required=True)
    step = _name(obj, "step", required=True)
    run_id = _name(obj, "run_id", required=False)
    requested_by = _name(obj, "requested_by", required=False)
    draft = obj.get("draft")
    if not isinstance(draft, dict):
        raise _bad("draft", "draft must be an object with a body")
    body = draft.get("body")
    if not isinstance(body, str):
        raise _bad("draft.body", "draft.body must be a string")
    if not is_unicode(body):
        raise _bad("draft.body", "draft.body is not valid Unicode (lone surrogate)")
    content_type = draft.get("content_type", "text/plain")
    if content_type is None:
        content_type = "text/plain"
    if not isinstance(content_type, str) or not content_type.strip() or len(content_type) > 200:
        raise _bad("draft.content_type", "draft.content_type must be a short non-empty string")
    if has_control_characters(content_type):
        # relays may put it in a header or a card: no CR/LF (header injection), no escapes
        raise _bad("draft.content_type", "draft.content_type must not contain control characters")
    if not is_unicode(content_type):
        raise _bad("draft.content_type", "draft.content_type is not valid Unicode")
    spend = obj.get("spend")
    if spend is not None:
        if isinstance(spend, bool) or not isinstance(spend, int | float):
            raise _bad("spend", "spend must be a number >= 0")
        try:
            spend = float(spend)  # an integer literal of 309+ digits does not fit a float
        except OverflowError:
            raise _bad("spend", "spend is too large") from None
        problem = spend_problem(spend)
        if problem is not None:
            raise _bad("spend", f"spend {problem}")
    assert pipeline is not None and step is not None
    return CreateRequest(pipeline, step, run_id, content_type, body, spend, requested_by)
