"""``hitl-gate mcp`` over stdio: the real MCP client of the ``mcp`` package spawns
``python -m gate mcp``, which talks to a real gate; a capturing relay on loopback receives the
dispatches and real signed decisions and answers go back. Waits are conditions with
deadlines."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import pytest

from gate.protocol.answer import build_answer
from gate.protocol.canonical import payload_hash
from tests.mcp_support import (
    dispatch_for,
    error_text,
    mcp_args,
    result_json,
    rows,
    stdio_mcp,
)
from tests.support import (
    GateProcess,
    decision_body,
    free_port,
    module_gate,
    post_decision,
    run_cli,
    wait_until,
)

pytestmark = pytest.mark.e2e

STEPS = [
    {"name": "q1", "quorum": 1, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "short", "quorum": 1, "approvers": [101, 102], "timeout": "3s"},
    {"name": "ask", "type": "question", "approvers": [101, 102], "timeout": "1h"},
]
REASON = "Mention the PO number"


relay, gate = module_gate("mcp", steps=STEPS, relay={"questions": True})


def decide(gate: GateProcess, dispatch: dict[str, Any], verb: str, **extra: Any) -> None:
    status, answer, _ = post_decision(
        gate.callback_url, decision_body(dispatch, "alice@example.com", verb, **extra)
    )
    assert status == 200, answer


async def request(client: Any, draft: str, **args: Any) -> dict[str, Any]:
    call = {"pipeline": "p", "step": "q1", "draft": draft, "wait_seconds": 20, **args}
    return result_json(await client.call_tool("request_approval", call))


async def test_mcp_stdio_lists_the_tools_saying_pending_is_never_yes(gate, errlog):
    async with stdio_mcp(gate, errlog) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}

    assert set(tools) == {
        "request_approval",
        "get_approval",
        "cancel_approval",
        "ask_human",
        "get_question",
        "list_pending",
    }
    text = tools["request_approval"].description or ""
    assert "NOT YET, never yes" in text and "act on the returned body" in text
    assert tools["request_approval"].input_schema["properties"]["wait_seconds"]["maximum"] == 50
    hints = {name: t.annotations for name, t in tools.items()}
    assert hints["get_approval"] and hints["get_approval"].read_only_hint is True
    assert hints["cancel_approval"] and hints["cancel_approval"].destructive_hint is True


def test_mcp_stdio_ends_with_its_input_exit_0(gate):
    done = run_cli(*mcp_args(gate)[2:], stdin=b"")

    assert done.returncode == 0, done.stderr.decode()
    err = done.stderr.decode()
    assert "event=mcp_ready transport=stdio" in err and "event=mcp_stopped" in err
    assert done.stdout == b""  # stdout is the MCP channel: nothing else is written there


async def test_mcp_stdio_unreachable_gate_is_a_tool_error_nothing_decided(gate, errlog):
    closed = f"http://127.0.0.1:{free_port()}"
    call = {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": 0}

    async with stdio_mcp(gate, errlog, api_url=closed) as client:
        result = await client.call_tool("request_approval", call)

    assert result.is_error
    assert "the gate is unreachable, nothing was decided" in error_text(result)


@pytest.mark.parametrize(
    ("verb", "extra", "outcome", "allowed"),
    [
        pytest.param("approve", {}, "approved", True, id="approve"),
        pytest.param("adjust", {"adjust_text": "Hallo Anna, PO 7."}, "adjusted", True, id="adjust"),
        pytest.param("skip", {"reason": REASON}, "skipped", False, id="skip-with-reason"),
    ],
)
async def test_mcp_stdio_request_approval_blocks_until_decided(
    gate, relay, errlog, verb, extra, outcome, allowed
):
    draft = f"Hallo Anna, Rechnung über 1.240,00 € ({verb} {time.monotonic_ns()})"
    async with stdio_mcp(gate, errlog) as client:
        call = asyncio.create_task(request(client, draft))
        dispatch = await dispatch_for(relay, draft)
        await asyncio.to_thread(decide, gate, dispatch, verb, **extra)
        got = await call

    assert got["approval_id"] == dispatch["approval_id"]
    assert (got["state"], got["outcome"], got["allowed"]) == ("resolved", outcome, allowed)
    final = extra.get("adjust_text", draft)
    assert got["payload_hash"] == payload_hash(final)  # of the body to act on
    assert got["body"] == (final if allowed else None)
    assert got["reason"] == (REASON if verb == "skip" else None)
    assert got["decided_by"] == ["alice@example.com"] and got["receipt"]
    assert rows(
        gate, "SELECT outcome FROM approvals WHERE approval_id = ?", got["approval_id"]
    ) == [(outcome,)]
    errlog.seek(0)
    log = errlog.read()
    assert f"id={got['approval_id']}" in log  # one line per answer, with the id ...
    assert draft not in log and REASON not in log  # ... never the draft or the reason


@pytest.mark.slow
async def test_mcp_stdio_request_approval_times_out(gate, errlog):
    async with stdio_mcp(gate, errlog) as client:
        got = await request(client, f"nobody decides {time.monotonic_ns()}", step="short")

    assert (got["state"], got["outcome"], got["allowed"], got["body"]) == (
        "resolved",
        "timeout",
        False,
        None,
    )


async def test_mcp_stdio_pending_then_get_approval(gate, relay, errlog):
    draft = f"pending first {time.monotonic_ns()}"
    async with stdio_mcp(gate, errlog) as client:
        pending = await request(client, draft, wait_seconds=0)
        dispatch = await dispatch_for(relay, draft)
        listed = result_json(await client.call_tool("list_pending", {"pipeline": "p"}))
        await asyncio.to_thread(decide, gate, dispatch, "approve")
        got = result_json(
            await client.call_tool(
                "get_approval", {"approval_id": pending["approval_id"], "wait_seconds": 20}
            )
        )

    assert pending == {
        "approval_id": dispatch["approval_id"],
        "state": "pending",
        "outcome": None,
        "allowed": False,
        "ask_again_after_seconds": 1,
    }
    mine = [a for a in listed["approvals"] if a.get("approval_id") == pending["approval_id"]]
    assert mine and mine[0]["step"] == "q1" and draft not in str(listed)
    assert (got["outcome"], got["body"]) == ("approved", draft)


async def test_mcp_stdio_cancel_approval(gate, errlog):
    async with stdio_mcp(gate, errlog) as client:
        pending = await request(client, f"to cancel {time.monotonic_ns()}", wait_seconds=0)
        got = result_json(
            await client.call_tool("cancel_approval", {"approval_id": pending["approval_id"]})
        )
        again = await client.call_tool("cancel_approval", {"approval_id": pending["approval_id"]})

    assert (got["outcome"], got["allowed"]) == ("cancelled", False)
    assert again.is_error and error_text(again).count("approval_id:") == 1


async def test_mcp_stdio_a_key_reused_for_another_draft_is_refused_naming_it(gate, errlog):
    key = f"agent-key-{time.monotonic_ns()}"
    async with stdio_mcp(gate, errlog) as client:
        first = await request(client, f"draft A {key}", idempotency_key=key, wait_seconds=0)
        same = await request(client, f"draft A {key}", idempotency_key=key, wait_seconds=0)
        other = await client.call_tool(
            "request_approval",
            {"pipeline": "p", "step": "q1", "draft": f"draft B {key}", "idempotency_key": key},
        )

    assert same["approval_id"] == first["approval_id"]
    assert other.is_error
    assert ": idempotency_key: " in error_text(other)
    assert "idempotency_key_reused" in error_text(other)
    assert rows(gate, "SELECT COUNT(*) FROM approvals WHERE idempotency_key = ?", key) == [(1,)]


async def test_mcp_stdio_restart_mid_wait_joins_the_same_approval(gate, relay, errlog):
    draft = f"restart me {time.monotonic_ns()}"
    run = f"run-{time.monotonic_ns()}"
    async with stdio_mcp(gate, errlog) as client:
        waiting = asyncio.create_task(
            request(client, draft, run_id=run, idempotency_key=f"call-{run}", wait_seconds=40)
        )
        dispatch = await dispatch_for(relay, draft)
        waiting.cancel()  # the host goes away mid-wait: the server process ends with it
        with pytest.raises(asyncio.CancelledError):
            await waiting

    async with stdio_mcp(gate, errlog) as client:  # a new server process, the same call
        key = f"call-{run}"  # the host's tool-call id, the same on a retry
        again = await request(client, draft, run_id=run, idempotency_key=key, wait_seconds=0)
        other = await request(client, draft + " (other)", run_id=run, wait_seconds=0)
        await asyncio.to_thread(decide, gate, dispatch, "approve")
        got = await request(client, draft, run_id=run, idempotency_key=key)

    assert again["approval_id"] == dispatch["approval_id"] == got["approval_id"]
    assert other["approval_id"] != dispatch["approval_id"]
    assert (got["outcome"], got["body"]) == ("approved", draft)
    assert rows(gate, "SELECT COUNT(*) FROM approvals WHERE run_id = ?", run) == [(2,)]


async def test_mcp_stdio_without_a_key_the_same_call_is_asked_again(gate, relay, errlog):
    """Review 18c findings 1, 13: run_id is a label; without an idempotency_key the same
    draft in the same run is a new approval each time (never an old approval's yes), also
    two at once and after a timeout."""
    draft = f"pay acme 100 {time.monotonic_ns()}"
    run = f"run-{time.monotonic_ns()}"
    async with stdio_mcp(gate, errlog) as client:
        first = await request(client, draft, run_id=run, wait_seconds=0)
        await asyncio.to_thread(decide, gate, await dispatch_for(relay, draft), "approve")
        again, parallel = await asyncio.gather(
            request(client, draft, run_id=run, wait_seconds=0),
            request(client, draft, run_id=run, wait_seconds=0),
        )

    ids = {first["approval_id"], again["approval_id"], parallel["approval_id"]}
    assert len(ids) == 3
    assert again["state"] == parallel["state"] == "pending"
    assert rows(gate, "SELECT COUNT(*) FROM approvals WHERE run_id = ?", run) == [(3,)]


async def test_mcp_stdio_parallel_calls_are_separate_approvals(gate, relay, errlog):
    """Two tool calls in flight at once in one run, different drafts: two approvals, each
    with its own outcome (never one decision for both)."""
    run = f"run-{time.monotonic_ns()}"
    drafts = [f"pay acme {run}", f"pay globex {run}"]
    async with stdio_mcp(gate, errlog) as client:
        calls = [asyncio.create_task(request(client, d, run_id=run)) for d in drafts]
        first, second = [await dispatch_for(relay, d) for d in drafts]
        await asyncio.to_thread(decide, gate, second, "skip", reason=REASON)
        await asyncio.to_thread(decide, gate, first, "approve")
        got = [await c for c in calls]

    assert [g["approval_id"] for g in got] == [first["approval_id"], second["approval_id"]]
    assert [(g["outcome"], g["body"]) for g in got] == [
        ("approved", drafts[0]),
        ("skipped", None),
    ]


async def test_mcp_stdio_ask_human_gets_the_answer(gate, relay, errlog):
    text = f"Which supplier? {time.monotonic_ns()}"
    call = {
        "pipeline": "p",
        "step": "ask",
        "text": text,
        "response_type": "single_choice",
        "options": ["acme", "globex"],
        "wait_seconds": 20,
    }
    async with stdio_mcp(gate, errlog) as client:
        asking = asyncio.create_task(client.call_tool("ask_human", call))

        def find() -> dict[str, Any] | None:
            return next(
                (d for d in relay.dispatches() if d.get("question", {}).get("text") == text), None
            )

        d = await asyncio.to_thread(wait_until, find, what="question dispatch")
        body = build_answer(
            question_id=d["question_id"],
            nonce=d["callback"]["nonce"],
            request_hash=d["request_hash"],
            value="globex",
            approver_id="alice@example.com",
            decided_at_ms=int(time.time() * 1000),
        )
        status, _, _ = await asyncio.to_thread(post_decision, gate.callback_url, body)
        got = result_json(await asking)
        again = result_json(
            await client.call_tool("get_question", {"question_id": d["question_id"]})
        )

    assert status == 200
    assert got["question_id"] == d["question_id"] == again["question_id"]
    assert (got["state"], got["outcome"], got["answer"]) == ("resolved", "answered", "globex")
    assert got["answered_by"] == "alice@example.com" and again["answer"] == "globex"


BAD_ARGUMENTS = [
    # (tool, arguments, the argument the error names)
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": 51},
     "wait_seconds"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": -1},
     "wait_seconds"),
    ("request_approval", {"pipeline": "p", "step": "q1"}, "draft"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": ""}, "draft"),
    ("request_approval", {"pipeline": "p", "step": "nope", "draft": "x", "wait_seconds": 0},
     "step"),
    ("request_approval", {"pipeline": "nope", "step": "q1", "draft": "x", "wait_seconds": 0},
     "pipeline"),
    ("get_approval", {"approval_id": "01JZZZZZZZZZZZZZZZZZZZZZZZ", "wait_seconds": 0},
     "approval_id"),
    ("ask_human", {"pipeline": "p", "step": "ask", "text": "Which?",
                   "response_type": "single_choice"}, "options"),
    ("ask_human", {"pipeline": "p", "step": "ask", "text": "Which?", "response_type": "yes_no"},
     "response_type"),
    ("ask_human", {"pipeline": "p", "step": "ask", "text": "Form?", "response_type": "form"},
     "schema"),
    # review 18c findings 11, 12: ids are path segments, keys are the gate's
    ("cancel_approval", {"approval_id": "../questions/01JZZZZZZZZZZZZZZZZZZZZZZZ"},
     "approval_id"),
    ("get_approval", {"approval_id": "a/b", "wait_seconds": 0}, "approval_id"),
    ("get_question", {"question_id": "..", "wait_seconds": 0}, "question_id"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": 0,
                          "idempotency_key": "a\nb"}, "idempotency_key"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": 0,
                          "idempotency_key": "k" * 100_000}, "idempotency_key"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": 0,
                          "idempotency_key": ""}, "idempotency_key"),
    ("ask_human", {"pipeline": "p", "step": "ask", "text": "Which?", "wait_seconds": 0,
                   "idempotency_key": " "}, "idempotency_key"),
]  # fmt: skip


async def test_mcp_stdio_bad_arguments_are_tool_errors_naming_the_argument(gate, errlog):
    """One server for every case (each start costs seconds); each error names its argument
    and nothing is created."""
    before = rows(gate, "SELECT COUNT(*) FROM approvals")
    asked = rows(gate, "SELECT COUNT(*) FROM questions")
    texts = []

    async with stdio_mcp(gate, errlog) as client:
        for tool, args, argument in BAD_ARGUMENTS:
            result = await client.call_tool(tool, args)
            texts.append((tool, argument, result.is_error, error_text(result)))

    for tool, argument, is_error, text in texts:
        assert is_error, (tool, argument, text)
        # "<argument>: why" (our own checks, the gate's refusals) or pydantic's "\n<argument>\n"
        assert re.search(rf"(: |\n){argument}(:|\n)", text), (tool, argument, text)
    assert rows(gate, "SELECT COUNT(*) FROM approvals") == before  # nothing was created
    assert rows(gate, "SELECT COUNT(*) FROM questions") == asked
    errlog.seek(0)
    assert "Traceback" not in errlog.read()


async def test_mcp_stdio_list_pending_lists_questions_too_each_with_its_kind(gate, errlog):
    draft = f"waiting {time.monotonic_ns()}"
    async with stdio_mcp(gate, errlog) as client:
        approval = await request(client, draft, wait_seconds=0)
        question = result_json(
            await client.call_tool(
                "ask_human",
                {"pipeline": "p", "step": "ask", "text": "Which one?", "wait_seconds": 0},
            )
        )
        listed = result_json(await client.call_tool("list_pending", {"pipeline": "p"}))

    items = {
        (i["kind"], i.get("approval_id") or i.get("question_id")): i
        for i in listed["approvals"] + listed["questions"]
    }
    mine = items[("approval", approval["approval_id"])]
    asked = items[("question", question["question_id"])]
    assert (mine["pipeline"], mine["step"]) == ("p", "q1")
    assert (asked["pipeline"], asked["step"], asked["response_type"]) == ("p", "ask", "free_text")
    assert asked["expires_at"] and mine["expires_at"]
    assert {i["kind"] for i in listed["approvals"] + listed["questions"]} <= {
        "approval",
        "question",
    }
    assert draft not in str(listed) and "Which one?" not in str(listed)


PLAIN_ERRORS = [
    # (tool, arguments, the whole error text after "Error executing tool <tool>: ")
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "spend": "abc"},
     "spend: must be a number"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "spend": -1},
     "spend: must be at least 0"),
    # a string is no number (the pipeline API refuses it too): "12", "1_0" made approvals
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "spend": "12"},
     "spend: must be a number"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "spend": "1_0"},
     "spend: must be a number"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "spend": 10**400},
     "spend: must be at most 1e+15"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": "5"},
     "wait_seconds: must be a number"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": "x", "wait_seconds": 51},
     "wait_seconds: must be at most 50"),
    ("request_approval", {"pipeline": "p", "step": "q1"}, "draft: required"),
    ("request_approval", {"pipeline": "p", "step": "q1", "draft": ""},
     "draft: must not be empty"),
    ("ask_human", {"pipeline": "p", "step": "ask", "text": "?", "response_type": "yes_no"},
     "response_type: must be one of 'free_text', 'single_choice', 'multi_choice' or 'form'"),
    ("ask_human", {"pipeline": "p", "step": "ask", "text": "?", "options": ["a", 1]},
     "options[1]: must be a string"),
    ("get_approval", {"approval_id": "x", "foo": 1},
     "unknown argument: foo (this tool takes: approval_id, wait_seconds)"),
]  # fmt: skip


async def test_mcp_stdio_argument_errors_are_one_plain_line_per_argument(gate, errlog):
    async with stdio_mcp(gate, errlog) as client:
        results = [
            (tool, want, await client.call_tool(tool, args)) for tool, args, want in PLAIN_ERRORS
        ]

    for tool, want, result in results:
        assert result.is_error
        assert error_text(result) == f"Error executing tool {tool}: {want}"
