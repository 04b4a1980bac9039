"""The pipeline's question requests (POST /v1/questions and .../revise): parsing and
validation of the bodies; the question itself is checked by ``gate.protocol.question``."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from gate.core.requests.fields import bad_field, invalid, opened
from gate.protocol.canonical import canonical_json
from gate.protocol.question import QuestionSpec, parse_question

QUESTION_FIELDS = ("text", "reason", "response_type", "options", "schema")


@dataclass(frozen=True, slots=True)
class QuestionRequest:
    """A validated create body: where it goes, the normalized ``spec``, and the optional
    ``run_id`` and ``requested_by`` (an operator identity, checked by the service)."""

    pipeline: str
    step: str
    run_id: str | None
    spec: QuestionSpec
    requested_by: str | None = None

    def body_hash(self) -> str:
        """SHA-256 hex of this request's canonical JSON: the Idempotency-Key comparison
        (same key and same body -> the same question)."""
        fields: dict[str, Any] = {
            "pipeline": self.pipeline,
            "step": self.step,
            "run_id": self.run_id,
            "question": self.spec.to_json(),
        }
        if self.requested_by is not None:
            fields["requested_by"] = self.requested_by
        return hashlib.sha256(canonical_json(fields)).hexdigest()


def check_text_bytes(spec: QuestionSpec, max_bytes: int) -> None:
    """A question's ``text`` is at most ``max_bytes`` bytes UTF-8 (``api.max_draft_bytes``).
    Raises GateError 413 ``question_too_large`` (field ``text``)."""
    if len(spec.text.encode("utf-8")) > max_bytes:
        raise invalid("question_too_large", "text", f"text is larger than {max_bytes} bytes", 413)


def parse_question_create(obj: Any, *, max_bytes: int, max_options: int) -> QuestionRequest:
    """Validate a decoded create body ``{pipeline, step, run_id?, text, reason?,
    response_type, options?, schema?, requested_by?}``. Raises GateError 400
    ``invalid_<field>`` (``field`` the JSON path), 413 ``question_too_large``. The step's
    ``max_options`` is applied by the caller, which knows the step (``parse_spec``)."""
    obj, pipeline, step, run_id, requested_by = opened(obj)
    spec = parse_spec(obj, max_bytes=max_bytes, max_options=max_options)
    return QuestionRequest(pipeline, step, run_id, spec, requested_by)


def parse_spec(
    obj: dict[str, Any], *, max_bytes: int, max_options: int, max_answer_chars: int | None = None
) -> QuestionSpec:
    """The question fields of ``obj`` (``gate.protocol.question.parse_question``) with the
    text's byte limit; with the step's ``max_answer_chars``, a form field no answer could fill
    is refused. Raises GateError 400/413 as ``parse_question_create``."""
    spec = parse_question(
        obj, max_text_chars=max_bytes, max_options=max_options, max_answer_chars=max_answer_chars
    )
    check_text_bytes(spec, max_bytes)
    return spec


def revised_fields(current: QuestionSpec, body: Any) -> dict[str, Any]:
    """The question a revise body asks for: the current one with the given fields replaced.
    A new ``response_type`` drops the current ``options``/``schema``
    unless given again (they belong to the old type). Raises GateError 400 ``invalid_json``
    for a body that is no object, ``invalid_revise`` when it names no question field."""
    if not isinstance(body, dict):
        raise bad_field("json", "body must be a JSON object")
    given = {key: body[key] for key in QUESTION_FIELDS if key in body}
    if not given:
        raise bad_field("revise", f"give at least one of {', '.join(QUESTION_FIELDS)}")
    merged = current.to_json()
    if "response_type" in given and given["response_type"] != current.response_type:
        merged.pop("options", None)
        merged.pop("schema", None)
    merged.update(given)
    return {key: value for key, value in merged.items() if value is not None}
