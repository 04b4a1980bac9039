"""Docs checked against the code: every command in README.md's table with an example in its
``--help``, and config.example.yaml naming exactly the keys of the config model.

A new command or config key fails here until it is documented; a removed one fails until
the docs drop it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import typing
from pathlib import Path
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
    """Every command and group below ``group``, as name paths (``("audit", "verify")``);
    through click's own listing, so the lazily imported commands (gate.cli.COMMANDS) count."""
    out: list[tuple[str, ...]] = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
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
        f"`hitl-gate {name}` is missing from README.md's command table"
    )


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
    if typing.get_origin(annotation) is dict:  # a map's keys are the user's
        return [], False
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
        path = f"{prefix}{field.alias or name}"
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
    """Keys of the example config, with those of its commented-out ``#|`` sections."""
    from tests.test_config import _commented_example

    text = EXAMPLE.read_text(encoding="utf-8")
    return yaml_keys(yaml.safe_load(text)) | yaml_keys(_commented_example())


MODEL_KEYS = sorted(model_keys())


def test_docs_model_walk_sees_nested_and_list_keys():
    keys = set(MODEL_KEYS)

    assert {
        "relay.security.max_skew",
        "relay.operators[].identity",
        "pipelines[].steps[].quorum",
        "http.body_timeout",
    } <= keys


@pytest.mark.parametrize("key", MODEL_KEYS)
def test_docs_every_config_key_in_example(key):
    assert key in example_keys(), f"config key {key} is missing from config.example.yaml"


def test_docs_example_has_no_unknown_key():
    unknown = sorted(example_keys() - set(MODEL_KEYS))

    assert not unknown, f"config.example.yaml has keys the config model does not know: {unknown}"


# --------------------------------------------------------------------------- Makefile

# Stands in for python3 and the venv's pip/python: records each call, installs nothing.
FAKE_PYTHON = """#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin"
    for tool in pip python; do
        printf '#!/bin/sh\\necho "%s $*" >> "$MAKE_LOG"\\n' "$tool" > "$3/bin/$tool"
        chmod +x "$3/bin/$tool"
    done
    echo "venv" >> "$MAKE_LOG"
    exit 0
fi
echo "unexpected: $*" >&2
exit 1
"""


