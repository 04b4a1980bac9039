"""The per-approver rate limit (SPEC §2 check 13) across gates: on PostgreSQL its attempts
are in ``rate_events``, read and written inside the serialised write batch, so the window is
exact whichever gate an attempt reaches, also when they arrive at once; an attempt refused
after check 13 (a duplicate, check 14) still counts, on both backends; each write deletes
the approver's attempts older than the window. Real gate processes on a throwaway server."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gate.config import load_config
from gate.core.transactions import Transactions
from gate.postgres.connection import PgConnection
from gate.store.batch import Faults, Job, run_batch
from gate.store.pg_backend import PgBatch
from gate.store.pg_rate import PgRateEvents
from tests.pg_server import pg_fixtures, psycopg_or_skip
from tests.support import (
    ASK_STEP,
    Q1_STEP,
    CaptureRelay,
    GateProcess,
    answer,
    ask,
    decision_body,
    dispatch_of,
    write_config,
)
from tests.test_gate_on_postgres import at_once, decide, gate_fixtures, rows, start_gate
from tests.test_store_pg_connection import RECEIPT_KEY, Hand, ManualClock

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]

psycopg = psycopg_or_skip()

server, url = pg_fixtures()
relay, gates = gate_fixtures()
ALICE, BOB = "alice@example.com", "bob@example.com"
ALICE_ID = 101
RATE_LIMITED = {"status": "rate_limited", "reason": "rate_limited"}


def opened(gate: GateProcess, relay: CaptureRelay) -> dict[str, Any]:
    """A new quorum-2 approval created on ``gate``: its dispatch."""
    return relay.wait_dispatch(gate.api().create("q2")["approval_id"])


def limited(answer: tuple[int, Any]) -> bool:
    """True for a 429 ``rate_limited`` answer with a retry_after of 1-60 s."""
    status, body = answer
    if status != 429:
        return False
    assert {k: v for k, v in body.items() if k != "retry_after"} == RATE_LIMITED, body
    assert 1 <= body["retry_after"] <= 60, body
    return True


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_ratelimit_counts_an_attempt_refused_after_check_13(
    backend: str, tmp_path: Path, relay: CaptureRelay, url: str, gates: list[GateProcess]
) -> None:
    """rate_limit 2: Alice's decision (recorded) and the same decision again (409
    ``duplicate``, check 14) are two attempts: her next decision is 429, Bob's is not."""
    security = {"rate_limit": 2}
    if backend == "sqlite":
        gate = GateProcess(write_config(tmp_path, relay.url, security=security)).start()
    else:
        gate = start_gate(tmp_path, relay, url, security=security)
    gates.append(gate)
    first, second = opened(gate, relay), opened(gate, relay)
    alice = decision_body(first, ALICE)

    assert decide(gate, alice)[0] == 200
    assert decide(gate, alice) == (409, {"status": "duplicate", "reason": "duplicate"})
    assert limited(decide(gate, decision_body(second, ALICE)))
    assert decide(gate, decision_body(second, BOB))[0] == 200
    if backend == "postgresql":
        kept = rows(url, "SELECT count(*) FROM rate_events WHERE operator_id = %s", ALICE_ID)
        assert kept == [(2,)]  # the refused attempt is kept; the 429 is not an attempt


def test_ratelimit_is_one_window_across_gates(
    tmp_path: Path, relay: CaptureRelay, url: str, gates: list[GateProcess]
) -> None:
    """rate_limit 5 on two gates: Alice's attempts spread over both count in one window,
    the sixth is 429 wherever it lands, also on a gate restarted since; six sent at once:
    five recorded, one 429."""
    security = {"rate_limit": 5}
    gates.extend(start_gate(tmp_path / name, relay, url, security=security) for name in "ab")
    dispatches = [opened(gates[i % 2], relay) for i in range(12)]

    for i, dispatch in enumerate(dispatches[:5]):
        assert decide(gates[i % 2], decision_body(dispatch, ALICE))[0] == 200
    for gate in gates:
        assert limited(decide(gate, decision_body(dispatches[5], ALICE)))
    assert decide(gates[1], decision_body(dispatches[5], BOB))[0] == 200  # per approver
    # a gate restarted (killed, even) does not forget the minute: the attempts are the database's
    gates[0].kill9()
    gates[0] = GateProcess(gates[0].config, env=gates[0].env).start()
    assert limited(decide(gates[0], decision_body(dispatches[5], ALICE)))
    decided = rows(url, "SELECT count(*) FROM decisions WHERE operator_id = %s", ALICE_ID)
    assert decided == [(5,)]

    # Carol's six at once, three on each gate: exactly five get through
    answers = at_once(
        [
            partial(decide, gates[i % 2], decision_body(dispatch, "carol@example.com"))
            for i, dispatch in enumerate(dispatches[6:])
        ]
    )
    assert sorted(status for status, _ in answers) == [200] * 5 + [429], answers
    assert sum(limited(answer) for answer in answers) == 1
    carol = rows(url, "SELECT count(*) FROM decisions WHERE operator_id = 103")
    assert carol == [(5,)]


