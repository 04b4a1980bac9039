"""Questions through expiry and kill -9: a question left alone resolves ``timeout``
at its ``expires_at`` and a later answer is 410 ``expired``; a pending question survives a
SIGKILL of the daemon, is sent again if its dispatch was never acked, and still expires on its
original ``expires_at``. Real daemons, a capturing relay, signed answers, the SQLite file."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests import support
from tests.support import (
    ASK_STEP,
    Q1_STEP,
    CaptureRelay,
    GateProcess,
    db,
    dispatch_of,
    kinds_of,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.e2e

# this module's question, and the approver who answers it
ask = functools.partial(support.ask, text="What PO number?")
answer = functools.partial(support.answer, who="alice@example.com")

STEPS = [
    Q1_STEP,
    ASK_STEP,
    {"name": "brief", "type": "question", "approvers": [101, 102], "timeout": "3s"},
]


def config(tmp_path: Path, relay: CaptureRelay) -> Path:
    return write_config(tmp_path, relay.url, steps=STEPS, relay={"questions": True})


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def view(gate: GateProcess, question_id: str, wait: float | None = None) -> dict[str, Any]:
    path = f"/v1/questions/{question_id}" + (f"?wait={wait}" if wait is not None else "")
    status, out = gate.api().call("GET", path)
    assert status == 200, (status, out)
    return out


def wait_resolved(gate: GateProcess, question_id: str, timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"question {question_id} not resolved in {timeout} s"
        found = view(gate, question_id, wait=round(min(remaining, 10), 2))
        if found["state"] == "resolved":
            return found


# ---- expiry ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_question_expires_as_timeout_and_a_late_answer_is_410(
    tmp_path: Path, relay: CaptureRelay, spawn: Callable[[Path], GateProcess]
) -> None:
    gate = spawn(config(tmp_path, relay))
    q = ask(gate, "brief", response_type="single_choice", options=["acme", "globex"])
    d = dispatch_of(relay, q["question_id"])

    final = wait_resolved(gate, q["question_id"])

    assert (final["state"], final["outcome"], final["answer"]) == ("resolved", "timeout", None)
    assert final["expires_at"] == q["expires_at"]
    assert epoch(final["resolved_at"]) >= epoch(final["expires_at"])
    assert final["receipt"] is not None
    assert kinds_of(gate, q["question_id"])[-1] == "question_resolved"
    assert db(
        gate,
        "SELECT state, outcome, answer FROM questions WHERE question_id = ?",
        q["question_id"],
    ) == [("resolved", "timeout", None)]
    before = db(gate, "SELECT COUNT(*) FROM audit_log")

    # a fresh, validly signed answer after the gate's own clock expired it
    assert answer(gate, d, "acme") == (410, {"status": "expired", "reason": "expired"})
    assert db(gate, "SELECT COUNT(*) FROM audit_log") == before
    assert view(gate, q["question_id"]) == final
    # and the pipeline cannot cancel or revise it any more
    status, out = gate.api().call("POST", f"/v1/questions/{q['question_id']}/cancel")
    assert (status, out["reason"], out["outcome"]) == (409, "already_resolved", "timeout")


# ---- kill -9 and restart ----------------------------------------------------------------------


def test_kill9_keeps_an_acked_pending_question(
    tmp_path: Path, relay: CaptureRelay, spawn: Callable[[Path], GateProcess]
) -> None:
    gate = spawn(config(tmp_path, relay))
    q = ask(gate, response_type="multi_choice", options=["a", "b", "c"])
    d = dispatch_of(relay, q["question_id"])
    before = wait_until(
        lambda: (v := view(gate, q["question_id"]))["dispatch"]["delivered_at"] and v,
        what="the ack recorded",
    )

    gate.kill9()
    restarted = spawn(gate.config)

    after = view(restarted, q["question_id"])
    assert after["state"] == "pending"
    for key in ("expires_at", "created_at", "request_hash", "question", "version", "approvers"):
        assert after[key] == before[key], key
    assert after["dispatch"]["delivered_at"] == before["dispatch"]["delivered_at"]
    # the nonce dispatched before the crash still answers it, on the new listener
    assert answer(restarted, d, ["c", "a"]) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "answered"},
    )
    assert view(restarted, q["question_id"])["answer"]["value"] == ["c", "a"]


def test_kill9_unacked_question_is_dispatched_after_restart(
    tmp_path: Path, relay: CaptureRelay, spawn: Callable[[Path], GateProcess]
) -> None:
    relay.status = 503
    gate = spawn(config(tmp_path, relay))
    q = ask(gate, response_type="free_text")
    # the relay sees an attempt before the gate records it: wait for the record
    wait_until(
        lambda: view(gate, q["question_id"])["dispatch"]["attempts"] >= 1,
        what="a refused attempt recorded",
    )
    gate.kill9()
    assert [d for d in relay.dispatches() if d.get("question_id") == q["question_id"]] == []

    relay.status = 202
    restarted = spawn(gate.config)
    d = dispatch_of(relay, q["question_id"])

    assert d["callback"]["url"] == restarted.callback_url
    assert d["expires_at"] == q["expires_at"] and d["request_hash"] == q["request_hash"]
    acked = wait_until(
        lambda: (v := view(restarted, q["question_id"]))["dispatch"]["delivered_at"] and v,
        what="the ack recorded after the restart",
    )
    assert acked["state"] == "pending" and acked["dispatch"]["attempts"] >= 2
    assert acked["expires_at"] == q["expires_at"]
    assert answer(restarted, d, "PO-5")[0] == 200
    assert kinds_of(restarted, q["question_id"]).count("question_dispatch_ack") == 1


@pytest.mark.slow
def test_kill9_question_expires_on_its_original_expires_at(
    tmp_path: Path, relay: CaptureRelay, spawn: Callable[[Path], GateProcess]
) -> None:
    gate = spawn(config(tmp_path, relay))
    q = ask(gate, "brief", response_type="free_text")
    dispatch_of(relay, q["question_id"])
    gate.kill9()
    assert time.time() < epoch(q["expires_at"])  # killed while still pending

    restarted = spawn(gate.config)  # back before the deadline: the expiry is re-armed
    final = wait_resolved(restarted, q["question_id"])

    assert (final["state"], final["outcome"]) == ("resolved", "timeout")
    assert final["expires_at"] == q["expires_at"]
    assert epoch(final["resolved_at"]) >= epoch(q["expires_at"])


@pytest.mark.slow
def test_kill9_question_expired_while_down_resolves_timeout_on_restart(
    tmp_path: Path, relay: CaptureRelay, spawn: Callable[[Path], GateProcess]
) -> None:
    gate = spawn(config(tmp_path, relay))
    q = ask(gate, "brief", response_type="free_text")
    d = dispatch_of(relay, q["question_id"])
    gate.kill9()
    deadline = epoch(q["expires_at"])
    wait_until(lambda: time.time() > deadline + 0.2, timeout=10, what="expires_at to pass")

    restarted = spawn(gate.config)
    # past expires_at, whether or not the expiry worker got to it yet: 410
    assert answer(restarted, d, "too late") == (410, {"status": "expired", "reason": "expired"})
    final = wait_resolved(restarted, q["question_id"], timeout=10)

    assert (final["state"], final["outcome"], final["answer"]) == ("resolved", "timeout", None)
    assert final["expires_at"] == q["expires_at"]
    assert epoch(final["resolved_at"]) > deadline
    assert "question_answered" not in kinds_of(restarted, q["question_id"])
