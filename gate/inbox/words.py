"""What the inbox's pages say in words: time left, quorum progress, a budget,
the gate's answer to a decision, a question's form fields. Pure: ``now`` is an argument."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gate.protocol.form_schema import parse_schema
from gate.protocol.numbers import in_range, is_json_number, number_text

MAX_FORM_OPTIONS = 1000
"""Bound on a form's enum when the inbox reads a schema (the gate's own bound is lower)."""


def time_left(expires_at_ms: int, now_ms: int) -> str:
    """``"expired"``, ``"less than a minute"``, ``"42 min"``, ``"3 h 5 min"``, ``"2 d 4 h"``."""
    left = expires_at_ms - now_ms
    if left <= 0:
        return "expired"
    minutes = left // 60_000
    if minutes < 1:
        return "less than a minute"
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def quorum(collected: int, required: int) -> str:
    """``"1 of 2"`` approvals collected of those the step needs."""
    return f"{collected} of {required}"


def _amount(value: Any, unit: str) -> str | None:
    """``value`` with at most 6 decimals; a number beyond ``in_range`` as its exact text."""
    if not is_json_number(value) or (isinstance(value, float) and not math.isfinite(value)):
        return None
    text = f"{float(value):.6f}".rstrip("0").rstrip(".") if in_range(value) else number_text(value)
    return f"{text} {unit}".strip()


def budget(obj: Mapping[str, Any] | None) -> list[str]:
    """The dispatch's ``budget`` (docs/protocol.md) as lines: ``"today: 4.12 EUR of 20
    EUR"``, ``"this pipeline: 0.38 EUR of 2 EUR"``, ``"this request: 1.5 EUR"``; nothing
    for what is absent or not a finite number."""
    if not isinstance(obj, Mapping):
        return []
    raw_unit = obj.get("unit")
    unit = raw_unit if isinstance(raw_unit, str) else ""
    lines = []
    for label, spent, cap in (
        ("today", "spent_today", "cap_today"),
        ("this pipeline", "spent_pipeline", "cap_pipeline"),
        ("this request", "this_request", ""),  # no cap
    ):
        have, limit = _amount(obj.get(spent), unit), _amount(cap and obj.get(cap), unit)
        if have is not None:
            lines.append(f"{label}: {have}" + ("" if limit is None else f" of {limit}"))
    return lines


ANSWERS = {
    "recorded": "Your decision was recorded. The step needs more approvals before it resolves.",
    "resolved": "Your decision was recorded and the approval is resolved.",
    "superseded": "This revision was replaced by a newer one: open the item again to decide on it.",
    "expired": "The approval expired before your decision reached the gate; nothing was recorded.",
    "sent": "Sent to the gate; the gate's answer was not received. The gate has it if it"
    " arrived: check the item before deciding again.",
    "unreachable": "The gate could not be reached; it may not have your decision. Open the"
    " item and decide again.",
    "already_decided": "You have already decided on this revision; nothing changed.",
    "answered": "Your answer was recorded and the question is resolved.",
    "already_resolved": "The approval was already resolved; nothing was recorded.",
    "cancelled": "The approval was cancelled; nothing was recorded.",
    "rate_limited": "Over the gate's limit of decisions a minute from you; nothing was"
    " recorded: decide again in a minute.",
    "not_sent": "Not sent: the inbox stopped before it sent this one; nothing was recorded.",
    "unknown": "The gate no longer has this request (its database may have been restored from"
    " a backup taken before it); nothing was recorded, and the inbox closed it.",
}
# what a question's answer was told when the gate had closed the question meanwhile
QUESTION_ANSWERS = {
    "expired": "The question expired before your answer reached the gate; nothing was recorded.",
    "already_resolved": "The question was already answered or closed; nothing was recorded.",
    "cancelled": "The question was cancelled; nothing was recorded.",
}


def gate_code(answer: Mapping[str, Any]) -> str:
    """The reason code of the gate's refusal ``answer`` (``error``, else ``reason``)."""
    return str(answer.get("error") or answer.get("reason") or "")


