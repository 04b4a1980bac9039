"""Pydantic validation errors -> ``"<yaml.path>: <message>"`` lines, and pruning what they name."""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "tuple_type": "a list",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "path_type": "a path string",
}


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "top level"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds, looking through ``Annotated``, ``X | None`` and
    ``tuple[X, ...]``; None for a plain value."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _keys_at(root: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The YAML keys the model at ``loc`` (a mapping's path; list indexes skipped) accepts."""
    model = root
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: the same model as the list's
        # the field the YAML key ``part`` sets (its alias, else its name)
        field = next((f for k, f in model.model_fields.items() if (f.alias or k) == part), None)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return []
        model = inner
    keys = [f.alias or k for k, f in model.model_fields.items()]
    return [k for k in keys if k != "source"] if model is root else keys


def _unknown_key(loc: Sequence[int | str], root: type[BaseModel] | None) -> str:
    """``<path>: unknown key``, plus the closest valid key when one is close enough
    (``difflib.get_close_matches``, its default 0.6 similarity)."""
    where = f"{_path(loc[:-1]) + '.' if loc[:-1] else ''}{loc[-1]}"
    key = loc[-1]
    if root is not None and isinstance(key, str):
        close = difflib.get_close_matches(key, _keys_at(root, loc[:-1]), n=1)
        if close:
            return f'{where}: unknown key; did you mean "{close[0]}"?'
    return f"{where}: unknown key"


def pydantic_error(err: Mapping[str, Any], root: type[BaseModel] | None = None) -> str:
    """One ``"<yaml.path>: <message>"`` line for a pydantic error; with ``root`` (the model
    validated), an unknown key names the closest valid key at its place."""
    kind = err["type"]
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind in ("extra_forbidden", "invalid_key"):
        return _unknown_key(loc, root)
    where = _path(loc)
    if kind == "missing":
        message = "required"
    elif kind in _EXPECTED:
        message = f"expected {_EXPECTED[kind]}, got {describe_value(value)}"
    elif kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
    elif kind == "literal_error":
        expected = str(ctx.get("expected", "?"))
        one_of = "one of " if " or " in expected else ""
        message = f"must be {one_of}{expected}, got {describe_value(value)}"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {
            "greater_than_equal": ">=",
            "greater_than": ">",
            "less_than_equal": "<=",
            "less_than": "<",
        }[kind]
        bound = next(iter(ctx.values()), "?")
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        message = f"must be {op} {bound}, got {value!r}"
    elif kind in ("too_short", "string_too_short"):
        message = "must not be empty"
    elif kind == "string_too_long":
        length = len(value) if isinstance(value, str) else "?"
        message = f"must be at most {ctx.get('max_length', '?')} characters, got {length}"
    elif kind == "finite_number":
        message = "must be a finite number"
    else:
        message = " ".join(str(err["msg"]).split())
    return f"{where}: {message}"


def describe_value(value: Any) -> str:
    """Short one-line description of a YAML value for messages (type, plus short scalars)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _prune(data: dict[Any, Any], err: Mapping[str, Any]) -> str | None:
    """Delete from ``data`` the mapping key an error points at (or into); return its YAML path,
    or None when there is no such key (a required value is missing or a list item is bad)."""
    loc = tuple(err["loc"])
    if err["type"] in ("extra_forbidden", "invalid_key"):
        last = len(loc) - 1
    else:
        last = max((i for i, part in enumerate(loc) if isinstance(part, str)), default=-1)
    if last < 0 or err["type"] == "missing":
        return None
    node: Any = data
    for part in loc[:last]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    if not isinstance(node, dict) or loc[last] not in node:
        return None
    del node[loc[last]]
    return _path(loc[: last + 1])


def _under(message: str, paths: Sequence[str | None]) -> bool:
    """True when ``message`` is about one of ``paths`` or something inside it."""
    where = message.split(": ", 1)[0]
    return any(
        p is not None and (where == p or where.startswith((p + ".", p + "["))) for p in paths
    )
