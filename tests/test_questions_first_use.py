"""Questions as a new user first meets them, end to end: a real
daemon with approvals at one capturing relay and questions at another, resolution notices on,
signed answers, the SQLite file read back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gate.protocol import SIGNATURE_HEADER, signing
from tests.support import (
    ASK_STEP,
    Q1_STEP,
    SECRET,
    CaptureRelay,
    GateProcess,
    answer,
    ask,
    dispatch_of,
    run_cli,
    wait_until,
    write_config,
)
from tests.support import db as db_rows

pytestmark = pytest.mark.e2e

STEPS = [
    Q1_STEP,
    ASK_STEP,
]


@pytest.fixture(scope="module")
def relay() -> Iterator[CaptureRelay]:
    """The approvals' relay (``relay.url``)."""
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def qrelay() -> Iterator[CaptureRelay]:
    """The questions' relay (``relay.question_url``)."""
    r = CaptureRelay().start()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def gate(
    tmp_path_factory: pytest.TempPathFactory, relay: CaptureRelay, qrelay: CaptureRelay
) -> Iterator[GateProcess]:
    config = write_config(
        tmp_path_factory.mktemp("qfind"),
        relay.url,
        steps=STEPS,
        relay={"question_url": qrelay.url, "notices": True},
    )
    proc = GateProcess(config).start()
    yield proc
    proc.stop()


FORM = {
    "type": "object",
    "properties": {
        "zeta": {"type": "string", "title": "Z"},
        "alpha": {"type": "integer", "maximum": 9, "minimum": 1},
        "mid": {"type": "boolean"},
    },
    "required": ["zeta"],
}


def test_form_properties_keep_the_order_given(gate: GateProcess, qrelay: CaptureRelay) -> None:
    """A form's fields come back in the order the pipeline gave them (and each
    property's keywords too), in the dispatch and in GET /v1/questions/{id}."""
    q = ask(gate, response_type="form", schema=FORM)
    d = dispatch_of(qrelay, q["question_id"])
    _, got = gate.api().call("GET", f"/v1/questions/{q['question_id']}")

    for shown in (q["question"], d["question"], got["question"]):
        assert list(shown["schema"]["properties"]) == ["zeta", "alpha", "mid"]
        assert list(shown["schema"]["properties"]["alpha"]) == ["type", "maximum", "minimum"]
        assert shown["schema"] == FORM
    assert d["request_hash"] == q["request_hash"]
    assert answer(gate, d, {"zeta": "z", "alpha": 3})[0] == 200


def notices_of(r: CaptureRelay, question_id: str) -> list[dict[str, Any]]:
    """The signed notices ``r`` received about ``question_id`` (signature checked)."""
    found = []
    for record in list(r.received):
        body = json.loads(record["raw"])
        if body.get("type") == "notice" and body.get("question_id") == question_id:
            signing.verify(
                record["headers"].get(SIGNATURE_HEADER), record["raw"], [SECRET], time.time(), 60
            )
            found.append(body)
    return found


def test_question_resolution_sends_a_signed_notice_to_the_question_relay(
    gate: GateProcess, relay: CaptureRelay, qrelay: CaptureRelay
) -> None:
    """With notices on, a question's resolution (cancelled, answered) is told to the
    question relay as a signed notice with kind question, so it closes its prompt."""
    cancelled = ask(gate, response_type="free_text")
    dispatch_of(qrelay, cancelled["question_id"])
    assert gate.api().call("POST", f"/v1/questions/{cancelled['question_id']}/cancel")[0] == 200
    answered = ask(gate, response_type="single_choice", options=["acme", "globex"])
    assert answer(gate, dispatch_of(qrelay, answered["question_id"]), "globex")[0] == 200

    for question, outcome, by in ((cancelled, "cancelled", None),
                                  (answered, "answered", "alice@example.com")):  # fmt: skip
        qid = question["question_id"]
        (notice,) = wait_until(lambda q=qid: notices_of(qrelay, q), what=f"{outcome} notice")
        resolved = gate.api().call("GET", f"/v1/questions/{qid}")[1]
        assert notice == {
            "protocol": "hitl/v0",
            "type": "notice",
            "kind": "question",
            "question_id": qid,
            "run_id": question["run_id"],
            "pipeline": "p",
            "step": "ask",
            "outcome": outcome,
            "resolved_at": resolved["resolved_at"],
            "version": 1,
            "request_hash": question["request_hash"],
            "answered_by": by,
        }
        assert not notices_of(relay, qid)  # the approvals' relay is not the question relay
        wait_until(
            lambda q=qid: db_rows(
                gate,
                "SELECT 1 FROM question_notices WHERE question_id = ? AND delivered_at IS NOT NULL",
                q,
            ),
            what="the notice marked delivered",
        )


def test_too_many_options_says_why(gate: GateProcess) -> None:
    """The step's max_options refusal carries its message like the parser's (the
    parser itself applies the step's limit)."""
    body = {"pipeline": "p", "step": "ask", "text": "Which?", "response_type": "single_choice"}
    body["options"] = [f"o{i}" for i in range(51)]
    status, out = gate.api().call("POST", "/v1/questions", body)
    assert (status, out) == (
        400,
        {
            "status": "invalid",
            "reason": "invalid_options",
            "field": "options",
            "message": "options has more than 50 options",
        },
    )


def _cli(gate: GateProcess, *args: str) -> tuple[int, str, str]:
    proc = run_cli(*args, "-c", str(gate.config), "--api-url", gate.api_url)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_cli_hints_the_other_kind_of_step_and_id(gate: GateProcess) -> None:
    """Asking on an approval step, requesting on a question step, showing an id of the
    other kind: one Error line that says which command to use."""
    code, _, err = _cli(gate, "ask", "--pipeline", "p", "--step", "q1", "--text", "Which?")
    assert (code, err) == (
        1,
        "Error: step 'q1' is an approval step: use hitl-gate request (POST /v1/approvals)\n",
    )
    code, _, err = _cli(gate, "request", "--pipeline", "p", "--step", "ask", "--draft", "x")
    assert (code, err) == (
        1,
        "Error: step 'ask' is a question step: use hitl-gate ask (POST /v1/questions)\n",
    )
    question = ask(gate, response_type="free_text")["question_id"]
    approval = gate.api().create(step="q1")["approval_id"]
    code, _, err = _cli(gate, "questions", "show", approval)
    assert (code, err) == (1, f"Error: {approval} is an approval: use hitl-gate show {approval}\n")
    code, _, err = _cli(gate, "show", question)
    assert (code, err) == (
        1,
        f"Error: {question} is a question: use hitl-gate questions show {question}\n",
    )


def test_a_blank_reason_is_no_reason(gate: GateProcess, qrelay: CaptureRelay) -> None:
    """A reason of only White_Space is stored and dispatched without ``reason``, from the
    API and from ``hitl-gate ask --reason``."""
    q = ask(gate, response_type="free_text", reason=" \u3000\n\t")
    code, out, err = _cli(
        gate, "ask", "--pipeline", "p", "--step", "ask", "--text", "PO?", "--reason", "  ", "--json"
    )
    assert code == 0, err
    from_cli = json.loads(out)
    for question in (q, from_cli):
        qid = question["question_id"]
        assert "reason" not in question["question"]
        assert "reason" not in dispatch_of(qrelay, qid)["question"]
        ((stored,),) = db_rows(
            gate, "SELECT question FROM question_versions WHERE question_id = ?", qid
        )
        assert "reason" not in json.loads(stored)
