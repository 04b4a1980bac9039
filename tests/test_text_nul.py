"""U+0000 (NUL) in a text field of a JSON request body is refused 400 ``invalid_<field>`` with
a sentence naming it, on both backends alike, before anything is written: PostgreSQL's
``text`` cannot hold it, and a draft a human approves must not hide the end of a C string.
The other control characters stay text (the displays mark them). Real gate processes, one
per backend and test; each refusal checked against the rows read back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gate.protocol.envelope import nul_field
from tests.pg_server import pg_fixtures, psycopg_or_skip
from tests.support import (
    CaptureRelay,
    GateProcess,
    db,
    decision_body,
    post_decision,
    write_config,
)
from tests.test_gate_on_postgres import gate_fixtures, rows, start_gate

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()

server, url = pg_fixtures()
relay = gate_fixtures()[0]
STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]
COUNTED = ("approvals", "revisions", "decisions", "questions", "audit_log")


@pytest.fixture(params=["sqlite", "postgresql"])
def gate(
    request: pytest.FixtureRequest, tmp_path: Path, relay: CaptureRelay, url: str
) -> Iterator[tuple[GateProcess, Any]]:
    """A gate on each backend, and how to count its rows (``count(table)``)."""
    path = write_config(tmp_path, relay.url, steps=STEPS, relay={"questions": True})
    if request.param == "sqlite":
        started = GateProcess(path).start()

        def count(table: str) -> int:
            return int(db(started, f"SELECT count(*) FROM {table}")[0][0])
    else:
        started = start_gate(tmp_path, relay, url, steps=STEPS, relay={"questions": True})

        def count(table: str) -> int:
            return int(rows(url, f"SELECT count(*) FROM {table}")[0][0])

    yield started, count
    started.stop()


def api_post(gate: GateProcess, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """POST ``body`` as JSON (U+0000 goes over the wire as its ``\\u0000`` escape)."""
    return gate.api().call("POST", path, body)


def refused(answer: tuple[int, Any], field: str) -> None:
    status, body = answer
    assert (status, body["status"], body["reason"], body["field"]) == (
        400,
        "invalid",
        f"invalid_{field.split('[')[0]}",
        field,
    ), body
    assert body["message"] == f"{field} holds U+0000 (NUL): not allowed in text", body


def draft(body: str) -> dict[str, Any]:
    return {"pipeline": "p", "step": "q1", "draft": {"content_type": "text/plain", "body": body}}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        pytest.param(draft("pay 12\x00000 to X"), "draft.body", id="draft-body"),
        pytest.param({**draft("x"), "run_id": "r\x00"}, "run_id", id="run-id"),
        pytest.param({**draft("x"), "label": "\x00"}, "label", id="unknown-field"),
    ],
)
def test_text_nul_is_refused_in_a_create(
    gate: tuple[GateProcess, Any], body: dict[str, Any], field: str
) -> None:
    started, count = gate
    before = [count(table) for table in COUNTED]
    refused(api_post(started, "/v1/approvals", body), field)
    assert [count(table) for table in COUNTED] == before
    assert "Traceback" not in started.log()


def test_text_nul_is_refused_in_a_question_and_a_decision(
    gate: tuple[GateProcess, Any], relay: CaptureRelay
) -> None:
    started, count = gate
    question = {
        "pipeline": "p",
        "step": "ask",
        "text": "Which\x00PO?",
        "response_type": "free_text",
    }
    refused(api_post(started, "/v1/questions", question), "text")
    assert count("questions") == 0

    approval_id = started.api().create("q1")["approval_id"]
    dispatch = relay.wait_dispatch(approval_id)
    for key, verb in (("reason", "skip"), ("adjust_text", "adjust")):
        body = decision_body(dispatch, "alice@example.com", verb, **{key: "a\x00b"})
        status, answer, _ = post_decision(started.callback_url, body)
        refused((status, answer), key)
    assert count("decisions") == 0
    # the other control characters are text: the same decision with U+0001 is taken
    body = decision_body(dispatch, "alice@example.com", "skip", reason="a\x01b")
    assert post_decision(started.callback_url, body)[0] == 200


@pytest.mark.parametrize(
    ("value", "field"),
    [
        pytest.param({"a": "ok", "b": ["x", "y\x00"]}, "b[1]", id="list-item"),
        pytest.param({"a": {"k\x00": "v"}}, "a", id="key-reported-at-its-parent"),
        pytest.param("\x00", "json", id="top-level-string"),
        pytest.param({"a": "\x01\x7f"}, None, id="other-controls-are-text"),
    ],
)
def test_text_nul_field_names_the_first(value: Any, field: str | None) -> None:
    assert nul_field(value) == field


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        pytest.param("GET", "/v1/approvals/a%00b", (404, "unknown_approval"), id="get"),
        pytest.param("GET", "/v1/questions/a%00b?wait=1", (404, "unknown_question"), id="wait"),
        pytest.param("POST", "/v1/approvals/a%00b/cancel", (404, "unknown_approval"), id="cancel"),
        pytest.param("GET", "/v1/approvals?pipeline=p%00", (200, None), id="list"),
    ],
)
def test_text_nul_in_a_url_names_nothing_on_either_backend(
    gate: tuple[GateProcess, Any], method: str, path: str, expected: tuple[int, str | None]
) -> None:
    """A URL is no JSON body: an id or a name holding U+0000 (``%00``) finds nothing, the
    answer SQLite always gave, also on PostgreSQL (whose driver cannot send it)."""
    started, _ = gate
    started.api().create("q1")
    status, answer = started.api().call(method, path)
    if expected[1] is None:
        assert (status, answer) == (200, {"items": [], "next_cursor": None})
    else:
        assert (status, answer["reason"]) == expected, answer