def answer_words(status: int, answer: Mapping[str, Any], decision: str = "") -> tuple[str, str]:
    """The gate's answer to a posted decision (docs/protocol.md, "Decisions": checks 8, 9,
    14 and "recorded") as ``(kind, sentence)``: ``kind`` one of ``ANSWERS``'s keys or
    ``refused``. 200 ``{"status":"recorded","resolved":true|false}`` is resolved or recorded;
    a refusal is named by its reason code (``error``, else ``reason``), an
    ``approver_signature_invalid`` by its ``detail`` in words (``refusal_words``). Status 0 is a
    decision sent whose answer never came back (``sent``), or of a bulk approval never sent
    (``not_sent``: the inbox stopped mid-batch). A recorded ``decision`` ``answer``
    (a question's) is ``resolved``, said as an answer, not an approval; 404
    ``unknown_approval`` is ``unknown`` (the gate no longer has the request), 429
    ``rate_limited`` its own kind (the gate's limit: decide again in a minute); a closed question
    is said as a question (``QUESTION_ANSWERS``)."""
    if status == 0:
        kind = {"gate_unreachable": "unreachable", "not_sent": "not_sent"}.get(
            str(answer.get("error")), "sent"
        )
        return kind, ANSWERS[kind]
    if 200 <= status < 300 and decision == "answer":
        return "resolved", ANSWERS["answered"]
    if 200 <= status < 300:
        kind = "resolved" if answer.get("resolved") is True else "recorded"
        return kind, ANSWERS[kind]
    code = gate_code(answer)
    kind = "already_decided" if code == "duplicate" else code
    if kind == "unknown_approval":
        return "unknown", ANSWERS["unknown"]
    if kind == "rate_limited":
        return kind, ANSWERS[kind]
    if kind in ("superseded", "expired", "already_resolved", "already_decided"):
        if kind == "already_resolved" and answer.get("outcome") == "cancelled":
            kind = "cancelled"
        said = QUESTION_ANSWERS if decision == "answer" else ANSWERS
        return kind, said.get(kind, ANSWERS[kind])
    return "refused", refusal_words(code, answer.get("detail"))


def bulk_heading(kinds: list[str]) -> str:
    """What happened to a bulk approval, from each item's ``answer_words`` kind: ``"All 5
    approved"``, ``"3 of 5 approved"``, ``"None of 2 approved"``; when an approval was
    recorded but its step needs another approver (``recorded``), it is not said approved:
    ``"4 decisions recorded: 3 approved, 1 waits for another approver"`` (``"4 of 5
    decisions recorded: …"`` when not all were); plus ``", 1 not answered"`` for decisions
    whose answer never came back (``sent``, ``unreachable``) and ``", 13 not sent: nothing
    was recorded for them"`` for items of a batch the inbox never sent (``not_sent``); the
    items the gate's per-approver limit refused (``rate_limited``) are said with what to do:
    ``", 5 over the gate's limit of decisions a minute: select them again in a minute"``."""
    total = len(kinds)
    approved = kinds.count("resolved")
    waits = kinds.count("recorded")
    done = approved + waits
    unknown = sum(k in ("sent", "unreachable") for k in kinds)
    if waits:
        of = f"{done} decisions" if done == total else f"{done} of {total} decisions"
        parts = [f"{approved} approved"] if approved else []
        parts.append(f"{waits} {'waits' if waits == 1 else 'wait'} for another approver")
        said = f"{of} recorded: " + ", ".join(parts)
    elif done == total:
        said = f"All {total} approved"
    elif done == 0:
        said = f"None of {total} approved"
    else:
        said = f"{done} of {total} approved"
    said += f", {unknown} not answered" if unknown else ""
    limited = kinds.count("rate_limited")
    if limited:
        it = "them" if limited > 1 else "it"
        said += f", {limited} over the gate's limit of decisions a minute: select {it} again in"
        said += " a minute"
    unsent = kinds.count("not_sent")
    them = "them" if unsent > 1 else "it"
    return said + (f", {unsent} not sent: nothing was recorded for {them}" if unsent else "")


