"""``hitl-gate ask`` end to end: a real gate, the real reference relay (``--auto
--auto-answer`` and at a real pseudo-terminal), the real pipeline command; real signed
envelopes over loopback. Waits are conditions with deadlines."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from gate.protocol import signing
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, build_question_dispatch, request_hash
from tests import test_relay_terminal
from tests.support import (
    SECRET,
    CliProcess,
    http_request,
    run_cli,
    shown_time,
    write_config,
)

pytestmark = pytest.mark.e2e

pty_relay = test_relay_terminal.pty_relay  # the fixture: relays on a pseudo-terminal


LISTENING = r"event=relay_listening url=(http://127\.0\.0\.1:\d+/)"
FORM = {
    "type": "object",
    "properties": {
        "po": {"type": "string", "maxLength": 20},
        "amount": {"type": "integer", "minimum": 1, "maximum": 100},
    },
    "required": ["po", "amount"],
}
STEPS = [
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
    {"name": "brief", "type": "question", "approvers": [101], "timeout": "3s"},
    {
        "name": "tight",
        "type": "question",
        "approvers": [101],
        "timeout": "1h",
        "max_answer_chars": 5,
    },
]


def start_gate(tmp_path: Path, spawn: Any, relay_url: str) -> Any:
    return spawn(write_config(tmp_path, relay_url, steps=STEPS, relay={"questions": True}))


def ask(gate: Any, config: Path, *args: str, step: str = "ask") -> list[str]:
    return [
        "ask",
        "-c",
        str(config),
        "--api-url",
        gate.api_url,
        "--pipeline",
        "p",
        "--step",
        step,
        *args,
    ]


def auto_relay(clis: Any, *extra: str) -> tuple[CliProcess, str]:
    relay = clis(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--auto",
        "approve",
        *extra,
    )
    return relay, relay.wait_for_line(LISTENING).group(1)


@pytest.mark.parametrize(
    ("args", "auto_answer", "printed"),
    [
        pytest.param(["--text", "PO number?"], "2026-114", "2026-114\n", id="free_text"),
        pytest.param(
            ["--text", "Supplier?", "--choice", "Acme", "--choice", "Globex"],
            "Globex",
            "Globex\n",
            id="single_choice",
        ),
        pytest.param(
            ["--text", "Checks?", "--choice", "credit", "--choice", "sanctions", "--multi"],
            '["sanctions","credit"]',
            '["sanctions","credit"]\n',
            id="multi_choice",
        ),
        pytest.param(
            ["--text", "PO details?", "--schema", "FORM"],
            '{"po":"2026-114","amount":12}',
            '{"amount":12,"po":"2026-114"}\n',  # the gate keeps the canonical JSON
            id="form",
        ),
    ],
)
def test_ask_wait_prints_the_auto_relays_answer(tmp_path, clis, spawn, args, auto_answer, printed):
    relay, url = auto_relay(clis, "--auto-answer", auto_answer)
    gate = start_gate(tmp_path, spawn, url)
    form = tmp_path / "form.json"
    form.write_text(json.dumps(FORM), encoding="utf-8")
    args = [str(form) if a == "FORM" else a for a in args]

    done = run_cli(*ask(gate, gate.config, *args, "--wait"))

    assert (done.returncode, done.stdout.decode()) == (0, printed), done.stderr.decode()
    stderr = done.stderr.decode()
    assert "answered by alice@example.com" in stderr
    assert "resolved: answered" in stderr
    assert auto_answer not in stderr  # the answer goes to stdout only
    relay.stop()


def test_ask_interactive_multi_choice_refused_locally_then_accepted(tmp_path, pty_relay, spawn):
    relay = pty_relay("--as", "alice@example.com")
    gate = start_gate(tmp_path, spawn, relay.url)
    asking = CliProcess(
        *ask(
            gate,
            gate.config,
            "--text",
            "Checks?",
            "--choice",
            "credit",
            "--choice",
            "sanctions",
            "--multi",
            "--wait",
        )
    )
    relay.wait_screen("QUESTION ")
    relay.wait_screen("comma-separated (1-2): ")
    mark = len(relay.screen)
    relay.type("1,1\n")
    relay.wait_screen("Not taken: 'credit' is chosen twice.", mark)
    relay.wait_screen("comma-separated (1-2): ", mark)
    relay.type("2\n")

    code, out, err = asking.finish()

    assert (code, out.decode()) == (0, '["sanctions"]\n'), err
    relay.wait_screen("Recorded: question ")


def test_ask_interactive_relay_asks_again_on_the_gates_422(tmp_path, pty_relay, spawn):
    """The step takes at most 5 characters: the relay's own check (which cannot know that)
    passes a longer answer, the gate refuses it 422, the relay says so and asks again."""
    relay = pty_relay("--as", "alice@example.com")
    gate = start_gate(tmp_path, spawn, relay.url)
    asking = CliProcess(*ask(gate, gate.config, "--text", "Code?", "--wait", step="tight"))
    relay.wait_screen("Your answer (one line): ")
    mark = len(relay.screen)
    relay.type("far too long\n")
    relay.wait_screen("The gate refused that answer: ", mark)
    relay.wait_screen("Your answer (one line): ", mark)
    relay.type("ok\n")

    code, out, err = asking.finish()

    assert (code, out.decode()) == (0, "ok\n"), err


def test_ask_exit_4_when_the_question_times_out(tmp_path, clis, spawn):
    """--auto without --auto-answer refuses questions (503 no_auto_answer): nobody answers,
    the step's 3 s timeout resolves it as timeout."""
    relay, url = auto_relay(clis)
    gate = start_gate(tmp_path, spawn, url)

    done = run_cli(*ask(gate, gate.config, "--text", "Anyone?", "--wait", step="brief"))

    assert (done.returncode, done.stdout) == (4, b""), done.stderr.decode()
    assert "resolved: timeout" in done.stderr.decode()
    relay.wait_for_line("reason=no_auto_answer")


