"""What the reference relay shows a human: a dispatch in words, and what they may type. Pure."""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gate.protocol.display import code_point, display_time, is_hidden, marked
from gate.protocol.numbers import in_range
from gate.protocol.whitespace import is_blank

RULE = "=" * 72
SEPARATOR = "-" * 72
# put by the relay before every line of a draft (relay review item A): no line the relay writes
# itself starts with either, so nothing in a draft can pass for the relay's own screen; a
# draft line that starts with one is shown behind another, visibly nested. WRAP_GUTTER starts
# the rest of a draft line too long for the terminal.
GUTTER = "\u2502 "
WRAP_GUTTER = "\u2506 "
TAB_SIZE = 8
# risks (docs: ``risk`` of a step) at which one key answers; any other, ``high``, ``critical``
# or one this relay does not know, needs the whole word
ONE_KEY_RISKS = frozenset({"low", "normal"})
KEYS = {"a": "approve", "s": "skip", "e": "adjust"}
# gate answers after which nobody needs to decide the approval any more
FINAL = frozenset({"already_resolved", "expired", "unknown_approval"})
WORDS = {"approve": "approve", "skip": "skip", "edit": "adjust", "adjust": "adjust"}
# whitespace a human knows by name; any other is shown as its code point
_SPACE_NAMES = {
    " ": "space",
    "\t": "tab",
    "\n": "newline",
    "\r": "carriage return",
    "\x0b": "vertical tab",
    "\x0c": "form feed",
}


def visible(text: str) -> tuple[str, int]:
    """Return ``(text, count)``: ``text`` with every character a terminal would not show as
    itself (a control, format, line/paragraph-separator, surrogate or unassigned code point;
    newline and tab excepted) replaced by a visible ``<U+XXXX>`` mark, and how many were
    (``gate.protocol.display.marked``: one rule for every screen).

    A draft of ``"pay 12000 to X\\r\\x1b[2Kpay 12 to Y"`` would otherwise show as its second
    half only (security review); the human must see what the payload hash covers.
    """
    return marked(text), sum(char not in "\n\t" and is_hidden(char) for char in text)


def shown(value: object) -> str:
    """``str(value)`` as ``visible`` shows it (for one-line fields of an envelope)."""
    return visible(str(value))[0]


@dataclass(frozen=True, slots=True)
class Kind:
    """What tells the two kinds of dispatch (and of notice) apart where the relay handles them
    alike: the ``noun`` it is said with, the field naming it (``key``) and the one numbering
    its versions (``step``, also the word for one; 1 when absent)."""

    noun: str
    key: str
    step: str


APPROVAL = Kind("Approval", "approval_id", "revision")
QUESTION = Kind("Question", "question_id", "version")


def kind_of(envelope: dict[str, Any]) -> Kind:
    """``QUESTION`` for a dispatch or notice that says ``"kind": "question"``, else ``APPROVAL``."""
    return QUESTION if envelope.get("kind") == "question" else APPROVAL


def _number(value: object) -> float | None:
    """A JSON number as a float; None for null, booleans, text, or a number beyond ±2**53
    (``in_range``: the budget is then shown as its JSON, the numbers as sent)."""
    return float(value) if in_range(value) else None


def amount(value: float, unit: str) -> str:
    """``value`` with at most 6 decimals, trailing zeros dropped, then ``unit``:
    ``20.0 -> "20 EUR"``, ``0.1 + 0.2 -> "0.3 EUR"``."""
    text = f"{round(value, 6) + 0.0:.6f}".rstrip("0").rstrip(".")
    return f"{text} {unit}" if unit else text


def quorum_words(quorum: object) -> str:
    """``{"required": 2, "collected": 1}`` -> ``approvals: 1 of 2 collected``."""
    q = quorum if isinstance(quorum, dict) else {}
    return f"approvals: {shown(q.get('collected'))} of {shown(q.get('required'))} collected"


def budget_lines(budget: object, pipeline: str) -> list[str]:
    """The dispatch's ``budget`` (docs/protocol.md: ``unit``, ``spent_today``, ``cap_today``,
    ``spent_pipeline``, ``cap_pipeline``, ``this_request``; amounts in ``unit``, "today" is
    the gate's UTC day, spent = what fired) in words, one line per configured cap:
    ``budget: spend 120 EUR of 500 EUR left today (all pipelines: cap 500 EUR, 0 EUR spent)``.

    No budget, no lines; a budget whose fields are not of those types is shown as its JSON.
    """
    if not budget:
        return []
    fields = ("spent_today", "cap_today", "spent_pipeline", "cap_pipeline", "this_request")
    if (
        not isinstance(budget, dict)
        or not isinstance(budget.get("unit", ""), str)
        or any(budget.get(key) is not None and _number(budget.get(key)) is None for key in fields)
    ):
        return [f"budget: {shown(json.dumps(budget, ensure_ascii=False))}"]
    unit = shown(budget.get("unit") or "")
    spend = _number(budget.get("this_request"))
    lines = []
    for scope, spent_key, cap_key in (
        ("all pipelines", "spent_today", "cap_today"),
        (f"pipeline {shown(pipeline)}", "spent_pipeline", "cap_pipeline"),
    ):
        cap = _number(budget.get(cap_key))
        if cap is None:
            continue
        spent = _number(budget.get(spent_key)) or 0.0
        left = max(cap - spent, 0.0)
        if spend is not None:
            words = f"spend {amount(spend, unit)} of {amount(left, unit)} left today"
            if spend > left:
                words += f", {amount(spend - left, unit)} over the cap"
        else:
            words = f"{amount(left, unit)} of {amount(cap, unit)} left today"
            if spent > cap:
                words += f", already {amount(spent - cap, unit)} over the cap"
            words += ", the request names no spend"
        lines.append(
            f"budget: {words} ({scope}: cap {amount(cap, unit)}, {amount(spent, unit)} spent)"
        )
    if not lines and spend is not None:
        lines.append(f"budget: spend {amount(spend, unit)} (no cap)")
    return lines


