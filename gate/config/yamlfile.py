"""Strict YAML loading (safe, no duplicate keys, no base-60 numbers) and YAML error text."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml


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
