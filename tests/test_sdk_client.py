"""The SDK's clients (gate/sdk): AsyncGate and Gate against a real daemon and a
capturing relay on loopback, decisions and answers signed and posted as a relay does."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from gate.protocol.answer import build_answer
from gate.sdk import (
    Approval,
    ApprovalCancelled,
    ApprovalDenied,
    ApprovalNotGranted,
    ApprovalPending,
    ApprovalTimedOut,
    AsyncGate,
    Gate,
    GateRequestError,
    GateUnavailable,
    QuestionNotAnswered,
)
from tests.support import (
    API_TOKEN,
    CaptureRelay,
    GateProcess,
    decision_body,
    module_gate,
    post_decision,
    wait_until,
)
from tests.support import db as rows

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "short", "quorum": 1, "approvers": [101, 102], "timeout": "2s"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]


relay, gate = module_gate("sdk", steps=STEPS, relay={"questions": True})


def decide(
    gate: GateProcess, relay: CaptureRelay, approval_id: str, verb: str, **extra: Any
) -> None:
    """Answer the approval's dispatch as a relay does (signed), asserting the gate took it."""
    dispatch = relay.wait_dispatch(approval_id)
    status, out, _ = post_decision(gate.callback_url, decision_body(dispatch, verb=verb, **extra))
    assert status == 200, (status, out)


def decide_later(
    gate: GateProcess, relay: CaptureRelay, approval_id: str, verb: str, **extra: Any
) -> threading.Thread:
    """``decide`` in a thread, for a client blocked on the outcome meanwhile."""
    thread = threading.Thread(target=decide, args=(gate, relay, approval_id, verb), kwargs=extra)
    thread.start()
    return thread


def pending_id(gate: GateProcess, step: str) -> str:
    """The id of the one pending approval on ``step`` (waits for it to exist)."""
    found = wait_until(
        lambda: [
            a["approval_id"]
            for a in gate.api().call("GET", "/v1/approvals?state=pending")[1]["items"]
            if a["step"] == step
        ],
        what=f"a pending approval on {step}",
    )
    assert len(found) == 1, found
    return str(found[0])


# ---- AsyncGate -----------------------------------------------------------------------


async def test_sdk_async_approve_after_pending(gate: GateProcess, relay: CaptureRelay) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        first = await client.request_approval("p", "q1", "Send invoice 7\n", run_id="r-1", wait=0)
        assert (first.state, first.outcome, first.body) == ("pending", None, None)
        with pytest.raises(ApprovalPending):
            first.raise_for_outcome()
        await asyncio.to_thread(decide, gate, relay, first.id, "approve")

        final = await client.get_approval(first.id)

    assert final.raise_for_outcome() is final
    assert (final.state, final.outcome, final.body) == ("resolved", "approved", "Send invoice 7\n")
    assert final.granted and final.decided_by == ("alice@example.com",)
    assert final.payload_hash == first.payload_hash and final.run_id == "r-1"
    assert final.receipt is not None and final.receipt["seq"] > 0
    assert final.content_type == "text/plain" and final.raw["approval_id"] == final.id
    stored = rows(gate, "SELECT outcome FROM approvals WHERE approval_id = ?", final.id)
    assert stored == [("approved",)]


