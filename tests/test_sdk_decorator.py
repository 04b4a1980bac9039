"""``require_approval`` (gate/sdk/decorator.py) against a real daemon and a
capturing relay on loopback: the gated function runs only on approved, with the edited
arguments on adjusted, never otherwise; the same run repeating a call joins its approval."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gate.sdk import (
    AdjustNotApplicable,
    ApprovalCancelled,
    ApprovalDenied,
    ApprovalPending,
    ApprovalTimedOut,
    AsyncGate,
    Gate,
)
from gate.sdk.decorator import JsonRenderer, call_key, require_approval
from tests.support import (
    API_TOKEN,
    CaptureRelay,
    GateProcess,
    decision_body,
    module_gate,
    post_decision,
    wait_until,
)

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "short", "quorum": 1, "approvers": [101, 102], "timeout": "2s"},
]


# an edit is a whole JSON document: allow more than the default test limit of 50
relay, gate = module_gate("deco", steps=STEPS, security={"max_input_length": 2000})


def dispatch_with(relay: CaptureRelay, marker: str, count: int = 1) -> list[dict[str, Any]]:
    """The ``count`` dispatches whose draft holds ``marker`` (waits for them)."""
    return list(
        wait_until(
            lambda: (
                found
                if len(
                    found := [
                        d
                        for d in relay.dispatches()
                        if marker in (d.get("draft") or {}).get("body", "")
                    ]
                )
                >= count
                else None
            ),
            what=f"{count} dispatch(es) holding {marker!r}",
        )
    )


def decide(
    gate: GateProcess, relay: CaptureRelay, marker: str, verb: str, **extra: Any
) -> dict[str, Any]:
    """Wait for the dispatch holding ``marker`` and answer it as a relay does; returns it."""
    (dispatch,) = dispatch_with(relay, marker)
    status, out, _ = post_decision(gate.callback_url, decision_body(dispatch, verb=verb, **extra))
    assert status == 200, (status, out)
    return dispatch


def in_thread(target: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=target)
    thread.start()
    return thread


# ---- sync ----------------------------------------------------------------------------


def test_sdk_decorator_runs_on_approve_with_the_call_as_drafted(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    ran: list[tuple[str, float, str]] = []
    client = Gate(gate.api_url, API_TOKEN)

    @require_approval(client, pipeline="p", step="q1")
    def send_invoice(customer: str, amount: float, currency: str = "EUR") -> str:
        ran.append((customer, amount, currency))
        return f"sent {amount} {currency} to {customer}"

    seen: list[dict[str, Any]] = []
    thread = in_thread(lambda: seen.append(decide(gate, relay, "acme-approve", "approve")))
    result = send_invoice("acme-approve", 120.5)
    thread.join()

    assert result == "sent 120.5 EUR to acme-approve"
    assert ran == [("acme-approve", 120.5, "EUR")]
    draft = seen[0]["draft"]
    assert draft["content_type"] == "application/json"
    assert json.loads(draft["body"]) == {
        "function": f"{__name__}.{send_invoice.__qualname__}",
        "arguments": {"customer": "acme-approve", "amount": 120.5, "currency": "EUR"},
    }


def test_sdk_decorator_runs_adjusted_arguments(gate: GateProcess, relay: CaptureRelay) -> None:
    ran: list[tuple[str, float]] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1")
    def pay(to: str, amount: float) -> None:
        ran.append((to, amount))

    name = f"{__name__}.{pay.__qualname__}"
    edit = json.dumps({"function": name, "arguments": {"to": "bob-adj", "amount": 90}})
    thread = in_thread(lambda: decide(gate, relay, "bob-adj", "adjust", adjust_text=edit))
    pay("bob-adj", 100.0)
    thread.join()

    assert ran == [("bob-adj", 90)]


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        ("not json at all", "not JSON"),
        ('{"arguments": {"to": "x", "amount": 1, "tip": 5}}', "extra: tip"),
        ('{"arguments": {"to": "x"}}', "missing: amount"),
        ('{"function": "other", "arguments": {"to": "x", "amount": 1}}', "names function"),
        ('["to", "x"]', '"arguments"'),
    ],
    ids=["not-json", "unknown-argument", "missing-argument", "other-function", "not-an-object"],
)
def test_sdk_decorator_refuses_an_edit_it_cannot_apply(
    gate: GateProcess, relay: CaptureRelay, edit: str, why: str
) -> None:
    ran: list[Any] = []
    marker = f"carol-{abs(hash(edit))}"

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1")
    def pay(to: str, amount: float) -> None:
        ran.append((to, amount))

    thread = in_thread(lambda: decide(gate, relay, marker, "adjust", adjust_text=edit))
    with pytest.raises(AdjustNotApplicable, match=why) as caught:
        pay(marker, 5.0)
    thread.join()

    assert ran == []
    assert caught.value.approval.outcome == "adjusted" and caught.value.approval.body == edit


def test_sdk_decorator_skip_raises_denied_and_does_not_run(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    ran: list[str] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1")
    def drop_table(name: str) -> None:
        ran.append(name)

    thread = in_thread(lambda: decide(gate, relay, "users-skip", "skip", reason="prod data"))
    with pytest.raises(ApprovalDenied, match="prod data") as caught:
        drop_table("users-skip")
    thread.join()

    assert ran == [] and caught.value.reason == "prod data"


def test_sdk_decorator_cancel_raises_cancelled(gate: GateProcess, relay: CaptureRelay) -> None:
    ran: list[str] = []
    client = Gate(gate.api_url, API_TOKEN)

    @require_approval(client, pipeline="p", step="q1")
    def deploy(target: str) -> None:
        ran.append(target)

    def cancel() -> None:
        (dispatch,) = dispatch_with(relay, "cancel-me")
        client.cancel_approval(dispatch["approval_id"])

    thread = in_thread(cancel)
    with pytest.raises(ApprovalCancelled):
        deploy("cancel-me")
    thread.join()

    assert ran == []


@pytest.mark.slow
def test_sdk_decorator_gate_timeout_raises_timed_out(gate: GateProcess) -> None:
    ran: list[str] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="short")
    def deploy(target: str) -> None:
        ran.append(target)

    with pytest.raises(ApprovalTimedOut):
        deploy("nobody-looks")

    assert ran == []


def test_sdk_decorator_same_run_asks_again_for_the_same_call(
    gate: GateProcess, relay: CaptureRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An approval covers one call: the same run repeating the same call in this process
    asks again (review finding 1); another run is apart too. A restarted process replaying
    its calls rejoins them (tests/test_sdk_example.py)."""
    monkeypatch.setenv("HITL_RUN_ID", "run-restart-1")
    ran: list[str] = []
    client = Gate(gate.api_url, API_TOKEN)

    @require_approval(client, pipeline="p", step="q1", wait=0.2)
    def refund(order: str) -> None:
        ran.append(order)

    with pytest.raises(ApprovalPending) as first:
        refund("order-restart")
    decide(gate, relay, "order-restart", "approve")
    with pytest.raises(ApprovalPending) as again:
        refund("order-restart")
    monkeypatch.setenv("HITL_RUN_ID", "run-restart-2")
    with pytest.raises(ApprovalPending) as other_run:
        refund("order-restart")

    ids = {first.value.approval.id, again.value.approval.id, other_run.value.approval.id}
    assert ran == [] and len(ids) == 3
    assert len(dispatch_with(relay, "order-restart", 3)) == 3
    client.cancel_approval(again.value.approval.id)
    client.cancel_approval(other_run.value.approval.id)


