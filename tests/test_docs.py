"""Docs checked against the code: every command in README.md's table with an example in its
``--help``, and config.example.yaml naming exactly the keys of the config model.

A new command or config key fails here until it is documented; a removed one fails until
the docs drop it.
"""

from __future__ import annotations

import re
import typing
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from pydantic import BaseModel

from gate.cli import main
from gate.config import Config
from tests.support import ROOT

README = ROOT / "README.md"
EXAMPLE = ROOT / "config.example.yaml"
NOT_IN_YAML = {"source"}  # Config.source: the file it was loaded from, set by load_config


# --------------------------------------------------------------------------- commands


def command_paths(group: click.Group = main, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and group below ``group``, as name paths (``("audit", "verify")``)."""
    out: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        path = (*prefix, name)
        out.append(path)
        if isinstance(command, click.Group):
            out.extend(command_paths(command, path))
    return out


COMMANDS = command_paths()


def readme_table_commands() -> list[str]:
    """The first cell of every row of README.md's command table, e.g. ``hitl-gate list``."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for line in section.splitlines():
        match = re.match(r"\| `hitl-gate ([a-z][a-z -]*?)(?: [-\[(A-Z]|`)", line)
        if match:
            out.append(match.group(1))
    return out


def test_docs_command_scanner_finds_the_table():
    documented = readme_table_commands()

    assert "serve" in documented and "audit verify" in documented
    assert ("audit",) in COMMANDS and ("audit", "verify") in COMMANDS


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_docs_every_command_in_readme_table(path):
    name = " ".join(path)
    documented = readme_table_commands()

    assert any(row == name or row.startswith(name + " ") for row in documented), (
        f"`hitl-gate {name}` is missing from README.md's command table")


def test_docs_readme_table_has_no_unknown_command():
    known = {" ".join(path) for path in COMMANDS}

    unknown = [row for row in readme_table_commands() if row not in known]

    assert not unknown, f"README.md's command table lists commands that do not exist: {unknown}"


@pytest.mark.parametrize("path", [(), *COMMANDS], ids=lambda p: " ".join(p) or "main")
def test_docs_every_command_help_has_an_example(path):
    result = CliRunner().invoke(main, [*path, "--help"], catch_exceptions=False)

    assert result.exit_code == 0, result.output
    assert "Example:" in result.output, f"`hitl-gate {' '.join(path)} --help` has no Example:"


# --------------------------------------------------------------------------- config keys


def _models_in(annotation: Any) -> tuple[list[type[BaseModel]], bool]:
    """The pydantic models inside a field annotation, and whether they come in a list
    (``tuple[Operator, ...]``); looks through ``X | None`` and ``Annotated[...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation], False
    models: list[type[BaseModel]] = []
    is_list = False
    for arg in typing.get_args(annotation):
        found, inner_list = _models_in(arg)
        models += found
        is_list = is_list or inner_list
    if models and typing.get_origin(annotation) in (tuple, list):
        is_list = True
    return models, is_list


def model_keys(model: type[BaseModel] = Config, prefix: str = "") -> set[str]:
    """Every key path of the config model, lists as ``[]``: ``relay.operators[].id``."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        if not prefix and name in NOT_IN_YAML:
            continue
        path = f"{prefix}{name}"
        out.add(path)
        models, is_list = _models_in(field.annotation)
        for sub in models:
            out |= model_keys(sub, path + ("[]." if is_list else "."))
    return out


def yaml_keys(node: Any, prefix: str = "") -> set[str]:
    """Every key path of a parsed YAML document, lists as ``[]``: ``pipelines[].name``."""
    out: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.add(path)
            out |= yaml_keys(value, path)
    elif isinstance(node, list):
        for item in node:
            out |= yaml_keys(item, prefix + "[]")
    return out


def example_keys() -> set[str]:
    return yaml_keys(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")))


MODEL_KEYS = sorted(model_keys())


def test_docs_model_walk_sees_nested_and_list_keys():
    keys = set(MODEL_KEYS)

    assert {"relay.security.max_skew", "relay.operators[].identity",
            "pipelines[].steps[].quorum", "http.body_timeout"} <= keys


@pytest.mark.parametrize("key", MODEL_KEYS)
def test_docs_every_config_key_in_example(key):
    assert key in example_keys(), f"config key {key} is missing from config.example.yaml"


def test_docs_example_has_no_unknown_key():
    unknown = sorted(example_keys() - set(MODEL_KEYS))

    assert not unknown, f"config.example.yaml has keys the config model does not know: {unknown}"
