"""What the inbox's pages say in words (issue 17): time left, quorum progress, a budget,
the gate's answer to a decision, a question's form fields. Pure: ``now`` is an argument."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gate.protocol.form_schema import is_number, parse_schema

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
    if not is_number(value) or not math.isfinite(float(value)):
        return None
    text = f"{float(value):.6f}".rstrip("0").rstrip(".")
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
    ):
        have, limit = _amount(obj.get(spent), unit), _amount(obj.get(cap), unit)
        if have is not None and limit is not None:
            lines.append(f"{label}: {have} of {limit}")
        elif have is not None:
            lines.append(f"{label}: {have}")
    this = _amount(obj.get("this_request"), unit)
    if this is not None:
        lines.append(f"this request: {this}")
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
    "already_resolved": "The approval was already resolved; nothing was recorded.",
    "cancelled": "The approval was cancelled; nothing was recorded.",
}


# the ``detail`` of 403 ``approver_signature_invalid`` in words (docs/protocol.md "Approver
# signatures"; issue 17 finding 7): what the approver can do about it. One table: other
# refusals worded for the pages go here too.
SIGNATURE_WORDS = {
    "revoked": "your passkey was revoked: ask for a new invite",
    "unknown_credential": "the gate does not know this passkey: ask for a new invite",
    "wrong_operator": "this passkey is enrolled for another approver: sign in with your own",
    "counter_regressed": "your passkey's signature counter went backwards: it may have been"
    " copied; ask your administrator",
    "counter_went_backwards": "your passkey's signature counter went backwards: it may have"
    " been copied; ask your administrator",
    "origin_mismatch": "this inbox is not allowed by the gate's passkey settings"
    " (webauthn.origins)",
    "rp_id_mismatch": "your passkey is for another site than the gate's passkey settings"
    " (webauthn.rp_id)",
    "rp_unavailable": "the gate has no passkey settings (its webauthn section is off)",
    "user_not_verified": "your passkey did not verify you (PIN or biometrics): try again",
    "user_not_present": "your passkey was not touched: try again",
    "challenge_mismatch": "the signature is not over this decision: reload the page and try again",
    "not_in_batch": "the signature is not over this decision: reload the page and try again",
    "bad_signature": "your passkey's signature did not verify: try again",
    "wrong_type": "the gate takes another kind of signature for this step",
    "malformed": "the inbox sent a signature the gate could not read",
}


def answer_words(status: int, answer: Mapping[str, Any]) -> tuple[str, str]:
    """The gate's answer to a posted decision (docs/protocol.md, "Decisions": checks 8, 9,
    14 and "recorded") as ``(kind, sentence)``: ``kind`` one of ``ANSWERS``'s keys or
    ``refused``. 200 ``{"status":"recorded","resolved":true|false}`` is resolved or recorded;
    a refusal is named by its reason code (``error``, else ``reason``), an
    ``approver_signature_invalid`` by its ``detail`` in words (``SIGNATURE_WORDS``). Status 0 is a
    decision sent whose answer never came back (``sent``)."""
    if status == 0:
        kind = "unreachable" if answer.get("error") == "gate_unreachable" else "sent"
        return kind, ANSWERS[kind]
    if 200 <= status < 300:
        kind = "resolved" if answer.get("resolved") is True else "recorded"
        return kind, ANSWERS[kind]
    code = str(answer.get("error") or answer.get("reason") or "")
    kinds = {
        "superseded": "superseded",
        "expired": "expired",
        "already_resolved": "already_resolved",
    }
    kinds |= {"duplicate": "already_decided", "already_decided": "already_decided"}
    if code in kinds:
        kind = kinds[code]
        if kind == "already_resolved" and answer.get("outcome") == "cancelled":
            kind = "cancelled"
        return kind, ANSWERS[kind]
    signature = SIGNATURE_WORDS.get(str(answer.get("detail") or ""))
    if code == "approver_signature_invalid" and signature is not None:
        return "refused", f"The gate refused the decision: {signature}."
    return "refused", f"The gate refused the decision ({status} {code or 'no reason given'})."


@dataclass(frozen=True, slots=True)
class Field:
    """One control of a form question: ``name`` (the schema's property), ``label``, optional
    ``description``, ``control`` (``text``, ``email``, ``url``, ``date``, ``number``,
    ``checkbox``, ``select`` or ``checkboxes``), ``required``, HTML limits in ``attrs``
    (minlength, maxlength, min, max, step) and ``choices`` ``(value, label)``."""

    name: str
    label: str
    control: str
    required: bool
    description: str | None = None
    attrs: tuple[tuple[str, str], ...] = ()
    choices: tuple[tuple[str, str], ...] = ()
    checked: bool = False


_FORMATS = {"email": "email", "uri": "url", "date": "date"}


def _limits(
    prop: Mapping[str, Any], pairs: tuple[tuple[str, str], ...]
) -> tuple[tuple[str, str], ...]:
    out = []
    for key, attr in pairs:
        value: Any = prop.get(key)
        if is_number(value) and math.isfinite(float(value)):
            out.append((attr, format(value, "g") if isinstance(value, float) else str(value)))
    return tuple(out)


def form_fields(schema: Any) -> list[Field]:
    """A form question's schema (issue 15, read with ``gate.protocol.form_schema``) as the
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
