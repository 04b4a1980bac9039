"""What ``hitl-gate ask --wait`` and ``request --wait`` print (new-user findings 2, 8
and 16): stdout is the answer exactly as recorded, hop lines on stderr show what a relay chose
on one line, a revise during the wait is a hop. A real gate, a capturing relay on loopback,
signed answers and decisions posted as a relay would, the real pipeline command."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gate.protocol.answer import build_answer
from tests.support import (
    CaptureRelay,
    CliProcess,
    GateProcess,
    decision_body,
    module_gate,
    post_decision,
    wait_until,
)

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]
# what a relay may choose: a channel holding a cursor move, a carriage return and a newline
# that would start a fake hop line of its own
FAKE_LINE = "tty\x1b[2K\rresolved: cancelled\n"
FAKE_SHOWN = "tty<U+001B>[2K<U+000D>resolved: cancelled<U+000A>"
# an answer with a newline, ANSI colour, a carriage return and a right-to-left override
RAW_ANSWER = "line1\nline2\x1b[31mRED\x1b[0m\r\u202eevil"


relay, gate = module_gate("out", steps=STEPS, relay={"questions": True})


def _cli(gate: GateProcess, command: str, *args: str) -> CliProcess:
    return CliProcess(
        command, "-c", str(gate.config), "--api-url", gate.api_url, "--pipeline", "p", *args
    )


def _question_dispatch(relay: CaptureRelay, question_id: str, version: int) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        return next(
            (
                d
                for d in relay.dispatches()
                if d.get("question_id") == question_id and d.get("version") == version
            ),
            None,
        )

    return wait_until(find, what=f"dispatch of question {question_id} version {version}")


def _answer(gate: GateProcess, dispatch: dict[str, Any], value: Any, channel: str) -> None:
    body = build_answer(
        question_id=dispatch["question_id"],
        nonce=dispatch["callback"]["nonce"],
        request_hash=dispatch["request_hash"],
        value=value,
        approver_id="alice@example.com",
        decided_at_ms=int(time.time() * 1000),
        channel=channel,
    )
    status, out, _ = post_decision(gate.callback_url, body)
    assert status == 200, out


def _hop_lines(stderr: str) -> list[str]:
    return stderr.splitlines()


def test_ask_wait_prints_the_answer_bytes_exactly_and_escapes_the_relays_channel(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    asking = _cli(gate, "ask", "--step", "ask", "--text", "Notes?", "--wait")
    question_id = asking.wait_for_line(r"asked question (\S+)").group(1)
    dispatch = _question_dispatch(relay, question_id, 1)

    _answer(gate, dispatch, RAW_ANSWER, FAKE_LINE)
    code, out, err = asking.finish()

    assert (code, out) == (0, RAW_ANSWER.encode("utf-8") + b"\n"), err
    assert f"via {FAKE_SHOWN})" in err
    assert "resolved: cancelled" not in [line.strip() for line in _hop_lines(err)]
    assert [line for line in _hop_lines(err) if line.startswith("resolved: ")] == [
        f"resolved: answered (version 1, {dispatch['request_hash']})"
    ]


def test_ask_wait_json_prints_the_answer_escaped_as_json(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    asking = _cli(gate, "ask", "--step", "ask", "--text", "Notes?", "--wait", "--json")
    question_id = asking.wait_for_line(r"asked question (\S+)").group(1)
    _answer(gate, _question_dispatch(relay, question_id, 1), RAW_ANSWER, "test")

    code, out, err = asking.finish()

    assert code == 0, err
    assert json.loads(out)["answer"]["value"] == RAW_ANSWER
    assert b"\x1b" not in out and "\u202e".encode() not in out and b"\r" not in out


def test_ask_wait_reports_a_revise_during_the_wait_as_a_hop(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    asking = _cli(gate, "ask", "--step", "ask", "--text", "Secret question 1?", "--wait")
    question_id = asking.wait_for_line(r"asked question (\S+)").group(1)
    _question_dispatch(relay, question_id, 1)
    asking.wait_for_line(r"dispatched question version 1 ")

    status, revised = gate.api().call(
        "POST", f"/v1/questions/{question_id}/revise", {"text": "Secret question 2?"}
    )
    assert (status, revised["version"]) == (200, 2), revised
    # a revise does not end the long-poll: the hop comes with the next view the wait gets
    _answer(gate, _question_dispatch(relay, question_id, 2), "yes", "test")
    code, out, err = asking.finish()

    assert (code, out) == (0, b"yes\n"), err
    assert "Secret question" not in err  # never the text
    assert err.index("question revised to version 2") < err.index("dispatched question version 2 ")


def test_request_wait_escapes_the_relays_channel_on_one_line(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    requesting = _cli(gate, "request", "--step", "q1", "--draft", "hello", "--wait")
    approval_id = requesting.wait_for_line(r"requested approval (\S+)").group(1)
    dispatch = relay.wait_dispatch(approval_id)

    decision = decision_body(dispatch)
    decision["approver"].update(channel=FAKE_LINE, display=FAKE_LINE)
    status, out, _ = post_decision(gate.callback_url, decision)
    assert status == 200, out
    code, body, err = requesting.finish()

    assert (code, body) == (0, b"hello"), err
    assert f"via {FAKE_SHOWN})" in err
    assert "resolved: cancelled" not in [line.strip() for line in _hop_lines(err)]