async def test_sdk_async_blocks_until_adjusted_and_returns_the_edit(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        waiting = asyncio.create_task(client.request_approval("p", "q1", "Pay 100 EUR\n"))
        approval_id = await asyncio.to_thread(pending_id, gate, "q1")
        await asyncio.to_thread(decide, gate, relay, approval_id, "adjust", adjust_text="Pay 90")

        final = await waiting

    assert (final.id, final.outcome, final.body) == (approval_id, "adjusted", "Pay 90")
    assert final.raise_for_outcome() is final


async def test_sdk_async_skip_raises_denied_with_the_reason(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        made = await client.request_approval("p", "q1", "Delete the table\n", wait=0)
        await asyncio.to_thread(decide, gate, relay, made.id, "skip", reason="not on Fridays")
        final = await client.get_approval(made.id, wait=30)

    assert (final.outcome, final.body, final.reason) == ("skipped", None, "not on Fridays")
    with pytest.raises(ApprovalDenied, match="not on Fridays") as caught:
        final.raise_for_outcome()
    assert caught.value.reason == "not on Fridays" and caught.value.approval is final
    assert caught.value.skipped_by == ("alice@example.com",)
    assert isinstance(caught.value, ApprovalNotGranted)


async def test_sdk_async_skip_after_an_approve_names_only_the_skipper(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        made = await client.request_approval("p", "q2", "Two must agree\n", wait=0)
        dispatch = await asyncio.to_thread(relay.wait_dispatch, made.id)
        for who, verb in (("alice@example.com", "approve"), ("bob@example.com", "skip")):
            body = decision_body(dispatch, identity=who, verb=verb)
            status, out, _ = await asyncio.to_thread(post_decision, gate.callback_url, body)
            assert status == 200, out
        final = await client.get_approval(made.id, wait=30)

    assert final.outcome == "skipped"
    assert final.decided_by == ("alice@example.com", "bob@example.com")
    with pytest.raises(ApprovalDenied, match="skipped by bob@example.com$") as caught:
        final.raise_for_outcome()
    assert caught.value.skipped_by == ("bob@example.com",) and caught.value.reason is None


async def test_sdk_async_cancel(gate: GateProcess) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        made = await client.request_approval("p", "q1", "Cancel me\n", wait=0)
        cancelled = await client.cancel_approval(made.id)
        with pytest.raises(GateRequestError) as again:
            await client.cancel_approval(made.id)

    assert (cancelled.state, cancelled.outcome) == ("resolved", "cancelled")
    with pytest.raises(ApprovalCancelled):
        cancelled.raise_for_outcome()
    assert again.value.status == 409


@pytest.mark.slow
async def test_sdk_async_gate_side_timeout_raises_timed_out(gate: GateProcess) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        final = await client.request_approval("p", "short", "Nobody looks\n")

    assert (final.state, final.outcome) == ("resolved", "timeout")
    with pytest.raises(ApprovalTimedOut):
        final.raise_for_outcome()


async def test_sdk_async_bounded_wait_returns_pending(gate: GateProcess) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        made = await client.request_approval("p", "q1", "Wait a bit\n", wait=0.3)
        listed = await client.list_pending("p")
        await client.cancel_approval(made.id)

    assert made.state == "pending" and not made.granted
    assert made.id in {a.id for a in listed}


async def test_sdk_async_same_key_joins_the_same_approval(gate: GateProcess) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        one = await client.request_approval("p", "q1", "Once\n", idempotency_key="k-1", wait=0)
        two = await client.request_approval("p", "q1", "Once\n", idempotency_key="k-1", wait=0)
        other = await client.request_approval("p", "q1", "Once\n", wait=0)
        with pytest.raises(GateRequestError) as reused:
            await client.request_approval("p", "q1", "Twice\n", idempotency_key="k-1", wait=0)
        for made in (one, other):
            await client.cancel_approval(made.id)

    assert one.id == two.id != other.id
    assert (reused.value.status, reused.value.reason) == (409, "idempotency_key_reused")


async def test_sdk_async_gate_errors_name_reason_and_field(gate: GateProcess) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        with pytest.raises(GateRequestError) as unknown:
            await client.request_approval("p", "nope", "x", wait=0)
        with pytest.raises(GateRequestError) as bad_type:
            await client.request_approval("p", "q1", "x", content_type="", wait=0)
    async with AsyncGate(gate.api_url, "wrong-token") as client:
        with pytest.raises(GateRequestError) as denied:
            await client.list_pending()

    assert unknown.value.status == 404
    assert bad_type.value.status == 400 and bad_type.value.field
    assert denied.value.status == 401


async def test_sdk_async_unreachable_gate_raises_unavailable_with_no_wait() -> None:
    async with AsyncGate("http://127.0.0.1:9", API_TOKEN) as client:
        with pytest.raises(GateUnavailable, match="cannot reach the gate"):
            await client.request_approval("p", "q1", "x", wait=0)


async def test_sdk_async_question_answered(gate: GateProcess, relay: CaptureRelay) -> None:
    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        asked = await client.ask(
            "p",
            "ask",
            "Which supplier?",
            response_type="single_choice",
            options=["acme", "globex"],
            wait=0,
        )
        dispatch = wait_until(
            lambda: [d for d in relay.dispatches() if d.get("question_id") == asked.id],
            what="question dispatch",
        )[0]
        body = build_answer(
            question_id=asked.id,
            nonce=dispatch["callback"]["nonce"],
            request_hash=dispatch["request_hash"],
            value="globex",
            approver_id=dispatch["approvers"][0],
            decided_at_ms=int(time.time() * 1000),
        )
        status, _, _ = await asyncio.to_thread(post_decision, gate.callback_url, body)
        answered = await client.get_question(asked.id)
        other = await client.ask("p", "ask", "Cancel me?", wait=0)
        cancelled = await client.cancel_question(other.id)

    assert status == 200
    assert (answered.outcome, answered.answer) == ("answered", "globex")
    assert answered.raise_for_outcome() is answered and answered.answered_by
    assert (answered.text, answered.response_type) == ("Which supplier?", "single_choice")
    with pytest.raises(QuestionNotAnswered):
        cancelled.raise_for_outcome()


# ---- Gate (sync) ---------------------------------------------------------------------


def test_sdk_sync_blocks_until_approved(gate: GateProcess, relay: CaptureRelay) -> None:
    client = Gate(gate.api_url, API_TOKEN)
    thread = threading.Thread(target=lambda: decide(gate, relay, pending_id(gate, "q1"), "approve"))
    thread.start()

    final = client.request_approval("p", "q1", "Sync please\n", content_type="text/markdown")
    thread.join()

    assert isinstance(final, Approval)
    assert (final.outcome, final.body, final.content_type) == (
        "approved",
        "Sync please\n",
        "text/markdown",
    )
    assert client.get_approval(final.id) == final


async def test_sdk_sync_refuses_inside_a_running_loop(gate: GateProcess) -> None:
    with pytest.raises(RuntimeError, match="AsyncGate"):
        Gate(gate.api_url, API_TOKEN).list_pending()


def test_sdk_from_env_and_from_config(gate: GateProcess) -> None:
    env = {"HITL_GATE_URL": gate.api_url, "HITL_GATE_TOKEN": API_TOKEN}
    assert Gate.from_env(env).list_pending() == Gate(gate.api_url, API_TOKEN).list_pending()
    with pytest.raises(ValueError, match="HITL_GATE_TOKEN is not set"):
        AsyncGate.from_env({"HITL_GATE_URL": gate.api_url})
    # api.listen binds port 0 in tests: from_config resolves it as the CLI does
    assert AsyncGate.from_config(gate.config, {"HITL_API_TOKEN": API_TOKEN}).url.startswith(
        "http://127.0.0.1:"
    )
    with pytest.raises(ValueError, match="HITL_API_TOKEN"):
        AsyncGate.from_config(gate.config, {})


def test_sdk_rejects_a_bad_url_or_wait() -> None:
    with pytest.raises(ValueError, match="url must be"):
        Gate("ftp://x", API_TOKEN)
    with pytest.raises(ValueError, match="wait must be"):
        Gate("http://127.0.0.1:9", API_TOKEN).get_approval("x", wait=-1)


# ---- review 18c findings 11, 12: ids are one path segment, keys the gate's rule ---------


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda g, q: g.cancel_approval(f"../questions/{q}"), "approval_id"),
        (lambda g, q: g.get_approval("a/b", wait=0), "approval_id"),
        (lambda g, q: g.get_question("..", wait=0), "question_id"),
        (lambda g, q: g.cancel_question(f"../approvals/{q}"), "question_id"),
        (lambda g, q: g.request_approval("p", "q1", "x", idempotency_key="a\nb"),
         "idempotency_key"),
        (lambda g, q: g.request_approval("p", "q1", "x", idempotency_key="k" * 100_000),
         "idempotency_key"),
        (lambda g, q: g.request_approval("p", "q1", "x", idempotency_key=""), "idempotency_key"),
        (lambda g, q: g.ask("p", "ask", "Which?", idempotency_key=" "), "idempotency_key"),
    ],
)  # fmt: skip
def test_sdk_refuses_ids_and_keys_the_gate_would_misread(
    gate: GateProcess, call: Any, argument: str
) -> None:
    client = Gate(gate.api_url, API_TOKEN)
    question = client.ask("p", "ask", "Still there?", wait=0)
    before = rows(gate, "SELECT COUNT(*) FROM approvals")

    with pytest.raises(ValueError, match=f"^{argument}: "):
        call(client, question.id)

    assert client.get_question(question.id, wait=0).state == "pending"  # not cancelled
    assert rows(gate, "SELECT COUNT(*) FROM approvals") == before
    client.cancel_question(question.id)


def test_sdk_async_gate_follows_the_running_loop(gate: GateProcess) -> None:
    """Review 18c finding 9: one AsyncGate used from two ``asyncio.run`` calls works in both,
    and every approval it made is returned (none made and then lost to a loop error)."""
    client = AsyncGate(gate.api_url, API_TOKEN)
    before = rows(gate, "SELECT COUNT(*) FROM approvals")[0][0]

    first = asyncio.run(client.request_approval("p", "q1", "loop one", wait=0))
    second = asyncio.run(client.request_approval("p", "q1", "loop two", wait=0))
    asyncio.run(client.close())

    assert first.state == second.state == "pending" and first.id != second.id
    assert rows(gate, "SELECT COUNT(*) FROM approvals")[0][0] == before + 2
    Gate(gate.api_url, API_TOKEN).cancel_approval(first.id)
    Gate(gate.api_url, API_TOKEN).cancel_approval(second.id)
