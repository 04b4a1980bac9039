"""The question sender's last look before a POST (review finding 7): a question
resolved, revised, acked or expired between the dispatch plan and the attempt is not sent,
exactly as the approvals' dispatcher decides (``Dispatcher._send``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gate.core.model import Dispatch, Question, QuestionVersion
from gate.daemon.question_sender import still_due

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
