"""The question sender: its last look before a POST (a question resolved, revised, acked or
expired between the dispatch plan and the attempt is not sent, exactly as the approvals'
dispatcher decides) and, against a real daemon, a send that cannot be built."""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from gate.daemon.delivery import still_due
from gate.model import Dispatch, Question, QuestionVersion
from tests.outbox_harness import ScriptedRelay
from tests.support import GateProcess, wait_until, write_config

NOW = 1_767_225_600_000
V1 = QuestionVersion(
    1, {"text": "q", "response_type": "free_text"}, "sha256:" + "1" * 64, "a" * 32, NOW
)
V2 = replace(V1, version=2, request_hash="sha256:" + "2" * 64, nonce="b" * 32)
PENDING = Question(
    question_id="01KDWZ8B00J3Q9V5X7Z2M4N6PR",
    run_id="r",
    pipeline="p",
    step="ask",
    risk="normal",
    scope=((101, "alice@example.com"),),
    version=1,
    state="pending",
    outcome=None,
    created_at=NOW,
    expires_at=NOW + 60_000,
    resolved_at=None,
    idempotency_key=None,
    request_body_hash="0" * 64,
    requested_by=None,
    requested_by_id=None,
    answer=None,
    receipt=None,
    versions=(V1,),
    outbox=(Dispatch(1, 0, NOW, None, None),),
)


def test_still_due_a_pending_current_unacked_version() -> None:
    assert still_due(PENDING, 1, NOW)


@pytest.mark.parametrize(
    ("question", "version", "now"),
    [
        pytest.param(
            replace(PENDING, state="resolved", outcome="cancelled"), 1, NOW, id="cancelled"
        ),
        pytest.param(replace(PENDING, state="resolved", outcome="answered"), 1, NOW, id="answered"),
        pytest.param(replace(PENDING, state="resolved", outcome="timeout"), 1, NOW, id="timeout"),
        pytest.param(replace(PENDING, version=2, versions=(V1, V2)), 1, NOW, id="revised"),
        pytest.param(
            replace(PENDING, outbox=(Dispatch(1, 1, NOW, NOW, None),)), 1, NOW, id="acked"
        ),
        pytest.param(PENDING, 1, NOW + 60_000, id="past-expires-at"),
    ],
)
def test_still_due_not_after_the_plan_changed(question: Question, version: int, now: int) -> None:
    assert not still_due(question, version, now)


# ---- the sender against a real daemon -------------------------------------------------------

STEPS = [{"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"}]


def ask(gate: GateProcess, run_id: str) -> str:
    body = {
        "pipeline": "p",
        "step": "ask",
        "run_id": run_id,
        "text": "Which supplier?",
        "response_type": "free_text",
    }
    status, answer = gate.api().call("POST", "/v1/questions", body)
    assert status == 201, (status, answer)
    return str(answer["question_id"])


def outbox_row(db: Path, question_id: str) -> tuple[int, int | None, str | None]:
    """``(attempts, delivered_at, last_error)`` of the question's dispatch, as stored."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        row = conn.execute(
            "SELECT attempts, delivered_at, last_error FROM question_outbox"
            " WHERE question_id = ? AND version = 1",
            (question_id,),
        ).fetchone()
    return int(row[0]), row[1], row[2]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_question_dispatch_that_cannot_be_built_is_retried_with_backoff_not_in_a_hot_loop(
    tmp_path: Path, scripted: ScriptedRelay
) -> None:
    """A fault while building one question's dispatch (here: a stored question that lost its
    text) is recorded as that attempt's failure and retried with backoff, as approvals'
    dispatches are; other questions are dispatched as usual. Nothing is sent after the fault."""
    scripted.script = {"poison": (503, 0.0)}  # its first attempt fails: the row waits 0.25-0.5 s
    config = write_config(tmp_path, scripted.url, steps=STEPS, relay={"questions": True})
    db = tmp_path / "gate.db"
    gate = GateProcess(config).start()
    try:
        poison = ask(gate, "poison")
        wait_until(lambda: outbox_row(db, poison)[0] >= 1, what="the first (refused) attempt")
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
            conn.execute(
                "UPDATE question_versions SET question = '{}' WHERE question_id = ?", (poison,)
            )
            conn.commit()
        wait_until(
            lambda: "could not be built" in (outbox_row(db, poison)[2] or ""),
            15.0,
            "the failure recorded",
        )
        attempts, delivered_at, error = outbox_row(db, poison)
        assert (delivered_at, error) == (None, "the dispatch could not be built (KeyError)")

        other = ask(gate, "other")
        wait_until(lambda: outbox_row(db, other)[1], what="the other question's ack")
        # backoff, not a loop: 0.5 s doubling means a handful of attempts by now, not thousands
        attempts = outbox_row(db, poison)[0]
        assert 2 <= attempts <= 6, attempts
        failures = gate.log().count(f"event=question_dispatch_failed question_id={poison}")
        assert failures <= 6, failures
        assert scripted.count("poison") == 1
        assert gate.stop() == 0
    finally:
        if gate.proc and gate.proc.poll() is None:
            gate.stop()
