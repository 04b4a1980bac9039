"""README.md's examples run as written: each shell block of a section is taken from the
README, run with ``bash`` against config.example.yaml (its commented-out parts uncommented
where the README says so), and what it prints is compared with the ``# `` lines the README
shows under each command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import (
    DEADLINE_S,
    ROOT,
    CaptureRelay,
    CliProcess,
    GateProcess,
    free_port,
    gate_env,
)
from tests.test_config import _commented_example

pytestmark = pytest.mark.e2e

README = ROOT / "README.md"
EXAMPLE = ROOT / "config.example.yaml"
DEMO_ENV = {
    "HITL_RELAY_SECRET": "demo-relay-secret-change-me-8f2c41d0",
    "HITL_API_TOKEN": "demo-api-token-change-me-5b7e93a1c6",
    "HITL_RECEIPT_KEY": "demo-receipt-key-change-me-2d94f0e7",
    "HITL_ADMIN_TOKEN": "demo-admin-token-change-me-77c1e0a9",
    "HITL_MCP_TOKEN": "readme-mcp-token-change-me-3e8a51c7",
}


def section_block(heading: str, language: str = "sh", index: int = 0) -> str:
    """The ``index``-th fenced ``language`` block under the README heading ``heading``
    (up to the next heading)."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n#", start + len(heading) + 2)
    while end != -1 and text[end + 1 : end + 4] not in ("## ", "###"):
        end = text.find("\n#", end + 1)
    body = text[start : end if end != -1 else len(text)]
    blocks = re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)
    assert len(blocks) > index, f"no {language} block {index} under {heading!r}"
    return str(blocks[index])


def commands_and_outputs(block: str) -> list[tuple[str, list[str]]]:
    """A shell block as ``(command, the lines shown under it)``: a command is the lines up to
    one that ends without ``|`` or ``\\``; the ``# `` lines after it are its output."""
    out: list[tuple[str, list[str]]] = []
    command: list[str] = []
    for line in block.splitlines():
        if line.startswith("#"):
            assert out and not command, f"output without a command: {line}"
            out[-1][1].append(line[2:])
        elif line.strip():
            command.append(line)
            if not line.rstrip().endswith(("|", "\\")):
                out.append(("\n".join(command), []))
                command = []
    return out


def example_with(*pipelines: str, **changes: Any) -> dict[str, Any]:
    """config.example.yaml with the named commented-out pipelines added after its own."""
    data = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    commented = _commented_example()["pipelines"]
    data["pipelines"] += [p for p in commented if p["name"] in pipelines]
    data.update(changes)
    assert isinstance(data, dict)
    return data


def bash(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``command`` run by bash in ``cwd``, the venv's ``hitl-gate`` first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=cwd,
        env={**os.environ, **env, "PATH": path},
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


def test_readme_policy_test_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(example_with("agent-tools")), encoding="utf-8")
    runs = commands_and_outputs(section_block("### Policy: what nobody needs to approve"))

    assert len(runs) == 2
    for command, shown in runs:
        done = bash(command, tmp_path, DEMO_ENV)
        assert (done.returncode, done.stderr) == (0, ""), command
        assert done.stdout.splitlines() == shown, command


@pytest.fixture(scope="module")
def example_gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateProcess]:
    """A real gate on config.example.yaml as ``config.yaml``, with the admin token the
    README's approver section sets, on free loopback ports, dispatching to a capturing
    relay."""
    relay = CaptureRelay().start()
    directory = tmp_path_factory.mktemp("readme")
    data = example_with()
    callback, api = free_port(), free_port()
    data["relay"] |= {
        "url": relay.url,
        "callback_addr": f"127.0.0.1:{callback}",
        "public_url": f"http://localhost:{callback}",
    }
    data["api"] |= {"listen": f"127.0.0.1:{api}", "admin_token_env": "HITL_ADMIN_TOKEN"}
    config = directory / "config.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    gate = GateProcess(config, env=gate_env(**DEMO_ENV)).start()
    yield gate
    gate.stop()
    relay.stop()


def test_readme_approver_signing_commands_run_on_the_example_config(
    example_gate: GateProcess, tmp_path: Path
) -> None:
    """Every command of the section but two: the ``export`` of a fresh admin token (the
    gate already has one) and ``hitl-gate relay`` (it serves until stopped)."""
    runs = commands_and_outputs(section_block("### Approvers sign their own decisions"))
    commands = [c for c, _ in runs if not c.startswith(("export ", "hitl-gate relay "))]
    env = DEMO_ENV | {"HOME": str(tmp_path)}

    assert [c.split()[1] for c in commands] == ["keygen", "approvers", "approvers", "approvers",
                                                "audit"]  # fmt: skip
    for command in commands:
        done = bash(command, example_gate.config.parent, env)
        assert done.returncode == 0, (command, done.stderr)


@pytest.mark.parametrize("wait", [0, 6], ids=["as_written", "waiting_longer_than_5s"])
def test_readme_mcp_python_client_runs_over_stdio_and_http(
    example_gate: GateProcess, wait: int
) -> None:
    """The README's Python client, as written, against the example gate; only the HTTP
    server's port differs (it listens on a free one). Its HTTP client must outwait a tool
    call: with ``wait_seconds`` 6 (nobody decides) the call blocks past httpx's default 5 s."""
    code = section_block("### An agent host: `hitl-gate mcp`", "python")
    assert '"wait_seconds": 0,' in code
    code = code.replace('"wait_seconds": 0,', f'"wait_seconds": {wait},')
    args = ["mcp", "-c", str(example_gate.config), "--http", "127.0.0.1:0"]
    server = CliProcess(*args, "--token-env", "HITL_MCP_TOKEN", env=gate_env(**DEMO_ENV))
    try:
        url = server.wait_for_line(r"event=mcp_listening url=(\S+)").group(1)
        assert "http://127.0.0.1:8093/mcp" in code
        done = bash(
            f'exec {sys.executable} -c "$CODE"',
            example_gate.config.parent,
            DEMO_ENV | {"CODE": code.replace("http://127.0.0.1:8093/mcp", url)},
        )
    finally:
        assert server.stop() == 0, server.log()

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["pending False", "['approval']"] * 2
