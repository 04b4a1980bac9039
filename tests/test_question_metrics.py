"""Questions in ``GET /metrics`` on a real daemon: a question relay outage shows
in the dispatch counters and in its own up gauge, which its alert rule selects; a refused
answer counts once, in ``hitl_gate_answers_total`` only."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gate.protocol.answer import build_answer
from tests.support import CaptureRelay, GateProcess, post_decision, wait_until, write_config
from tests.test_metrics import _rules, _series_names, by_label, scrape, value

pytestmark = pytest.mark.e2e

STEPS = [{"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"}]


@pytest.fixture
def relays() -> Iterator[tuple[CaptureRelay, CaptureRelay]]:
    """(the approvals' relay, the questions' relay)."""
    pair = (CaptureRelay().start(), CaptureRelay().start())
    yield pair
    for relay in pair:
        relay.stop()


def test_question_relay_outage_counts_as_failed_dispatches(
    tmp_path: Path, relays: tuple[CaptureRelay, CaptureRelay]
) -> None:
    relay, qrelay = relays
    config = write_config(tmp_path, relay.url, steps=STEPS, relay={"question_url": qrelay.url})
    gate = GateProcess(config).start()
    try:
        qrelay.status = 503
        body = {"pipeline": "p", "step": "ask", "text": "Which?", "response_type": "free_text"}
        status, question = gate.api().call("POST", "/v1/questions", body)
        assert status == 201, question
        wait_until(lambda: qrelay.received, what="a refused question dispatch")

        def counted(acked: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            samples = scrape(gate)[1]
            total = value(samples, "hitl_gate_dispatch_attempts_total")
            return samples if total == len(qrelay.received) and total > acked else None

        samples = wait_until(lambda: counted(0), what="the failed attempt counted")
        refused = len(qrelay.received)
        assert by_label(samples, "hitl_gate_dispatch_failures_total", "reason") == {
            "http_status": refused,
            "timeout": 0,
            "connection": 0,
        }
        assert value(samples, "hitl_gate_question_relay_up") == 0
        # the approvals' relay gauge says nothing of the question relay (no approval sent)
        assert ("hitl_gate_relay_up", ()) not in samples
        assert not relay.received

        qrelay.status = 202
        dispatch = wait_until(
            lambda: next(iter(qrelay.dispatches()), None), what="the question dispatch acked"
        )
        samples = wait_until(
            lambda: (
                s
                if (s := scrape(gate)[1]).get(("hitl_gate_question_relay_up", ())) == 1
                and value(s, "hitl_gate_dispatch_attempts_total") == len(qrelay.received)
                else None
            ),
            what="the acked attempt counted",
        )
        assert value(samples, "hitl_gate_dispatch_ack_seconds_count") == 1
        exposed = {name for name, _ in samples}
        for rule in _rules():
            if "question" in rule["alert"].lower():
                assert _series_names(rule["expr"]) <= exposed, rule

        # a refused answer (422: not blank) counts in answers_total only
        answer = build_answer(
            question_id=dispatch["question_id"],
            nonce=dispatch["callback"]["nonce"],
            request_hash=dispatch["request_hash"],
            value=" ",
            approver_id=dispatch["approvers"][0],
            decided_at_ms=int(time.time() * 1000),
        )
        status, out, _ = post_decision(gate.callback_url, answer)
        assert (status, out["reason"]) == (422, "invalid_value")
        samples = scrape(gate)[1]
        assert by_label(samples, "hitl_gate_answers_total", "result") == {
            "accepted": 0,
            "invalid_value": 1,
        }
        assert by_label(samples, "hitl_gate_decisions_refused_total", "reason") == {}
    finally:
        assert gate.stop() == 0