def draft_lines(body: str, width: int | None = None) -> tuple[list[str], list[str]]:
    """Return ``(warnings, lines)`` for a draft: what to say above it, and what to print
    between the separators. The body is shown through ``visible``, every line behind
    ``GUTTER`` (with ``width``, the terminal's columns, tabs are expanded and a line too long
    for it goes on behind ``WRAP_GUTTER``, so the terminal never wraps draft text to column 0). An
    empty draft, or one of whitespace only, is said in words (``(the draft is empty)``)
    instead of printing nothing."""
    text, hidden = visible(body)
    warnings = []
    if hidden:
        warnings.append(
            f"warning: the draft holds {hidden} control or invisible characters, "
            "shown as <U+XXXX>; the draft approved is exactly as sent, with them"
        )
    if not body:
        return warnings, ["(the draft is empty)"]
    if is_blank(body):  # the gate's rule: only Unicode White_Space
        counts = Counter(body)
        kinds = ", ".join(
            _count(n, _SPACE_NAMES.get(c) or code_point(c)) for c, n in counts.items()
        )
        return warnings, [
            f"(the draft is only whitespace, {_count(len(body), 'character')}: {kinds})"
        ]
    lines: list[str] = []
    for line in text.split("\n")[: line_count(body)]:
        lines.extend(_wrapped(line if width is None else line.expandtabs(TAB_SIZE), width))
    return warnings, lines


def line_count(body: str) -> int:
    """How many lines the draft ``body`` has: a final newline ends the last line, it does
    not start another (``"a\\nb\\n"`` has 2); an empty body has 0."""
    return len(body.removesuffix("\n").split("\n")) if body else 0


def _columns(char: str) -> int:
    """Terminal columns ``char`` takes: 0 combining, 2 wide (East Asian W/F), else 1."""
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def _wrapped(line: str, width: int | None) -> list[str]:
    """``line`` behind ``GUTTER``, cut into pieces that fit ``width`` columns (None: one
    piece), the pieces after the first behind ``WRAP_GUTTER``."""
    room = None if width is None else max(width - len(GUTTER), 8)
    if room is None:
        return [GUTTER + line]
    pieces: list[str] = []
    piece: list[str] = []
    used = 0
    for char in line:
        cols = _columns(char)
        if used + cols > room and piece:
            pieces.append("".join(piece))
            piece, used = [], 0
        piece.append(char)
        used += cols
    pieces.append("".join(piece))
    return [GUTTER + pieces[0]] + [WRAP_GUTTER + p for p in pieces[1:]]


def _count(n: int, name: str) -> str:
    return f"{n} {name}" + ("s" if n != 1 and not name.startswith("U+") else "")


def requested_by_lines(envelope: dict[str, Any]) -> list[str]:
    """``requested by IDENTITY`` when the dispatch names who asked (its additive
    ``requested_by``), else nothing."""
    who = envelope.get("requested_by")
    return [f"requested by {shown(who)}"] if isinstance(who, str) else []


