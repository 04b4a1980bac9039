"""The Node-RED relay template (conformance/relays/node-red/) really runs and passes verify.

prove.sh installs node-red 4.1.x (cached in .node/), starts it on loopback, deploys flow.json
through the admin API and runs ``hitl-gate verify`` against it. A second run deploys the same
flow with its signature check disabled, to prove the negative path is real. A third serves the
flow behind a real gate with ``relay.notices: true``: a resolution notice closes
the flow's pending item.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    SECRET,
    GateProcess,
    decision_body,
    http_request,
    post_decision,
    sign_headers,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.toolchain]

ROOT = Path(__file__).resolve().parent.parent
RELAY_DIR = ROOT / "conformance" / "relays" / "node-red"
PROVE = RELAY_DIR / "prove.sh"
FLOW = RELAY_DIR / "flow.json"
SIGNATURE_CHECK = (
    "const refusal = checkSignature(header, raw, secrets, Date.now() / 1000);"
    " // hitl:signature-check"
)
CHECKS = (
    "relay.ack",
    "relay.decision_received",
    "relay.decision_signed",
    "relay.decision_in_window",
    "relay.nonce",
    "relay.payload_hash_echo",
    "relay.approver_in_scope",
    "relay.decision_accepted",
    "relay.refuses_bad_signature",
    "relay.refuses_stale_timestamp",
    "gate.replay_refused",
    "gate.mutated_hash_refused",
    "gate.out_of_scope_refused",
    # verify --questions: the flow's question path
    "question.ack",
    "question.answer_received",
    "question.answer_signed",
    "question.answer_in_window",
    "question.nonce",
    "question.request_hash_echo",
    "question.approver_in_scope",
    "question.value_typed",
    "question.answer_accepted",
    "question.refuses_bad_signature",
    "question.replay_refused",
    "question.wrong_type_refused",
    "question.mutated_hash_refused",
    "question.as_approval_refused",
)
LINE = re.compile(r"^(PASS|FAIL)  (\S+)", re.MULTILINE)

needs_node = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="node and npm are needed to install and run Node-RED (CI has them)",
)


def _gate_bin() -> str:
    beside = Path(sys.executable).parent / "hitl-gate"
    return str(beside if beside.exists() else ROOT / ".venv" / "bin" / "hitl-gate")


def _prove(flow: Path | None = None, timeout_s: float = 540) -> tuple[int, str, dict[str, str]]:
    """Run prove.sh; return its exit code, its output (stdout + stderr) and check -> PASS/FAIL."""
    env = {**os.environ, "HITL_GATE_BIN": _gate_bin(), "HITL_VERIFY_TIMEOUT": "30"}
    if flow is not None:
        env["HITL_FLOW_FILE"] = str(flow)
    proc = subprocess.run(
        ["bash", str(PROVE)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    results = {name: verdict for verdict, name in LINE.findall(proc.stdout)}
    return proc.returncode, proc.stdout, results


def _load_flow() -> list[dict]:
    return json.loads(FLOW.read_text(encoding="utf-8"))


def test_flow_reads_raw_body_and_keeps_the_secret_out() -> None:
    flow = _load_flow()
    http_in = [n for n in flow if n["type"] == "http in"]
    assert len(http_in) == 1
    assert http_in[0]["method"] == "post" and http_in[0]["url"] == "/hitl"
    assert http_in[0]["skipBodyParsing"] is True  # "Accept raw body": msg.payload is a Buffer
    funcs = {n["name"]: n for n in flow if n["type"] == "function"}
    assert funcs["verify dispatch signature"]["func"].count(SIGNATURE_CHECK) == 1
    for name in ("verify dispatch signature", "build + sign decision"):
        assert funcs[name]["libs"] == [{"var": "crypto", "module": "crypto"}]
        assert 'env.get("HITL_RELAY_SECRET")' in funcs[name]["func"]
    assert "HITL_AUTO_DECISION" in funcs["HUMAN STEP (placeholder: replace me)"]["func"]
    assert "HITL_AUTO_ANSWER" in funcs["QUESTION STEP (placeholder: replace me)"]["func"]
    # a question goes to the question step (output 4), never to the human step
    (verify_node,) = [n for n in flow if n.get("name") == "verify dispatch signature"]
    question_step = funcs["QUESTION STEP (placeholder: replace me)"]["id"]
    assert verify_node["wires"][3] == [question_step]
    assert all(question_step not in w for w in verify_node["wires"][:3])
    assert not any("credentials" in n for n in flow)  # the secret comes from the environment


@needs_node
@pytest.mark.timeout(600)
def test_node_red_relay_is_conformant() -> None:
    rc, out, results = _prove()
    assert rc == 0, out
    assert re.search(r"^27/27 checks passed: CONFORMANT$", out, re.MULTILINE), out
    assert results == dict.fromkeys(CHECKS, "PASS"), out
    assert "timings: install" in out


@needs_node
@pytest.mark.timeout(600)
def test_node_red_relay_without_signature_check_fails_verify(tmp_path: Path) -> None:
    flow = _load_flow()
    (verify_node,) = [n for n in flow if n.get("name") == "verify dispatch signature"]
    assert verify_node["func"].count(SIGNATURE_CHECK) == 1
    verify_node["func"] = verify_node["func"].replace(
        SIGNATURE_CHECK, "const refusal = null; // signature check disabled by the test"
    )
    broken = tmp_path / "flow-without-signature-check.json"
    broken.write_text(json.dumps(flow), encoding="utf-8")

    rc, out, results = _prove(broken)

    assert rc == 1, out
    assert results["relay.refuses_bad_signature"] == "FAIL", out
    assert results["relay.refuses_stale_timestamp"] == "FAIL", out
    assert results["question.refuses_bad_signature"] == "FAIL", out  # the same check guards both
    # everything else still works: only the missing check is reported
    assert results["relay.ack"] == results["relay.decision_accepted"] == "PASS", out
    assert results["question.answer_accepted"] == results["question.value_typed"] == "PASS", out
    assert "NOT CONFORMANT" in out


_RUN_BUILD = r"""
const crypto = require("crypto");
const [func, cases] = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = cases.map(msg => {
    const errors = [];
    const node = { error: m => errors.push(String(m)), warn: () => {}, status: () => {} };
    const env = { get: k => ({ HITL_RELAY_SECRET: "s".repeat(32) })[k] };
    const result = new Function("msg", "node", "env", "crypto", func)(msg, node, env, crypto);
    return result ? { body: result.payload.toString("utf8") } : { errors };
});
process.stdout.write(JSON.stringify(out));
"""


@needs_node
def test_build_node_passes_a_reason_through() -> None:
    """``msg.decision.reason`` becomes the decision's ``reason`` (left out when
    absent or blank, so such a decision is as before); another type is not sent."""
    func = next(n for n in _load_flow() if n.get("name") == "build + sign decision")["func"]
    hitl = {
        "approval_id": "01J0000000000000000000000A",
        "nonce": "n" * 32,
        "payload_hash": "sha256:" + "0" * 64,
        "callback_url": "http://127.0.0.1:1/hitl/v0/decisions",
        "approvers": ["alice@example.com"],
    }

    def msg(verb: str, **extra: object) -> dict[str, object]:
        return {"hitl": hitl, "decision": {"verb": verb, "approver": {"id": "alice@example.com"}}
                | extra}  # fmt: skip

    cases = [
        msg("skip", reason="Betrag falsch: 1.200,00 €"),
        msg("skip"),
        msg("approve", reason=" \n"),
        msg("skip", reason=12),
    ]
    proc = subprocess.run(
        ["node", "-e", _RUN_BUILD],
        input=json.dumps([func, cases]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outs = json.loads(proc.stdout)
    sent = [json.loads(o["body"]) for o in outs[:3]]
    assert [(b["decision"], b.get("reason", "absent")) for b in sent] == [
        ("skip", "Betrag falsch: 1.200,00 €"),
        ("skip", "absent"),
        ("approve", "absent"),
    ]
    assert "reason must be a string" in outs[3]["errors"][0]


_RUN_QUESTION_STEP = r"""
const [func, dispatches] = JSON.parse(require("fs").readFileSync(0, "utf8"));
const out = dispatches.map(d => {
    const node = { error: () => {}, warn: () => {}, status: () => {} };
    const vars = { HITL_AUTO_ANSWER: "Grüße aus dem Test", HITL_APPROVER_ID: "alice@example.com" };
    const env = { get: k => vars[k] };
    const msg = { payload: d, hitl: { question_id: d.question_id } };
    const result = new Function("msg", "node", "env", func)(msg, node, env);
    return result.answer.value;
});
process.stdout.write(JSON.stringify(out));
"""


@needs_node
def test_question_step_demo_mode_answers_every_type_with_a_value_that_fits() -> None:
    """The placeholder's demo/test mode answers a choice with its first option, free
    text with HITL_AUTO_ANSWER, and a form with values built from its schema; each value
    passes the gate's own check (``check_value``)."""
    from gate.protocol.question import check_value, parse_question

    func = next(
        n for n in _load_flow() if n.get("name") == "QUESTION STEP (placeholder: replace me)"
    )["func"]
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 30, "maxLength": 40},
            "email": {"type": "string", "format": "email"},
            "site": {"type": "string", "format": "uri"},
            "when": {"type": "string", "format": "date"},
            "amount": {"type": "number", "minimum": 2.5, "maximum": 100},
            "count": {"type": "integer", "minimum": 1.5},
            "below": {"type": "integer", "maximum": -3},
            "ok": {"type": "boolean"},
            "colour": {"type": "string", "enum": ["rot", "grün"]},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                     "minItems": 2},
        },
        "required": ["name", "email", "amount", "tags"],
    }  # fmt: skip
    questions = [
        {"text": "Warum?", "response_type": "free_text"},
        {"text": "Welcher?", "response_type": "single_choice", "options": ["Müller", "Ørsted"]},
        {"text": "Welche?", "response_type": "multi_choice", "options": ["x", "y"]},
        {"text": "Formular", "response_type": "form", "schema": schema},
    ]
    dispatches = [{"question_id": f"q{i}", "question": q} for i, q in enumerate(questions)]
    proc = subprocess.run(
        ["node", "-e", _RUN_QUESTION_STEP],
        input=json.dumps([func, dispatches]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    values = json.loads(proc.stdout)
    assert values[:3] == ["Grüße aus dem Test", "Müller", ["x"]]
    for question, value in zip(questions, values, strict=True):
        spec = parse_question(question, max_text_chars=1000, max_options=50)
        check_value(spec, value, max_answer_chars=2000)  # raises on a value that does not fit


TAB = "4a1c7e0d2b9f0001"  # the flow's tab: flow context lives under this id


class NodeRed:
    """prove.sh with HITL_PROVE_SERVE=1: Node-RED on loopback running ``flow.json`` with the
    placeholder human step deciding nothing, until its stdin is closed."""

    def __init__(self) -> None:
        env = {
            **os.environ,
            "HITL_GATE_BIN": _gate_bin(),
            "HITL_PROVE_SERVE": "1",
            "HITL_AUTO_DECISION": "",
            "HITL_RELAY_SECRET": SECRET,
        }
        self.proc = subprocess.Popen(
            ["bash", str(PROVE)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # prove.sh's own deadlines bound this
        assert line.startswith("READY http://127.0.0.1:"), (line, self.proc.poll())
        self.base = line.split()[1]

    def pending(self) -> dict[str, Any]:
        """The flow's ``hitl_pending`` context (approval_id -> item), read with the admin API."""
        status, _, raw = http_request(f"{self.base}/context/flow/{TAB}/hitl_pending")
        assert status == 200, (status, raw)
        value = json.loads(raw)  # {"msg": JSON text, "format": "Object"}
        if value.get("format") == "undefined":  # not set yet
            return {}
        assert value.get("format") == "Object", value
        return json.loads(value["msg"])

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # prove.sh stops Node-RED and exits
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        assert self.proc.wait(60) == 0


@pytest.fixture
def node_red() -> Iterator[NodeRed]:
    relay = NodeRed()
    try:
        yield relay
    finally:
        relay.stop()


@needs_node
@pytest.mark.timeout(300)
def test_a_notice_closes_the_pending_item(node_red: NodeRed, tmp_path: Path) -> None:
    """The gate's signed notice, after a cancel and after a decision
    made elsewhere, removes the approval's pending item; an unsigned notice is refused 401 and
    changes nothing; a notice is never shown as a request."""
    config = write_config(tmp_path, node_red.base + "/hitl", relay={"notices": True})
    gate = GateProcess(config).start()
    try:
        api = gate.api()
        cancelled = api.create("q1", "The pipeline withdraws this\n")["approval_id"]
        decided = api.create("q1", "Bob skips this elsewhere\n")["approval_id"]
        items = wait_until(
            lambda: (p := node_red.pending()) and {cancelled, decided} <= p.keys() and p,
            what="both approvals pending in the flow",
        )

        forged = json.dumps(
            {
                "protocol": "hitl/v0",
                "type": "notice",
                "approval_id": cancelled,
                "outcome": "cancelled",
            }  # fmt: skip
        ).encode()
        for headers in (
            sign_headers(forged, "not-the-secret-" * 3),
            {"Content-Type": "application/json"},
        ):
            status, _, answer = http_request(node_red.base + "/hitl", "POST", forged, headers)
            assert status == 401, answer
        assert node_red.pending().keys() == items.keys()

        assert api.call("POST", f"/v1/approvals/{cancelled}/cancel")[0] == 200
        wait_until(lambda: cancelled not in node_red.pending(), what="the cancelled item gone")
        assert decided in node_red.pending()

        dispatch = {
            "approval_id": decided,
            "callback": {"nonce": items[decided]["nonce"]},
            "payload_hash": items[decided]["payload_hash"],
        }
        status, answer, _ = post_decision(
            gate.callback_url, decision_body(dispatch, "bob@example.com", "skip")
        )
        assert status == 200, answer
        wait_until(lambda: not node_red.pending(), what="the decided item gone")

        gate.wait_for_line(rf"event=followup_sent approval_id={decided} kind=notice ")
        # nothing was taken for a request: no decision came back from the flow
        assert api.get(cancelled)["outcome"] == "cancelled"
        assert [d["identity"] for d in api.get(decided)["decisions"]] == ["bob@example.com"]
    finally:
        gate.stop()
