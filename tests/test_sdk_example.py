"""examples/agent.py run as an agent would be: a separate process against a real
gate and the reference relay (``hitl-gate relay --auto ...``) or a capturing relay."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    API_TOKEN,
    ROOT,
    CaptureRelay,
    decision_body,
    gate_env,
    post_decision,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

AGENT = ROOT / "examples" / "agent.py"
LISTENING = r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)"
# an edit is a whole JSON document: allow more than the default test limit of 50
SECURITY = {"max_input_length": 2000}


def agent(gate: Any, *args: str, run_id: str | None = None) -> subprocess.Popen[str]:
    env = gate_env(HITL_GATE_URL=gate.api_url, HITL_GATE_TOKEN=API_TOKEN)
    env.pop("HITL_RUN_ID", None)
    if run_id:
        env["HITL_RUN_ID"] = run_id
    return subprocess.Popen(
        [sys.executable, str(AGENT), "--pipeline", "p", "--step", "q1", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out + err


def start(tmp_path: Path, clis: Any, spawn: Any, auto: str) -> Any:
    relay = clis(
        "relay", "--listen", "127.0.0.1:0", "--secret-env", "HITL_RELAY_SECRET", "--auto", auto
    )
    url = relay.wait_for_line(LISTENING).group(1)
    return spawn(write_config(tmp_path, url, security=SECURITY))


EDIT = {
    "function": "__main__.send_invoice",
    "arguments": {"customer": "acme", "amount": 99, "currency": "EUR"},
}


@pytest.mark.parametrize(
    ("auto", "code", "printed"),
    [
        ("approve", 0, "sent invoice to acme: 120.50 EUR\n"),
        ("adjust:" + json.dumps(EDIT), 0, "sent invoice to acme: 99.00 EUR\n"),
        ("skip:over budget", 3, "not sent: skipped by alice@example.com: over budget\n"),
        ("adjust:120 EUR is fine", 6, "the edit cannot be applied: the edited draft is not JSON"),
        (
            "adjust:" + json.dumps({**EDIT, "arguments": {**EDIT["arguments"], "amount": "99"}}),
            6,
            "argument 'amount' must stay float (the edit gives string)",
        ),
    ],
    ids=["approve", "adjust", "skip", "adjust-not-json", "adjust-amount-a-string"],
)
def test_sdk_example_agent_against_the_reference_relay(
    tmp_path: Path, clis: Any, spawn: Any, auto: str, code: int, printed: str
) -> None:
    gate = start(tmp_path, clis, spawn, auto)

    returncode, output = finish(agent(gate, "acme", "120.5"))

    assert returncode == code, output
    assert output.startswith("agent: asking to send 120.50 EUR to acme\n")
    assert printed in output


def test_sdk_example_restarted_agent_joins_its_approval(
    tmp_path: Path, relay: CaptureRelay, spawn: Any
) -> None:
    """The agent is killed while it waits; started again with the same run id it asks for
    the same call, joins the same approval (no second one, no second dispatch) and sends
    once it is approved."""
    gate = spawn(write_config(tmp_path, relay.url, security=SECURITY))
    first = agent(gate, "globex", "80", run_id="run-restart")
    dispatch = wait_until(
        lambda: [d for d in relay.dispatches() if "globex" in d["draft"]["body"]],
        what="the first agent's dispatch",
    )[0]
    first.kill()
    first.communicate(timeout=30)

    second = agent(gate, "globex", "80", run_id="run-restart")
    status, out, _ = post_decision(gate.callback_url, decision_body(dispatch, verb="approve"))
    returncode, output = finish(second)

    assert status == 200, out
    assert (returncode, output.splitlines()[-1]) == (0, "sent invoice to globex: 80.00 EUR")
    assert [d["approval_id"] for d in relay.dispatches()] == [dispatch["approval_id"]]
    conn = sqlite3.connect(gate.config.parent / "gate.db")
    try:
        made = conn.execute("SELECT approval_id, run_id FROM approvals").fetchall()
    finally:
        conn.close()
    assert made == [(dispatch["approval_id"], "run-restart")]