def render(envelope: dict[str, Any], identity: str, width: int | None = None) -> str:
    """The whole block shown for one approver: header (approval, pipeline/step, risk,
    revision; quorum, expiry, who answers; who asked; budget), then the draft between two
    separators, each line behind ``GUTTER`` (``draft_lines``; ``width``: the terminal's columns)."""
    draft = envelope.get("draft") or {}
    warnings, body = draft_lines(str(draft.get("body", "")), width)
    lines = [
        "",
        RULE,
        f"Approval {shown(envelope.get('approval_id'))}  {shown(envelope.get('pipeline'))}/"
        f"{shown(envelope.get('step'))}  risk {shown(envelope.get('risk'))}  revision "
        f"{shown(envelope.get('revision', 1))}",
        f"{quorum_words(envelope.get('quorum'))}  expires "
        f"{shown(display_time(envelope.get('expires_at')))}  you are {shown(identity)}",
        *requested_by_lines(envelope),
        *budget_lines(envelope.get("budget"), str(envelope.get("pipeline"))),
        *warnings,
        SEPARATOR,
        *body,
        SEPARATOR,
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Choices:
    """What an approver may type at a prompt: at risk ``low`` or ``normal`` one key (``a``,
    ``s``, ``e``) or the word; at any other risk only the whole word (``approve``, ``skip``,
    ``edit``/``adjust``), so no stray key approves a high-risk action."""

    risk: str
    whole_words: bool

    @classmethod
    def for_risk(cls, risk: object) -> Choices:
        """The choices at ``risk`` (a dispatch's ``risk`` field; unknown counts as high)."""
        text = shown(risk)
        return cls(text, text not in ONE_KEY_RISKS)

    @property
    def prompt(self) -> str:
        """The question, ending where the answer is typed."""
        if self.whole_words:
            return f"Risk {self.risk}: type the whole word approve, skip or edit: "
        return "[a]pprove, [s]kip or [e]dit (adjust)? "

    @property
    def hint(self) -> str:
        """The line shown after an answer that is not taken."""
        if self.whole_words:
            return f"Not taken: at risk {self.risk} type the whole word approve, skip or edit."
        return "Not taken: type a, s or e (or approve, skip, edit)."

    def parse(self, answer: str) -> str | None:
        """The verb (approve|skip|adjust) ``answer`` means, or None when it is not taken."""
        word = answer.strip().lower()
        if word in WORDS:
            return WORDS[word]
        return None if self.whole_words else KEYS.get(word)


def question(envelope: dict[str, Any], choices: Choices) -> str:
    """The prompt, restating what is decided so that no text inside a draft can pass for it
    (relay review item A): ``Approval ID  PIPELINE/STEP  revision N, draft of K lines above.
    [a]pprove, [s]kip or [e]dit (adjust)? ``."""
    draft = envelope.get("draft") or {}
    count = line_count(str(draft.get("body", "") if isinstance(draft, dict) else ""))
    return (
        f"Approval {shown(envelope.get('approval_id'))}  {shown(envelope.get('pipeline'))}/"
        f"{shown(envelope.get('step'))}  revision {shown(envelope.get('revision', 1))}, "
        f"draft of {_count(count, 'line')} above. {choices.prompt}"
    )


def reason_question(required: bool) -> str:
    """The prompt for a skip's reason (one line)."""
    if required:
        return "Why skip? What should change (required, one line): "
    return "Why skip? What should change (optional, one line; empty for none): "


def verdict(verb: str, status: int, answer: Any) -> str:
    """One line telling the human at the terminal what the gate did with their answer; a
    refusal shows its reason and, when the answer has one, its ``detail``."""
    if status == 200 and isinstance(answer, dict):
        if answer.get("resolved"):
            return f"Recorded: {shown(answer.get('outcome'))}; the approval is resolved."
        return "Recorded; the quorum is not complete yet."
    fields = answer if isinstance(answer, dict) else {}
    reason, outcome, detail = fields.get("reason"), fields.get("outcome"), fields.get("detail")
    tail = (
        f"; the approval was already resolved: {shown(outcome)}."
        if outcome
        else "; the approval timed out without it."
        if reason == "expired"
        else "; the approval is resolved without it."
        if reason in FINAL
        else "."
    )
    said = shown(reason or "refused")
    if isinstance(detail, str):  # e.g. approver_signature_invalid: wrong_operator
        said += f": {shown(detail)}"
    return f"The gate did not record your {verb}: {said} (HTTP {status}){tail}"


def resolved_elsewhere(notice: dict[str, Any]) -> str:
    """How a resolution notice says an approval or a question ended, for the terminal:
    ``Approval 01J… resolved elsewhere: skipped by bob@… (reason: …)``, ``Question 01J…
    resolved elsewhere: answered by bob@…``."""
    kind, outcome = kind_of(notice), notice.get("outcome")
    text = f"{kind.noun} {shown(notice.get(kind.key))} resolved elsewhere: {shown(outcome)}"
    if kind is QUESTION:
        by = notice.get("answered_by")
        return text + (f" by {shown(by)}" if isinstance(by, str) else "")
    deciders = [d for d in notice.get("decided_by") or () if isinstance(d, dict)]
    if outcome in ("approved", "adjusted", "skipped") and deciders:
        last = deciders[-1]
        text += f" by {shown(last.get('identity'))}"
        if isinstance(last.get("on_behalf_of"), str):
            text += f" on behalf of {shown(last['on_behalf_of'])}"
    reason = notice.get("reason")
    if isinstance(reason, str):
        text += f" (reason: {shown(reason)})"
    return text


def greeting(url: str, identities: Sequence[str], interactive: bool) -> str:
    """The relay's first line at the terminal: where it listens, as whom and how it asks."""
    who = f"as {', '.join(identities)}" if identities else "as each dispatch's first approver"
    how = (
        "on this terminal; keys typed before a prompt are discarded"
        if interactive
        else "reading the answers from stdin (not a terminal): one line per prompt, in order"
    )
    return f"hitl-gate relay listening on {url}; asking {who}, {how}. Ctrl-C stops."
