"""Revising questions, and the bounds of a question, over real HTTP: concurrent revises all
kept, a revise cap, a revise after the deadline resolves ``timeout``, a revise wakes
long-polls, non-finite numbers refused as not JSON (never a 500), a step's ``max_options``
bounds form enums and its ``max_answer_chars`` refuses unanswerable string fields at
creation. Each refusal is read back from the real SQLite file as changing nothing."""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest

from gate.core.questions.revise_tx import MAX_VERSIONS
from gate.protocol.canonical import wire_json
from tests import support
from tests.support import (
    ASK_STEP,
    DEADLINE_S,
    CaptureRelay,
    GateProcess,
    answer_body,
    db,
    dispatch_of,
    module_gate,
    post_decision,
    snapshot,
    wait_until,
)

pytestmark = pytest.mark.e2e

ask = functools.partial(support.ask, text="orig")  # what each revise here replaces

STEPS = [
    ASK_STEP,
    {
        "name": "tight",
        "type": "question",
        "approvers": [101, 102],
        "timeout": "1h",
        "max_options": 3,
        "max_answer_chars": 10,
    },
    {"name": "brief", "type": "question", "approvers": [101], "timeout": "1s"},
]
AMOUNT_FORM = {
    "type": "object",
    "properties": {"amount": {"type": "number", "maximum": 100}},
    "required": ["amount"],
}


relay, gate = module_gate("qreview", steps=STEPS, relay={"questions": True})


def revise(gate: GateProcess, question_id: str, body: dict[str, Any]) -> tuple[int, Any]:
    return gate.api().call("POST", f"/v1/questions/{question_id}/revise", body)


def answer_raw(dispatch: dict[str, Any], value: Any, amount_text: str | None = None) -> bytes:
    """A signed-ready answer body; ``amount_text`` replaces the JSON of ``value.amount`` (e.g.
    ``1e999``, which no encoder writes)."""
    raw = wire_json(answer_body(dispatch, value))
    if amount_text is not None:
        raw = raw.replace(b'"amount":0', b'"amount":' + amount_text.encode())
    return raw


def versions_of(gate: GateProcess, question_id: str) -> list[int]:
    rows = db(gate, "SELECT version FROM question_versions WHERE question_id = ?", question_id)
    return sorted(r[0] for r in rows)


# ---- concurrent revises --------------------------------------------------------------------------


@pytest.mark.parametrize("round_", range(3))
def test_parallel_revises_of_different_fields_are_all_kept(gate: GateProcess, round_: int) -> None:
    q = ask(gate, response_type="single_choice", options=["a", "b"])
    changes: list[dict[str, Any]] = [
        {"text": "newtext"},
        {"reason": "because"},
        {"options": ["c", "d", "e"]},
    ]
    barrier = threading.Barrier(len(changes))

    def send(body: dict[str, Any]) -> tuple[int, Any]:
        barrier.wait(DEADLINE_S)
        return revise(gate, q["question_id"], body)

    with ThreadPoolExecutor(len(changes)) as pool:
        results = list(pool.map(send, changes))

    assert [status for status, _ in results] == [200] * len(changes), results
    assert sorted(out["version"] for _, out in results) == [2, 3, 4]
    view = gate.api().call("GET", f"/v1/questions/{q['question_id']}")[1]
    assert view["version"] == 4
    assert view["question"] == {
        "text": "newtext",
        "reason": "because",
        "response_type": "single_choice",
        "options": ["c", "d", "e"],
    }
    assert versions_of(gate, q["question_id"]) == [1, 2, 3, 4]


# ---- the revise cap ------------------------------------------------------------------------------


def test_revise_past_the_version_cap_is_409_and_changes_nothing(gate: GateProcess) -> None:
    q = ask(gate, response_type="free_text")
    for n in range(2, MAX_VERSIONS + 1):
        status, out = revise(gate, q["question_id"], {"text": f"try {n}"})
        assert (status, out["version"]) == (200, n), out
    before = snapshot(gate)

    status, out = revise(gate, q["question_id"], {"text": "one more"})

    assert (status, out["status"], out["reason"]) == (409, "conflict", "too_many_versions"), out
    assert str(MAX_VERSIONS) in out["message"]
    assert snapshot(gate) == before


# ---- a revise after the deadline -----------------------------------------------------------------


def test_revise_after_the_deadline_is_409_timeout_and_adds_no_version(gate: GateProcess) -> None:
    q = ask(gate, step="brief", response_type="free_text")
    deadline = datetime.fromisoformat(q["expires_at"].replace("Z", "+00:00")).timestamp()
    wait_until(lambda: time.time() >= deadline + 0.05, what="the question's deadline")

    status, out = revise(gate, q["question_id"], {"text": "too late"})

    assert (status, out["reason"], out["outcome"]) == (409, "already_resolved", "timeout"), out
    assert versions_of(gate, q["question_id"]) == [1]
    view = gate.api().call("GET", f"/v1/questions/{q['question_id']}")[1]
    assert (view["state"], view["outcome"], view["version"]) == ("resolved", "timeout", 1)


