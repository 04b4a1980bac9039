"""The MCP tools of ``hitl-gate mcp``: request_approval, get_approval,
cancel_approval, ask_human, get_question and list_pending, each one call of the SDK's
AsyncGate. Bad arguments and gate refusals are tool errors (``isError``) naming the argument;
nothing a caller sent (a draft, a question, an answer) is logged."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import BeforeValidator, Field, Strict

from gate.mcp.results import (
    DEFAULT_WAIT_S,
    MAX_WAIT_S,
    approval_result,
    pending_summary,
    question_result,
    refusal_text,
    refused_argument,
)
from gate.mcp.strict import strict_tool
from gate.sdk import Approval, AsyncGate, GateRequestError, GateUnavailable, Question

T = TypeVar("T")

log = logging.getLogger(__name__)

NOT_YET = (
    'Only outcome "approved" or "adjusted" (allowed: true) permits the action; with "adjusted" '
    'act on the returned body, not on your original draft. state "pending" means NOT YET, '
    "never yes: do not act, call get_approval with the approval_id to keep waiting. "
    '"skipped" (read reason: what the person wants changed), "timeout" and "cancelled" mean '
    "do not act."
)

MAX_SPEND = 1e15  # the pipeline API's bound on spend (gate.core.approvals.create)


def _at_most(limit: float) -> BeforeValidator:
    """Refuse an int beyond ``limit`` in words before it is made a float (``10**400`` has no
    float: pydantic would say "must be a number" of a number)."""

    def check(value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > limit:
            raise ValueError(f"must be at most {limit:g}")
        return value

    return BeforeValidator(check)


# numbers are strict: a string is no number ("12", "1_0"), as the pipeline API answers
Wait = Annotated[
    float,
    Field(
        ge=0,
        le=MAX_WAIT_S,
        description=f"Seconds to block waiting for a person (0 to {MAX_WAIT_S}); "
        "still pending after that, the answer says so and you ask again.",
    ),
    Strict(),
    _at_most(MAX_WAIT_S),
]
Text = Annotated[str, Field(min_length=1)]
Spend = Annotated[
    Annotated[float, Field(ge=0, le=MAX_SPEND, allow_inf_nan=False), Strict(), _at_most(MAX_SPEND)]
    | None,
    Field(
        description="What the action costs, in the step's budget unit (a number >= 0); "
        "a step's max_spend policy rule and budget read it.",
    ),
]
RequestedBy = Annotated[
    str | None,
    Field(
        description="Who asks: must be an operator's identity in relay.operators (an email "
        "address as configured, not an operator id); that person cannot decide it.",
    ),
]

REQUEST_APPROVAL = (
    "Ask a person to approve an action before you take it (the hitl-gate). Send the draft "
    "exactly as it would be sent or executed. Blocks up to wait_seconds. " + NOT_YET + " "
    "Pass idempotency_key = your host's tool-call id: a retry of that same tool call (e.g. "
    "after a restart) then joins its approval instead of asking twice. Without it every "
    "call is a new approval, even with the same draft; run_id is only a label. Pass spend "
    "(a number >= 0 in the step's budget unit) when the action costs something: the step's "
    "budget and max_spend rules read it. Pass requested_by (an operator's identity in "
    "relay.operators) to say who asks: that person cannot approve it."
)
GET_APPROVAL = (
    "Wait up to wait_seconds for an approval made by request_approval and return it. " + NOT_YET
)
CANCEL_APPROVAL = (
    "Withdraw a pending approval you no longer need (outcome cancelled: the action must "
    "not be taken). Refused when it is already resolved."
)
ASK_HUMAN = (
    "Ask a person a question (a step of type question) and wait up to wait_seconds for the "
    "answer. response_type: free_text, single_choice or multi_choice (give options), or form "
    "(give schema, a JSON form schema). state pending means no answer yet: call get_question "
    "with the question_id. Outcome answered carries the answer; timeout or cancelled none."
)
GET_QUESTION = "Wait up to wait_seconds for a question asked with ask_human and return it."
LIST_PENDING = (
    "List what still waits for a person (optionally of one pipeline): approvals under "
    '"approvals" and questions under "questions", each item with its kind ("approval" or '
    '"question"), id, pipeline, step and expiry, never a draft or question text. Pending '
    "means not decided: never yes."
)


def _refusal(exc: GateRequestError | GateUnavailable, argument: str) -> ToolError:
    """A gate refusal as a tool error naming the argument; unreachable as one saying nothing
    was decided."""
    if isinstance(exc, GateUnavailable):
        return ToolError(f"the gate is unreachable, nothing was decided (ask again): {exc}")
    if (text := refusal_text(exc.status, exc.reason)) is not None:
        return ToolError(text)
    return ToolError(f"{refused_argument(exc.reason, exc.field, argument)}: {exc.message}")


async def _gate_call(call: Awaitable[T], argument: str) -> T:
    """Await one SDK call; a ValueError (an argument the SDK refuses: it names it) or a gate
    refusal becomes the tool error (``_refusal``, naming ``argument`` when the gate blames no
    other)."""
    try:
        return await call
    except ValueError as exc:
        raise ToolError(str(exc)) from None
    except (GateRequestError, GateUnavailable) as exc:
        raise _refusal(exc, argument) from exc


async def _answer(tool: str, call: Awaitable[Approval | Question], argument: str) -> dict[str, Any]:
    """One tool's answer: the SDK call awaited (``_gate_call``), one log line (ids and
    outcome only, never a draft, text or answer), and the result of gate.mcp.results for
    its kind."""
    obj = await _gate_call(call, argument)
    log.info(
        "event=mcp_tool tool=%s id=%s state=%s outcome=%s", tool, obj.id, obj.state, obj.outcome
    )
    return approval_result(obj) if isinstance(obj, Approval) else question_result(obj)


def _create_keywords(
    run_id: str | None, idempotency_key: str | None, requested_by: str | None, wait_seconds: float
) -> dict[str, Any]:
    """The keywords of the SDK every create takes (``request_approval``, ``ask``), from the
    create tool's arguments of the same names (``wait_seconds`` is ``wait``)."""
    return {
        "run_id": run_id,
        "idempotency_key": idempotency_key,
        "requested_by": requested_by,
        "wait": wait_seconds,
    }


