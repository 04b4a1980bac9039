"""The reference relay's question prompt: show a question on the terminal and read
an answer of its type until one passes ``gate.protocol.question.check_value``; and the
``--auto-answer`` VALUE read for a question."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from gate.errors import GateError
from gate.protocol.form_value import check_form_value
from gate.protocol.question import QuestionSpec, check_value
from gate.tools.reference_relay.question_view import (
    OMIT,
    answer_prompt,
    field_prompt,
    form_fields,
    line,
    parse_choice,
    parse_field,
    render_question,
)
from gate.tools.reference_relay.terminal import Terminal

if TYPE_CHECKING:
    from gate.tools.reference_relay.relay import Relay

# the relay does not know the step's max_answer_chars: it checks against what a 64 KiB
# answer envelope can hold, and the gate's 422 for a longer answer than the step takes is
# shown and asked again
LOCAL_MAX_ANSWER_CHARS = 60_000


def auto_value(spec: QuestionSpec, given: str) -> Any:
    """The ``--auto-answer`` VALUE for this question: VALUE read as JSON when that fits the
    question, else VALUE as plain text when that fits; raises GateError (422
    ``invalid_value``) with the JSON reading's reason when neither does."""
    try:
        candidates: list[Any] = [json.loads(given), given]
    except ValueError:
        candidates = [given]
    error: GateError | None = None
    for value in candidates:
        try:
            return check_value(spec, value, max_answer_chars=LOCAL_MAX_ANSWER_CHARS)
        except GateError as exc:
            error = error or exc
    assert error is not None
    raise error


async def prompt_value(
    relay: Relay, envelope: dict[str, Any], spec: QuestionSpec, identity: str
) -> Any:
    """Show the question and read an answer until one passes ``check_value``; withdrawn
    (Withdrawn) when it goes stale on screen (a newer version, expiry)."""
    terminal = relay.terminal
    qid = envelope["question_id"]
    expired = f"Question {line(qid)} expired while waiting for an answer; not asking any more."
    with relay.asking_about(envelope, expired) as stale:
        async with terminal.prompting(render_question(envelope, identity, terminal.width())):
            while True:
                value = await _read(terminal, envelope, spec, stale)
                try:
                    return check_value(spec, value, max_answer_chars=LOCAL_MAX_ANSWER_CHARS)
                except GateError as exc:
                    terminal.say(f"Not taken: {line(exc.message)}.")


async def _read(
    terminal: Terminal, envelope: dict[str, Any], spec: QuestionSpec, stale: asyncio.Future[str]
) -> Any:
    """One typed answer of the question's type (not yet checked)."""
    kind = spec.response_type
    if kind != "form":
        while True:
            terminal.say(answer_prompt(envelope), end="")
            text = await terminal.lines.next(stale)
            if kind == "free_text":
                return text
            typed = parse_choice(text, list(spec.options or ()), kind == "multi_choice")
            if typed.hint is None:
                return typed.value
            terminal.say(typed.hint)
    terminal.say(answer_prompt(envelope))
    value: dict[str, Any] = {}
    for name, prop, required in form_fields(envelope["question"]):
        while True:
            terminal.say(field_prompt(name, prop, required), end="")
            typed = parse_field(await terminal.lines.next(stale), prop, required)
            hint = typed.hint or field_refusal(name, prop, required, typed.value)
            if hint is None:
                break
            terminal.say(hint)
        if typed.value is not OMIT:
            value[name] = typed.value
    return value


def field_refusal(name: str, prop: dict[str, Any], required: bool, typed: Any) -> str | None:
    """The ``Not taken: ...`` line for one form field's typed value that the form's own check
    (``check_form_value``: length, range, format, choices) refuses on this field alone, or
    None when it fits or was left out (``OMIT``); so a field is asked again at once, not after
    the whole form (new-user finding 6)."""
    if typed is OMIT:
        return None
    alone = {"properties": {name: prop}, "required": [name] if required else []}
    try:
        check_form_value(alone, {name: typed}, max_answer_chars=LOCAL_MAX_ANSWER_CHARS)
    except GateError as exc:
        return f"Not taken: {line(exc.message)}."
    return None
