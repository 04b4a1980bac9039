"""What a request promises on one gate holds across gates on one PostgreSQL database: the same
Idempotency-Key sent to two gates at once is one request (one approval, one ``created``
entry, one dispatch; 201 once, 200 for the other, the same id and receipt), and with another
body it is refused 409 ``idempotency_key_reused`` on every gate; a nonce replayed to another
gate is refused as on one gate (``duplicate``, ``already_decided``, ``superseded``,
``already_resolved``; signed too long ago: 401 ``timestamp_out_of_window``), and the same
signed decision sent to two gates at once is recorded once. Real gate processes on a
throwaway server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gate.protocol.canonical import wire_json
from tests.pg_server import pg_fixtures, psycopg_or_skip
from tests.support import CaptureRelay, GateProcess, decision_body, post_decision
from tests.test_gate_on_postgres import (
    assert_log_whole,
    at_once,
    decide,
    gate_fixtures,
    rows,
    start_gate,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg_or_skip()

server, url = pg_fixtures()
relay = gate_fixtures()[0]
ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"


@pytest.fixture
def gates(tmp_path: Path, relay: CaptureRelay, url: str) -> Iterator[list[GateProcess]]:
    """Two gates on the test's database."""
    started = [start_gate(tmp_path / name, relay, url) for name in "ab"]
    yield started
    for gate in started:
        gate.stop()


def refusal(status: int, reason: str) -> Any:
    """A matcher of ``(status, answer)`` for a refusal with ``reason``."""
    return lambda answer: (answer[0], answer[1]["reason"]) == (status, reason)


def send_raw(gate: GateProcess, raw: bytes) -> tuple[int, Any]:
    status, answer, _ = post_decision(gate.callback_url, raw)
    return status, answer


def test_requests_the_same_idempotency_key_on_two_gates_at_once_is_one_request(
    gates: list[GateProcess], relay: CaptureRelay, url: str
) -> None:
    for round_ in range(4):
        body = f"deploy {round_}?\n"
        payload = {"pipeline": "p", "step": "q1", "draft": {"body": body}}
        key = {"Idempotency-Key": f"cluster-create-{round_}"}
        answers = at_once(
            [partial(gate.api().call, "POST", "/v1/approvals", payload, key) for gate in gates]
        )

        assert sorted(status for status, _ in answers) == [200, 201], answers
        (approval_id,) = {answer["approval_id"] for _, answer in answers}
        assert len({str(answer["created_receipt"]) for _, answer in answers}) == 1, answers
        created = "SELECT count(*) FROM audit_log WHERE kind = 'created' AND approval_id = %s"
        assert rows(url, created, approval_id) == [(1,)]
        assert rows(url, "SELECT count(*) FROM outbox WHERE approval_id = %s", approval_id) == [
            (1,)
        ]
        for gate in gates:  # read-your-writes on either gate
            assert gate.api().get(approval_id)["approval_id"] == approval_id
            other = {**payload, "draft": {"body": "something else\n"}}
            status, answer = gate.api().call("POST", "/v1/approvals", other, key)
            assert (status, answer["reason"]) == (409, "idempotency_key_reused"), answer
    assert rows(url, "SELECT count(*) FROM approvals") == [(4,)]
    assert_log_whole(url)


def test_requests_a_nonce_replayed_to_another_gate_is_refused_as_on_one(
    gates: list[GateProcess], relay: CaptureRelay, url: str
) -> None:
    a, b = gates
    approval_id = a.api().create("q2")["approval_id"]
    first = relay.wait_dispatch(approval_id)
    raw = wire_json(decision_body(first, ALICE))
    assert send_raw(a, raw)[0] == 200
    assert send_raw(b, raw) == (409, {"status": "duplicate", "reason": "duplicate"})
    assert refusal(409, "already_decided")(decide(b, decision_body(first, ALICE, "skip")))
    decided = "SELECT count(*) FROM decisions WHERE approval_id = %s"
    assert rows(url, decided, approval_id) == [(1,)]
    assert b.api().get(approval_id)["quorum"] == {"required": 2, "collected": 1}

    # Bob adjusts on A: revision 2; a revision-1 nonce is superseded on B
    adjust = decision_body(first, BOB, "adjust", adjust_text="deploy, but later\n")
    assert decide(a, adjust)[0] == 200
    assert refusal(409, "superseded")(decide(b, decision_body(first, CAROL)))
    second = relay.wait_dispatch(approval_id, revision=2)
    assert decide(b, decision_body(second, ALICE))[0] == 200  # with Bob's adjust: quorum
    assert a.api().wait_resolved(approval_id)["outcome"] == "adjusted"
    for gate in gates:  # after the resolution, any replay on any gate
        assert refusal(409, "already_resolved")(send_raw(gate, raw))
        assert refusal(409, "already_resolved")(decide(gate, decision_body(second, BOB)))
        # signed longer ago than relay.security.max_skew (300 s): refused before the nonce
        status, answer, _ = post_decision(gate.callback_url, raw, t=int(time.time()) - 400)
        assert refusal(401, "timestamp_out_of_window")((status, answer))


def test_requests_the_same_signed_decision_on_two_gates_at_once_is_recorded_once(
    gates: list[GateProcess], relay: CaptureRelay, url: str
) -> None:
    for _ in range(4):
        approval_id = gates[0].api().create("q2")["approval_id"]
        raw = wire_json(decision_body(relay.wait_dispatch(approval_id), ALICE))
        answers = at_once([partial(send_raw, gate, raw) for gate in gates])

        assert sorted(status for status, _ in answers) == [200, 409], answers
        assert refusal(409, "duplicate")(max(answers, key=lambda answer: answer[0]))
        decided = "SELECT count(*) FROM decisions WHERE approval_id = %s"
        assert rows(url, decided, approval_id) == [(1,)]
        kinds = "SELECT kind FROM audit_log WHERE approval_id = %s AND kind = 'decision'"
        assert len(rows(url, kinds, approval_id)) == 1
    assert_log_whole(url)