def register(gate: AsyncGate) -> list[Tool]:
    """The six tools, each calling ``gate`` (the pipeline API, SPEC §3),
    for ``MCPServer(tools=…)``; an argument a tool does not take is a tool error naming it
    (gate.mcp.strict). Tool results are the dicts of gate.mcp.results."""
    asks = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=True)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    withdraws = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False)
    request_approval, get_approval, cancel_approval = _approval_tools(gate)
    ask_human, get_question = _question_tools(gate)

    async def list_pending(pipeline: str | None = None) -> dict[str, Any]:
        approvals = await _gate_call(gate.list_pending(pipeline), "pipeline")
        questions = await _gate_call(gate.list_pending_questions(pipeline), "pipeline")
        return {
            "approvals": [pending_summary(a) for a in approvals],
            "questions": [pending_summary(q) for q in questions],
        }

    return [
        strict_tool(fn, description, hints)
        for fn, description, hints in (
            (request_approval, REQUEST_APPROVAL, asks),
            (get_approval, GET_APPROVAL, reads),
            (cancel_approval, CANCEL_APPROVAL, withdraws),
            (ask_human, ASK_HUMAN, asks),
            (get_question, GET_QUESTION, reads),
            (list_pending, LIST_PENDING, reads),
        )
    ]


def _approval_tools(gate: AsyncGate) -> tuple[Callable[..., Awaitable[Any]], ...]:
    """request_approval, get_approval and cancel_approval on ``gate``."""

    async def request_approval(
        pipeline: Text,
        step: Text,
        draft: Text,
        content_type: Text = "text/plain",
        run_id: str | None = None,
        idempotency_key: str | None = None,
        wait_seconds: Wait = DEFAULT_WAIT_S,
        spend: Spend = None,
        requested_by: RequestedBy = None,
    ) -> dict[str, Any]:
        common = _create_keywords(run_id, idempotency_key, requested_by, wait_seconds)
        call = gate.request_approval(
            pipeline, step, draft, content_type=content_type, spend=spend, **common
        )
        return await _answer("request_approval", call, "pipeline")

    async def get_approval(
        approval_id: Text, wait_seconds: Wait = DEFAULT_WAIT_S
    ) -> dict[str, Any]:
        call = gate.get_approval(approval_id, wait=wait_seconds)
        return await _answer("get_approval", call, "approval_id")

    async def cancel_approval(approval_id: Text) -> dict[str, Any]:
        return await _answer("cancel_approval", gate.cancel_approval(approval_id), "approval_id")

    return request_approval, get_approval, cancel_approval


def _question_tools(gate: AsyncGate) -> tuple[Callable[..., Awaitable[Any]], ...]:
    """ask_human and get_question on ``gate``."""

    async def ask_human(
        pipeline: Text,
        step: Text,
        text: Text,
        response_type: Literal["free_text", "single_choice", "multi_choice", "form"] = (
            "free_text"
        ),
        options: list[str] | None = None,
        schema: dict[str, Any] | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        wait_seconds: Wait = DEFAULT_WAIT_S,
        requested_by: RequestedBy = None,
    ) -> dict[str, Any]:
        if response_type in ("single_choice", "multi_choice") and not options:
            raise ToolError(f"options: {response_type} needs the options to choose from")
        if response_type == "form" and schema is None:
            raise ToolError("schema: form needs a JSON form schema")
        common = _create_keywords(run_id, idempotency_key, requested_by, wait_seconds)
        call = gate.ask(
            pipeline,
            step,
            text,
            response_type=response_type,
            options=options,
            schema=schema,
            **common,
        )
        return await _answer("ask_human", call, "pipeline")

    async def get_question(
        question_id: Text, wait_seconds: Wait = DEFAULT_WAIT_S
    ) -> dict[str, Any]:
        call = gate.get_question(question_id, wait=wait_seconds)
        return await _answer("get_question", call, "question_id")

    return ask_human, get_question
