"""Answers to questions at the inbox (docs/protocol.md "Questions"): the question
page's plain HTML form turned into the typed answer value, checked with the gate's own rule
(``gate.protocol.question.check_value``, answer check 12: one rule, two callers),
and the answer envelope posted to the gate. An answer is not an approval: no passkey.

The pure part (``question_of``, ``value_from_form``, ``checked_value``, ``in_words``,
``answer_envelope``) takes no request; the route is added by ``add_routes``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gate.inbox import pages
from gate.inbox.decide import Refused, check_open, checked_request, send_recorded
from gate.inbox.model import DecisionRecord, Item
from gate.inbox.state import state_of
from gate.protocol.answer import build_answer
from gate.protocol.errors import ProtocolError
from gate.protocol.numbers import INTEGER_TEXT, NUMBER_TEXT
from gate.protocol.question import QuestionSpec, check_value, parse_question

log = logging.getLogger(__name__)

MAX_ANSWER_CHARS = 60_000
"""The inbox cannot know the step's ``max_answer_chars`` (default 2000, at most 60 000): it
checks against the largest; a lower cap is the gate's 422, shown in words the same way."""
MAX_OPTIONS = 1000


class AnswerInvalid(ValueError):
    """A form answer the gate would refuse: ``field`` (``value``, ``value[i]``,
    ``value.<name>``, as the gate names it) and ``words`` (the sentence the page shows)."""

    def __init__(self, field: str, words: str) -> None:
        super().__init__(words)
        self.field = field
        self.words = words


def question_of(item: Item) -> QuestionSpec:
    """The question a stored question dispatch asks, read with the gate's own parser.
    Raises ``ProtocolError`` for one the gate would not have sent."""
    question = item.dispatch.get("question")
    if not isinstance(question, dict):
        raise ProtocolError("invalid_question", "the dispatch has no question", status=400)
    return parse_question(question, max_text_chars=10**9, max_options=MAX_OPTIONS)


def _all(fields: Mapping[str, Any], name: str) -> list[str]:
    """Every value posted under ``name`` (a repeated checkbox posts several)."""
    found = fields.get(name)
    if found is None:
        return []
    values = found if isinstance(found, list | tuple) else [found]
    return [str(v).replace("\r\n", "\n") for v in values]


def _one(fields: Mapping[str, Any], name: str) -> str | None:
    found = _all(fields, name)
    return found[0] if found else None


def _number(text: str, integer: bool) -> Any:
    """An ``<input type=number>`` as a JSON number; a text that is none stays a string (the
    gate's rule then says "must be a number")."""
    text = text.strip()
    if INTEGER_TEXT.fullmatch(text):
        return int(text)
    if not integer and NUMBER_TEXT.fullmatch(text):
        value = float(text)
        return value if math.isfinite(value) else text
    return text


def value_from_form(spec: QuestionSpec, fields: Mapping[str, Any]) -> Any:
    """The typed answer value the question page's ``fields`` (name -> str or list of str,
    form-urlencoded; CRLF line breaks read as LF) stand for: free text and a single choice
    the ``value`` string (None when absent), a multi choice the list of ``value``s, a form
    an object of its declared properties — an empty optional field left out, a number
    field a number, a checkbox ``true``/``false``, checkboxes a list. Not yet checked."""
    kind = spec.response_type
    if kind in ("free_text", "single_choice"):
        return _one(fields, "value")
    if kind == "multi_choice":
        return _all(fields, "value")
    assert spec.schema is not None
    required = set(spec.schema.get("required", ()))
    value: dict[str, Any] = {}
    for name, prop in spec.schema["properties"].items():
        kind = prop.get("type")
        if kind == "boolean":
            value[name] = _one(fields, name) == "true"
        elif kind == "array":
            chosen = _all(fields, name)
            if chosen or name in required:
                value[name] = chosen
        else:
            text = _one(fields, name)
            if text is None or text.strip() == "":
                if name in required and text:
                    value[name] = text  # only white space: the gate says "must not be blank"
                continue
            value[name] = (
                _number(text, kind == "integer") if kind in ("number", "integer") else text
            )
    return value


def in_words(spec: QuestionSpec, field: str, message: str) -> str:
    """The gate's message about ``field`` said to a person: ``value`` is "Your answer", a
    form's ``value.<name>`` its field's title in quotes."""
    if field.startswith("value.") and spec.schema is not None:
        name = field[len("value.") :]
        prop = spec.schema["properties"].get(name, {})
        label = f"\u201c{prop.get('title') or name}\u201d"
        return label + message[len(field) :] if message.startswith(field) else message
    if field.startswith("value[") or field == "value":
        shown = "Your answer" if field == "value" else f"Choice {int(field[6:-1]) + 1}"
        rest = message[len(field) :] if message.startswith(field) else ": " + message
        return shown + rest
    return message


