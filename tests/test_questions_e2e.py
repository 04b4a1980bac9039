"""Questions end to end: a real daemon, a capturing relay on loopback, signed
answers, the SQLite file read back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import (
    ASK_STEP,
    COUNT_CHANGES,
    Q1_STEP,
    CaptureRelay,
    GateProcess,
    answer,
    ask,
    decision_body,
    dispatch_of,
    module_gate,
    post_decision,
)
from tests.support import db as db_rows

pytestmark = pytest.mark.e2e

STEPS = [
    Q1_STEP,
    ASK_STEP,
]


relay, gate = module_gate("q", steps=STEPS, relay={"questions": True})


def test_question_single_choice_answered_end_to_end(gate: GateProcess, relay: CaptureRelay) -> None:
    q = ask(gate, response_type="single_choice", options=["acme", "globex"])
    d = dispatch_of(relay, q["question_id"])
    assert d["kind"] == "question" and "approval_id" not in d and "draft" not in d
    assert d["question"] == {
        "text": "Which supplier?",
        "response_type": "single_choice",
        "options": ["acme", "globex"],
    }

    status, out = answer(gate, d, "globex")

    assert (status, out) == (200, {"status": "recorded", "resolved": True, "outcome": "answered"})
    view = gate.api().call("GET", f"/v1/questions/{q['question_id']}?wait=5")[1]
    assert view["outcome"] == "answered" and view["answer"]["value"] == "globex"
    assert view["answer"]["request_hash"] == d["request_hash"] and view["receipt"]
    assert db_rows(
        gate, "SELECT answer FROM questions WHERE question_id = ?", q["question_id"]
    ) == [('"globex"',)]
    kinds = [
        r[0]
        for r in db_rows(
            gate, "SELECT kind FROM audit_log WHERE approval_id = ? ORDER BY seq", q["question_id"]
        )
    ]
    assert kinds[0] == "question_created" and kinds[-2:] == [
        "question_answered",
        "question_resolved",
    ]
    # the same answer again: duplicate; another one: already_resolved
    assert (
        answer(gate, d, "globex")[0] == 409
        and answer(gate, d, "globex")[1]["reason"] == "duplicate"
    )
    assert answer(gate, d, "acme")[1]["reason"] == "already_resolved"


@pytest.mark.parametrize(
    ("kind", "extra", "value"),
    [
        ("free_text", {}, "PO-1234"),
        ("multi_choice", {"options": ["a", "b", "c"]}, ["c", "a"]),
        (
            "form",
            {
                "schema": {
                    "type": "object",
                    "properties": {"amount": {"type": "integer", "maximum": 100}},
                    "required": ["amount"],
                }
            },
            {"amount": 42},
        ),
    ],
)
def test_question_every_type_answered(
    gate: GateProcess, relay: CaptureRelay, kind: str, extra: dict[str, Any], value: Any
) -> None:
    q = ask(gate, response_type=kind, **extra)
    d = dispatch_of(relay, q["question_id"])

    assert answer(gate, d, value)[0] == 200
    assert (
        gate.api().call("GET", f"/v1/questions/{q['question_id']}")[1]["answer"]["value"] == value
    )


def test_question_invalid_value_is_422_and_changes_nothing(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    q = ask(gate, response_type="single_choice", options=["acme", "globex"])
    d = dispatch_of(relay, q["question_id"])

    status, out = answer(gate, d, "initech")

    assert status == 422 and out["reason"] == "invalid_value" and out["field"] == "value"
    assert db_rows(
        gate, "SELECT state, answer FROM questions WHERE question_id = ?", q["question_id"]
    ) == [("pending", None)]


def test_question_revised_old_version_superseded(gate: GateProcess, relay: CaptureRelay) -> None:
    q = ask(gate, response_type="free_text")
    d1 = dispatch_of(relay, q["question_id"])
    status, revised = gate.api().call(
        "POST", f"/v1/questions/{q['question_id']}/revise", {"text": "What PO?"}
    )
    assert (
        status == 200 and revised["version"] == 2 and revised["request_hash"] != d1["request_hash"]
    )
    d2 = dispatch_of(relay, q["question_id"], 2)

    assert answer(gate, d1, "x")[1]["reason"] == "superseded"
    assert answer(gate, d2, "PO-9")[0] == 200


def test_question_cross_kind_refusals_change_nothing(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    q = ask(gate, response_type="free_text")
    d = dispatch_of(relay, q["question_id"])
    approval = gate.api().create(step="q1")
    before = db_rows(gate, COUNT_CHANGES)

    # an approve naming the question's id
    status, out, _ = post_decision(
        gate.callback_url,
        decision_body(
            {
                "approval_id": q["question_id"],
                "callback": d["callback"],
                "payload_hash": "sha256:" + "0" * 64,
            }
        ),
    )
    assert (status, out["reason"]) == (409, "wrong_kind")
    # an answer naming the approval's id
    wrong = dict(d, question_id=approval["approval_id"])
    status, out = answer(gate, wrong, "x")
    assert (status, out["reason"]) == (409, "wrong_kind")
    assert db_rows(gate, COUNT_CHANGES) == before
    # and the cross-step refusals at the API
    status, out = gate.api().call(
        "POST", "/v1/approvals", {"pipeline": "p", "step": "ask", "draft": {"body": "x"}}
    )
    assert (status, out["reason"]) == (400, "step_is_question")
    status, out = gate.api().call(
        "POST",
        "/v1/questions",
        {"pipeline": "p", "step": "q1", "text": "x", "response_type": "free_text"},
    )
    assert (status, out["reason"]) == (400, "step_is_approval")


def test_question_cancel_and_idempotency(gate: GateProcess) -> None:
    body = {"pipeline": "p", "step": "ask", "text": "t", "response_type": "free_text"}
    api = gate.api()
    s1, q1 = api.call("POST", "/v1/questions", body, {"Idempotency-Key": "k-1"})
    s2, q2 = api.call("POST", "/v1/questions", body, {"Idempotency-Key": "k-1"})
    s3, q3 = api.call("POST", "/v1/questions", dict(body, text="u"), {"Idempotency-Key": "k-1"})
    assert (s1, s2, s3) == (201, 200, 409) and q1["question_id"] == q2["question_id"]
    assert q3["reason"] == "idempotency_key_reused"

    status, view = api.call("POST", f"/v1/questions/{q1['question_id']}/cancel")
    assert status == 200 and view["outcome"] == "cancelled"
    status, again = api.call("POST", f"/v1/questions/{q1['question_id']}/cancel")
    assert (status, again["reason"], again["outcome"]) == (409, "already_resolved", "cancelled")
    listed = api.call("GET", "/v1/questions?state=resolved&limit=500")[1]
    assert q1["question_id"] in [item["question_id"] for item in listed["items"]]
    assert json.dumps(listed)  # JSON-ready
    # notices are off here: no question notice is ever queued (A2)
    assert db_rows(gate, "SELECT COUNT(*) FROM question_notices") == [(0,)]
