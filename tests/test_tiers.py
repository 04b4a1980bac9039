"""The test tiers cannot rot: a test that starts a process without an ``e2e``, ``slow`` or
``toolchain`` marker fails (the audit hook in tests/conftest.py), so ``make test-fast``
(``-m "not e2e and not slow and not toolchain"``) never starts a daemon.

Checked by running pytest on a small test file, with this suite's conftest, as a subprocess.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import TIER_MARKERS
from tests.support import ROOT, gate_env

SAMPLE = """
import subprocess
import sys
import threading

import pytest

PASS = [sys.executable, "-c", "pass"]


def test_unmarked_starts_a_process():
    subprocess.run(PASS, check=True)


@pytest.mark.e2e
def test_e2e_starts_a_process():
    subprocess.run(PASS, check=True)


@pytest.mark.slow
def test_slow_starts_a_process():
    subprocess.run(PASS, check=True)


@pytest.mark.toolchain
def test_toolchain_starts_a_process():
    subprocess.run(PASS, check=True)


@pytest.fixture(scope="module")
def daemon():
    return subprocess.run(PASS, check=True)


def test_unmarked_uses_a_module_scoped_process(daemon):
    pass


def test_unmarked_swallows_the_refusal_in_a_thread():
    def spawn():
        try:
            subprocess.run(PASS, check=True)
        except BaseException:
            pass

    thread = threading.Thread(target=spawn)
    thread.start()
    thread.join()


def test_unmarked_in_process_only():
    assert sum(range(4)) == 6
"""


def test_tiers_markers_are_registered_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    pytest_ini = config["tool"]["pytest"]["ini_options"]
    registered = {line.split(":", 1)[0] for line in pytest_ini["markers"]}

    assert set(TIER_MARKERS) <= registered
    assert "--strict-markers" in pytest_ini["addopts"]


@pytest.mark.e2e
@pytest.mark.slow
def test_tiers_a_test_that_starts_a_process_unmarked_fails(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa\n")
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\naddopts = --strict-markers\nmarkers =\n"
        + "".join(f"    {name}: tier\n" for name in TIER_MARKERS)
    )

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        capture_output=True,
        env=gate_env(PYTHONPATH=str(ROOT)),
        cwd=tmp_path,
        timeout=60,
    )
    out = done.stdout.decode()

    failed = set(re.findall(r"^(?:FAILED|ERROR) test_sample\.py::(\w+)", out, re.M))
    passed = set(re.findall(r"^PASSED test_sample\.py::(\w+)", out, re.M)) - failed
    assert failed == {
        "test_unmarked_starts_a_process",
        "test_unmarked_uses_a_module_scoped_process",
        "test_unmarked_swallows_the_refusal_in_a_thread",  # an error at its teardown
    }, out
    assert passed == {
        "test_e2e_starts_a_process",
        "test_slow_starts_a_process",
        "test_toolchain_starts_a_process",
        "test_unmarked_in_process_only",
    }, out
    assert "is not marked e2e, slow or toolchain" in out
    assert done.returncode == 1, out
