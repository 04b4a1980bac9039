"""How a policy reads a draft (fail closed): the strict JSON reader, the
strings of a JSON value, media types, and each argument constraint judged as holds /
does not hold / cannot be judged. Pure: no I/O, no clock read."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gate.config.policy import ArgumentConstraint, glob_pattern, unjudgeable
from gate.protocol.canonical import (
    finite_float,
    json_type,
    no_duplicate_keys,
    reject_json_constant,
)


@dataclass(frozen=True, slots=True)
class Unreadable:
    """What ``read_json`` gives for a draft that is no strict JSON: ``why``, in words
    (``the draft is not strict JSON (duplicate key "to")``)."""

    why: str = "the draft is not strict JSON"

    def __repr__(self) -> str:
        return "UNREADABLE"


# a document not read: no condition of the rule looks at it
UNREADABLE: Any = Unreadable()
# what a check answers for a constraint that cannot be evaluated (``Check.answer``)
UNKNOWN = None


def media_type(content_type: str) -> str:
    """The media type of ``content_type``: before ``;``, trimmed, casefolded
    (``TEXT/HTML; charset=utf-8`` is ``text/html``)."""
    return content_type.split(";", 1)[0].strip().casefold()


def is_json(content_type: str) -> bool:
    """True for ``application/json`` and ``*+json`` media types."""
    media = media_type(content_type)
    return media == "application/json" or media.endswith("+json")


def read_json(body: str) -> Any:
    """``body`` as strict JSON, or an ``Unreadable`` saying why not: a BOM, a comment, a
    trailing comma, duplicate keys (review M2), NaN/Infinity, a number too large to be finite
    or beyond Python's integer digits limit, nesting too deep for the parser (review L1)."""
    try:
        return json.loads(
            body,
            object_pairs_hook=no_duplicate_keys,
            parse_constant=reject_json_constant,
            parse_float=finite_float,
        )
    except json.JSONDecodeError as exc:
        problem = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    except ValueError as exc:
        problem = str(exc)
    except RecursionError:
        problem = "it nests too deeply"
    return Unreadable(f"the draft is not strict JSON ({problem})")


def unreadable(document: Any) -> bool:
    """True for a document ``read_json`` could not read (an ``Unreadable``)."""
    return isinstance(document, Unreadable)


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON ``value``: object keys and string values at any depth
    (iterative: the depth is the parser's)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            yield from item.keys()
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


@dataclass(frozen=True, slots=True)
class Check:
    """One condition judged: ``answer`` True (holds), False, or ``UNKNOWN`` (None: cannot be
    evaluated), and ``why``: the values it compared, in words (``spend 400 > max_spend
    100``), what ``policy test`` prints for the first condition that kept a rule from
    matching."""

    answer: bool | None
    why: str


def shown(value: Any) -> str:
    """``value`` (a decoded JSON value or a number) as it reads in an explanation: compact
    JSON, at most 40 characters (longer: cut, with ``…``); a whole float without ``.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_NUMBER:
        value = int(value)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _bound(value: Any, bound: float, name: str, lower: bool) -> Check:
    if not number(value):
        return Check(UNKNOWN, f"{shown(value)} is no number for {name} {shown(bound)}")
    holds = bool(value >= bound) if lower else bool(value <= bound)
    sign = ("<" if lower else ">") if not holds else (">=" if lower else "<=")
    return Check(holds, f"{shown(value)} {sign} {name} {shown(bound)}")


def judge_parts(constraint: ArgumentConstraint, value: Any) -> list[Check]:
    """Each part of ``constraint`` judged on ``value`` (a decoded JSON value), in the order
    equals, one_of, glob, min, max: ``UNKNOWN`` when a part cannot be judged (a value of
    another JSON type than ``equals``/``one_of`` give, no finite ``number`` for
    ``min``/``max``, no string or an ``unjudgeable`` one for ``glob``)."""
    out: list[Check] = []
    given = constraint.model_fields_set
    if "equals" in given:
        wanted = shown(constraint.equals)
        if json_type(value) != json_type(constraint.equals):
            out.append(Check(UNKNOWN, f"{shown(value)} is no {json_type(constraint.equals)}"
                             f" for equals {wanted}"))  # fmt: skip
        else:
            same = json_equal(value, constraint.equals)
            out.append(Check(same, f"{shown(value)} {'is' if same else 'is not'} {wanted}"))
    if constraint.one_of is not None:
        listed = shown(list(constraint.one_of))
        if json_type(value) not in {json_type(v) for v in constraint.one_of}:
            out.append(Check(UNKNOWN, f"{shown(value)} is of no type in one_of {listed}"))
        else:
            found = any(json_equal(value, v) for v in constraint.one_of)
            out.append(Check(found, f"{shown(value)} is {'' if found else 'not '}in {listed}"))
    if constraint.glob is not None:
        wanted = shown(constraint.glob)
        if not isinstance(value, str) or unjudgeable(value):
            out.append(Check(UNKNOWN, f"{shown(value)} cannot be judged by glob {wanted}"))
        else:
            fits = glob_pattern(constraint.glob).fullmatch(value.casefold()) is not None
            verb = "matches" if fits else "does not match"
            out.append(Check(fits, f"{shown(value)} {verb} glob {wanted}"))
    if constraint.min is not None:
        out.append(_bound(value, constraint.min, "min", lower=True))
    if constraint.max is not None:
        out.append(_bound(value, constraint.max, "max", lower=False))
    return out


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``, ``1`` is ``1.0``; arrays and objects compared
    member by member."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if number(a) and number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


# the largest magnitude a policy compares: 2**53, where JSON numbers stop being exact
# across implementations (RFC 7493 I-JSON); beyond it a number cannot be evaluated
MAX_NUMBER = 2**53


def number(value: Any) -> bool:
    """True for a finite JSON number (not a boolean) of magnitude <= ``MAX_NUMBER``."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value))
        and abs(value) <= MAX_NUMBER
    )
