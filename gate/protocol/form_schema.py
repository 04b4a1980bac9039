"""The form questions: the schema a pipeline may ask with (a flat subset of MCP
elicitation's ``requestedSchema``). Pure. The check of a form answer against it:
``gate.protocol.form_value``.

Errors name the JSON path of the offending part: ``schema.properties.amount.maximum`` at
creation (400 ``invalid_schema``).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

from gate.protocol.envelope import is_unicode
from gate.protocol.errors import ProtocolError, field_refused
from gate.protocol.numbers import MAX_MAGNITUDE, RANGE_WORDS, in_range
from gate.protocol.whitespace import is_blank

MAX_PROPERTIES = 50
"""At most this many properties in one form."""
MAX_TITLE_CHARS = 200
"""A property's ``title`` (and each ``enumNames`` label) is at most this many characters."""
MAX_DESCRIPTION_CHARS = 2000
"""A property's ``description`` is at most this many characters."""
MAX_ENUM_CHARS = 200
"""Each enum value is at most this many characters, like a choice's option."""
PROPERTY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
"""What a property name must fully match: it becomes ``value.<name>`` in error paths."""
FORMATS = ("email", "uri", "date")

_COMMON = frozenset({"type", "title", "description"})
_KEYWORDS: dict[str, frozenset[str]] = {
    "string": _COMMON | {"minLength", "maxLength", "format"},
    "enum": _COMMON | {"enum", "enumNames"},
    "number": _COMMON | {"minimum", "maximum"},
    "integer": _COMMON | {"minimum", "maximum"},
    "boolean": _COMMON | {"default"},
    "array": _COMMON | {"items", "minItems", "maxItems"},
}
_TYPE_RULE = (
    "must be one of string, number, integer, boolean, array"
    ' (a list of types such as ["string","null"] is not supported:'
    " leave the property out of required instead)"
)
_A = {"string": "a string", "enum": "an enum", "number": "a number", "integer": "an integer"}
_A |= {"boolean": "a boolean", "array": "an array"}


def schema_error(path: str, message: str) -> ProtocolError:
    """400 ``invalid_schema`` with ``field`` = ``path``."""
    return field_refused("invalid_schema", path, message)


_COUNT_WORDS = f"a non-negative integer up to 2**53 ({MAX_MAGNITUDE})"


