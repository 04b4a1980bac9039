"""The form answers: the check of a form answer's value against a schema that
``gate.protocol.form_schema.parse_schema`` accepted, and the answer check's error. Pure.

Errors name the JSON path of the offending part: ``value.amount`` (422 ``invalid_value``).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from datetime import date
from typing import Any

from gate.protocol.envelope import is_unicode
from gate.protocol.errors import ProtocolError, field_refused
from gate.protocol.numbers import RANGE_WORDS, in_range, is_json_number
from gate.protocol.whitespace import WHITE_SPACE, is_blank

_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def value_error(path: str, message: str) -> ProtocolError:
    """422 ``invalid_value`` with ``field`` = ``path`` (answer check 12)."""
    return field_refused("invalid_value", path, message, status=422)


def _plausible_email(text: str) -> bool:
    """A plausibility check, not RFC 5322: one ``@``, a non-empty local part, a domain with a
    dot inside it, no White_Space anywhere."""
    local, at, domain = text.partition("@")
    if not at or not local or "@" in domain or any(c in WHITE_SPACE for c in text):
        return False
    return "." in domain.strip(".") and not domain.startswith(".") and not domain.endswith(".")


def _absolute_uri(text: str) -> bool:
    """An absolute URI with a scheme and a host part (``urllib.parse``), no White_Space."""
    if any(c in WHITE_SPACE for c in text):
        return False
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError:
        return False
    return bool(parts.scheme and parts.netloc)


def _real_date(text: str) -> bool:
    if _DATE.fullmatch(text) is None:
        return False
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


_FORMAT_CHECKS = {
    "email": (_plausible_email, "an email address"),
    "uri": (_absolute_uri, "an absolute URI (scheme://host...)"),
    "date": (_real_date, "a date (YYYY-MM-DD)"),
}


def _string_value(prop: Mapping[str, Any], value: Any, at: str, required: bool, cap: int) -> None:
    if not isinstance(value, str) or not is_unicode(value):
        raise value_error(at, f"{at} must be a string")
    if required and is_blank(value):
        raise value_error(at, f"{at} must not be blank")
    longest = min(cap, prop.get("maxLength", cap))
    if len(value) > longest:
        raise value_error(at, f"{at} is longer than {longest} characters")
    if len(value) < prop.get("minLength", 0):
        raise value_error(at, f"{at} is shorter than {prop['minLength']} characters")
    if "format" in prop:
        check, what = _FORMAT_CHECKS[prop["format"]]
        if not check(value):
            raise value_error(at, f"{at} must be {what}")


def _field_value(prop: Mapping[str, Any], value: Any, at: str, required: bool, cap: int) -> None:
    kind = "enum" if "enum" in prop else prop["type"]
    if kind == "string":
        _string_value(prop, value, at, required, cap)
    elif kind == "enum":
        if not isinstance(value, str) or value not in prop["enum"]:
            raise value_error(at, f"{at}: {value!r} is not one of its options")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise value_error(at, f"{at} must be true or false")
    elif kind in ("number", "integer"):
        if kind == "integer" and isinstance(value, float):
            hint = f": send {int(value)}, not {value!r}" if value.is_integer() else ""
            raise value_error(at, f"{at} must be an integer{hint}")
        what = "an integer" if kind == "integer" else "a number"
        if not is_json_number(value) or (kind == "integer" and not isinstance(value, int)):
            raise value_error(at, f"{at} must be {what}")
        if not in_range(value):
            raise value_error(at, f"{at} must be {what} {RANGE_WORDS}")
        if "minimum" in prop and value < prop["minimum"]:
            raise value_error(at, f"{at} must be at least {prop['minimum']}")
        if "maximum" in prop and value > prop["maximum"]:
            raise value_error(at, f"{at} must be at most {prop['maximum']}")
    else:  # array of enum strings
        choices = prop["items"]["enum"]
        if not isinstance(value, list):
            raise value_error(at, f"{at} must be a list of its options")
        for i, item in enumerate(value):
            if not isinstance(item, str) or item not in choices:
                raise value_error(at, f"{at}[{i}]: {item!r} is not one of its options")
            if item in value[:i]:
                raise value_error(at, f"{at}: {item!r} is chosen twice")
        if len(value) < prop.get("minItems", 0):
            raise value_error(at, f"{at} must choose at least {prop['minItems']}")
        if "maxItems" in prop and len(value) > prop["maxItems"]:
            raise value_error(at, f"{at} must choose at most {prop['maxItems']}")


def check_form_value(
    schema: Mapping[str, Any], value: Any, *, max_answer_chars: int
) -> dict[str, Any]:
    """Check a form answer (answer check 12) against a schema from ``parse_schema``:
    an object with only declared properties (first unknown one, in the order sent, is named),
    every required one present, each fitting its property (in the schema's order). A required
    string must not be blank; every string is at most ``max_answer_chars`` characters. ``null``
    is not a value: leave an optional property out instead. Returns the value as a new dict;
    raises 422 ``invalid_value`` with ``field`` ``value`` or ``value.<property>``.
    """
    if not isinstance(value, dict):
        raise value_error("value", "value must be an object (the form's fields)")
    props: Mapping[str, Any] = schema["properties"]
    for name in value:
        if name not in props:
            at = f"value.{name}"
            raise value_error(at, f"{at} is not a field of this form")
    required = set(schema.get("required", ()))
    for name, prop in props.items():
        at = f"value.{name}"
        if name not in value:
            if name in required:
                raise value_error(at, f"{at} is required")
            continue
        _field_value(prop, value[name], at, name in required, max_answer_chars)
    return dict(value)
