"""The form schema and question fields at their edges (pure, fast tier): every JSON
type at every keyword position comes out as a 400 ``ProtocolError`` and never as another
exception (a new user's 500 with a traceback); questions no answer can satisfy are refused at
creation."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.protocol.errors import ProtocolError
from gate.protocol.question import check_value, parse_question

JSON_VALUES: tuple[Any, ...] = (None, True, 1, 1.5, "x", [], [1], {}, {"a": 1})
"""One of each JSON type, empty and not: what the fuzz puts at every position."""

PROPERTIES: dict[str, dict[str, Any]] = {
    "string": {"type": "string", "title": "T", "description": "D", "minLength": 0,
               "maxLength": 5, "format": "date"},
    "number": {"type": "number", "title": "T", "description": "D", "minimum": 0, "maximum": 9},
    "integer": {"type": "integer", "title": "T", "description": "D", "minimum": 0,
                "maximum": 9},
    "boolean": {"type": "boolean", "title": "T", "description": "D", "default": False},
    "enum": {"type": "string", "title": "T", "description": "D", "enum": ["x", "y"],
             "enumNames": ["X", "Y"]},
    "array": {"type": "array", "title": "T", "description": "D",
              "items": {"type": "string", "enum": ["x", "y"]}, "minItems": 0, "maxItems": 2},
}  # fmt: skip
"""One valid property of each kind, every keyword it takes present."""


def _form(prop: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": prop}, "required": ["a"]}


def _positions() -> Iterator[tuple[str, dict[str, Any]]]:
    """(id, schema) with one JSON value put at one keyword position of a valid form."""
    for kind, prop in PROPERTIES.items():
        for key in [*prop, "unknown"]:
            for value in JSON_VALUES:
                changed = copy.deepcopy(prop)
                changed[key] = value
                yield f"{kind}.{key}={value!r}", _form(changed)
        if kind == "array":
            for key in ("type", "enum", "unknown"):
                for value in JSON_VALUES:
                    changed = copy.deepcopy(prop)
                    changed["items"][key] = value
                    yield f"array.items.{key}={value!r}", _form(changed)
        for list_key in ("enum", "enumNames"):
            if list_key in prop:
                for value in JSON_VALUES:
                    changed = copy.deepcopy(prop)
                    changed[list_key] = ["x", value]
                    yield f"{kind}.{list_key}[1]={value!r}", _form(changed)
    for key in ("type", "properties", "required", "unknown"):
        for value in JSON_VALUES:
            schema = _form(PROPERTIES["string"])
            schema[key] = value
            yield f"schema.{key}={value!r}", schema
    for value in JSON_VALUES:
        yield f"schema.properties.a={value!r}", {"type": "object", "properties": {"a": value}}
        yield f"schema.required[0]={value!r}", {**_form(PROPERTIES["string"]), "required": [value]}


POSITIONS = list(_positions())


def _parse(schema: Any) -> Any:
    body = {"text": "q", "response_type": "form", "schema": schema}
    return parse_question(body, max_text_chars=1000, max_options=50)


def test_form_schema_fuzz_valid_forms_pass() -> None:
    for prop in PROPERTIES.values():
        assert _parse(_form(prop)).schema is not None


@pytest.mark.parametrize(("schema"), [s for _, s in POSITIONS], ids=[i for i, _ in POSITIONS])
def test_form_schema_fuzz_only_400_comes_out(schema: dict[str, Any]) -> None:
    try:
        _parse(schema)
    except ProtocolError as err:
        assert (err.status, err.code) == (400, "invalid_schema")
        assert str(err.extra["field"]).startswith("schema")
        assert err.extra["message"] == err.message


TYPE_MESSAGE = (
    "schema.properties.a.type must be one of string, number, integer, boolean, array"
    ' (a list of types such as ["string","null"] is not supported:'
    " leave the property out of required instead)"
)


@pytest.mark.parametrize(
    "kind",
    [["string", "null"], {"x": 1}, None, "object", "null", 3],
    ids=["list", "object", "null", "nested", "null-string", "number"],
)
def test_form_schema_property_type_refusal_names_the_path(kind: Any) -> None:
    with pytest.raises(ProtocolError) as info:
        _parse({"type": "object", "properties": {"a": {"type": kind}}})
    err = info.value
    assert (err.status, err.code, err.extra["field"]) == (
        400,
        "invalid_schema",
        "schema.properties.a.type",
    )
    assert err.message == TYPE_MESSAGE


NFC, NFD = "M\u00fcller", "Mu\u0308ller"  # "Müller" composed and decomposed


def _refused(body: dict[str, Any]) -> tuple[str, str, str]:
    with pytest.raises(ProtocolError) as info:
        parse_question({"text": "q", **body}, max_text_chars=1000, max_options=50)
    err = info.value
    assert err.status == 400 and err.extra["message"] == err.message
    return err.code, str(err.extra["field"]), err.message


@pytest.mark.parametrize(
    ("bounds", "ok"),
    [((1.5, 1.7), False), ((1.5, 1.5), False), ((0.1, 0.9), False), ((1.5, 2), True),
     ((1, 1), True), ((-1.5, -1.2), False), ((2.0, 2.0), True)],
)  # fmt: skip
def test_integer_bounds_with_no_integer_between_are_refused(
    bounds: tuple[float, float], ok: bool
) -> None:
    """B2: an integer field no answer can fill is refused at creation, naming the path."""
    prop = {"type": "integer", "minimum": bounds[0], "maximum": bounds[1]}
    schema = {"type": "object", "properties": {"n": prop}}
    if ok:
        assert _parse(schema).schema is not None
        return
    assert _refused({"response_type": "form", "schema": schema}) == (
        "invalid_schema",
        "schema.properties.n.minimum",
        f"schema.properties.n.minimum: no integer lies between minimum {bounds[0]}"
        f" and maximum {bounds[1]}",
    )


def test_options_equal_once_normalized_are_a_repeat() -> None:
    """B2: "Müller" composed and decomposed look the same to a person: one is a repeat."""
    got = _refused({"response_type": "single_choice", "options": [NFC, "x", NFD]})
    assert got == (
        "invalid_options",
        "options[2]",
        f"options[2] repeats {NFC!r} (the same text once Unicode-normalized, NFC)",
    )
    assert _refused({"response_type": "multi_choice", "options": ["a", "a"]})[2] == (
        "options[1] repeats 'a'"
    )


@pytest.mark.parametrize(
    ("prop", "field"),
    [
        ({"type": "string", "enum": [NFD, NFC]}, "enum[1]"),
        ({"type": "array", "items": {"type": "string", "enum": [NFD, NFC]}}, "items.enum[1]"),
    ],
    ids=["single", "multi"],
)
def test_enum_values_equal_once_normalized_are_a_repeat(prop: dict[str, Any], field: str) -> None:
    schema = {"type": "object", "properties": {"a": prop}}
    where = f"schema.properties.a.{field}"
    assert _refused({"response_type": "form", "schema": schema}) == (
        "invalid_schema",
        where,
        f"{where} repeats {NFD!r} (the same text once Unicode-normalized, NFC)",
    )


RANGE = "must be a number between -2**53 and 2**53 (±9007199254740992)"
BIG = 10**400


@pytest.mark.parametrize(
    ("kind", "bounds", "key"),
    [("integer", {"minimum": BIG}, "minimum"),
     ("integer", {"minimum": -BIG, "maximum": BIG}, "minimum"),
     ("integer", {"minimum": 0.5, "maximum": BIG}, "maximum"),
     ("number", {"maximum": BIG}, "maximum"),
     ("number", {"minimum": -(2**53) - 1}, "minimum"),
     ("number", {"maximum": 2**53 + 1}, "maximum"),
     ("integer", {"maximum": 1e300}, "maximum"),
     ("number", {"minimum": -1e16}, "minimum")],
    ids=["int-min-huge", "int-both-huge", "int-half-to-huge", "num-max-huge", "num-min-2**53-1",
         "num-max-2**53+1", "int-max-1e300", "num-min--1e16"],
)  # fmt: skip
def test_form_schema_bounds_beyond_2_53_are_refused_naming_the_path(
    kind: str, bounds: dict[str, Any], key: str
) -> None:
    """A bound no float holds (10**400) answered 500 (``math.isfinite`` on an int); every
    bound is a finite number within ±2**53 (docs/design.md "Numbers")."""
    schema = {"type": "object", "properties": {"n": {"type": kind, **bounds}}}
    assert _refused({"response_type": "form", "schema": schema}) == (
        "invalid_schema",
        f"schema.properties.n.{key}",
        f"schema.properties.n.{key} {RANGE}",
    )


@pytest.mark.parametrize("kind", ["integer", "number"])
def test_form_schema_bounds_at_2_53_are_accepted(kind: str) -> None:
    for low, high in ((-(2**53), 2**53), (-float(2**53), float(2**53)), (0, 2**53)):
        prop = {"type": kind, "minimum": low, "maximum": high}
        assert _parse(_form(prop)).schema is not None


JSON_NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=2**50, max_value=2**1400),
    st.integers(min_value=-(2**1400), max_value=-(2**50)),
    st.floats(),
)
"""Any JSON number, ints far beyond a float's range included (NaN and infinities too: a
Python caller may pass them though JSON cannot)."""


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(sorted(PROPERTIES)),
    st.sampled_from(["minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems"]),
    JSON_NUMBERS,
    st.one_of(st.none(), JSON_NUMBERS),
)
def test_form_schema_any_number_at_a_numeric_keyword_is_accepted_or_400(
    kind: str, key: str, value: Any, other: Any
) -> None:
    prop = copy.deepcopy(PROPERTIES[kind])
    prop[key] = value
    if other is not None:
        prop["maximum" if key == "minimum" else "minimum"] = other
    try:
        _parse(_form(prop))
    except ProtocolError as err:
        assert (err.status, err.code) == (400, "invalid_schema")
        assert str(err.extra["field"]).startswith("schema.properties.a.")


@pytest.mark.parametrize("kind", ["integer", "number"])
@pytest.mark.parametrize(
    "value", [BIG, -BIG, 2**53 + 1, 1e300], ids=["big", "-big", "2**53+1", "1e300"]
)
def test_form_value_numbers_beyond_2_53_are_refused_as_invalid_value(kind: str, value: Any) -> None:
    """A huge answer is refused by the answer check (422), never a 500."""
    schema = {"type": "object", "properties": {"n": {"type": kind}}}
    spec = _parse(schema)
    if kind == "integer" and isinstance(value, float):
        return  # a float for an integer field is refused as such (test_protocol_question)
    what = "an integer" if kind == "integer" else "a number"
    with pytest.raises(ProtocolError) as info:
        check_value(spec, {"n": value}, max_answer_chars=5)
    err = info.value
    assert (err.status, err.code, err.extra["field"]) == (422, "invalid_value", "value.n")
    assert err.message == f"value.n must be {what} {RANGE.removeprefix('must be a number ')}"
    assert check_value(spec, {"n": 2**53}, max_answer_chars=5) == {"n": 2**53}


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [("array", "maxItems", BIG), ("array", "minItems", 2**53 + 1),
     ("string", "maxLength", 9007199254740993), ("string", "minLength", BIG)],
    ids=["maxItems-huge", "minItems-2**53+1", "maxLength-2**53+1", "minLength-huge"],
)  # fmt: skip
def test_form_schema_counts_beyond_2_53_are_refused_naming_the_path(
    kind: str, key: str, value: int
) -> None:
    """``maxItems: 10**400`` was accepted and a relay printed its 401 digits: a count keyword
    follows the same rule as ``minimum``/``maximum`` (docs/design.md "Numbers")."""
    prop = {k: v for k, v in PROPERTIES[kind].items() if k not in ("minItems", "minLength")}
    prop[key] = value
    field = f"schema.properties.a.{key}"
    with pytest.raises(ProtocolError) as info:
        _parse(_form(prop))
    err = info.value
    assert (err.status, err.code, err.extra["field"]) == (400, "invalid_schema", field)
    assert err.message == f"{field} must be a non-negative integer up to 2**53 (9007199254740992)"
    prop[key] = 2**53 if key.startswith("max") else 0
    assert _parse(_form(prop)).schema is not None