def _is_count(value: Any) -> bool:
    """A length or item count: an int from 0 to 2**53 (the rule for numbers)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MAGNITUDE


def _text(prop: Mapping[str, Any], key: str, path: str, limit: int) -> None:
    if key not in prop:
        return
    value = prop[key]
    if not isinstance(value, str) or not is_unicode(value):
        raise schema_error(f"{path}.{key}", f"{path}.{key} must be a string")
    if len(value) > limit:
        raise schema_error(f"{path}.{key}", f"{path}.{key} is longer than {limit} characters")


def check_labels(
    values: Any,
    path: str,
    limit: int,
    most: int,
    *,
    distinct: bool = True,
    refuse: Callable[[str, str], ProtocolError] = schema_error,
    entries: str = "entries",
) -> None:
    """``values`` is a non-empty list of at most ``most`` non-blank strings of at most
    ``limit`` characters each, and with ``distinct`` no two the same (``repeated``): a form's
    enums and their names, a question's options. Raises ``refuse(path, message)`` for the
    first that is not, ``path`` the list's or the entry's (``options[2]``)."""
    if not isinstance(values, list) or not values:
        raise refuse(path, f"{path} must be a non-empty list of strings")
    if len(values) > most:
        raise refuse(path, f"{path} has more than {most} {entries}")
    seen: dict[str, str] = {}
    for i, item in enumerate(values):
        where = f"{path}[{i}]"
        if not isinstance(item, str) or not is_unicode(item) or is_blank(item):
            raise refuse(where, f"{where} must be a non-blank string")
        if len(item) > limit:
            raise refuse(where, f"{where} is longer than {limit} characters")
        seen_as = repeated(seen, item) if distinct else None
        if seen_as is not None:
            raise refuse(where, f"{where} {seen_as}")


def repeated(seen: dict[str, str], item: str) -> str | None:
    """How ``item`` repeats an entry in ``seen`` (NFC form -> the entry as given), or None
    when it is new, in which case it is added: ``"repeats 'x'"``, or, when equal only once
    both are Unicode-normalized (NFC: "Müller" composed and decomposed look the same to a
    person), saying so. One dict lookup: O(n) per list."""
    key = unicodedata.normalize("NFC", item)
    earlier = seen.get(key)
    if earlier is None:
        seen[key] = item
        return None
    if earlier == item:
        return f"repeats {item!r}"
    return f"repeats {earlier!r} (the same text once Unicode-normalized, NFC)"


def _bounds(
    prop: Mapping[str, Any], low: str, high: str, path: str, check: Callable[[Any], bool]
) -> None:
    for key in (low, high):
        if key in prop and not check(prop[key]):
            kind = _COUNT_WORDS if check is _is_count else f"a number {RANGE_WORDS}"
            raise schema_error(f"{path}.{key}", f"{path}.{key} must be {kind}")
    if low in prop and high in prop and prop[low] > prop[high]:
        raise schema_error(f"{path}.{low}", f"{path}.{low} is greater than {high}")


def _kind(prop: Mapping[str, Any], path: str) -> str:
    kind = prop.get("type")
    if kind == "string" and "enum" in prop:
        return "enum"
    if not isinstance(kind, str) or kind not in _KEYWORDS or kind == "enum":
        raise schema_error(f"{path}.type", f"{path}.type {_TYPE_RULE}")
    return kind


def _property(prop: Any, path: str, max_options: int) -> dict[str, Any]:
    if not isinstance(prop, dict):
        raise schema_error(path, f"{path} must be an object")
    kind = _kind(prop, path)
    for key in prop:
        if key not in _KEYWORDS[kind]:
            raise schema_error(f"{path}.{key}", f"{path}.{key} is not allowed for {_A[kind]}")
    _text(prop, "title", path, MAX_TITLE_CHARS)
    _text(prop, "description", path, MAX_DESCRIPTION_CHARS)
    if kind == "string":
        _bounds(prop, "minLength", "maxLength", path, _is_count)
        if "format" in prop and prop["format"] not in FORMATS:
            raise schema_error(f"{path}.format", f"{path}.format must be email, uri or date")
    elif kind in ("number", "integer"):
        _bounds(prop, "minimum", "maximum", path, in_range)
        low, high = prop.get("minimum"), prop.get("maximum")
        if kind == "integer" and low is not None and high is not None:
            if math.ceil(low) > math.floor(high):  # nothing could be answered (B2)
                raise schema_error(
                    f"{path}.minimum",
                    f"{path}.minimum: no integer lies between minimum {low} and maximum {high}",
                )
    elif kind == "boolean":
        if "default" in prop and not isinstance(prop["default"], bool):
            raise schema_error(f"{path}.default", f"{path}.default must be true or false")
    elif kind == "enum":
        check_labels(prop["enum"], f"{path}.enum", MAX_ENUM_CHARS, max_options)
        if "enumNames" in prop:
            names = f"{path}.enumNames"
            check_labels(prop["enumNames"], names, MAX_TITLE_CHARS, max_options, distinct=False)
            if len(prop["enumNames"]) != len(prop["enum"]):
                raise schema_error(names, f"{names} must have one label per enum value")
    else:  # array: a multi enum
        items, where = prop.get("items"), f"{path}.items"
        if not isinstance(items, dict) or items.get("type") != "string" or "enum" not in items:
            raise schema_error(where, f"{where} must be {{type: string, enum: [...]}}")
        for key in items:
            if key not in ("type", "enum"):
                raise schema_error(f"{where}.{key}", f"{where}.{key} is not allowed")
        check_labels(items["enum"], f"{where}.enum", MAX_ENUM_CHARS, max_options)
        _bounds(prop, "minItems", "maxItems", path, _is_count)
        if prop.get("minItems", 0) > len(items["enum"]):
            raise schema_error(f"{path}.minItems", f"{path}.minItems is more than the choices")
    return dict(prop)


def _answerable(out: Mapping[str, Any], path: str, max_answer_chars: int) -> None:
    """Refuse a string field no answer can fill: a ``minLength`` above the step's
    ``max_answer_chars``, or ``maxLength: 0`` on a required one (a required string must not
    be blank)."""
    required = set(out.get("required", ()))
    for name, prop in out["properties"].items():
        if prop["type"] != "string" or "enum" in prop:
            continue
        where = f"{path}.properties.{name}"
        if prop.get("minLength", 0) > max_answer_chars:
            raise schema_error(
                f"{where}.minLength",
                f"{where}.minLength is more than the step's max_answer_chars "
                f"({max_answer_chars}): no answer could fill it",
            )
        if name in required and prop.get("maxLength") == 0:
            raise schema_error(
                f"{where}.maxLength",
                f"{where}.maxLength is 0 but the field is required and must not be blank",
            )


def parse_schema(
    schema: Any, *, max_options: int, path: str = "schema", max_answer_chars: int | None = None
) -> dict[str, Any]:
    """Validate a form schema: ``{"type": "object", "properties": {name: prop},
    "required"?: [names]}`` with flat properties (string with min/maxLength and format
    email|uri|date, number/integer with minimum/maximum, boolean with default, single enum,
    multi enum); ``max_options`` bounds each enum. With ``max_answer_chars`` (the step's), a
    string field no answer can fill is refused too (``_answerable``). Returns it as a new dict
    (the normalized form is the accepted one: nothing is added). Raises 400 ``invalid_schema``
    naming the JSON path for anything else: unknown keywords, nesting, min > max, unknown
    required names.
    """
    if not isinstance(schema, dict):
        raise schema_error(path, f"{path} must be an object")
    for key in schema:
        if key not in ("type", "properties", "required"):
            raise schema_error(f"{path}.{key}", f"{path}.{key} is not allowed")
    if schema.get("type") != "object":
        raise schema_error(f"{path}.type", f"{path}.type must be 'object'")
    props, where = schema.get("properties"), f"{path}.properties"
    if not isinstance(props, dict) or not props:
        raise schema_error(where, f"{where} must be an object with at least one property")
    if len(props) > MAX_PROPERTIES:
        raise schema_error(where, f"{where} has more than {MAX_PROPERTIES} properties")
    out: dict[str, Any] = {"type": "object", "properties": {}}
    for name, prop in props.items():
        if PROPERTY_NAME.fullmatch(name) is None:
            raise schema_error(f"{where}.{name}", f"{where}: {name!r} is not a valid name")
        out["properties"][name] = _property(prop, f"{where}.{name}", max_options)
    if "required" in schema:
        required, where = schema["required"], f"{path}.required"
        if not isinstance(required, list):
            raise schema_error(where, f"{where} must be a list of property names")
        for i, name in enumerate(required):
            if not isinstance(name, str) or name not in props:
                raise schema_error(f"{where}[{i}]", f"{where}[{i}] is not a property of the form")
            if name in required[:i]:
                raise schema_error(f"{where}[{i}]", f"{where}[{i}] repeats {name!r}")
        out["required"] = list(required)
    if max_answer_chars is not None:
        _answerable(out, path, max_answer_chars)
    return out
