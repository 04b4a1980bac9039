"""What the reference relay shows for a question and how it reads what is typed:
a block under its own ``QUESTION`` header, never like an approval's, and one parser per
response type. Pure: no I/O; the answer's check is ``gate.protocol.question.check_value``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gate.protocol.display import display_time, is_hidden, marked
from gate.protocol.numbers import INTEGER_TEXT, NUMBER_TEXT, ascii_int
from gate.tools.reference_relay.view import (
    SEPARATOR,
    draft_lines,
    line_count,
    requested_by_lines,
    visible,
)

# not the approvals' "=" rule: the two never look alike; plain ASCII, and not "?" (a rule of
# question marks reads as characters the terminal could not show: new-user finding 7)
QUESTION_RULE = "#" * 72


def line(value: object) -> str:
    """``str(value)`` on one line: what ``visible`` hides as ``<U+XXXX>``, newline and tab
    too (``marked`` keeping nothing: an option or a title cannot fake a line of the relay's
    own)."""
    return marked(str(value), keep="")


def hidden_count(question: dict[str, Any]) -> int:
    """How many characters of everything shown of a question are shown as ``<U+XXXX>``: its
    text (``visible``: newline and tab kept), and on one line each (``line``) its reason,
    options and the form's field names, titles, descriptions, enum values and enumNames
    (new-user finding 7: the text alone was counted)."""
    count = visible(str(question.get("text", "")))[1]
    shown: list[object] = []
    if isinstance(question.get("reason"), str):
        shown.append(question["reason"])
    shown += list(question.get("options") or [])
    for name, prop, _ in form_fields(question):
        shown.append(name)
        shown += [prop[k] for k in ("title", "description") if isinstance(prop.get(k), str)]
        shown += list(prop.get("enum") or []) + list(prop.get("enumNames") or [])
        shown += list((prop.get("items") or {}).get("enum") or [])
    return count + sum(sum(map(is_hidden, str(v))) for v in shown)  # as ``line`` marks them


def field_summary(prop: dict[str, Any], required: bool) -> str:
    """A form field's type and limits in words: ``integer, 1 to 100, required``."""
    kind = "choice" if "enum" in prop else str(prop.get("type"))
    words = [kind]
    if kind == "string":
        if "format" in prop:
            words[0] = f"string ({line(prop['format'])})"
        if "minLength" in prop or "maxLength" in prop:
            words.append(f"{prop.get('minLength', 0)} to {prop.get('maxLength', '…')} characters")
    elif kind in ("number", "integer") and ("minimum" in prop or "maximum" in prop):
        words.append(f"{prop.get('minimum', '…')} to {prop.get('maximum', '…')}")
    elif kind == "choice":
        words[0] = "one of: " + ", ".join(f"{i}) {line(v)}" for i, v in enumerate(_labels(prop), 1))
    elif kind == "array":
        enum = (prop.get("items") or {}).get("enum") or []
        words[0] = "any of: " + ", ".join(f"{i}) {line(v)}" for i, v in enumerate(enum, 1))
        if "minItems" in prop or "maxItems" in prop:
            words.append(f"{prop.get('minItems', 0)} to {prop.get('maxItems', len(enum))} chosen")
    elif kind == "boolean":
        words[0] = "yes or no"
    words.append("required" if required else "optional: empty line to leave out")
    return ", ".join(words)


def _labels(prop: dict[str, Any]) -> list[Any]:
    """A single enum's labels: ``enumNames`` when given, else the values."""
    names = prop.get("enumNames")
    return list(names) if isinstance(names, list) else list(prop.get("enum") or [])


def render_question(envelope: dict[str, Any], identity: str, width: int | None = None) -> str:
    """The whole block for one question: header (id, pipeline/step, risk, version, expiry,
    who answers), the reason, the text between separators (each line behind the gutter, as
    a draft), then the options numbered or the form's fields with their types and limits."""
    question = envelope.get("question") or {}
    body = draft_lines(str(question.get("text", "")), width)[1]  # its warning is a draft's
    hidden = hidden_count(question)
    warnings = (
        [
            f"warning: the question holds {hidden} control or invisible characters, shown as "
            "<U+XXXX>; it is asked, and your answer recorded against it, exactly as sent"
        ]
        if hidden
        else []
    )
    kind = question.get("response_type")
    lines = [
        "",
        QUESTION_RULE,
        f"QUESTION {line(envelope.get('question_id'))}  {line(envelope.get('pipeline'))}/"
        f"{line(envelope.get('step'))}  risk {line(envelope.get('risk'))}  version "
        f"{line(envelope.get('version', 1))}",
        f"answer: {line(kind)}  expires {line(display_time(envelope.get('expires_at')))}  you are "
        f"{line(identity)}",
        *requested_by_lines(envelope),
    ]
    if isinstance(question.get("reason"), str):
        lines.append(f"why it is asked: {line(question['reason'])}")
    lines += [*warnings, SEPARATOR, *body, SEPARATOR]
    if kind in ("single_choice", "multi_choice"):
        lines += [f"  {i}) {line(o)}" for i, o in enumerate(question.get("options") or [], 1)]
    elif kind == "form":
        for name, prop, required in form_fields(question):
            title = f" ({line(prop['title'])})" if isinstance(prop.get("title"), str) else ""
            lines.append(f"  {line(name)}{title}: {field_summary(prop, required)}")
            if isinstance(prop.get("description"), str):
                lines.append(f"      {line(prop['description'])}")
    lines.append(QUESTION_RULE)
    return "\n".join(lines) + "\n"