def test_sdk_decorator_key_is_the_run_the_call_and_its_occurrence() -> None:
    draft = JsonRenderer().render(test_sdk_decorator_refuses_a_mismatched_client, {"a": 1})
    key = call_key("r", "p", "q1", "m.f", "", draft, 1)

    assert key == call_key("r", "p", "q1", "m.f", "", draft, 1)
    others = {
        call_key("r2", "p", "q1", "m.f", "", draft, 1),
        call_key("r", "p", "q1", "n.f", "", draft, 1),
        call_key("r", "p", "q1", "m.f", "Obj()", draft, 1),
        call_key("r", "p", "q1", "m.f", "", draft + " ", 1),
        call_key("r", "p", "q1", "m.f", "", draft, 2),
    }
    assert key not in others and len(others) == 5
    assert key.startswith("hitl-sdk-call-") and len(key) == len("hitl-sdk-call-") + 64


def test_sdk_decorator_refuses_a_mismatched_client() -> None:
    sync, aio = Gate("http://127.0.0.1:9", API_TOKEN), AsyncGate("http://127.0.0.1:9", API_TOKEN)

    with pytest.raises(TypeError, match="is async; pass an AsyncGate"):

        @require_approval(sync, pipeline="p", step="q1")
        async def a() -> None: ...

    with pytest.raises(TypeError, match="is not async; pass a Gate"):

        @require_approval(aio, pipeline="p", step="q1")
        def b() -> None: ...


def test_sdk_decorator_refuses_an_argument_json_cannot_hold() -> None:
    @require_approval(Gate("http://127.0.0.1:9", API_TOKEN), pipeline="p", step="q1")
    def f(blob: object) -> None: ...

    with pytest.raises(TypeError, match="argument 'blob' .* pass renderer="):
        f(object())


