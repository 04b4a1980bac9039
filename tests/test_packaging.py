"""Packaging: the base install is the gate and its SDK; ``hitl-gate[inbox]`` and
``hitl-gate[mcp]`` add the two separate programs' stacks.

Fast: every third-party import of ``gate/`` (an AST scan, lazy imports included) comes from
a distribution its package may use (the base dependencies everywhere, plus the inbox extra
in ``gate/inbox`` and the MCP extra in ``gate/mcp``), and ``gate.cli.EXTRAS`` (what the CLI
looks for before it says which extra to install) names exactly the extras' modules.

Slow: ``scripts/ci_wheel_check.sh`` with ``DEPS=venv`` builds the sdist and the wheel
(``python -m build`` without isolation), installs the wheel without extras into a fresh venv
outside the source tree from a wheelhouse repacked from this venv's packages (no package
index; what the metadata forgets is missing there) and runs the installed ``hitl-gate
--help``, ``hitl-gate check-config``, ``import gate.sdk`` and ``hitl-gate inbox serve`` /
``hitl-gate mcp``, which must name their extra in one line (about 15 s).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gate.cli import EXTRAS
from tests.support import ROOT

SCRIPT = ROOT / "scripts" / "ci_wheel_check.sh"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def distributions(requirements: list[str]) -> set[str]:
    """The canonical names of the distributions ``requirements`` list (``hitl-gate[…]``
    itself left out)."""
    names = {canonicalize_name(Requirement(text).name) for text in requirements}
    return names - {"hitl-gate"}


BASE = distributions(PROJECT["dependencies"])
EXTRA = {name: distributions(PROJECT["optional-dependencies"][name]) for name in EXTRAS}


def extra_of(path: Path) -> str:
    """The extra a module of gate/ belongs to: "inbox" or "mcp" for gate/inbox and gate/mcp,
    "postgres" for the PostgreSQL modules (gate/postgres/ and gate/store/pg_*.py, which
    import the driver lazily: the base install imports them), "" (the base install) for the
    rest."""
    parts = path.relative_to(ROOT / "gate").parts
    if parts[0] == "postgres" or (parts[0] == "store" and parts[-1].startswith("pg_")):
        return "postgres"
    return parts[0] if parts[0] in EXTRAS else ""


def third_party_imports() -> dict[str, dict[str, str]]:
    """``{extra: {top-level module: first file importing it}}`` for every import in gate/
    (``extra_of`` its file) that is neither the standard library nor gate itself."""
    found: dict[str, dict[str, str]] = {"": {}, **{name: {} for name in EXTRAS}}
    for path in sorted((ROOT / "gate").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for top in {module.split(".")[0] for module in modules}:
                if top not in sys.stdlib_module_names and top not in ("gate", "__future__"):
                    found[extra_of(path)].setdefault(top, str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("extra", ["", *EXTRAS], ids=["base", *EXTRAS])
def test_packaging_imports_come_from_what_the_package_may_use(extra):
    allowed = BASE | EXTRA.get(extra, set())
    owners = packages_distributions()

    undeclared = {
        module: path
        for module, path in third_party_imports()[extra].items()
        if not {canonicalize_name(name) for name in owners.get(module, [])} & allowed
    }

    assert not undeclared, f"no dependency it may use provides these: {undeclared}"


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_packaging_cli_extras_name_the_modules_of_each_extra(extra):
    provided = {
        module
        for module, names in packages_distributions().items()
        if not module.startswith("_") and {canonicalize_name(n) for n in names} & EXTRA[extra]
    }

    assert set(EXTRAS[extra]) == provided


def test_packaging_extras_add_to_the_base_and_the_test_extra_installs_both():
    for name, extra in EXTRA.items():
        assert extra and not extra & BASE, name
    assert "hitl-gate[inbox,mcp,postgres]" in PROJECT["optional-dependencies"]["test"]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.toolchain
@pytest.mark.timeout(300)
def test_packaging_wheel_without_extras_installs_and_runs_outside_the_tree():
    env = dict(os.environ, PYTHON=sys.executable, BUILD_PYTHON=sys.executable, DEPS="venv")
    env.pop("KEEP", None)

    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )

    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert output.rstrip().endswith("wheel check: OK"), output
    assert "config.example.yaml: ok (" in output
    assert "gate imported from " in output and "/venv/" in output
    assert "dependencies from venv" in output and "distributions repacked" in output
    assert "gate.sdk imported; none of the inbox, mcp, postgres extras installed" in output
    for extra in ("inbox", "mcp"):
        line = f"Error: hitl-gate {extra} needs the {extra} extra: pip install 'hitl-gate[{extra}]'"
        assert line in output, output
    line = "storage.url (PostgreSQL) needs the postgres extra: pip install 'hitl-gate[postgres]'"
    assert f"Error: {line}" in output, output
