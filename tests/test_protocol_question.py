"""The protocol layer of questions (pure, fast tier): the question fields and the form
schema with their exact JSON paths, the typing of answers (check 12), the answer envelope
(check 5), the routing of a callback body, the builders, and conformance/vectors/question.json
(hashes recomputed here with json and hashlib alone, from the contract's words)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from gate.protocol import signing
from gate.protocol.answer import Answer, build_answer, is_answer, parse_answer, parse_callback
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import Decision, build_decision, decode_json, parse_decision
from gate.protocol.errors import ProtocolError
from gate.protocol.followup import build_question_notice
from gate.protocol.form_schema import MAX_PROPERTIES, parse_schema
from gate.protocol.question import (
    QuestionSpec,
    answer_text,
    build_question_dispatch,
    check_value,
    parse_question,
    request_hash,
    value_hash,
)
from tests.test_protocol import VECTORS, independent_header, load_cases

QID = "01KDWZ8B00J3Q9V5X7Z2M4N6PR"
T_MS = 1767225600000
CASES = load_cases("question.json")


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _question(obj: dict[str, Any], max_options: int = 50) -> QuestionSpec:
    return parse_question(obj, max_text_chars=1000, max_options=max_options)


def _refusal(call: Any, *args: Any, **kwargs: Any) -> tuple[int, str, object, str]:
    with pytest.raises(ProtocolError) as info:
        call(*args, **kwargs)
    err = info.value
    return err.status, err.code, err.extra.get("field"), err.message


FORM = {"type": "object", "properties": {"a": {"type": "string"}}}


# --------------------------------------------------------------------------- the vectors


def test_question_vectors_file_well_formed() -> None:
    data = json.loads((VECTORS / "question.json").read_text(encoding="utf-8"))
    assert set(data) == {"description", "cases"}
    ids = [case["id"] for case in data["cases"]]
    assert len(ids) == len(set(ids))
    kinds = {case["question"]["response_type"] for case in data["cases"] if "request_hash" in case}
    assert kinds == {"free_text", "single_choice", "multi_choice", "form"}


@pytest.mark.parametrize("case", CASES)
def test_vector_question(case: dict[str, Any]) -> None:
    if "request_hash" in case:
        obj = {"question_id": case["question_id"], "version": case["version"]}
        obj["question"] = case["question"]
        assert _canonical(obj) == case["canonical_utf8"].encode("utf-8")
        digest = hashlib.sha256(case["canonical_utf8"].encode("utf-8")).hexdigest()
        assert case["request_hash"] == "sha256:" + digest
        spec = _question(case["question"])
        assert spec.to_json() == case["question"]
        assert request_hash(case["question_id"], case["version"], spec) == case["request_hash"]
    elif "notice" in case:  # a question's resolution notice (new-user finding A2)
        body = wire_json(build_question_notice(**case["notice"]))
        assert body == case["body_utf8"].encode("utf-8")
        assert independent_header(case["secret"], case["t"], body) == case["header"]
        assert signing.sign(case["secret"], case["t"], body) == case["header"]
        assert "approval_id" not in json.loads(body)
    elif "value_hash" in case:
        assert _canonical(case["value"]) == case["canonical_utf8"].encode("utf-8")
        salt = bytes.fromhex(case["salt"])
        digest = hashlib.sha256(salt + case["canonical_utf8"].encode("utf-8")).hexdigest()
        assert case["value_hash"] == "sha256:" + digest == value_hash(case["value"], salt=salt)
        assert value_hash(case["value"], salt=bytes(16)) != case["value_hash"]
    else:
        spec = _question(case["question"])
        cap = case["max_answer_chars"]
        if case["accepted"]:
            assert check_value(spec, case["value"], max_answer_chars=cap) == case["value"]
        else:
            expected = (case["status"], case["reason"], case["field"], case["message"])
            assert _refusal(check_value, spec, case["value"], max_answer_chars=cap) == expected


def test_request_hash_changes_with_every_part() -> None:
    spec = _question({"text": "Wer?", "response_type": "single_choice", "options": ["a", "b"]})
    other = _question({"text": "Wer?", "response_type": "single_choice", "options": ["b", "a"]})
    hashes = {
        request_hash(QID, 1, spec),
        request_hash(QID, 2, spec),
        request_hash(QID[:-1] + "Q", 1, spec),
        request_hash(QID, 1, other),
    }
    assert len(hashes) == 4


# --------------------------------------------------------------------------- parse_question


def test_parse_question_every_type_and_round_trip() -> None:
    bodies = [
        {"text": "PO?", "reason": "missing", "response_type": "free_text"},
        {"text": "Which?", "response_type": "single_choice", "options": ["a", "b"]},
        {"text": "Which?", "response_type": "multi_choice", "options": ["a"]},
        {"text": "Fill", "response_type": "form", "schema": {**FORM, "required": ["a"]}},
    ]
    for body in bodies:
        spec = _question(body)
        assert spec.to_json() == body
        assert QuestionSpec.from_json(json.loads(_canonical(spec.to_json()))) == spec
    assert "reason" not in _question(bodies[1]).to_json()  # left out, not null


FT, SC, MC = "free_text", "single_choice", "multi_choice"


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"text": None, "response_type": FT}, "text", "text must be a string"),
        ({"text": " \u3000", "response_type": FT}, "text", "text must not be blank"),
        ({"reason": 5, "response_type": FT}, "reason", "reason must be a string"),
        ({"reason": "r" * 2001, "response_type": FT}, "reason",
         "reason is longer than 2000 characters"),
        ({"response_type": "yes_no"}, "response_type",
         "response_type must be one of free_text, single_choice, multi_choice, form"),
        ({"response_type": SC}, "options", "options is required for single_choice"),
        ({"response_type": FT, "options": ["a"]}, "options",
         "options is only for single_choice and multi_choice"),
        ({"response_type": MC, "options": []}, "options",
         "options must be a non-empty list of strings"),
        ({"response_type": MC, "options": ["a", "b", "c", "d"]}, "options",
         "options has more than 3 options"),
        ({"response_type": MC, "options": ["a", " "]}, "options[1]",
         "options[1] must be a non-blank string"),
        ({"response_type": MC, "options": ["a", "b", "a"]}, "options[2]",
         "options[2] repeats 'a'"),
        ({"response_type": SC, "options": ["x" * 201]}, "options[0]",
         "options[0] is longer than 200 characters"),
        ({"response_type": "form"}, "schema", "schema is required for form"),
        ({"response_type": FT, "schema": FORM}, "schema", "schema is only for form"),
    ],
)  # fmt: skip
def test_parse_question_refusals(body: dict[str, Any], field: str, message: str) -> None:
    reason = "invalid_" + field.split("[")[0]
    got = _refusal(_question, {"text": "q", **body}, max_options=3)
    assert got == (400, reason, field, message)


def test_parse_question_text_too_long_is_413_and_prefix_names_the_path() -> None:
    got = _refusal(parse_question, {"text": "abcd"}, max_text_chars=3, max_options=3)
    assert got == (413, "question_too_large", "text", "text is longer than 3 characters")
    body = {"text": "q", "response_type": "single_choice", "options": ["a", "a"]}
    got = _refusal(parse_question, body, max_text_chars=9, max_options=3, prefix="question.")
    assert got[1:3] == ("invalid_options", "question.options[1]")


def _schema_refusal(schema: Any) -> tuple[object, str]:
    body = {"text": "q", "response_type": "form", "schema": schema}
    status, reason, field, message = _refusal(_question, body, max_options=3)
    assert (status, reason) == (400, "invalid_schema")
    return field, message


P = "schema.properties"
A = f"{P}.a"
NUMBER, STRING = {"type": "number"}, {"type": "string"}
MULTI = {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}}


@pytest.mark.parametrize(
    ("schema", "field", "message"),
    [
        ([], "schema", "schema must be an object"),
        ({"type": "array", "properties": {}}, "schema.type", "schema.type must be 'object'"),
        ({**FORM, "$schema": "x"}, "schema.$schema", "schema.$schema is not allowed"),
        ({"type": "object", "properties": {}}, P,
         f"{P} must be an object with at least one property"),
        ({"type": "object", "properties": {"1a": STRING}}, f"{P}.1a",
         f"{P}: '1a' is not a valid name"),
        ({**FORM, "required": "a"}, "schema.required",
         "schema.required must be a list of property names"),
        ({**FORM, "required": ["a", "b"]}, "schema.required[1]",
         "schema.required[1] is not a property of the form"),
        ({**FORM, "required": ["a", "a"]}, "schema.required[1]", "schema.required[1] repeats 'a'"),
    ],
)  # fmt: skip
def test_form_schema_refusals_name_the_path(schema: Any, field: str, message: str) -> None:
    assert _schema_refusal(schema) == (field, message)


@pytest.mark.parametrize(
    ("prop", "field", "message"),
    [
        ("string", "", " must be an object"),
        ({"type": "object"}, ".type",
         ".type must be one of string, number, integer, boolean, array (a list of types such"
         ' as ["string","null"] is not supported: leave the property out of required instead)'),
        ({**STRING, "pattern": "x"}, ".pattern", ".pattern is not allowed for a string"),
        ({**NUMBER, "default": 1}, ".default", ".default is not allowed for a number"),
        ({**STRING, "format": "ipv4"}, ".format", ".format must be email, uri or date"),
        ({**STRING, "minLength": -1}, ".minLength",
         ".minLength must be a non-negative integer up to 2**53 (9007199254740992)"),
        ({**STRING, "minLength": 5, "maxLength": 4}, ".minLength",
         ".minLength is greater than maxLength"),
        ({**NUMBER, "minimum": 5, "maximum": 1}, ".minimum", ".minimum is greater than maximum"),
        ({"type": "integer", "maximum": True}, ".maximum",
         ".maximum must be a number between -2**53 and 2**53 (±9007199254740992)"),
        ({"type": "boolean", "default": "no"}, ".default", ".default must be true or false"),
        ({**STRING, "title": 3}, ".title", ".title must be a string"),
        ({**STRING, "description": "d" * 2001}, ".description",
         ".description is longer than 2000 characters"),
        ({**STRING, "enum": []}, ".enum", ".enum must be a non-empty list of strings"),
        ({**STRING, "enum": ["x", "x"]}, ".enum[1]", ".enum[1] repeats 'x'"),
        ({**STRING, "enum": ["1", "2", "3", "4"]}, ".enum", ".enum has more than 3 entries"),
        ({**STRING, "enum": ["x", "y"], "enumNames": ["X"]}, ".enumNames",
         ".enumNames must have one label per enum value"),
        ({**STRING, "enum": ["x"], "format": "date"}, ".format",
         ".format is not allowed for an enum"),
        ({**MULTI, "items": NUMBER}, ".items", ".items must be {type: string, enum: [...]}"),
        ({**MULTI, "items": {**MULTI["items"], "default": "x"}}, ".items.default",
         ".items.default is not allowed"),
        ({**MULTI, "minItems": 3}, ".minItems", ".minItems is more than the choices"),
        ({**MULTI, "minItems": 2, "maxItems": 1}, ".minItems",
         ".minItems is greater than maxItems"),
    ],
)  # fmt: skip
def test_form_schema_property_refusals_name_the_path(prop: Any, field: str, message: str) -> None:
    schema = {"type": "object", "properties": {"a": prop}}
    assert _schema_refusal(schema) == (A + field, A + message)


def test_form_schema_path_names_the_property() -> None:
    schema = {"type": "object", "properties": {"amount": {**NUMBER, "minimum": 5, "maximum": 1}}}
    field = f"{P}.amount.minimum"
    assert _schema_refusal(schema) == (field, f"{field} is greater than maximum")


def test_form_schema_property_count_is_bounded() -> None:
    props = {f"p{i}": {"type": "boolean"} for i in range(MAX_PROPERTIES + 1)}
    field, message = _schema_refusal({"type": "object", "properties": props})
    assert (field, message) == (P, f"{P} has more than {MAX_PROPERTIES} properties")
    del props[f"p{MAX_PROPERTIES}"]
    assert _question(
        {"text": "q", "response_type": "form", "schema": {**FORM, "properties": props}}
    )


# --------------------------------------------------------------------------- check_value


def test_check_value_free_text_counts_characters_not_bytes() -> None:
    spec = _question({"text": "q", "response_type": "free_text"})
    assert check_value(spec, "é" * 5, max_answer_chars=5) == "é" * 5
    assert _refusal(check_value, spec, "\ud800", max_answer_chars=5)[2:] == (
        "value",
        "value must be a string (free text)",
    )
    assert check_value(spec, "\x1f", max_answer_chars=5) == "\x1f"  # not White_Space: not blank


def test_check_value_form_optional_string_may_be_empty_required_may_not() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}}
    spec = _question(
        {"text": "q", "response_type": "form", "schema": {**schema, "required": ["a"]}}
    )
    assert check_value(spec, {"a": "x", "b": ""}, max_answer_chars=5) == {"a": "x", "b": ""}
    got = _refusal(check_value, spec, {"a": " "}, max_answer_chars=5)
    assert got == (422, "invalid_value", "value.a", "value.a must not be blank")
    got = _refusal(check_value, spec, {"a": "x", "b": "toolong"}, max_answer_chars=5)
    assert got[2:] == ("value.b", "value.b is longer than 5 characters")


@pytest.mark.parametrize(
    ("address", "ok"),
    [
        ("a@b.co", True),
        ("zoë@exämple.com", True),
        ("a@b", False),
        ("@b.co", False),
        ("a@@b.co", False),
        ("a b@c.co", False),
        ("a@.co", False),
        ("a@b.co.", False),
    ],
)
def test_check_value_email_is_a_plausibility_check(address: str, ok: bool) -> None:
    schema = {"type": "object", "properties": {"e": {"type": "string", "format": "email"}}}
    spec = _question({"text": "q", "response_type": "form", "schema": schema})
    if ok:
        assert check_value(spec, {"e": address}, max_answer_chars=50) == {"e": address}
    else:
        assert _refusal(check_value, spec, {"e": address}, max_answer_chars=50)[2] == "value.e"


def test_check_value_integer_float_with_fraction_and_large_numbers() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer", "maximum": 10}}}
    spec = _question({"text": "q", "response_type": "form", "schema": schema})
    got = _refusal(check_value, spec, {"n": 2.5}, max_answer_chars=5)
    assert got[2:] == ("value.n", "value.n must be an integer")
    assert _refusal(check_value, spec, {"n": 11}, max_answer_chars=5)[3] == (
        "value.n must be at most 10"
    )
    assert check_value(spec, {"n": -(2**53)}, max_answer_chars=5) == {"n": -(2**53)}


@pytest.mark.parametrize("number", ["1e999", "-1e999", "1E400", "123456789e999"])
def test_decode_json_refuses_numbers_too_large_to_be_finite(number: str) -> None:
    raw = b'{"value": {"amount": ' + number.encode() + b"}}"
    got = _refusal(decode_json, raw)
    assert got[:2] == (400, "invalid_json")
    assert got[3] == "body is not valid JSON: a number is too large to be finite"
    assert number not in got[3]
    assert decode_json(b'{"a": 1e308, "b": 10000000000000000000000}') == {"a": 1e308, "b": 10**22}


def test_non_finite_numbers_are_no_numbers_in_a_schema_or_a_value() -> None:
    # decode_json refuses them; these are the checks behind it, for values built in Python
    prop = {"type": "number", "maximum": float("inf")}
    got = _refusal(parse_schema, {"type": "object", "properties": {"n": prop}}, max_options=5)
    assert got[1:3] == ("invalid_schema", "schema.properties.n.maximum")
    schema = {"type": "object", "properties": {"n": {"type": "number"}}}
    spec = _question({"text": "q", "response_type": "form", "schema": schema})
    for bad in (float("inf"), float("-inf"), float("nan")):
        got = _refusal(check_value, spec, {"n": bad}, max_answer_chars=5)
        assert got[:3] == (422, "invalid_value", "value.n")


def test_duplicates_are_named_at_the_first_repeat_even_in_long_lists() -> None:
    options = [f"o{i}" for i in range(999)] + ["o500"]
    body = {"text": "q", "response_type": "single_choice", "options": options}
    got = _refusal(_question, body, max_options=1000)
    assert got[2:] == ("options[999]", "options[999] repeats 'o500'")
    prop = {"type": "string", "enum": options}
    got = _refusal(parse_schema, {"type": "object", "properties": {"e": prop}}, max_options=1000)
    assert got[2:] == (
        "schema.properties.e.enum[999]",
        "schema.properties.e.enum[999] repeats 'o500'",
    )


@pytest.mark.parametrize(
    ("prop", "required", "field"),
    [
        pytest.param({"type": "string", "minLength": 11}, False, "minLength", id="min-over-cap"),
        pytest.param({"type": "string", "maxLength": 0}, True, "maxLength", id="required-max-0"),
    ],
)
def test_form_schema_refuses_string_fields_no_answer_can_fill(
    prop: dict[str, Any], required: bool, field: str
) -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"s": prop}}
    if required:
        schema["required"] = ["s"]
    got = _refusal(parse_schema, schema, max_options=5, max_answer_chars=10)
    assert got[:3] == (400, "invalid_schema", f"schema.properties.s.{field}")
    # without the step's limit (a relay re-checking a dispatched schema) it parses as before
    assert parse_schema(schema, max_options=5)["properties"]["s"] == prop


@pytest.mark.parametrize(
    ("prop", "required"),
    [
        pytest.param({"type": "string", "minLength": 10}, True, id="min-at-cap"),
        pytest.param({"type": "string", "maxLength": 0}, False, id="optional-max-0"),
        pytest.param({"type": "string", "enum": ["a" * 50]}, True, id="enum-is-not-free-text"),
    ],
)
def test_form_schema_string_fields_an_answer_can_fill_are_accepted(
    prop: dict[str, Any], required: bool
) -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"s": prop}}
    if required:
        schema["required"] = ["s"]
    assert parse_schema(schema, max_options=5, max_answer_chars=10)["properties"]["s"] == prop


# --------------------------------------------------------------------------- the envelopes


def _answer(**changes: Any) -> dict[str, Any]:
    body = build_answer(
        question_id=QID,
        nonce="6f1c2a9e0b7d4e3f8a5b1c0d2e4f6a7b",
        request_hash="sha256:" + "0" * 64,
        value={"a": "é"},
        approver_id="alice@example.com",
        decided_at_ms=T_MS,
        display="Alice",
    )
    body.update(changes)
    return body


def test_answer_round_trips_through_parse_callback() -> None:
    body = _answer()
    raw = wire_json(body)
    got = parse_callback(raw)
    assert isinstance(got, Answer)
    assert (got.question_id, got.value, got.approver_display) == (QID, {"a": "é"}, "Alice")
    assert got.decided_at == "2026-01-01T00:00:00Z" and is_answer(body)
    assert body["kind"] == "question" and body["decision"] == "answer"
    header = signing.sign("test-secret-new", 1767225600, raw)  # signed like any decision
    assert header == independent_header("test-secret-new", 1767225600, raw)


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"protocol": "hitl/v1"}, "protocol", "protocol must be 'hitl/v0'"),
        ({"kind": "approval"}, "kind", "kind must be 'question' for an answer"),
        ({"question_id": None}, "question_id", "question_id is required"),
        ({"question_id": None, "approval_id": QID}, "question_id",
         "an answer names a question_id; approvals take approve, skip or adjust"),
        ({"nonce": " "}, "nonce", "nonce must not be empty"),
        ({"request_hash": 5}, "request_hash", "request_hash must be a string"),
        ({"approver": "alice"}, "approver", "approver must be an object with an id"),
        ({"approver": {"display": "A"}}, "approver.id", "approver.id is required"),
        ({"decided_at": "2026-01-01"}, "decided_at", "decided_at must be an RFC 3339 timestamp"),
    ],
)  # fmt: skip
def test_answer_shape_refusals(changes: dict[str, Any], field: str, message: str) -> None:
    raw = wire_json(_answer(**changes))
    assert _refusal(parse_callback, raw) == (400, f"invalid_{field}", field, message)


def test_answer_without_value_is_refused_but_null_value_passes_shape() -> None:
    body = _answer()
    del body["value"]
    assert _refusal(parse_answer, body) == (400, "invalid_value", "value", "value is required")
    assert parse_answer(_answer(value=None)).value is None  # check 12 refuses it with 422


def test_decision_naming_only_a_question_is_refused_with_a_hint() -> None:
    body = build_decision(
        approval_id=QID,
        nonce="n",
        decision="approve",
        payload_hash="sha256:x",
        approver_id="alice",
        decided_at_ms=T_MS,
    )
    del body["approval_id"]
    body["question_id"] = QID
    raw = wire_json(body)
    message = "approve, skip and adjust name an approval_id; a question takes decision answer"
    assert _refusal(parse_callback, raw) == (400, "invalid_approval_id", "approval_id", message)
    # parse_decision keeps its own answer for the same bytes (behaviour unchanged)
    assert _refusal(parse_decision, raw)[3] == "approval_id is required"
    body["approval_id"] = QID
    assert isinstance(parse_callback(wire_json(body)), Decision)


def test_parse_callback_refuses_non_objects_like_parse_decision() -> None:
    for raw in (b"[]", b"{", b'"answer"'):
        assert _refusal(parse_callback, raw) == _refusal(parse_decision, raw)


def test_an_answer_is_never_a_decision() -> None:
    raw = wire_json(_answer(approval_id=QID, payload_hash="sha256:x"))
    assert isinstance(parse_callback(raw), Answer)
    assert _refusal(parse_decision, raw)[1] == "invalid_decision"


def test_question_dispatch_has_no_approval_fields() -> None:
    spec = _question({"text": "Wer?", "response_type": "multi_choice", "options": ["a", "b"]})
    envelope = build_question_dispatch(
        question_id=QID,
        run_id="run-7",
        pipeline="p",
        step="s",
        issued_at_ms=T_MS,
        expires_at_ms=T_MS + 3_600_000,
        risk="normal",
        version=2,
        spec=spec,
        request_hash=request_hash(QID, 2, spec),
        approvers=["alice@example.com"],
        callback_url="https://gate.example.com/hitl/v0/decisions",
        nonce="6f1c2a9e0b7d4e3f8a5b1c0d2e4f6a7b",
    )
    assert list(envelope) == [
        "protocol", "kind", "question_id", "run_id", "pipeline", "step", "issued_at",
        "expires_at", "risk", "version", "question", "request_hash", "approvers", "actions",
        "callback",
    ]  # fmt: skip
    assert envelope["kind"] == "question" and envelope["expires_at"] == "2026-01-01T01:00:00Z"
    assert envelope["actions"] == [{"verb": "answer", "accepts": "multi_choice"}]
    assert envelope["question"] == spec.to_json()
    digest = hashlib.sha256(
        _canonical({"question_id": QID, "version": 2, "question": envelope["question"]})
    ).hexdigest()
    assert envelope["request_hash"] == "sha256:" + digest


def test_answer_text_per_type() -> None:
    free = _question({"text": "q", "response_type": "free_text"})
    multi = _question({"text": "q", "response_type": "multi_choice", "options": ["東京", "b"]})
    form = _question({"text": "q", "response_type": "form", "schema": FORM})
    assert answer_text(free, "PO 1\n") == "PO 1\n"
    assert answer_text(multi, ["東京", "b"]) == '["東京","b"]'
    assert answer_text(form, {"b": 1, "a": True}) == '{"b":1,"a":true}'


def test_question_dispatch_names_who_asked_and_keeps_its_request_hash() -> None:
    """requested_by is additive: it ends the dispatch when named, is absent otherwise, and
    the request hash (over question_id, version and question) is the same either way."""
    spec = _question({"text": "Wer?", "response_type": "free_text"})
    common: dict[str, Any] = {
        "question_id": QID,
        "run_id": "run-7",
        "pipeline": "p",
        "step": "s",
        "issued_at_ms": T_MS,
        "expires_at_ms": T_MS + 3_600_000,
        "risk": "normal",
        "version": 1,
        "spec": spec,
        "request_hash": request_hash(QID, 1, spec),
        "approvers": ["alice@example.com"],
        "callback_url": "https://gate.example.com/hitl/v0/decisions",
        "nonce": "6f1c2a9e0b7d4e3f8a5b1c0d2e4f6a7b",
    }
    named = build_question_dispatch(**common, requested_by="bob@example.com")
    nobody = build_question_dispatch(**common)

    assert list(named)[-1] == "requested_by" and named["requested_by"] == "bob@example.com"
    assert "requested_by" not in nobody
    assert {k: v for k, v in named.items() if k != "requested_by"} == nobody
