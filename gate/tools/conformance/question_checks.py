"""Judging a relay's answer to ``hitl-gate verify --questions``' synthetic question:
one CheckResult per check, each with what to fix. Used by ``conformance.questions``."""

from __future__ import annotations

from typing import Any

from gate.errors import GateError
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, check_value
from gate.tools.conformance.checks import (
    Awaited,
    CheckResult,
    Echo,
    Observed,
    failed,
    judge_accepted,
    judge_echoes,
    judge_signature,
    passed,
)

MAX_ANSWER_CHARS = 2000  # the step default
NONCE_FIX = "echo callback.nonce unchanged"

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
    "question.ack",
    "question_id",
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
    body = answer.body() or {}
    current = full.current
    echoes = (
        Echo(names[2], "nonce", current.nonce, "nonce is the dispatched one", NONCE_FIX),
        Echo(
            names[3],
            "request_hash",
            current.request_hash,
            "request_hash matches the dispatch",
            "echo request_hash from the dispatch byte for byte; never recompute it",
        ),
    )
    results += judge_echoes(body, echoes, names[4], approver, "answered", shown)
    results.append(_judge_value(body, QuestionSpec.from_json(current.question)))
    results.append(judge_accepted(names[6], answer, "answer", shown))
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