def test_ask_exit_4_when_still_pending_after_timeout(tmp_path, clis, spawn):
    relay, url = auto_relay(clis)
    gate = start_gate(tmp_path, spawn, url)

    done = run_cli(*ask(gate, gate.config, "--text", "Anyone?", "--wait", "--timeout", "1"))

    assert done.returncode == 4
    assert re.search(
        r"Error: still pending after 1 s: question \S+ \(cancel it with: hitl-gate questions "
        r"cancel",
        done.stderr.decode(),
    ), done.stderr.decode()


def test_ask_exit_5_when_cancelled_with_questions_cancel(tmp_path, clis, spawn):
    relay, url = auto_relay(clis)
    gate = start_gate(tmp_path, spawn, url)
    asking = CliProcess(*ask(gate, gate.config, "--text", "Anyone?", "--wait"))
    question_id = asking.wait_for_line(r"asked question (\S+)").group(1)

    cancelled = run_cli(
        "questions", "cancel", "-c", str(gate.config), "--api-url", gate.api_url, question_id
    )
    code, out, err = asking.finish()

    assert (cancelled.returncode, cancelled.stdout.decode()) == (0, f"{question_id} cancelled\n")
    assert (code, out) == (5, b""), err
    again = run_cli(
        "questions", "cancel", "-c", str(gate.config), "--api-url", gate.api_url, question_id
    )
    assert again.returncode == 1
    assert again.stderr.decode() == (
        f"Error: question {question_id} is already resolved (outcome cancelled); nothing "
        "changed (HTTP 409 already_resolved)\n"
    )
    listed = run_cli(
        "questions", "list", "-c", str(gate.config), "--api-url", gate.api_url, "--state", "all"
    )
    shown = run_cli(
        "questions", "show", "-c", str(gate.config), "--api-url", gate.api_url, question_id
    )
    expires_at = json.loads(shown.stdout)["expires_at"]
    assert listed.stdout.decode() == (
        f"{question_id}  resolved  cancelled  p/ask  free_text  version 1  "
        f"expires {shown_time(expires_at)}\n"
    )


def _signed_question(url: str, **change: Any) -> tuple[int, Any]:
    spec = QuestionSpec(text="Which?", response_type="single_choice", options=("a", "b"))
    envelope = build_question_dispatch(
        question_id="01JQUESTION0000000000000000",
        run_id="r",
        pipeline="p",
        step="ask",
        issued_at_ms=int(time.time() * 1000),
        expires_at_ms=int(time.time() * 1000) + 60_000,
        risk="normal",
        version=1,
        spec=spec,
        request_hash=request_hash("01JQUESTION0000000000000000", 1, spec),
        approvers=["alice@example.com"],
        callback_url="http://127.0.0.1:9/hitl/v0/decisions",
        nonce="0" * 32,
    )
    envelope.update(change)
    body = wire_json(envelope)
    headers = {"X-Draftcat-Signature": signing.sign(SECRET, int(time.time()), body)}
    status, _, raw = http_request(url, "POST", body, headers)
    return status, json.loads(raw)


def test_relay_refuses_a_question_whose_hash_does_not_cover_it(clis):
    relay, url = auto_relay(clis, "--auto-answer", "a")

    status, answer = _signed_question(
        url,
        question={
            "text": "Which? (edited)",
            "response_type": "single_choice",
            "options": ["a", "b"],
        },
    )

    assert (status, answer) == (400, {"status": "invalid", "reason": "request_hash_mismatch"})


def test_relay_auto_without_auto_answer_refuses_questions_503(clis):
    relay, url = auto_relay(clis)

    assert _signed_question(url) == (503, {"status": "unavailable", "reason": "no_auto_answer"})


def test_relay_auto_answer_needs_auto():
    done = run_cli("relay", "--secret-env", "HITL_RELAY_SECRET", "--auto-answer", "x")

    assert done.returncode == 2
    assert done.stderr.decode() == (
        "Error: --auto-answer needs --auto (without it, questions are asked on the terminal)\n"
    )
