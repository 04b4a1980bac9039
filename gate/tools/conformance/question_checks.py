"""Judging a relay's answer to ``hitl-gate verify --questions``' synthetic question:
one CheckResult per check, each with what to fix. Used by ``conformance.questions``."""

from __future__ import annotations

from typing import Any

from gate.errors import GateError
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import decode_json
from gate.protocol.question import QuestionSpec, check_value
from gate.protocol.whitespace import identity_key
from gate.tools.conformance.checks import (
    Awaited,
    CheckResult,
    Observed,
    failed,
    judge_signature,
    passed,
)

MAX_ANSWER_CHARS = 2000  # the step default

# the checks of the relay's answer, in report order; reported as not run without an answer
ANSWER_CHECKS = (
    "question.answer_signed",
    "question.answer_in_window",
    "question.nonce",
    "question.request_hash_echo",
    "question.approver_in_scope",
    "question.value_typed",
    "question.answer_accepted",
)

ANSWER = Awaited(
    "question.answer_received",
    "answer",
    " (not acked)",
    'POST one signed decision "answer"',
    "fix question.ack first",
    "",
    ANSWER_CHECKS,
)


def shown(value: Any) -> str:
    return wire_json(value).decode("utf-8") if value is not None else "null"


def judge_answer(
    answer: Observed, secret: str, max_skew_s: float, full: Question, approver: str
) -> list[CheckResult]:
    """Check the relay's answer to ``full`` (``ANSWER_CHECKS``, in order): signed, in window,
    the dispatched nonce and request_hash echoed, ``approver`` reported, a value that fits
    the question (``check_value``, answer check 12), and accepted (200) by the gate."""
    names = ANSWER_CHECKS
    results = judge_signature(answer, secret, answer.received_at, max_skew_s, *names[:2])
    try:
        body = decode_json(answer.raw)
    except GateError:
        body = None
    if not isinstance(body, dict):
        body = {}
    current = full.current
    got = body.get("nonce")
    results.append(
        passed(names[2], "nonce is the dispatched one")
        if got == current.nonce
        else failed(names[2], f"nonce {shown(got)}", "echo callback.nonce unchanged")
    )
    got = body.get("request_hash")
    results.append(
        passed(names[3], "request_hash matches the dispatch")
        if got == current.request_hash
        else failed(
            names[3],
            f"request_hash {shown(got)}",
            "echo request_hash from the dispatch byte for byte; never recompute it",
        )
    )
    who = body.get("approver")
    got = who.get("id") if isinstance(who, dict) else None
    in_scope = isinstance(got, str) and identity_key(got) == identity_key(approver)
    results.append(
        passed(names[4], f"approver.id {shown(got)}")
        if in_scope
        else failed(
            names[4],
            f"approver.id {shown(got)}",
            f"report the human who answered as approver.id; expected {approver!r}, one of "
            "the dispatch's approvers",
        )
    )
    results.append(_judge_value(body, QuestionSpec.from_json(current.question)))
    gate = shown(answer.answer)
    results.append(
        passed(names[6], f"gate answered 200 {gate}")
        if answer.status == 200
        else failed(
            names[6],
            f"gate answered {answer.status} {gate}",
            "the gate refused this answer; the reason names the field or check",
        )
    )
    return results


def _judge_value(body: dict[str, Any], spec: QuestionSpec) -> CheckResult:
    name = ANSWER_CHECKS[5]
    if "value" not in body:
        return failed(name, "no value", 'send the answer as "value" (typed by response_type)')
    try:
        check_value(spec, body["value"], max_answer_chars=MAX_ANSWER_CHARS)
    except GateError as exc:
        return failed(
            name,
            f"value {shown(body['value'])}: {exc.message}",
            "send a value of the question's response_type: a string for free_text, one of "
            "the options exactly for single_choice, a list of distinct options for "
            "multi_choice, an object of the schema's properties for form",
        )
    return passed(name, f"value {shown(body['value'])} fits {spec.response_type}")
