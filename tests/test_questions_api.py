"""Questions' hard cases over real HTTP: every refusal of the answer table and of the
pipeline API with its exact status, reason and field, each proven to change nothing (the
question rows and the audit log read back from the real SQLite file); racing answers (exactly
one wins); the long-poll woken by an answer and the one whose wait elapses."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from ulid import ULID

from tests import support
from tests.support import (
    API_TOKEN,
    ASK_STEP,
    DEADLINE_S,
    Q1_STEP,
    Api,
    CaptureRelay,
    GateProcess,
    ask,
    db,
    dispatch_of,
    kinds_of,
    module_gate,
    post_decision,
    snapshot,
    write_config,
)

pytestmark = pytest.mark.e2e

# answers here come over the "test" channel
answer_body = functools.partial(support.answer_body, channel="test")

MAX_DRAFT_BYTES = 4096
FORM = {
    "type": "object",
    "properties": {
        "amount": {"type": "integer", "minimum": 1, "maximum": 100},
        "price": {"type": "number", "maximum": 9.5},
        "email": {"type": "string", "format": "email"},
        "site": {"type": "string", "format": "uri"},
        "when": {"type": "string", "format": "date"},
        "note": {"type": "string", "minLength": 2},
        "urgent": {"type": "boolean"},
        "colour": {"type": "string", "enum": ["red", "green"]},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "minItems": 1},
    },
    "required": ["amount", "email"],
}
STEPS = [
    Q1_STEP,
    # alice and bob may answer; carol is an allowed user outside this step's scope
    ASK_STEP,
    {
        "name": "tight",
        "type": "question",
        "approvers": [101, 102],
        "timeout": "1h",
        "max_options": 3,
        "max_answer_chars": 10,
    },
]


relay, gate = module_gate(
    "qhard", steps=STEPS, relay={"questions": True}, api={"max_draft_bytes": MAX_DRAFT_BYTES}
)


def post(gate: GateProcess, body: dict[str, Any]) -> tuple[int, Any]:
    status, out, _ = post_decision(gate.callback_url, body)
    return status, out


# ---- the answer table: checks 5x-13, each refusal changes nothing ---------------------------


def _unknown(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    d = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
    return answer_body(d, "x", question_id=str(ULID()))


def _nonce_of_another(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    d = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
    other = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
    return answer_body(d, "x", nonce=other["callback"]["nonce"])


def _superseded(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    q = ask(gate, response_type="free_text")
    d1 = dispatch_of(relay, q["question_id"])
    status, out = gate.api().call(
        "POST", f"/v1/questions/{q['question_id']}/revise", {"text": "What PO number?"}
    )
    assert status == 200 and out["version"] == 2, out
    dispatch_of(relay, q["question_id"], 2)
    return answer_body(d1, "PO-1")


def _hash_mismatch(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    d = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
    return answer_body(d, "x", request_hash="sha256:" + "0" * 64)


def _approver(who: str) -> Callable[[GateProcess, CaptureRelay], dict[str, Any]]:
    def make(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
        d = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
        return answer_body(d, "x", who=who)

    return make


def _approval_id_only(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    d = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
    body = answer_body(d, "x")
    body["approval_id"] = body.pop("question_id")
    return body


def _answer_to_approval(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    d = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
    approval = gate.api().create(step="q1")
    return answer_body(d, "x", question_id=approval["approval_id"])


def _decision_to_question(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    d = dispatch_of(relay, ask(gate, response_type="free_text")["question_id"])
    return {
        "protocol": "hitl/v0",
        "approval_id": d["question_id"],
        "nonce": d["callback"]["nonce"],
        "decision": "approve",
        "payload_hash": d["request_hash"],
        "approver": {"id": "alice@example.com"},
        "decided_at": "2026-08-02T09:31:05Z",
    }


REFUSALS = [
    pytest.param(_unknown, 404, "unknown_question:unknown_question", None, id="unknown-question"),
    pytest.param(
        _nonce_of_another, 403, "forbidden:nonce_mismatch", None, id="nonce-of-another-question"
    ),
    pytest.param(_superseded, 409, "superseded:superseded", None, id="superseded-after-revise"),
    pytest.param(
        _hash_mismatch, 403, "forbidden:request_hash_mismatch", None, id="request-hash-mismatch"
    ),
    pytest.param(
        _approver("carol@example.com"), 403, "forbidden:approver_not_allowed", None, id="carol"
    ),
    pytest.param(
        _approver("dave@example.com"), 403, "forbidden:approver_not_allowed", None, id="dave"
    ),
    pytest.param(
        _approver("eve@example.com"), 403, "forbidden:approver_not_allowed", None, id="stranger"
    ),
    pytest.param(
        _approval_id_only, 400, "invalid:invalid_question_id", "question_id", id="approval-id-only"
    ),
    pytest.param(
        _answer_to_approval, 409, "conflict:wrong_kind", None, id="answer-names-an-approval"
    ),
    pytest.param(
        _decision_to_question, 409, "conflict:wrong_kind", None, id="approve-names-a-question"
    ),
]


@pytest.mark.parametrize(("make", "status", "word_reason", "field"), REFUSALS)
def test_answer_refusal_is_exact_and_changes_nothing(
    gate: GateProcess,
    relay: CaptureRelay,
    make: Callable[[GateProcess, CaptureRelay], dict[str, Any]],
    status: int,
    word_reason: str,
    field: str | None,
) -> None:
    """``word_reason`` is ``"<status word>:<reason>"``: SPEC §2's answers of checks 6-13 use
    the reason as the status word (``unknown_approval``, ``superseded``), 403s ``forbidden``."""
    body = make(gate, relay)
    before = snapshot(gate)

    got, out = post(gate, body)

    assert (got, f"{out['status']}:{out['reason']}") == (status, word_reason), out
    if field is not None:
        assert out["field"] == field, out
    assert snapshot(gate) == before


CHOICES = {"response_type": "single_choice", "options": ["acme", "globex"]}
MULTI = {"response_type": "multi_choice", "options": ["a", "b", "c"]}
GOOD_FORM = {"amount": 5, "email": "a@b.io"}  # fits max_answer_chars 10
INVALID_VALUES = [
    pytest.param("ask", {"response_type": "free_text"}, "", "value", id="blank-text"),
    pytest.param("ask", {"response_type": "free_text"}, " \t\n", "value", id="whitespace-text"),
    pytest.param("ask", {"response_type": "free_text"}, 42, "value", id="text-not-a-string"),
    pytest.param("tight", {"response_type": "free_text"}, "x" * 11, "value", id="text-too-long"),
    pytest.param("ask", CHOICES, "initech", "value", id="option-not-offered"),
    pytest.param("ask", CHOICES, "ACME", "value", id="option-case-differs"),
    pytest.param("ask", CHOICES, ["acme"], "value", id="single-given-a-list"),
    pytest.param("ask", MULTI, [], "value", id="empty-multi"),
    pytest.param("ask", MULTI, ["a", "a"], "value[1]", id="duplicate-in-multi"),
    pytest.param("ask", MULTI, ["a", "z"], "value[1]", id="multi-option-not-offered"),
    pytest.param("ask", MULTI, "a", "value", id="multi-given-a-string"),
    pytest.param("ask", {}, {"email": "ann@example.com"}, "value.amount", id="form-missing"),
    pytest.param("ask", {}, {**GOOD_FORM, "amount": 101}, "value.amount", id="above-maximum"),
    pytest.param("ask", {}, {**GOOD_FORM, "amount": 0}, "value.amount", id="below-minimum"),
    pytest.param("ask", {}, {**GOOD_FORM, "amount": 1.5}, "value.amount", id="not-an-integer"),
    pytest.param("ask", {}, {**GOOD_FORM, "amount": "5"}, "value.amount", id="wrong-type"),
    pytest.param("ask", {}, {**GOOD_FORM, "amount": True}, "value.amount", id="bool-as-int"),
    pytest.param("ask", {}, {**GOOD_FORM, "price": 10}, "value.price", id="number-too-big"),
    pytest.param("ask", {}, {**GOOD_FORM, "extra": 1}, "value.extra", id="unknown-field"),
    pytest.param("ask", {}, {**GOOD_FORM, "email": "ann"}, "value.email", id="bad-email"),
    pytest.param("ask", {}, {**GOOD_FORM, "site": "not a uri"}, "value.site", id="bad-uri"),
    pytest.param("ask", {}, {**GOOD_FORM, "when": "2026-13-01"}, "value.when", id="bad-date"),
    pytest.param("ask", {}, {**GOOD_FORM, "note": "x"}, "value.note", id="too-short"),
    pytest.param("ask", {}, {**GOOD_FORM, "urgent": "yes"}, "value.urgent", id="not-boolean"),
    pytest.param("ask", {}, {**GOOD_FORM, "colour": "blue"}, "value.colour", id="not-in-enum"),
    pytest.param("ask", {}, {**GOOD_FORM, "tags": []}, "value.tags", id="too-few-items"),
    pytest.param("ask", {}, [GOOD_FORM], "value", id="form-given-a-list"),
    pytest.param("tight", {}, {**GOOD_FORM, "note": "y" * 11}, "value.note", id="form-too-long"),
]


@pytest.mark.parametrize(("step", "fields", "value", "field"), INVALID_VALUES)
def test_answer_invalid_value_is_422_naming_the_field_and_changes_nothing(
    gate: GateProcess,
    relay: CaptureRelay,
    step: str,
    fields: dict[str, Any],
    value: Any,
    field: str,
) -> None:
    q = ask(gate, step, **(fields or {"response_type": "form", "schema": FORM}))
    d = dispatch_of(relay, q["question_id"])
    before = snapshot(gate)

    status, out = post(gate, answer_body(d, value))

    assert (status, out["status"], out["reason"], out["field"]) == (
        422,
        "invalid",
        "invalid_value",
        field,
    ), out
    assert snapshot(gate) == before
    # and the question still takes a valid answer
    good = {"free_text": "ok", "single_choice": "acme", "multi_choice": ["b"], "form": GOOD_FORM}
    assert post(gate, answer_body(d, good[q["question"]["response_type"]]))[0] == 200


def test_answer_over_the_rate_limit_is_429_and_changes_nothing(
    tmp_path: Path, relay: CaptureRelay
) -> None:
    config = write_config(
        tmp_path,
        relay.url,
        steps=STEPS,
        relay={"questions": True},
        security={"rate_limit": 2},
    )
    limited = GateProcess(config).start()
    try:
        dispatches = [
            dispatch_of(relay, ask(limited, response_type="free_text")["question_id"])
            for _ in range(3)
        ]
        # alice's two recorded answers use up her budget of 2 a minute
        assert post(limited, answer_body(dispatches[0], "first"))[0] == 200
        assert post(limited, answer_body(dispatches[1], "second"))[0] == 200
        before = snapshot(limited)

        status, out = post(limited, answer_body(dispatches[2], "third"))

        assert (status, out["status"], out["reason"]) == (429, "rate_limited", "rate_limited")
        assert 1 <= out["retry_after"] <= 60
        assert snapshot(limited) == before
        # another approver is not limited by alice's answers
        assert post(limited, answer_body(dispatches[2], "third", who="bob@example.com"))[0] == 200
    finally:
        limited.stop()


# ---- racing answers: exactly one wins -----------------------------------------------------


def race(gate: GateProcess, bodies: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    """POST every body at once (threads released together by a barrier)."""
    barrier = threading.Barrier(len(bodies))

    def send(body: dict[str, Any]) -> tuple[int, Any]:
        barrier.wait(DEADLINE_S)
        return post(gate, body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(send, bodies))


@pytest.mark.parametrize("round_", range(3))
def test_racing_answers_from_different_approvers_exactly_one_wins(
    gate: GateProcess, relay: CaptureRelay, round_: int
) -> None:
    q = ask(gate, response_type="free_text")
    d = dispatch_of(relay, q["question_id"])
    bodies = [
        answer_body(d, f"answer {n}", who=("alice@example.com", "bob@example.com")[n % 2])
        for n in range(8)
    ]

    results = race(gate, bodies)

    winners = [n for n, (status, _) in enumerate(results) if status == 200]
    assert len(winners) == 1, results
    losers = [out for status, out in results if status != 200]
    assert {(out["status"], out["reason"]) for out in losers} <= {
        ("already_resolved", "already_resolved")
    }, losers
    assert all(status == 409 for status, _ in results if status != 200)
    won = bodies[winners[0]]
    view = gate.api().call("GET", f"/v1/questions/{q['question_id']}")[1]
    assert (view["answer"]["value"], view["answer"]["identity"]) == (
        won["value"],
        won["approver"]["id"],
    )
    kinds = kinds_of(gate, q["question_id"])
    assert kinds.count("question_answered") == 1 and kinds.count("question_resolved") == 1
    assert db(gate, "SELECT answer FROM questions WHERE question_id = ?", q["question_id"]) == [
        (f'"{won["value"]}"',)
    ]


def test_racing_same_answer_twice_one_recorded_one_duplicate(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    q = ask(gate, response_type="single_choice", options=["acme", "globex"])
    d = dispatch_of(relay, q["question_id"])
    body = answer_body(d, "acme", who="bob@example.com")

    results = race(gate, [body, dict(body)])

    assert sorted(status for status, _ in results) == [200, 409], results
    assert [out["reason"] for status, out in results if status == 409] == ["duplicate"]
    kinds = kinds_of(gate, q["question_id"])
    assert kinds.count("question_answered") == 1 and kinds.count("question_resolved") == 1


# ---- long-poll ---------------------------------------------------------------------------------


def test_long_poll_returns_when_answered_elsewhere(gate: GateProcess, relay: CaptureRelay) -> None:
    q = ask(gate, response_type="free_text")
    d = dispatch_of(relay, q["question_id"])
    got: list[tuple[int, Any]] = []
    # a wait far longer than the test's deadline: only the answer can end it in time
    poll = threading.Thread(
        target=lambda: got.append(
            gate.api().call("GET", f"/v1/questions/{q['question_id']}?wait=300")
        ),
        daemon=True,
    )
    poll.start()

    assert post(gate, answer_body(d, "PO-77"))[0] == 200

    poll.join(DEADLINE_S)
    assert not poll.is_alive(), "the long-poll was not woken by the answer"
    status, view = got[0]
    assert (status, view["state"], view["outcome"]) == (200, "resolved", "answered")
    assert view["answer"]["value"] == "PO-77"


def test_long_poll_wait_elapses_pending(gate: GateProcess) -> None:
    q = ask(gate, response_type="free_text")

    status, view = gate.api().call("GET", f"/v1/questions/{q['question_id']}?wait=0.3")

    assert (status, view["state"], view["outcome"], view["answer"]) == (200, "pending", None, None)


@pytest.mark.parametrize("wait", ["-1", "301", "soon", "nan", "%D9%A3", "1_0", "infinity"])
def test_long_poll_bad_wait_is_400(gate: GateProcess, wait: str) -> None:
    q = ask(gate, response_type="free_text")
    status, out = gate.api().call("GET", f"/v1/questions/{q['question_id']}?wait={wait}")
    assert (status, out["reason"], out["field"]) == (400, "invalid_wait", "wait")


@pytest.mark.parametrize("limit", ["%D9%A3", "%C2%B2", "1_0", "9" * 5000])
def test_list_limit_of_other_than_ascii_digits_is_400(gate: GateProcess, limit: str) -> None:
    """``int()`` took ``٣`` as 3 (and 5000 digits raised): a count is ASCII digits."""
    status, out = gate.api().call("GET", f"/v1/questions?limit={limit}")
    assert (status, out["reason"], out["field"]) == (400, "invalid_limit", "limit"), out


# ---- the pipeline API's refusals ------------------------------------------------------------


def schema_with(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


API_REFUSALS = [
    pytest.param({"text": "  "}, 400, "invalid_text", "text", id="blank-text"),
    pytest.param({"text": None}, 400, "invalid_text", "text", id="no-text"),
    pytest.param(
        {"text": "x" * (MAX_DRAFT_BYTES + 1)}, 413, "question_too_large", "text", id="too-large"
    ),
    pytest.param(
        {"text": "é" * (MAX_DRAFT_BYTES // 2 + 1)},
        413,
        "question_too_large",
        "text",
        id="too-large-in-utf8-bytes",
    ),
    pytest.param(
        {"response_type": "yes_no"}, 400, "invalid_response_type", "response_type", id="type"
    ),
    pytest.param({"reason": "r" * 2001}, 400, "invalid_reason", "reason", id="reason-too-long"),
    pytest.param(
        {"response_type": "single_choice"}, 400, "invalid_options", "options", id="no-options"
    ),
    pytest.param(
        {"response_type": "single_choice", "options": []},
        400,
        "invalid_options",
        "options",
        id="empty-options",
    ),
    pytest.param(
        {"response_type": "multi_choice", "options": ["a", "b", "a"]},
        400,
        "invalid_options",
        "options[2]",
        id="duplicate-option",
    ),
    pytest.param(
        {"response_type": "single_choice", "options": ["a", " "]},
        400,
        "invalid_options",
        "options[1]",
        id="blank-option",
    ),
    pytest.param(
        {"options": ["a", "b"]}, 400, "invalid_options", "options", id="options-on-free-text"
    ),
    pytest.param(
        {"step": "tight", "response_type": "single_choice", "options": ["a", "b", "c", "d"]},
        400,
        "invalid_options",
        "options",
        id="more-than-max-options",
    ),
    pytest.param(
        {"schema": schema_with(a={"type": "string"})},
        400,
        "invalid_schema",
        "schema",
        id="schema-on-free-text",
    ),
    pytest.param({"response_type": "form"}, 400, "invalid_schema", "schema", id="form-no-schema"),
    pytest.param(
        {
            "response_type": "form",
            "schema": schema_with(amount={"type": "integer", "minimum": 5, "maximum": 1}),
        },
        400,
        "invalid_schema",
        "schema.properties.amount.minimum",
        id="min-above-max",
    ),
    pytest.param(
        {"response_type": "form", "schema": schema_with(inner={"type": "object"})},
        400,
        "invalid_schema",
        "schema.properties.inner.type",
        id="nested-object",
    ),
    pytest.param(
        {
            "response_type": "form",
            "schema": schema_with(n={"type": "array", "items": {"type": "number"}}),
        },
        400,
        "invalid_schema",
        "schema.properties.n.items",
        id="array-of-numbers",
    ),
    pytest.param(
        {"response_type": "form", "schema": schema_with(a={"type": "string", "pattern": "x"})},
        400,
        "invalid_schema",
        "schema.properties.a.pattern",
        id="unknown-keyword",
    ),
    pytest.param(
        {"response_type": "form", "schema": schema_with(a={"type": "string", "format": "ipv4"})},
        400,
        "invalid_schema",
        "schema.properties.a.format",
        id="unknown-format",
    ),
    pytest.param(
        {
            "response_type": "form",
            "schema": {**schema_with(a={"type": "boolean"}), "required": ["b"]},
        },
        400,
        "invalid_schema",
        "schema.required[0]",
        id="required-unknown",
    ),
    pytest.param(
        {"response_type": "form", "schema": schema_with(**{"1bad": {"type": "string"}})},
        400,
        "invalid_schema",
        "schema.properties.1bad",
        id="bad-property-name",
    ),
    pytest.param({"step": "q1"}, 400, "step_is_approval", "step", id="approval-step"),
    pytest.param({"pipeline": "nope"}, 404, "unknown_pipeline", None, id="unknown-pipeline"),
    pytest.param({"step": "nope"}, 404, "unknown_step", None, id="unknown-step"),
]


@pytest.mark.parametrize(("fields", "status", "reason", "field"), API_REFUSALS)
def test_create_refusal_is_exact_and_changes_nothing(
    gate: GateProcess, fields: dict[str, Any], status: int, reason: str, field: str | None
) -> None:
    body = {"pipeline": "p", "step": "ask", "text": "Which?", "response_type": "free_text"}
    body.update(fields)
    body = {key: value for key, value in body.items() if value is not None}
    before = snapshot(gate)

    got, out = gate.api().call("POST", "/v1/questions", body)

    assert (got, out["reason"]) == (status, reason), out
    if field is not None:
        assert out["field"] == field, out
    assert snapshot(gate) == before


def test_question_endpoints_need_the_bearer_token(gate: GateProcess) -> None:
    q = ask(gate, response_type="free_text")
    before = snapshot(gate)
    paths = [
        ("POST", "/v1/questions", {"pipeline": "p", "step": "ask", "text": "t"}),
        ("GET", "/v1/questions", None),
        ("GET", f"/v1/questions/{q['question_id']}", None),
        ("POST", f"/v1/questions/{q['question_id']}/cancel", None),
        ("POST", f"/v1/questions/{q['question_id']}/revise", {"text": "u"}),
    ]
    for method, path, body in paths:
        assert Api(gate.api_url, None).call(method, path, body) == (
            401,
            {"status": "unauthorized", "reason": "token_missing"},
        ), path
        assert Api(gate.api_url, API_TOKEN + "x").call(method, path, body)[0] == 401, path
    assert snapshot(gate) == before


def test_unknown_question_id_is_404_on_every_endpoint(gate: GateProcess) -> None:
    missing = str(ULID())
    api = gate.api()
    for method, path, body in [
        ("GET", f"/v1/questions/{missing}", None),
        ("GET", f"/v1/questions/{missing}?wait=0.1", None),
        ("POST", f"/v1/questions/{missing}/cancel", None),
        ("POST", f"/v1/questions/{missing}/revise", {"text": "x"}),
    ]:
        status, out = api.call(method, path, body)
        assert (status, out["reason"]) == (404, "unknown_question"), (path, out)


def test_revise_and_cancel_of_a_resolved_question_are_409(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    api = gate.api()
    answered = ask(gate, response_type="free_text")
    assert post(gate, answer_body(dispatch_of(relay, answered["question_id"]), "yes"))[0] == 200
    cancelled = ask(gate, response_type="free_text")
    assert api.call("POST", f"/v1/questions/{cancelled['question_id']}/cancel")[0] == 200
    before = snapshot(gate)

    for q, outcome in ((answered, "answered"), (cancelled, "cancelled")):
        qid = q["question_id"]
        status, out = api.call("POST", f"/v1/questions/{qid}/revise", {"text": "again?"})
        assert (status, out["reason"], out["outcome"]) == (409, "already_resolved", outcome)
        status, out = api.call("POST", f"/v1/questions/{qid}/cancel")
        assert (status, out["reason"], out["outcome"]) == (409, "already_resolved", outcome)
    assert snapshot(gate) == before


@pytest.mark.parametrize(
    ("body", "status", "reason", "field"),
    [
        pytest.param({}, 400, "invalid_revise", None, id="no-field"),
        pytest.param({"text": ""}, 400, "invalid_text", "text", id="blank-text"),
        pytest.param(
            {"response_type": "single_choice"}, 400, "invalid_options", "options", id="no-options"
        ),
        pytest.param(
            {"text": "x" * (MAX_DRAFT_BYTES + 1)}, 413, "question_too_large", "text", id="large"
        ),
    ],
)
def test_revise_refusal_changes_nothing(
    gate: GateProcess, body: dict[str, Any], status: int, reason: str, field: str | None
) -> None:
    q = ask(gate, response_type="free_text")
    before = snapshot(gate)

    got, out = gate.api().call("POST", f"/v1/questions/{q['question_id']}/revise", body)

    assert (got, out["reason"]) == (status, reason), out
    if field is not None:
        assert out["field"] == field
    assert snapshot(gate) == before


def test_revise_keeps_the_deadline_and_changes_hash_and_nonce(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    q = ask(gate, response_type="single_choice", options=["acme", "globex"])
    d1 = dispatch_of(relay, q["question_id"])

    status, revised = gate.api().call(
        "POST",
        f"/v1/questions/{q['question_id']}/revise",
        {"response_type": "free_text"},
    )

    assert status == 200, revised
    assert (revised["expires_at"], revised["created_at"]) == (q["expires_at"], q["created_at"])
    assert revised["question"] == {"text": "Which supplier?", "response_type": "free_text"}
    d2 = dispatch_of(relay, q["question_id"], 2)
    assert d2["expires_at"] == d1["expires_at"]
    assert d2["request_hash"] != d1["request_hash"]
    assert d2["callback"]["nonce"] != d1["callback"]["nonce"]
    assert kinds_of(gate, q["question_id"]).count("question_revised") == 1


def test_question_text_and_answers_never_reach_the_log(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    q = ask(gate, text="Secret question 7d1f?", reason="secret reason 3b9e", **CHOICES)
    d = dispatch_of(relay, q["question_id"])
    assert post(gate, answer_body(d, "initech-4c2a"))[0] == 422
    assert post(gate, answer_body(d, "globex"))[0] == 200
    gate.wait_for_line(rf"event=question_answered question_id={q['question_id']}")

    log = gate.log()
    for secret in ("Secret question 7d1f", "secret reason 3b9e", "initech-4c2a", "globex"):
        assert secret not in log, secret


BIG = 10**400
HUGE_BOUNDS = [
    pytest.param("integer", {"minimum": BIG}, "minimum", id="int-min-10**400"),
    pytest.param("integer", {"minimum": -BIG, "maximum": BIG}, "minimum", id="int-both-huge"),
    pytest.param("integer", {"minimum": 0.5, "maximum": BIG}, "maximum", id="int-half-to-huge"),
    pytest.param("number", {"maximum": BIG}, "maximum", id="num-max-10**400"),
    pytest.param("number", {"maximum": 2**53 + 1}, "maximum", id="num-max-2**53+1"),
]


@pytest.mark.parametrize(("kind", "bounds", "key"), HUGE_BOUNDS)
def test_create_and_revise_refuse_bounds_beyond_2_53_and_change_nothing(
    gate: GateProcess, kind: str, bounds: dict[str, Any], key: str
) -> None:
    """A bound no float holds answered 500 internal_error; it is 400 invalid_schema naming
    the JSON path, on create and on revise, and nothing is created or changed."""
    q = ask(gate, response_type="free_text")
    schema = schema_with(n={"type": kind, **bounds})
    body = {"pipeline": "p", "step": "ask", "text": "How many?", "response_type": "form"}
    before = snapshot(gate)
    for path, sent in (
        ("/v1/questions", {**body, "schema": schema}),
        (f"/v1/questions/{q['question_id']}/revise", {"response_type": "form", "schema": schema}),
    ):
        got, out = gate.api().call("POST", path, sent)
        assert (got, out["reason"], out["field"]) == (
            400,
            "invalid_schema",
            f"schema.properties.n.{key}",
        ), out
        assert out["message"] == (
            f"schema.properties.n.{key} must be a number between -2**53 and 2**53"
            " (±9007199254740992)"
        )
        assert snapshot(gate) == before