# ---- async ---------------------------------------------------------------------------


async def test_sdk_decorator_async_parallel_calls_are_separate_approvals(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    ran: list[tuple[str, int]] = []
    async with AsyncGate(gate.api_url, API_TOKEN) as client:

        @require_approval(client, pipeline="p", step="q1", run_id="run-parallel")
        async def transfer(to: str, cents: int) -> str:
            ran.append((to, cents))
            return to

        calls = asyncio.gather(
            transfer("par-a", 1), transfer("par-b", 2), transfer("par-c", 3), return_exceptions=True
        )
        dispatches = await asyncio.to_thread(dispatch_with, relay, "par-", 3)
        by_to = {json.loads(d["draft"]["body"])["arguments"]["to"]: d for d in dispatches}
        for to, verb in (("par-a", "approve"), ("par-b", "skip"), ("par-c", "approve")):
            body = decision_body(by_to[to], verb=verb)
            await asyncio.to_thread(post_decision, gate.callback_url, body)
        results = await calls

    assert len({d["approval_id"] for d in dispatches}) == 3
    assert sorted(ran) == [("par-a", 1), ("par-c", 3)]
    assert results[0] == "par-a" and results[2] == "par-c"
    assert isinstance(results[1], ApprovalDenied)


async def test_sdk_decorator_async_adjust(gate: GateProcess, relay: CaptureRelay) -> None:
    ran: list[dict[str, Any]] = []

    class Mailer:
        def __init__(self) -> None:
            self.sent = ran

        async def send(self, to: str, **headers: str) -> None:
            self.sent.append({"to": to, **headers})

    async with AsyncGate(gate.api_url, API_TOKEN) as client:
        Mailer.send = require_approval(client, pipeline="p", step="q1")(Mailer.send)  # type: ignore[method-assign]
        edit = json.dumps({"arguments": {"to": "dan-async", "headers": {"Subject": "Hi"}}})
        waiting = asyncio.create_task(Mailer().send("dan-async", Subject="hello"))
        await asyncio.to_thread(decide, gate, relay, "dan-async", "adjust", adjust_text=edit)
        await waiting

    assert ran == [{"to": "dan-async", "Subject": "Hi"}]


class Sentence:
    """A renderer for people who read sentences: ``Pay AMOUNT to WHOM``."""

    def render(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> str:
        return f"Pay {arguments['amount']} to {arguments['to']}"

    def parse(self, fn: Callable[..., Any], text: str) -> dict[str, Any]:
        words = text.split()
        if len(words) != 4 or words[0] != "Pay" or words[2] != "to":
            raise ValueError("write it as: Pay AMOUNT to WHOM")
        return {"amount": int(words[1]), "to": words[3]}


@pytest.mark.parametrize(
    ("verb", "edit", "ran"),
    [
        ("approve", None, [("erin-text", 30)]),
        ("adjust", "Pay 25 to erin-text", [("erin-text", 25)]),
    ],
    ids=["approve", "adjust"],
)
def test_sdk_decorator_custom_renderer_and_content_type(
    gate: GateProcess, relay: CaptureRelay, verb: str, edit: str | None, ran: list[Any]
) -> None:
    calls: list[tuple[str, int]] = []
    marker = f"erin-text-{verb}"

    @require_approval(
        Gate(gate.api_url, API_TOKEN),
        pipeline="p",
        step="q1",
        renderer=Sentence(),
        content_type="text/markdown",
    )
    def pay(to: str, amount: int) -> None:
        calls.append((to, amount))

    extra = {} if edit is None else {"adjust_text": edit.replace("erin-text", marker)}
    seen: list[dict[str, Any]] = []
    thread = in_thread(lambda: seen.append(decide(gate, relay, marker, verb, **extra)))
    pay(marker, 30)
    thread.join()

    assert seen[0]["draft"] == {"content_type": "text/markdown", "body": f"Pay 30 to {marker}"}
    assert calls == [(to.replace("erin-text", marker), n) for to, n in ran]


def test_sdk_decorator_custom_renderer_refusal_names_why(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    calls: list[Any] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1", renderer=Sentence())
    def pay(to: str, amount: int) -> None:
        calls.append((to, amount))

    thread = in_thread(
        lambda: decide(gate, relay, "frank-text", "adjust", adjust_text="Pay frank-text less")
    )
    with pytest.raises(AdjustNotApplicable, match="write it as: Pay AMOUNT to WHOM"):
        pay("frank-text", 30)
    thread.join()

    assert calls == []