def _make(directory: Path, target: str, log: Path) -> list[str]:
    """Run the Makefile's ``target`` in ``directory`` with the fake python; return the
    venv/pip/python calls it made."""
    before = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
    result = subprocess.run(
        ["make", "--no-print-directory", target, f"PYTHON={directory / 'fake-python'}"],
        cwd=directory,
        env={**os.environ, "MAKE_LOG": str(log)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return log.read_text(encoding="utf-8").splitlines()[len(before) :]


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_the_runtime_only_and_make_test_adds_the_test_extras(
    tmp_path: Path,
) -> None:
    """``make demo`` installed the test tools (~50 packages) with an
    editable install whose setuptools notice was printed. The demo installs the package and
    its runtime dependencies only, as a regular (not editable) install; ``make test`` adds
    the [test] extra once, editable; neither reinstalls what the other did. The real
    Makefile runs, with a python that records the calls instead of installing."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "fake-python").write_text(FAKE_PYTHON, encoding="utf-8")
    (tmp_path / "fake-python").chmod(0o755)
    log = tmp_path / "calls.log"
    runtime = "pip install --quiet ."
    demo, tests = "python scripts/demo.py", "python -m pytest -n 3 --dist loadfile"
    with_extras = "pip install --quiet -e .[test]"
    assert _make(tmp_path, "demo", log) == [
        "venv",
        "pip install --quiet --upgrade pip",
        runtime,
        demo,
    ]
    assert _make(tmp_path, "test", log) == [with_extras, tests]
    assert _make(tmp_path, "demo", log) == [demo]
    assert _make(tmp_path, "test", log) == [tests]
    # a changed pyproject.toml is installed again, by whichever runs next
    later = time.time() + 5
    os.utime(tmp_path / "pyproject.toml", (later, later))
    assert _make(tmp_path, "demo", log) == [runtime, demo]
    # test first on a fresh clone: demo then has nothing left to install
    shutil.rmtree(tmp_path / ".venv")
    os.utime(tmp_path / "pyproject.toml", (time.time() - 5, time.time() - 5))
    assert _make(tmp_path, "test", log) == [
        "venv",
        "pip install --quiet --upgrade pip",
        with_extras,
        tests,
    ]
    assert _make(tmp_path, "demo", log) == [demo]
    # the fast tier needs the same install and nothing more
    assert _make(tmp_path, "test-fast", log) == [
        "python -m pytest -m not e2e and not slow and not toolchain"
    ]


def test_docs_readme_map_matches_the_package_docstrings() -> None:
    """README's map of gate/ is what scripts/devmap.py makes of the docstrings, and
    it names every package (a package added, moved or re-described shows up here)."""
    from scripts.devmap import entries, render

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("<!-- map:start -->\n```\n", 1)[1].split("```\n<!-- map:end -->", 1)[0]
    assert block == render(), "README's map is stale: run python scripts/devmap.py"
    shown = {name for name, _ in entries()}
    packages = {
        f"gate/{p.parent.relative_to(ROOT / 'gate').as_posix()}/"
        for p in (ROOT / "gate").rglob("__init__.py")
        if p.parent != ROOT / "gate"
    }
    assert packages <= shown
    assert all(text for _, text in entries()), "a package or module has no docstring"


# --------------------------------------------------------------------------- tracker numbers

# "issue 15", "Issues 14 and 15", "batch 02", also wrapped across a line (and a comment's "#")
TRACKER_REFERENCE = re.compile(r"\b(?:issues?\s+(?:#\s*)?\d+|batch\s+(?:#\s*)?0\d)", re.IGNORECASE)


def _shipped(folder: Path) -> list[Path]:
    """The files under ``folder`` but those a run makes (``.node/``, ``__pycache__/``)."""
    made = {"node_modules", "__pycache__"}
    return [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not any(part.startswith(".") or part in made for part in p.relative_to(ROOT).parts)
    ]


USER_FILES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        EXAMPLE,
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "docs" / "openapi.yaml",
        *_shipped(ROOT / "examples"),
        *_shipped(ROOT / "conformance"),
    }
)


def tracker_references(text: str) -> list[str]:
    """Each ``issue N`` / ``batch 0N`` in ``text`` with a few words around it."""
    return [
        " ".join(text[max(0, m.start() - 30) : m.end() + 10].split())
        for m in TRACKER_REFERENCE.finditer(text)
    ]


def test_docs_tracker_reference_scanner_finds_wrapped_and_plural_forms() -> None:
    text = "a question (issue\n  15), for Issues 14 and 15; # batch\n# 02 item 4; no reissue 3"

    assert len(tracker_references(text)) == 3
    assert tracker_references("the batch of 3 approvals, issued 14 minutes ago") == []


@pytest.mark.parametrize("path", USER_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_user_files_cite_no_tracker_numbers(path: Path) -> None:
    """Users have no tracker to look ``issue 16`` up in: a docs page links the section that
    explains the feature instead."""
    found = tracker_references(path.read_text(encoding="utf-8"))

    assert not found, f"{path.relative_to(ROOT)} cites tracker numbers: {found}"


@pytest.mark.parametrize("path", [(), *COMMANDS], ids=lambda p: " ".join(p) or "main")
def test_docs_help_cites_no_tracker_numbers(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(main, [*path, "--help"], catch_exceptions=False)

    assert result.exit_code == 0, result.output
    found = tracker_references(result.output)
    assert not found, f"`hitl-gate {' '.join(path)} --help` cites tracker numbers: {found}"