# the ``detail`` of 403 ``approver_signature_invalid`` in words (docs/protocol.md "Approver
# signatures"): what the approver can do about it. One table: other
# refusals worded for the pages go here too.
SIGNATURE_DETAILS = {
    "bad_signature": "the signature does not match your passkey",
    "challenge_mismatch": "your passkey signed something other than this decision",
    "origin_mismatch": "the gate does not accept passkeys used at this inbox's address"
    " (its webauthn.origins must list it)",
    "rp_id_mismatch": "your passkey belongs to another site",
    "user_not_present": "the authenticator did not confirm you were there",
    "user_not_verified": "the authenticator did not verify you (PIN or biometrics)",
    "counter_went_backwards": "its signature counter did not go up, as a copied passkey's"
    " would not",
    "counter_regressed": "its signature counter did not go up, as a copied passkey's would not",
    "wrong_type": "it is not the kind of credential the gate enrolled for you",
    "not_in_batch": "this item was not among those your passkey signed",
    "malformed": "the passkey's answer was malformed",
    "unknown_credential": "the gate does not know this passkey: ask for a new invite",
    "revoked": "this passkey was revoked at the gate: ask for a new invite",
    "wrong_operator": "this passkey belongs to another approver: sign in with your own",
    "rp_unavailable": "passkeys are not set up at the gate",
}
REFUSALS = {
    "approver_signature_required": "The gate requires your passkey's signature on this step.",
    "approver_not_allowed": "The gate does not count you among this step's approvers.",
    "self_approval": "The gate does not let you approve your own request.",
    "reason_required": "This step requires a reason to skip.",
    "payload_hash_mismatch": "The draft the inbox showed is not the one the gate holds.",
}
NOTHING = " Nothing was recorded."


def refusal_words(code: str, detail: Any = None) -> str:
    """A refusal of the gate (docs/protocol.md "Decisions", "Approver signatures") in words,
    ending "Nothing was recorded.": 403 ``approver_signature_invalid`` says its ``detail``
    in words; a few reasons have their own sentence; any other names its
    reason code in quotes (never a status number)."""
    if code == "approver_signature_invalid":
        why = SIGNATURE_DETAILS.get(detail) if isinstance(detail, str) else None
        said = "The gate refused your passkey's signature" + ("." if why is None else f": {why}.")
        return said + NOTHING
    if code in REFUSALS:
        return REFUSALS[code] + NOTHING
    if code:
        return f"The gate refused the decision (it said \u201c{code}\u201d)." + NOTHING
    return "The gate refused the decision." + NOTHING


def outcome_title(
    kind: str,
    decision: str,
    revision: int,
    progress: tuple[int, int] | None = None,
    sent: str | None = None,
) -> str | None:
    """The decision page's title naming what the approver's decision did: ``Approved``,
    ``Approved: recorded, 1 of 2`` (a quorum; ``progress`` is (collected, required), None
    when unknown), ``Skipped``, ``Adjusted: revision N+1``, ``Answered: Globex AG`` (an
    answer; ``sent`` is its value in words, ``decided.sent_words``); None when the gate did
    not record it (``kind`` other than ``resolved``/``recorded``: the page keeps its generic
    title)."""
    if kind not in ("resolved", "recorded"):
        return None
    if decision == "answer":
        return "Answered" if not sent else f"Answered: {sent}"
    if decision == "skip":
        return "Skipped"
    if decision == "adjust":
        return f"Adjusted: revision {revision + 1}"
    if kind == "resolved":
        return "Approved"
    return "Approved: recorded" + ("" if progress is None else f", {quorum(*progress)}")


@dataclass(frozen=True, slots=True)
class Field:
    """One control of a form question: ``name`` (the schema's property), ``label``, optional
    ``description``, ``control`` (``text``, ``email``, ``url``, ``date``, ``number``,
    ``checkbox``, ``select`` or ``checkboxes``), ``required``, HTML limits in ``attrs``
    (minlength, maxlength, min, max, step), ``choices`` ``(value, label)`` and ``limits``:
    what an answer must be, in words (``limits_words``), shown next to the control."""

    name: str
    label: str
    control: str
    required: bool
    description: str | None = None
    attrs: tuple[tuple[str, str], ...] = ()
    choices: tuple[tuple[str, str], ...] = ()
    checked: bool = False
    limits: str | None = None


_FORMATS = {"email": "email", "uri": "url", "date": "date"}
FORMAT_WORDS = {
    "email": "An e-mail address, such as name@example.com.",
    "uri": "A web address, such as https://example.com/page.",
    "date": "A date, as YYYY-MM-DD.",
}


