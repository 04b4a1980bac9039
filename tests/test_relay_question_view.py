"""The reference relay's question screen and typed-answer parsers: pure, no I/O."""

from __future__ import annotations

import pytest

from gate.tools.reference_relay.question_view import (
    OMIT,
    answer_prompt,
    field_prompt,
    parse_choice,
    parse_field,
    render_question,
)
from gate.tools.reference_relay.view import GUTTER

OPTIONS = ["Acme", "Globex", "Initech"]


def dispatch(question: dict) -> dict:
    return {
        "kind": "question",
        "question_id": "01QID",
        "pipeline": "p",
        "step": "ask",
        "risk": "normal",
        "version": 2,
        "expires_at": "2030-01-01T00:00:00Z",
        "question": question,
    }


@pytest.mark.parametrize(
    ("text", "multi", "value", "hint"),
    [
        pytest.param("2", False, "Globex", None, id="single"),
        pytest.param(" 3 ", False, "Initech", None, id="single-spaces"),
        pytest.param("1,3", True, ["Acme", "Initech"], None, id="multi"),
        pytest.param("1, 1", True, ["Acme", "Acme"], None, id="multi-twice-left-to-check"),
        pytest.param("4", False, None, "Not taken: type one number from 1 to 3.", id="range"),
        pytest.param("²", False, None, "Not taken: type one number from 1 to 3.", id="superscript"),
        pytest.param("1,2", False, None, "Not taken: type one number from 1 to 3.", id="two"),
        pytest.param(
            "Acme", True, None, "Not taken: type numbers, comma-separated, from 1 to 3.", id="word"
        ),
    ],
)
def test_question_view_parse_choice(text, multi, value, hint):
    typed = parse_choice(text, OPTIONS, multi)

    assert (typed.value, typed.hint) == (value, hint)


@pytest.mark.parametrize(
    ("prop", "required", "text", "value", "hint"),
    [
        ({"type": "string"}, True, "2026-114", "2026-114", None),
        ({"type": "string"}, False, "", OMIT, None),
        ({"type": "string"}, True, "", "", None),  # check_value says why
        ({"type": "integer"}, True, "12", 12, None),
        ({"type": "integer"}, True, "12.5", None, "Not taken: type a whole number."),
        ({"type": "number"}, True, "12.5", 12.5, None),
        ({"type": "number"}, True, "nan", None, "Not taken: type a number."),
        ({"type": "integer"}, True, "٣", None, "Not taken: type a whole number."),
        ({"type": "number"}, True, "1_0", None, "Not taken: type a number."),
        (
            {"type": "string", "enum": ["EUR", "USD"]},
            True,
            "²",
            None,
            "Not taken: type one number from 1 to 2.",
        ),
        ({"type": "boolean"}, True, "Yes", True, None),
        ({"type": "boolean"}, True, "n", False, None),
        ({"type": "boolean"}, True, "maybe", None, "Not taken: type yes or no."),
        ({"type": "string", "enum": ["EUR", "USD"]}, True, "2", "USD", None),
        (
            {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}},
            True,
            "3,1",
            ["c", "a"],
            None,
        ),
    ],
)
def test_question_view_parse_field_converts_by_type(prop, required, text, value, hint):
    typed = parse_field(text, prop, required)

    assert (typed.value, typed.hint) == (value, hint)


def test_question_view_shows_the_question_apart_with_options_numbered():
    screen = render_question(
        dispatch(
            {
                "text": "Which supplier?\nThey quoted within 2 %.",
                "reason": "two quotes",
                "response_type": "single_choice",
                "options": ["Acme", "Evil\nQUESTION 01FAKE"],
            }
        ),
        "alice@example.com",
    )

    assert "QUESTION 01QID  p/ask  risk normal  version 2" in screen
    assert "  expires 2030-01-01T00:00:00.000Z  " in screen
    assert "Approval" not in screen
    assert "why it is asked: two quotes" in screen
    assert f"{GUTTER}Which supplier?\n{GUTTER}They quoted within 2 %." in screen
    assert "  1) Acme\n  2) Evil<U+000A>QUESTION 01FAKE\n" in screen


def test_question_view_form_fields_with_types_and_limits():
    screen = render_question(
        dispatch(
            {
                "text": "PO details?",
                "response_type": "form",
                "schema": {
                    "type": "object",
                    "properties": {
                        "po": {"type": "string", "title": "PO number", "maxLength": 20},
                        "amount": {"type": "integer", "minimum": 1, "maximum": 100},
                        "urgent": {"type": "boolean"},
                    },
                    "required": ["po", "amount"],
                },
            }
        ),
        "alice@example.com",
    )

    assert "  po (PO number): string, 0 to 20 characters, required" in screen
    assert "  amount: integer, 1 to 100, required" in screen
    assert "  urgent: yes or no, optional: empty line to leave out" in screen


def test_question_view_prompt_names_the_question_and_the_range():
    prompt = answer_prompt(
        dispatch({"text": "Which?", "response_type": "multi_choice", "options": OPTIONS})
    )

    assert prompt == (
        "Question 01QID version 2, text of 1 line(s) above. "
        "Type the numbers of your choices, comma-separated (1-3): "
    )


def test_question_screen_rule_is_plain_ascii_and_no_question_marks() -> None:
    screen = render_question(dispatch({"text": "Why?", "response_type": "free_text"}), "a@x")

    rule = screen.splitlines()[1]
    assert rule.isascii() and "?" not in rule and len(rule) == 72


def test_question_screen_counts_hidden_characters_everywhere_in_question_words() -> None:
    question = {
        "text": "Pick\u202e",  # 1
        "reason": "because\nreally",  # 1 (newline, on one line)
        "response_type": "form",
        "schema": {
            "type": "object",
            "properties": {
                "who": {
                    "type": "string",
                    "enum": ["a", "b"],
                    "enumNames": ["A\x1b[2K", "B"],  # 1
                    "title": "Who\u200b",  # 1
                }
            },
            "required": ["who"],
        },
    }

    screen = render_question(dispatch(question), "a@x")

    assert (
        "warning: the question holds 4 control or invisible characters, shown as <U+XXXX>; it "
        "is asked, and your answer recorded against it, exactly as sent"
    ) in screen
    assert "draft" not in screen


def test_question_screen_options_hidden_characters_are_counted() -> None:
    question = {"text": "Pick", "response_type": "single_choice", "options": ["a\tb", "c\x7f"]}

    assert "holds 2 control" in render_question(dispatch(question), "a@x")


def test_form_field_prompt_leads_with_the_title() -> None:
    prop = {"type": "integer", "title": "Amount in EUR", "minimum": 1, "maximum": 100}

    assert field_prompt("amount", prop, True) == (
        "Amount in EUR [amount] (integer, 1 to 100, required): "
    )
    assert field_prompt("amount", {"type": "integer"}, True) == "amount (integer, required): "


def test_question_view_names_who_asked():
    asked = {**dispatch({"text": "Which PO?", "response_type": "free_text"}), "requested_by": "bob"}

    screen = render_question(asked, "alice@example.com")
    anonymous = render_question({**asked, "requested_by": None}, "alice@example.com")

    assert screen.split("\n")[4] == "requested by bob"
    assert "requested by" not in anonymous