def checked_value(spec: QuestionSpec, fields: Mapping[str, Any]) -> Any:
    """``value_from_form`` checked with the gate's rule (``check_value``). Returns the
    value; raises ``AnswerInvalid`` with the gate's field and the message in words."""
    value = value_from_form(spec, fields)
    if spec.response_type == "single_choice" and value is None:
        raise AnswerInvalid("value", "Choose one of the options.")
    if spec.response_type == "multi_choice" and not value:
        raise AnswerInvalid("value", "Choose at least one of the options.")
    if spec.response_type == "free_text" and not value:
        raise AnswerInvalid("value", "Write an answer: it must not be blank.")
    try:
        return check_value(spec, value, max_answer_chars=MAX_ANSWER_CHARS)
    except ProtocolError as exc:
        extra = exc.extra or {}
        field = str(extra.get("field", "value"))
        message = str(extra.get("message", exc))
        raise AnswerInvalid(field, in_words(spec, field, message).rstrip(".") + ".") from exc


def answer_envelope(item: Item, value: Any, identity: str, answered_at_ms: int) -> dict[str, Any]:
    """The hitl/v0 answer (docs/protocol.md "Questions") to the STORED question dispatch
    ``item``: its ``question_id``, callback nonce and ``request_hash``, the checked
    ``value``, the approver ``identity`` on channel ``inbox``, ``decided_at``."""
    return build_answer(
        question_id=item.approval_id,
        nonce=str(item.dispatch["callback"]["nonce"]),
        request_hash=item.payload_hash,
        value=value,
        approver_id=identity,
        decided_at_ms=answered_at_ms,
        channel="inbox",
    )


async def answer(request: web.Request) -> web.Response:
    """POST ``/items/{id}/answer`` (the question page's form: ``csrf``, ``version`` shown,
    the answer's fields): session (else sign-in), Origin and CSRF (``auth.read_post``: 403,
    nothing changes), the question the session may answer (else 404), pending (else 409 in
    words), the version shown (else 409 "changed"), the value by the gate's rule (else the
    form again, 422, the error in words, nothing posted); then a row (status 0), the answer
    posted to the dispatch's callback, the row updated with the gate's answer, 303 to
    ``/decisions/<n>``. A gate's 422 ``invalid_value`` (a step's lower ``max_answer_chars``)
    shows the form again in words; an unreachable gate is a 502 page."""
    session, item, fields = await checked_request(request)
    state = state_of(request)
    now = state.now_ms()

    def again(words: str) -> web.Response:
        return pages.question_page(
            request,
            item=item,
            session=session,
            now_ms=now,
            seq=item.updated_seq,
            error=words,
            status=422,
            submitted=fields,  # what was typed is shown again
        )

    def said(title: str, words: str, status: int) -> web.Response:
        return pages.plain_page(
            request, title=title, sentence=words, status=status, session=session
        )

    try:
        check_open(item, "question", fields.get("version", ""), "This question")
        spec = question_of(item)
        value = checked_value(spec, fields)
    except Refused as refused:
        title = "Not a question" if refused.reason == "not_a_question" else "Not sent"
        return said(title, refused.message, 409)
    except ProtocolError:
        return said("Not sent", "This question cannot be answered here.", 409)
    except AnswerInvalid as invalid:
        return again(invalid.words)
    body = answer_envelope(item, value, session.identity, now)
    sent = json.dumps(value, ensure_ascii=False)  # shown to the approver, never logged
    record = DecisionRecord(
        item.approval_id, item.revision, session.identity, "answer", 0, {}, now, sent=sent
    )
    number, answered = await send_recorded(state, item, record, body)
    if answered is None:
        return said("Not sent", "The gate could not be reached: your answer was not recorded.", 502)
    status, reply = answered
    log.info("event=inbox_answer question_id=%s status=%d", item.approval_id, status)
    if status == 422 and reply.get("reason") == "invalid_value":
        field = str(reply.get("field", "value"))
        return again(in_words(spec, field, str(reply.get("message", "is not accepted"))))
    raise web.HTTPSeeOther(f"/decisions/{number}")


def add_routes(app: web.Application) -> None:
    """POST ``/items/{id}/answer``."""
    app.router.add_post("/items/{id}/answer", answer)
