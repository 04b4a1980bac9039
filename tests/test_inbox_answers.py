"""A question's form at the inbox: posted fields -> the typed answer value, checked
with the gate's own rule (``gate.protocol.question.check_value``), errors in words. Pure."""

from __future__ import annotations

from typing import Any

import pytest

from gate.inbox.answers import (
    AnswerInvalid,
    answer_envelope,
    checked_value,
    question_of,
    value_from_form,
)
from gate.inbox.items import item_from
from gate.protocol.answer import parse_answer
from gate.protocol.errors import ProtocolError
from gate.protocol.question import check_value, parse_question

SCHEMA = {
    "type": "object",
    "properties": {
        "supplier": {"type": "string", "title": "Supplier", "minLength": 2},
        "amount": {"type": "number", "minimum": 0},
        "count": {"type": "integer", "maximum": 10},
        "urgent": {"type": "boolean"},
        "country": {"type": "string", "enum": ["DE", "FR"], "enumNames": ["Germany", "France"]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
        "note": {"type": "string"},
    },
    "required": ["supplier", "amount"],
}


def spec(kind: str, **more: Any) -> Any:
    return parse_question(
        {"text": "Which?", "response_type": kind, **more}, max_text_chars=1000, max_options=50
    )


def gate_field(spec_: Any, value: Any) -> str | None:
    """What the gate's own check says of ``value``: None (accepted) or the field it names."""
    try:
        check_value(spec_, value, max_answer_chars=2000)
    except ProtocolError as exc:
        return str(exc.extra["field"])
    return None


def test_free_text_keeps_the_text_with_lf_line_breaks() -> None:
    s = spec("free_text")

    assert checked_value(s, {"value": "line 1\r\nline 2", "csrf": "x"}) == "line 1\nline 2"
    for blank in ({}, {"value": ""}, {"value": " \u3000\n"}):
        with pytest.raises(AnswerInvalid) as exc:
            checked_value(s, blank)
        assert exc.value.field == "value"
        assert "blank" in exc.value.words and exc.value.words.endswith(".")


def test_single_and_multi_choice_take_only_offered_options() -> None:
    one, many = (
        spec("single_choice", options=["Yes", "No"]),
        spec("multi_choice", options=["a", "b", "c"]),
    )

    assert checked_value(one, {"value": "No"}) == "No"
    assert checked_value(many, {"value": ["c", "a"]}) == ["c", "a"]  # in the order sent
    with pytest.raises(AnswerInvalid) as forged:
        checked_value(one, {"value": "Maybe"})
    assert forged.value.words == "Your answer: 'Maybe' is not one of the options."
    with pytest.raises(AnswerInvalid) as none:
        checked_value(one, {})
    assert none.value.words == "Choose one of the options."
    with pytest.raises(AnswerInvalid) as empty:
        checked_value(many, {})
    assert empty.value.words == "Choose at least one of the options."
    with pytest.raises(AnswerInvalid) as twice:
        checked_value(many, {"value": ["a", "a"]})
    assert (twice.value.field, twice.value.words) == ("value[1]", "Choice 2: 'a' is chosen twice.")


def test_a_form_becomes_a_typed_object() -> None:
    s = spec("form", schema=SCHEMA)
    fields = {
        "supplier": "ACME",
        "amount": "12.5",
        "count": "3",
        "urgent": "true",
        "country": "FR",
        "tags": ["a", "c"],
        "note": "",
        "csrf": "not a field",
    }

    value = checked_value(s, fields)

    assert value == {
        "supplier": "ACME",
        "amount": 12.5,
        "count": 3,
        "urgent": True,
        "country": "FR",
        "tags": ["a", "c"],
    }
    assert gate_field(s, value) is None
    minimal = checked_value(s, {"supplier": "ACME", "amount": "0", "country": ""})
    assert minimal == {"supplier": "ACME", "amount": 0, "urgent": False}


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"amount": "1"}, "value.supplier", "\u201cSupplier\u201d is required."),
        (
            {"supplier": "   ", "amount": "1"},
            "value.supplier",
            "\u201cSupplier\u201d must not be blank.",
        ),
        ({"supplier": "A", "amount": "1"}, "value.supplier", None),
        ({"supplier": "ACME", "amount": "twelve"}, "value.amount", None),
        ({"supplier": "ACME", "amount": "-1"}, "value.amount", None),
        ({"supplier": "ACME", "amount": "nan"}, "value.amount", None),
        ({"supplier": "ACME", "amount": "1", "count": "2.5"}, "value.count", None),
        ({"supplier": "ACME", "amount": "1", "count": "11"}, "value.count", None),
        ({"supplier": "ACME", "amount": "١"}, "value.amount", None),
        ({"supplier": "ACME", "amount": "1", "count": "٣"}, "value.count", None),
        ({"supplier": "ACME", "amount": "1", "count": "9" * 30}, "value.count", None),
        ({"supplier": "ACME", "amount": "1e300"}, "value.amount", None),
        ({"supplier": "ACME", "amount": "1", "country": "XX"}, "value.country", None),
        ({"supplier": "ACME", "amount": "1", "tags": ["a", "z"]}, "value.tags", None),
    ],
)
def test_a_bad_form_is_refused_as_the_gate_refuses_it(
    fields: dict[str, Any], field: str, words: str | None
) -> None:
    s = spec("form", schema=SCHEMA)

    with pytest.raises(AnswerInvalid) as exc:
        checked_value(s, fields)

    assert exc.value.field == field
    assert gate_field(s, value_from_form(s, fields)) == field  # both say the same
    assert "value." not in exc.value.words  # said with the field's title, not its JSON path
    if words is not None:
        assert exc.value.words == words


def test_the_envelope_answers_the_stored_question() -> None:
    dispatch = {
        "protocol": "hitl/v0",
        "kind": "question",
        "question_id": "01Q",
        "pipeline": "p",
        "step": "ask",
        "version": 2,
        "question": {"text": "Which?", "response_type": "single_choice", "options": ["x", "y"]},
        "request_hash": "sha256:" + "ab" * 32,
        "approvers": ["alice@example.com"],
        "callback": {"url": "http://127.0.0.1:1/hitl/v0/callback", "nonce": "n-2"},
    }
    row = {
        "approval_id": "01Q",
        "kind": "question",
        "revision": 2,
        "nonce": "n-2",
        "payload_hash": dispatch["request_hash"],
        "state": "pending",
        "expires_at": 10**13,
        "received_at": 0,
        "updated_seq": 1,
        "previous_body": None,
        "outcome": None,
    }
    item = item_from(row, dispatch, 0)

    body = answer_envelope(item, checked_value(question_of(item), {"value": "y"}), "alice", 0)

    parsed = parse_answer(body)  # the gate's check 5
    assert (parsed.question_id, parsed.nonce, parsed.request_hash, parsed.value) == (
        "01Q",
        "n-2",
        dispatch["request_hash"],
        "y",
    )
    assert (parsed.approver_id, parsed.approver_channel) == ("alice", "inbox")
