"""The reference relay and questions, as a new user meets them: a real relay process, signed
question dispatches over loopback, a pseudo-terminal where the terminal is involved. Waits
are conditions with deadlines."""

from __future__ import annotations

import json

import pytest

from tests import test_relay_terminal
from tests.support import CliProcess
from tests.test_e2e_ask import LISTENING, _signed_question, ask, auto_relay, start_gate

pytestmark = pytest.mark.e2e

pty_relay = test_relay_terminal.pty_relay  # the fixture: relays on a pseudo-terminal


def test_relay_refuses_a_question_its_auto_answer_does_not_fit_503_before_acking(clis):
    relay, url = auto_relay(clis, "--auto-answer", '["a","b"]')

    status, answer = _signed_question(url)  # a single choice of "a" or "b"

    assert (status, answer) == (
        503,
        {"status": "unavailable", "reason": "auto_answer_does_not_fit"},
    )
    relay.wait_for_line(
        r"event=dispatch_refused reason=auto_answer_does_not_fit "
        r"question_id=01JQUESTION0000000000000000$"
    )
    relay.stop()
    assert "auto_answer_refused" not in relay.log()
    assert '"a"' not in relay.log() and "'a'" not in relay.log()  # never the value


def test_relay_with_stdin_at_eof_refuses_the_first_question_503(clis):
    relay = clis("relay", "--listen", "127.0.0.1:0", "--secret-env", "HITL_RELAY_SECRET")
    url = relay.wait_for_line(LISTENING).group(1)

    first = _signed_question(url)
    second = _signed_question(url, callback={"url": "http://127.0.0.1:9/", "nonce": "1" * 32})

    refused = (503, {"status": "unavailable", "reason": "no_human_at_terminal"})
    assert (first, second) == (refused, refused)


TITLED_FORM = {
    "type": "object",
    "properties": {
        "amount": {"type": "integer", "title": "Amount in EUR", "minimum": 1, "maximum": 100},
        "po": {"type": "string", "maxLength": 8},
    },
    "required": ["amount", "po"],
}


def test_relay_form_field_checked_as_entered_and_asked_again_alone(tmp_path, pty_relay, spawn):
    relay = pty_relay("--as", "alice@example.com")
    gate = start_gate(tmp_path, spawn, relay.url)
    form = tmp_path / "form.json"
    form.write_text(json.dumps(TITLED_FORM), encoding="utf-8")
    asking = CliProcess(*ask(gate, gate.config, "--text", "PO?", "--schema", str(form), "--wait"))
    relay.wait_screen("Amount in EUR [amount] (integer, 1 to 100, required): ")
    mark = len(relay.screen)
    relay.type("500\n")
    relay.wait_screen("Not taken: value.amount must be at most 100.", mark)
    relay.wait_screen("Amount in EUR [amount] (integer, 1 to 100, required): ", mark)
    relay.type("50\n")
    relay.wait_screen("po (string, 0 to 8 characters, required): ", mark)
    mark = len(relay.screen)
    relay.type("far too long\n")
    relay.wait_screen("Not taken: ", mark)
    relay.wait_screen("po (string, 0 to 8 characters, required): ", mark)
    assert "Amount in EUR" not in relay.screen[mark:]  # only the field, not the whole form
    relay.type("2026-114\n")

    code, out, err = asking.finish()

    assert (code, out) == (0, b'{"amount":50,"po":"2026-114"}\n'), err


def test_relay_says_a_revised_question_was_superseded_in_question_words(tmp_path, pty_relay, spawn):
    relay = pty_relay("--as", "alice@example.com")
    gate = start_gate(tmp_path, spawn, relay.url)
    asking = CliProcess(*ask(gate, gate.config, "--text", "Code?", "--wait"))
    question_id = asking.wait_for_line(r"asked question (\S+)").group(1)
    relay.wait_screen("Your answer (one line): ")
    mark = len(relay.screen)

    status, _ = gate.api().call(
        "POST", f"/v1/questions/{question_id}/revise", {"text": "Code, please?"}
    )

    assert status == 200
    relay.wait_screen(
        f"Question {question_id} version 1 was superseded by version 2; not asking again.", mark
    )
    relay.wait_screen("Your answer (one line): ", mark)
    assert "Approval" not in relay.screen[mark:] and "revision" not in relay.screen[mark:]
    relay.type("42\n")
    code, out, err = asking.finish()
    assert (code, out) == (0, b"42\n"), err
