"""The questions on the wire: the normalized question, its request hash, the dispatch
and the typing of an answer's value (check 12). Pure.

The form schema lives in ``gate.protocol.form_schema``, form values in
``gate.protocol.form_value``, the answer envelope in ``gate.protocol.answer``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate.protocol import PROTOCOL
from gate.protocol.answer import ANSWER, KIND
from gate.protocol.canonical import HASH_PREFIX, canonical_json, wire_json
from gate.protocol.envelope import is_unicode, routing
from gate.protocol.errors import field_refused
from gate.protocol.form_schema import check_labels, parse_schema
from gate.protocol.form_value import check_form_value, value_error
from gate.protocol.whitespace import is_blank

RESPONSE_TYPES = ("free_text", "single_choice", "multi_choice", "form")
MAX_REASON_CHARS = 2000
"""A question's ``reason`` (why the agent asks) is at most this many characters."""
MAX_OPTION_CHARS = 200
"""Each option of a single or multi choice is at most this many characters."""
_CHOICES = ("single_choice", "multi_choice")


@dataclass(frozen=True, slots=True)
class QuestionSpec:
    """The normalized question, exactly as dispatched and hashed.

    ``options`` is set for single/multi choice only, ``schema`` (from
    ``form_schema.parse_schema``) for a form only; ``reason`` is None when not given.
    """

    text: str
    response_type: str
    reason: str | None = None
    options: tuple[str, ...] | None = None
    schema: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """The question object of the dispatch: optional keys left out, never null."""
        out: dict[str, Any] = {"text": self.text}
        if self.reason is not None:
            out["reason"] = self.reason
        out["response_type"] = self.response_type
        if self.options is not None:
            out["options"] = list(self.options)
        if self.schema is not None:
            out["schema"] = self.schema
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> QuestionSpec:
        """Rebuild from ``to_json``'s output (e.g. the stored canonical JSON); trusted, not
        validated again."""
        options = obj.get("options")
        return cls(
            text=obj["text"],
            response_type=obj["response_type"],
            reason=obj.get("reason"),
            options=tuple(options) if options is not None else None,
            schema=obj.get("schema"),
        )


def _options(value: Any, path: str, max_options: int) -> tuple[str, ...]:
    refuse = functools.partial(field_refused, "invalid_options")
    check_labels(value, path, MAX_OPTION_CHARS, max_options, refuse=refuse, entries="options")
    return tuple(value)


def parse_question(
    obj: Mapping[str, Any],
    *,
    max_text_chars: int,
    max_options: int,
    prefix: str = "",
    max_answer_chars: int | None = None,
) -> QuestionSpec:
    """Validate the question fields of a create or revise body:
    ``text`` (non-blank string, at most ``max_text_chars`` characters, else 413
    ``question_too_large``), ``reason`` (optional string, at most MAX_REASON_CHARS; only
    White_Space is no reason: left out),
    ``response_type`` (one of RESPONSE_TYPES), ``options`` (required for single/multi choice:
    distinct non-blank strings, at most ``max_options``; refused otherwise), ``schema``
    (required for a form, refused otherwise; see ``form_schema.parse_schema``; with the
    step's ``max_answer_chars`` a string field no answer could fill is refused).
    Raises ProtocolError 400 ``invalid_<field>`` with ``field`` = the JSON path, prefixed by
    ``prefix`` (e.g. ``"question."``). The gate checks the byte size of ``text`` itself.
    """
    text = obj.get("text")
    at = prefix + "text"
    if not isinstance(text, str) or not is_unicode(text):
        raise field_refused("invalid_text", at, f"{at} must be a string")
    if is_blank(text):
        raise field_refused("invalid_text", at, f"{at} must not be blank")
    if len(text) > max_text_chars:
        message = f"{at} is longer than {max_text_chars} characters"
        raise field_refused("question_too_large", at, message, status=413)
    reason = obj.get("reason")
    at = prefix + "reason"
    if reason is not None:
        if not isinstance(reason, str) or not is_unicode(reason):
            raise field_refused("invalid_reason", at, f"{at} must be a string")
        if len(reason) > MAX_REASON_CHARS:
            raise field_refused(
                "invalid_reason", at, f"{at} is longer than {MAX_REASON_CHARS} characters"
            )
        if is_blank(reason):  # only White_Space: no reason, like a decision's (B4)
            reason = None
    kind = obj.get("response_type")
    at = prefix + "response_type"
    if kind not in RESPONSE_TYPES:
        raise field_refused(
            "invalid_response_type", at, f"{at} must be one of {', '.join(RESPONSE_TYPES)}"
        )
    options, at = obj.get("options"), prefix + "options"
    if kind in _CHOICES and options is None:
        raise field_refused("invalid_options", at, f"{at} is required for {kind}")
    if kind not in _CHOICES and options is not None:
        raise field_refused(
            "invalid_options", at, f"{at} is only for single_choice and multi_choice"
        )
    schema, at = obj.get("schema"), prefix + "schema"
    if kind == "form" and schema is None:
        raise field_refused("invalid_schema", at, f"{at} is required for form")
    if kind != "form" and schema is not None:
        raise field_refused("invalid_schema", at, f"{at} is only for form")
    return QuestionSpec(
        text=text,
        response_type=str(kind),
        reason=reason,
        options=_options(options, prefix + "options", max_options) if kind in _CHOICES else None,
        schema=(
            parse_schema(
                schema, max_options=max_options, path=at, max_answer_chars=max_answer_chars
            )
            if kind == "form"
            else None
        ),
    )


