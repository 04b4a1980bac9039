"""The SDK and examples/agent.py as a new agent developer meets them: a
pending Approval or Question is no truth value, the variables the SDK needs are named when
missing, ``aclose``, and the example's gated function is module-level. A real gate and a
capturing relay on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from gate.sdk import AsyncGate, Gate
from tests.support import (
    API_TOKEN,
    ROOT,
    gate_env,
    module_gate,
    wait_until,
)

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]


relay, gate = module_gate("sdkdx", steps=STEPS, relay={"questions": True})


def test_sdk_a_pending_approval_or_question_is_no_truth_value(gate):
    client = Gate(gate.api_url, API_TOKEN)
    approval = client.request_approval("p", "q1", "wire 5 EUR", wait=0)
    question = client.ask("p", "ask", "which supplier?", wait=0)

    assert approval.state == "pending" and approval.granted is False
    with pytest.raises(TypeError, match=r"use approval\.granted or raise_for_outcome\(\)"):
        bool(approval)
    with pytest.raises(TypeError, match=r"use question\.outcome or raise_for_outcome\(\)"):
        bool(question)


def test_sdk_from_env_names_both_variables():
    with pytest.raises(ValueError) as caught:
        AsyncGate.from_env({"HITL_API_TOKEN": API_TOKEN})

    assert str(caught.value) == (
        "HITL_GATE_URL is not set: the SDK needs HITL_GATE_URL (the gate's API URL) and "
        "HITL_GATE_TOKEN (its pipeline API token)"
    )


async def test_sdk_aclose_closes_the_session(gate):
    client = AsyncGate(gate.api_url, API_TOKEN)
    await client.list_pending()
    await client.aclose()
    await client.aclose()  # idempotent

    async with AsyncGate(gate.api_url, API_TOKEN) as again:
        assert isinstance(await again.list_pending(), list)


def agent(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_sdk_example_without_the_variables_is_one_line_exit_2():
    env = gate_env()
    env.pop("HITL_GATE_URL", None)
    env.pop("HITL_GATE_TOKEN", None)

    done = agent("acme", "1", env=env)

    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "agent.py: HITL_GATE_URL is not set: the SDK needs HITL_GATE_URL (the gate's API URL) "
        "and HITL_GATE_TOKEN (its pipeline API token)"
    ]


def test_sdk_example_shows_the_approver_a_module_level_function(gate, relay):
    env = gate_env(HITL_GATE_URL=gate.api_url, HITL_GATE_TOKEN=API_TOKEN)
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "agent.py"),
            "--step",
            "q1",
            "--pipeline",
            "p",
            "initech",
            "7",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    try:
        found: list[dict[str, Any]] = wait_until(
            lambda: [
                d for d in relay.dispatches() if "initech" in d.get("draft", {}).get("body", "")
            ],
            what="the agent's dispatch",
        )
    finally:
        proc.kill()
        proc.wait(30)

    function = json.loads(found[0]["draft"]["body"])["function"]
    assert function.rpartition(".")[2] == "send_invoice" and "<locals>" not in function