def test_ratelimit_keeps_only_the_window_on_postgres(url: str) -> None:
    """The window is read as ``(count, oldest)``, this batch's attempts included; the
    batch's attempts are written once, by ``flush``, which deletes their approvers' attempts
    the rule no longer counts, and only theirs; an attempt of a job that never ended (it
    failed on a storage error) is not written."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO rate_events VALUES (101, 1000), (101, 60000), (101, 61000), (102, 1000),"
            " (103, 500)"
        )
    sqlite_like: Any = PgConnection(psycopg.connect(url, autocommit=True))
    events = PgRateEvents(sqlite_like)
    sqlite_like.execute("BEGIN")
    assert events.window(101, 1000) == (2, 60000)
    events.job_started()
    events.add(101, 61001, 1001)
    assert events.window(101, 1000) == (3, 60000)  # the running job's, not yet written
    events.job_ended()
    events.job_started()
    events.add(104, 61002, 1002)
    assert events.window(104, 1002) == (1, 61002)
    events.job_started()  # the job adding 104's attempt never ended: it does not count
    assert events.window(104, 1002) == (0, None)
    events.add(102, 61003, 1003)
    events.job_ended()
    assert events.window(102, 0) == (2, 1000)
    events.flush()
    events.flush()  # nothing more to write
    sqlite_like.execute("COMMIT")
    sqlite_like.close()
    found = rows(url, "SELECT operator_id, at_ms FROM rate_events ORDER BY 1, 2")
    assert found == [(101, 60000), (101, 61000), (101, 61001), (102, 61003), (103, 500)]


def test_ratelimit_counts_answers_and_decisions_together_across_gates(
    tmp_path: Path, relay: CaptureRelay, url: str, gates: list[GateProcess]
) -> None:
    """One window per approver, whatever they send: rate_limit 2, Alice's answer to a
    question on one gate and her decision on the other fill it; her next answer is 429."""
    config: dict[str, Any] = {
        "security": {"rate_limit": 2},
        "steps": [Q1_STEP, ASK_STEP],
        "relay": {"questions": True},
    }
    gates.extend(start_gate(tmp_path / name, relay, url, **config) for name in "ab")
    asked = (ask(gates[0], response_type="free_text") for _ in range(2))
    first, second = (dispatch_of(relay, question["question_id"]) for question in asked)
    approval = relay.wait_dispatch(gates[1].api().create("q1")["approval_id"])

    assert answer(gates[0], first, "ACME", ALICE)[0] == 200
    assert decide(gates[1], decision_body(approval, ALICE))[0] == 200
    assert limited(answer(gates[0], second, "ACME", ALICE))
    assert answer(gates[1], second, "ACME", BOB)[0] == 200


def test_ratelimit_a_job_refused_after_a_write_keeps_its_attempt_on_postgres(
    url: str, tmp_path: Path
) -> None:
    """Without SAVEPOINTs, a job refused after it wrote has the batch rolled back and the
    jobs before it run again; its attempt (it passed check 13) is carried into the new
    transaction and written with the batch; the jobs run again count theirs once."""
    conn: Any = PgConnection(psycopg.connect(url, autocommit=True))
    config = load_config(write_config(tmp_path, "http://127.0.0.1:9/unused"))
    t = Transactions(config, ManualClock(), RECEIPT_KEY, None)

    def attempt(tx: Any, write: bool = False) -> None:
        t.rate.check(ALICE_ID, t.clock.now_ms(), tx.rate_events)
        if write:
            tx.append_audit("probe_entry", None, t.clock.now_ms(), {}, RECEIPT_KEY)
            tx.flush_audit()  # a row written: the refusal below undoes it by a new round
            raise RuntimeError("refused after a write")

    jobs = [Job(Hand(attempt)), Job(Hand(partial(attempt, write=True))), Job(Hand(attempt))]
    result = run_batch(conn, jobs, t.run, Faults(tmp_path / "f"), backend=PgBatch())
    errors = [type(error).__name__ if error else None for _, _, error in result.answers]
    conn.close()
    assert sorted(map(str, errors)) == ["None", "None", "RuntimeError"]
    assert rows(url, "SELECT count(*) FROM rate_events WHERE operator_id = %s", ALICE_ID) == [(3,)]
    assert rows(url, "SELECT count(*) FROM audit_log") == [(0,)]
