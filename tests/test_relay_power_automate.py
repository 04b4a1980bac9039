"""The Power Automate relay's custom connector code (conformance/relays/power-automate),
compiled with Mono as its guide describes: the signature and hash vectors, and the stand-in
flow (the connector's two operations behind an HttpListener) through ``hitl-gate verify``.

Power Automate itself cannot run here; this is what can. Needs Mono (`.ci/run` installs
mono-mcs, mono-runtime, libnewtonsoft-json-cil-dev, libmono-system-net-http4.0-cil); skipped
with the reason where it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import free_port

ROOT = Path(__file__).resolve().parent.parent
RUN_SH = ROOT / "conformance" / "relays" / "power-automate" / "connector" / "local-test" / "run.sh"
VECTORS = ROOT / "conformance" / "vectors"
SECRET = "power-automate-test-secret"
APPROVER = "alice@example.com"
DEADLINE_S = 60.0

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.toolchain,
    pytest.mark.skipif(
        shutil.which("mcs") is None
        or shutil.which("mono") is None
        or not list(Path("/usr/lib/mono/gac/Newtonsoft.Json").glob("*/Newtonsoft.Json.dll")),
        reason="the connector test needs Mono (apt-get install mono-mcs mono-runtime "
        "libnewtonsoft-json-cil-dev libmono-system-net-http4.0-cil)",
    ),
]


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HITL_")}
    env.update(HITL_RELAY_SECRET=SECRET, TMPDIR=str(tmp_path))
    return env


def test_connector_code_passes_every_signature_and_hash_vector(tmp_path: Path) -> None:
    """Regression (review): script.csx re-formatted ``t`` before the HMAC, so a header whose
    ``t`` has a leading zero (signed as sent) was refused ``signature_mismatch``."""
    expected = sum(
        len(json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))["cases"])
        for name in ("signature", "signature_header", "payload_hash")
    )
    proc = subprocess.run(
        ["sh", str(RUN_SH), "vectors", str(VECTORS)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"{expected} passed, 0 failed", proc.stdout


@pytest.mark.parametrize("as_sent", [False, True], ids=["re-serialised", "as-sent"])
def test_stand_in_flow_passes_verify(tmp_path: Path, as_sent: bool) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = tmp_path / "flow.log"
    with log.open("wb") as out:
        flow = subprocess.Popen(
            ["sh", str(RUN_SH), "relay", url, APPROVER, *(["--as-sent"] if as_sent else [])],
            env=_env(tmp_path),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + DEADLINE_S  # compiling takes a few seconds
        while b"stand-in flow listening" not in log.read_bytes():
            assert flow.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.05)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "gate",
                "verify",
                url,
                "--secret-env",
                "HITL_RELAY_SECRET",
                "--approver",
                APPROVER,
                "--timeout",
                "30",
                "--json",
            ],
            cwd=ROOT,
            env={**os.environ, "HITL_RELAY_SECRET": SECRET},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        context = f"{proc.stdout}\n{proc.stderr}\nflow log:\n{log.read_text(errors='replace')}"
        assert proc.returncode == 0, context
        report = json.loads(proc.stdout)
        assert report["ok"] is True and len(report["checks"]) == 13, context
    finally:
        os.killpg(flow.pid, signal.SIGTERM)
        flow.wait(DEADLINE_S)