def form_fields(question: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """``(name, property, required)`` per field of a form question, in the schema's order."""
    schema = question.get("schema") or {}
    required = set(schema.get("required") or [])
    props = schema.get("properties") or {}
    return [(n, p, n in required) for n, p in props.items() if isinstance(p, dict)]


def answer_prompt(envelope: dict[str, Any]) -> str:
    """The prompt, restating what is answered so no text inside the question can pass for it:
    ``Question ID version N, text of K lines above. Your answer (one line): ``."""
    question = envelope.get("question") or {}
    kind = question.get("response_type")
    count = len(question.get("options") or [])
    head = (
        f"Question {line(envelope.get('question_id'))} version "
        f"{line(envelope.get('version', 1))}, text of "
        f"{line_count(str(question.get('text', '')))} line(s) above. "
    )
    if kind == "single_choice":
        return head + f"Type the number of your choice (1-{count}): "
    if kind == "multi_choice":
        return head + f"Type the numbers of your choices, comma-separated (1-{count}): "
    if kind == "form":
        return head + "Fill in the form, one field at a time."
    return head + "Your answer (one line): "


@dataclass(frozen=True, slots=True)
class Typed:
    """What a typed line means: ``value`` (``OMIT`` for an optional field left empty), or
    ``hint`` (the line shown when it is not taken; ``value`` is then None)."""

    value: Any = None
    hint: str | None = None


OMIT = object()


def _numbers(text: str, count: int) -> list[int] | None:
    """``"1, 3"`` -> ``[0, 2]`` (0-based), each within 1..count; None otherwise."""
    out = []
    for part in text.split(","):
        word = part.strip()
        number = ascii_int(word)
        if number is None or not 1 <= number <= count:
            return None
        out.append(number - 1)
    return out


def parse_choice(text: str, options: list[str], multi: bool) -> Typed:
    """A typed single choice (one number) or multi choice (comma-separated numbers) as the
    option strings; a repeated number is kept (``check_value`` refuses it, naming why)."""
    picked = _numbers(text, len(options))
    if picked is None or (not multi and len(picked) != 1):
        what = "numbers, comma-separated," if multi else "one number"
        return Typed(hint=f"Not taken: type {what} from 1 to {len(options)}.")
    values = [options[i] for i in picked]
    return Typed(values if multi else values[0])


def field_prompt(name: str, prop: dict[str, Any], required: bool) -> str:
    """The prompt of one form field: ``amount (integer, 1 to 100, required): ``; with a
    ``title`` it leads: ``Amount in EUR [amount] (integer, ...): `` (new-user finding 6)."""
    summary = f"({field_summary(prop, required)}): "
    if isinstance(prop.get("title"), str) and prop["title"].strip():
        return f"{line(prop['title'])} [{line(name)}] {summary}"
    return f"{line(name)} {summary}"


def parse_field(text: str, prop: dict[str, Any], required: bool) -> Typed:
    """A typed form field converted by its type: a string as typed; a number or integer
    (``12``, ``12.5``); yes/no (``y``, ``yes``, ``true``, ``n``, ``no``, ``false``); a choice
    by its number; several by comma-separated numbers. An empty line leaves an optional field
    out (``OMIT``); for a required one it is taken as typed (``check_value`` says why not)."""
    kind = "enum" if "enum" in prop else prop.get("type")
    if not text.strip() and not required:
        return Typed(OMIT)
    if kind == "string":
        return Typed(text)
    if kind in ("number", "integer"):
        word = text.strip()
        if INTEGER_TEXT.fullmatch(word):
            return Typed(int(word))
        if kind == "number" and NUMBER_TEXT.fullmatch(word):
            number = float(word)
            if math.isfinite(number):
                return Typed(number)
        return Typed(
            hint=f"Not taken: type {'a whole number' if kind == 'integer' else 'a number'}."
        )
    if kind == "boolean":
        word = text.strip().lower()
        if word in ("y", "yes", "true"):
            return Typed(True)
        if word in ("n", "no", "false"):
            return Typed(False)
        return Typed(hint="Not taken: type yes or no.")
    if kind == "enum":
        return parse_choice(text, list(prop.get("enum") or []), multi=False)
    enum = list((prop.get("items") or {}).get("enum") or [])
    return parse_choice(text, enum, multi=True)


def gate_refusal(answer: Any) -> str:
    """What a gate's refusal of an answer says, for the terminal: its message when it sent
    one, else its reason and field (``invalid_value at value.amount``)."""
    fields = answer if isinstance(answer, dict) else {}
    if isinstance(fields.get("message"), str):
        return line(fields["message"])
    reason = line(fields.get("reason") or "refused")
    return reason + (f" at {line(fields['field'])}" if isinstance(fields.get("field"), str) else "")