def _span(low: Any, high: Any, unit: str = "") -> str:
    """``2 to 500 characters``, ``at least 2 characters``, ``exactly 3 characters``; the
    bounds as ``number_text`` says them (exact); "" without either."""
    tail = f" {unit}" if unit else ""
    if low is not None and high is not None:
        if low == high:
            return f"exactly {number_text(low)}{tail}"
        return f"{number_text(low)} to {number_text(high)}{tail}"
    if low is not None:
        return f"at least {number_text(low)}{tail}"
    if high is not None:
        return f"at most {number_text(high)}{tail}"
    return ""


def limits_words(prop: Mapping[str, Any], required: bool) -> str | None:
    """What an answer to a parsed form property must be, in sentences, before any answer
    was refused: ``2 to 500 characters.``, ``A whole number from 1 to 9.``, ``An e-mail
    address, such as name@example.com.``, ``Choose at least 1.``, ``Choose one.`` (a
    ``required`` list); None when nothing limits it (an optional text, a checkbox). That a
    field is required its label says."""
    said: list[str] = []
    kind = prop.get("type")
    if "enum" in prop:
        said += ["Choose one."] if required else []
    elif kind == "string":
        length = _span(prop.get("minLength"), prop.get("maxLength"), "characters")
        said += [length[0].upper() + length[1:] + "."] if length else []
        said += [FORMAT_WORDS[prop["format"]]] if "format" in prop else []
    elif kind in ("number", "integer"):
        noun = "A whole number" if kind == "integer" else "A number"
        low, high = prop.get("minimum"), prop.get("maximum")
        span = _span(low, high)
        if low is not None and high is not None and low != high:
            span = "from " + span
        elif span:
            span = "of " + span
        said.append(f"{noun} {span}".rstrip() + ".")
    elif kind == "array":
        span = _span(prop.get("minItems"), prop.get("maxItems"))
        said += [f"Choose {span}."] if span else []
    return " ".join(said) or None


def _limits(
    prop: Mapping[str, Any], pairs: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    found = ((attr, prop.get(key)) for key, attr in pairs)
    # number_text is exact: "g" rounds 2**53 to 9.0072e+15
    return tuple((attr, number_text(value)) for attr, value in found if in_range(value))


def form_fields(schema: Any) -> list[Field]:
    """A form question's schema (read with ``gate.protocol.form_schema``) as the
    controls the question page shows, in the schema's order, with the same limits as HTML
    attributes. Raises ``ProtocolError`` (400 ``invalid_schema``) for a schema the gate
    would not have sent."""
    parsed = parse_schema(schema, max_options=MAX_FORM_OPTIONS)
    required = set(parsed.get("required", ()))
    fields = []
    for name, prop in parsed["properties"].items():
        label = prop.get("title") or name
        common: dict[str, Any] = {
            "name": name,
            "label": label,
            "description": prop.get("description"),
            "required": name in required,
            "limits": limits_words(prop, name in required),
        }
        kind = prop.get("type")
        if "enum" in prop:
            labels = prop.get("enumNames") or prop["enum"]
            choices = tuple(zip(prop["enum"], labels, strict=True))
            fields.append(Field(control="select", choices=choices, **common))
        elif kind == "string":
            pairs = (("minLength", "minlength"), ("maxLength", "maxlength"))
            control = _FORMATS.get(prop.get("format", ""), "text")
            fields.append(Field(control=control, attrs=_limits(prop, pairs), **common))
        elif kind in ("number", "integer"):
            attrs = _limits(prop, (("minimum", "min"), ("maximum", "max")))
            attrs += (("step", "1" if kind == "integer" else "any"),)
            fields.append(Field(control="number", attrs=attrs, **common))
        elif kind == "boolean":
            common["required"] = False  # unchecked is an answer: false
            fields.append(Field(control="checkbox", checked=prop.get("default") is True, **common))
        else:
            values = prop["items"]["enum"]
            choices = tuple((v, v) for v in values)
            common["required"] = False  # minItems is checked by the gate, said in the label
            attrs = _limits(prop, (("minItems", "min"), ("maxItems", "max")))
            fields.append(Field(control="checkboxes", choices=choices, attrs=attrs, **common))
    return fields
