"""``require_approval`` and the calls it covers, each against a real
daemon and a capturing relay on loopback: an approval covers one call, never a later or a
parallel identical one; the draft shows (and the key holds) the receiver and the module;
the function runs only on the arguments a person saw; an edit names exactly the draft's
arguments with their JSON types."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

from gate.sdk import AdjustNotApplicable, ApprovalPending, ArgumentsChanged, Gate
from gate.sdk.decorator import require_approval
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

STEPS = [{"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"}]


relay, gate = module_gate("sdkf", steps=STEPS, security={"max_input_length": 2000})


def holding(relay: CaptureRelay, marker: str, count: int = 1) -> list[dict[str, Any]]:
    """The ``count`` dispatches whose draft holds ``marker`` (waits for them)."""

    def found() -> list[dict[str, Any]] | None:
        hits = [d for d in relay.dispatches() if marker in (d.get("draft") or {}).get("body", "")]
        return hits if len(hits) >= count else None

    return list(wait_until(found, what=f"{count} dispatch(es) holding {marker!r}"))


def decide(
    gate: GateProcess, dispatch: dict[str, Any], verb: str = "approve", **extra: Any
) -> None:
    status, out, _ = post_decision(gate.callback_url, decision_body(dispatch, verb=verb, **extra))
    assert status == 200, (status, out)


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["ret"] = target()
        except Exception as exc:  # the test reads what the call raised
            box["exc"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def test_sdk_a_second_identical_call_in_a_run_is_a_new_approval(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    """One approval never covers a later identical call of the same run."""
    ran: list[str] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1", run_id="run-f1")
    def wire(to: str) -> None:
        ran.append(to)

    thread, box = in_thread(lambda: wire("acct-f1"))
    (first,) = holding(relay, "acct-f1")
    decide(gate, first)
    thread.join()
    thread, box = in_thread(lambda: wire("acct-f1"))
    second = holding(relay, "acct-f1", 2)[1]

    assert second["approval_id"] != first["approval_id"]
    assert ran == ["acct-f1"]  # the second call waits for its own decision
    decide(gate, second, "skip", reason="not twice")
    thread.join()
    assert ran == ["acct-f1"] and "exc" in box


def test_sdk_parallel_identical_calls_are_two_approvals(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    """Two threads making the same call at once ask twice."""
    ran: list[int] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1", run_id="run-par")
    def pay(to: str, amount: int) -> None:
        ran.append(amount)

    calls = [in_thread(lambda: pay("acme-par", 100)) for _ in range(2)]
    first, second = holding(relay, "acme-par", 2)
    decide(gate, first)
    decide(gate, second)
    for thread, _ in calls:
        thread.join()

    assert first["approval_id"] != second["approval_id"]
    assert ran == [100, 100]


class Account:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Account({self.name!r})"


def test_sdk_the_receiver_and_module_are_shown_and_keyed(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    """The draft names the object a method runs on and the function's
    module; two receivers are two approvals."""
    client = Gate(gate.api_url, API_TOKEN)

    class Bank:
        def __init__(self, name: str) -> None:
            self.name = name

        def __repr__(self) -> str:
            return f"Bank({self.name!r})"

        @require_approval(client, pipeline="p", step="q1", run_id="run-recv", wait=0)
        def close(self, account: str) -> None: ...

    for bank in (Bank("prod"), Bank("test")):
        with pytest.raises(ApprovalPending):
            bank.close("acct-recv")
    prod, test = holding(relay, "acct-recv", 2)

    assert prod["approval_id"] != test["approval_id"]
    shown = json.loads(prod["draft"]["body"])
    assert shown["receiver"] == "Bank('prod')"
    assert shown["function"] == f"{__name__}.{Bank.close.__qualname__}"
    assert shown["arguments"] == {"account": "acct-recv"}


def test_sdk_arguments_changed_while_waiting_do_not_run(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    """The list a person approved is changed by the agent during the wait."""
    ran: list[list[str]] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1")
    def email(recipients: list[str], text: str) -> None:
        ran.append(list(recipients))

    rcpt = ["team@example.com"]
    thread, box = in_thread(lambda: email(rcpt, "mut-f4"))
    (dispatch,) = holding(relay, "mut-f4")
    rcpt.append("everyone@competitor.example")
    decide(gate, dispatch)
    thread.join()

    assert json.loads(dispatch["draft"]["body"])["arguments"]["recipients"] == rcpt[:1]
    assert isinstance(box.get("exc"), AdjustNotApplicable), box
    assert isinstance(box["exc"], ArgumentsChanged) and box["exc"].names == ["recipients"]
    assert ran == []


def _adjust(gate: GateProcess, relay: CaptureRelay, fn: Any, call: Any, marker: str, args: Any):
    thread, box = in_thread(call)
    (dispatch,) = holding(relay, marker)
    name = json.loads(dispatch["draft"]["body"])["function"]
    edit = json.dumps({"function": name, "arguments": args})
    decide(gate, dispatch, "adjust", adjust_text=edit)
    thread.join()
    return box


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"dst": "inbox"}, "missing: src"),  # positional-only, one left out
        ({"src": "a-f5", "dst": "b", "force": True}, "extra: force"),
        ({"src": 7, "dst": "b"}, "'src'"),  # a string became a number
    ],
)
def test_sdk_an_edit_must_name_the_draft_arguments_with_their_types(
    gate: GateProcess, relay: CaptureRelay, edit: dict[str, Any], named: str
) -> None:
    ran: list[tuple[Any, Any]] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1")
    def move(src: Any, dst: str = "archive", /) -> None:
        ran.append((src, dst))

    marker = f"a-f5-{named}"
    box = _adjust(gate, relay, move, lambda: move(marker, "trash"), marker, edit)

    assert isinstance(box.get("exc"), AdjustNotApplicable), box
    assert named in str(box["exc"])
    assert ran == []


def test_sdk_an_int_stays_an_int_and_positional_only_edits_apply(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    ran: list[tuple[Any, ...]] = []

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1")
    def charge(card: str, amount: int, /, note: str = "") -> None:
        ran.append((card, amount, note))

    box = _adjust(
        gate,
        relay,
        charge,
        lambda: charge("c-int", 10),
        "c-int",
        {"card": "c-int", "amount": 9.5, "note": ""},
    )
    assert isinstance(box.get("exc"), AdjustNotApplicable) and "'amount'" in str(box["exc"])
    box = _adjust(
        gate,
        relay,
        charge,
        lambda: charge("c-int2", 10),
        "c-int2",
        {"card": "c-int2", "amount": 8, "note": "x"},
    )
    assert "exc" not in box, box
    assert ran == [("c-int2", 8, "x")]


def test_sdk_var_positional_and_keyword_functions_run_after_approval(
    gate: GateProcess, relay: CaptureRelay
) -> None:
    """Finding 8: ``f(channel, *users, **opts)`` approved runs as called."""

    @require_approval(Gate(gate.api_url, API_TOKEN), pipeline="p", step="q1")
    def notify(channel: str, *users: str, **opts: Any) -> tuple[Any, ...]:
        return (channel, users, opts)

    thread, box = in_thread(lambda: notify("ops-f8", "ann", "ben", loud=True))
    (dispatch,) = holding(relay, "ops-f8")
    decide(gate, dispatch)
    thread.join()

    assert box == {"ret": ("ops-f8", ("ann", "ben"), {"loud": True})}


def test_sdk_a_renderer_failure_names_the_argument_before_asking() -> None:
    """Mixed-type keys JSON cannot sort are refused naming the argument."""

    @require_approval(Gate("http://127.0.0.1:9", API_TOKEN), pipeline="p", step="q1")
    def tag(labels: dict[Any, str]) -> None: ...

    with pytest.raises(TypeError, match="argument 'labels' .* pass renderer="):
        tag({1: "a", "b": "c"})
