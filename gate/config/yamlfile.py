"""Strict YAML loading (safe, no duplicate keys, no base-60 numbers), YAML error text, and a
config file read as one mapping (``read_mapping``: the gate's config and the inbox's)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gate.config.messages import describe_value


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (last-one-wins would hide a mistake)."""


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    yield from loader.construct_yaml_map(node)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
# YAML 1.1 reads 1:30 as the base-60 number 90; keep such scalars strings so that
# `timeout: 1:30` is reported as an invalid duration instead of meaning 90 seconds.
_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_Loader.yaml_implicit_resolvers = {
    first: [("tag:yaml.org,2002:str", _SEXAGESIMAL)] * (first in "+-0123456789") + list(rules)
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return problem
    return " ".join(str(exc).split()) or "invalid YAML"


def read_mapping(source: Path, expected: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The YAML mapping in the config file ``source`` (UTF-8, a BOM allowed; strict YAML:
    ``_Loader``) and ``[]``, or None and the one error that stopped the reading, as a line:
    the file not found or unreadable, no UTF-8, a YAML syntax error (``line L, column C:
    ...``), or a top level that is no mapping ("expected a mapping with ``expected``, got
    ...")."""
    try:
        text = source.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return None, [f"config file not found: {source}"]
    except UnicodeDecodeError as exc:
        return None, [f"config file {source} is not valid UTF-8 (byte offset {exc.start})"]
    except OSError as exc:
        return None, [f"cannot read config file {source}: {exc.strerror or exc}"]
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        return None, [_yaml_error(exc)]
    if not isinstance(data, dict):
        found = "an empty file" if data is None else describe_value(data)
        return None, [f"top level: expected a mapping with {expected}, got {found}"]
    return data, []
