"""Packaging: ``scripts/ci_wheel_check.sh`` builds the sdist and the wheel with ``python -m
build``, installs the wheel into a fresh venv outside the source tree and runs the installed
``hitl-gate --help`` and ``hitl-gate check-config`` from another directory (about 1 minute:
build isolation and the wheel's dependencies come from the package index).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.toolchain]

SCRIPT = ROOT / "scripts" / "ci_wheel_check.sh"


@pytest.mark.timeout(900)
def test_packaging_wheel_installs_and_runs_outside_the_tree():
    env = dict(os.environ, PYTHON=sys.executable, BUILD_PYTHON=sys.executable)
    env.pop("KEEP", None)

    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )

    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert output.rstrip().endswith("wheel check: OK"), output
    assert "config.example.yaml: ok (" in output
    assert "gate imported from " in output and "/venv/" in output