# ---- a revise wakes long-polls -------------------------------------------------------------------


def test_revise_wakes_a_long_poll_with_the_new_version(gate: GateProcess) -> None:
    q = ask(gate, response_type="free_text")
    got: list[tuple[int, Any]] = []
    # a wait far longer than the test's deadline: only a revise can end it in time
    poll = threading.Thread(
        target=lambda: got.append(
            gate.api().call("GET", f"/v1/questions/{q['question_id']}?wait=300")
        ),
        daemon=True,
    )
    poll.start()

    # the poll may not be registered yet when a revise lands: revise until it returns
    for n in range(2, MAX_VERSIONS + 1):
        assert revise(gate, q["question_id"], {"text": f"v{n}"})[0] == 200
        poll.join(DEADLINE_S / MAX_VERSIONS)
        if not poll.is_alive():
            break

    assert not poll.is_alive(), "the long-poll was not woken by a revise"
    status, view = got[0]
    assert (status, view["state"]) == (200, "pending")
    assert view["version"] >= 2


# ---- non-finite numbers are not JSON -------------------------------------------------------------


def test_non_finite_schema_bound_is_invalid_json(gate: GateProcess) -> None:
    before = snapshot(gate)
    raw = wire_json(
        {
            "pipeline": "p",
            "step": "ask",
            "text": "How much?",
            "response_type": "form",
            "schema": AMOUNT_FORM,
        }
    ).replace(b'"maximum":100', b'"maximum":1e999')

    status, out = gate.api().call(
        "POST", "/v1/questions", raw, headers={"Content-Type": "application/json"}
    )

    assert (status, out["status"], out["reason"]) == (400, "invalid", "invalid_json"), out
    assert snapshot(gate) == before


def test_non_finite_form_answer_is_invalid_json_before_and_after_the_win(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    q = ask(gate, response_type="form", schema=AMOUNT_FORM)
    d = dispatch_of(relay, q["question_id"])
    before = snapshot(gate)

    for text in ("1e999", "-1e999"):
        status, out, _ = post_decision(gate.callback_url, answer_raw(d, {"amount": 0}, text))
        assert (status, out["status"], out["reason"]) == (400, "invalid", "invalid_json"), out
    assert snapshot(gate) == before

    status, out, _ = post_decision(gate.callback_url, answer_raw(d, {"amount": 5}))
    assert status == 200, out
    # the winner sends again with a non-finite value: refused as not JSON, never a 500
    status, out, _ = post_decision(gate.callback_url, answer_raw(d, {"amount": 0}, "1e999"))
    assert (status, out["reason"]) == (400, "invalid_json"), out
    assert "Traceback" not in gate.log()


# ---- the step's limits bound a form at creation --------------------------------------------------


def _form(prop: dict[str, Any], required: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": {"f": prop}}
    if required:
        schema["required"] = ["f"]
    return {"response_type": "form", "schema": schema}


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        pytest.param(
            _form({"type": "string", "enum": ["a", "b", "c", "d"]}), "enum", id="enum-over-step"
        ),
        pytest.param(
            _form({"type": "array", "items": {"type": "string", "enum": ["a", "b", "c", "d"]}}),
            "items.enum",
            id="multi-enum-over-step",
        ),
        pytest.param(
            _form({"type": "string", "minLength": 11}), "minLength", id="min-over-answer-chars"
        ),
        pytest.param(
            _form({"type": "string", "maxLength": 0}, required=True),
            "maxLength",
            id="required-max-zero",
        ),
    ],
)
def test_form_the_step_cannot_answer_is_400_naming_the_path(
    gate: GateProcess, fields: dict[str, Any], path: str
) -> None:
    before = snapshot(gate)

    status, out = gate.api().call(
        "POST", "/v1/questions", {"pipeline": "p", "step": "tight", "text": "q", **fields}
    )

    assert (status, out["reason"], out["field"]) == (
        400,
        "invalid_schema",
        f"schema.properties.f.{path}",
    ), out
    assert snapshot(gate) == before


def test_form_within_the_step_limits_is_created_and_revised(gate: GateProcess) -> None:
    q = ask(gate, step="tight", **_form({"type": "string", "enum": ["a", "b", "c"]}))

    status, out = revise(gate, q["question_id"], {"text": "again"})

    assert (status, out["version"]) == (200, 2), out