def request_hash(question_id: str, version: int, spec: QuestionSpec) -> str:
    """``"sha256:" + hex(SHA-256(canonical_json({"question_id", "version", "question"})))``
    with ``question`` = ``spec.to_json()``. A relay echoes it, never
    recomputes it."""
    body = {"question_id": question_id, "version": version, "question": spec.to_json()}
    return HASH_PREFIX + hashlib.sha256(canonical_json(body)).hexdigest()


def value_hash(value: Any, *, salt: bytes) -> str:
    """``"sha256:" + hex(SHA-256(salt + canonical_json(value)))``: what the audit trail keeps
    of an answer instead of the value. ``salt`` is the question's 16
    random bytes (its row's ``answer_salt``, never logged), so a short answer (yes/no, a
    choice, a date) cannot be confirmed from an export by hashing guesses (new-user finding
    B3); ``audit verify -c`` recomputes it with the row's salt."""
    return HASH_PREFIX + hashlib.sha256(bytes(salt) + canonical_json(value)).hexdigest()


def _choice(value: Any, options: tuple[str, ...], at: str) -> str:
    if not isinstance(value, str):
        raise value_error(at, f"{at} must be one of the options (a string)")
    if value not in options:
        raise value_error(at, f"{value!r} is not one of the options")
    return value


def check_value(spec: QuestionSpec, value: Any, *, max_answer_chars: int) -> Any:
    """Check an answer's ``value`` against the question (answer check 12): free text
    is a non-blank string of at most ``max_answer_chars`` characters; a single choice is one
    of the options, exactly; a multi choice a non-empty list of distinct offered options (kept
    in the order sent); a form an object (``form_schema.check_form_value``). Returns the value.
    Raises ProtocolError 422 ``invalid_value`` with ``field`` ``value``, ``value[i]`` or
    ``value.<property>`` and a message saying exactly why.
    """
    kind = spec.response_type
    if kind == "free_text":
        if not isinstance(value, str) or not is_unicode(value):
            raise value_error("value", "value must be a string (free text)")
        if is_blank(value):
            raise value_error("value", "value must not be blank")
        if len(value) > max_answer_chars:
            raise value_error("value", f"value is longer than {max_answer_chars} characters")
        return value
    if kind == "single_choice":
        assert spec.options is not None
        return _choice(value, spec.options, "value")
    if kind == "multi_choice":
        assert spec.options is not None
        if not isinstance(value, list):
            raise value_error("value", "value must be a list of options (multi choice)")
        if not value:
            raise value_error("value", "value must choose at least one option")
        for i, item in enumerate(value):
            _choice(item, spec.options, f"value[{i}]")
            if item in value[:i]:
                raise value_error(f"value[{i}]", f"{item!r} is chosen twice")
        return list(value)
    assert spec.schema is not None
    return check_form_value(spec.schema, value, max_answer_chars=max_answer_chars)


def build_question_dispatch(
    *,
    question_id: str,
    run_id: str,
    pipeline: str,
    step: str,
    issued_at_ms: int,
    expires_at_ms: int,
    risk: str,
    version: int,
    spec: QuestionSpec,
    request_hash: str,
    approvers: Sequence[str],
    callback_url: str,
    nonce: str,
    requested_by: str | None = None,
) -> dict[str, Any]:
    """Return a question dispatch as a dict ready for ``wire_json``. It has
    ``kind: "question"`` and no ``approval_id``, ``draft``, ``payload_hash`` or ``quorum``:
    an approval relay cannot take it for an approval. ``requested_by`` (additive: who asked)
    ends it only when given; ``request_hash`` does not cover it."""
    envelope = {
        "protocol": PROTOCOL,
        "kind": KIND,
        "question_id": question_id,
        **routing(run_id, pipeline, step, issued_at_ms, expires_at_ms, risk),
        "version": version,
        "question": spec.to_json(),
        "request_hash": request_hash,
        "approvers": list(approvers),
        "actions": [{"verb": ANSWER, "accepts": spec.response_type}],
        "callback": {"url": callback_url, "nonce": nonce},
    }
    if requested_by is not None:
        envelope["requested_by"] = requested_by
    return envelope


def answer_text(spec: QuestionSpec, value: Any) -> str:
    """What ``hitl-gate ask`` prints: the string itself for free text and a
    single choice, compact JSON (non-ASCII unescaped, keys as given) for a multi choice and a
    form."""
    if spec.response_type in ("free_text", "single_choice"):
        return str(value)
    return wire_json(value).decode("utf-8")
