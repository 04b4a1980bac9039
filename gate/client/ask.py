"""What ``hitl-gate ask`` does on the pipeline's side: create a question, then wait for its
answer and report each hop. The create and the wait are ``request``'s own
(``gate.client.request.create_and_wait``): one retry policy, one deadline rule."""

from __future__ import annotations

import functools
from typing import Any

from gate.client.hops import question_hops
from gate.client.request import RequestOptions, create_and_wait, state_text
from gate.protocol.question import QuestionSpec, answer_text
from gate.sdk.transport import QUESTIONS

# a question ends answered, timeout or cancelled (no 3: nobody "skips" a question)
EXIT_CODES = {"answered": 0, "timeout": 4, "cancelled": 5}


def _created_line(opts: RequestOptions, question: dict[str, Any], new: bool) -> str:
    """The line reporting a create: a new question, or one the same key made before."""
    body = opts.body
    if new:
        return (
            f"asked question {question['question_id']} ({body['response_type']}) on "
            f"{body['pipeline']}/{body['step']} ({question.get('request_hash')})"
        )
    return (
        f"already asked: question {question['question_id']} on {body['pipeline']}/"
        f"{body['step']} (the same question with Idempotency-Key {opts.idempotency_key} was "
        f"asked before; state {state_text(question)})"
    )


# create the question (``opts.body``: ``gate.sdk.client.question_body``), report it, and with
# ``wait`` wait for its answer reporting each hop: ``create_and_wait`` for questions
run_ask = functools.partial(
    create_and_wait, QUESTIONS, created_line=_created_line, hops=question_hops
)


def answer_output(question: dict[str, Any]) -> str:
    """What ``ask`` prints on stdout for an answered question
    (``gate.protocol.question.answer_text``): the text of a free text or single choice answer,
    compact JSON of a multi choice or form answer; "" when there is no answer."""
    answer = question.get("answer")
    if not isinstance(answer, dict):
        return ""
    return answer_text(QuestionSpec.from_json(question["question"]), answer.get("value"))
