"""What ``hitl-gate ask`` does on the pipeline's side: create a question, then wait for its
answer and report each hop. The create and the wait are ``request``'s own
(``gate.client.request.create_and_wait``): one retry policy, one deadline rule."""

from __future__ import annotations

from typing import Any

from gate.client.hops import question_hops
from gate.client.request import Progress, Report, RequestOptions, create_and_wait, state_text
from gate.protocol.question import QuestionSpec, answer_text
from gate.sdk.transport import QUESTIONS

# a question ends answered, timeout or cancelled (no 3: nobody "skips" a question)
EXIT_CODES = {"answered": 0, "timeout": 4, "cancelled": 5}


async def run_ask(
    opts: RequestOptions, report: Report, progress: Progress | None = None
) -> dict[str, Any] | None:
    """Create the question (``opts.body``, ``gate.sdk.client.question_body``; with ``wait``:
    retried with its Idempotency-Key), report it as new or found again, then with ``wait``
    wait for the outcome. One deadline, ``opts.timeout_s`` from now, covers both
    (``gate.client.request.create_and_wait``).

    Returns the last question object seen (still ``pending`` when ``timeout_s`` passed
    first), or None when the gate did not take the create within ``timeout_s``. Records the
    question id in ``progress``. Raises ClientError for what the gate refuses (400 naming
    the field, 404 unknown pipeline/step, 409 ``idempotency_key_reused``, ...).
    """
    progress = progress if progress is not None else Progress()
    return await create_and_wait(QUESTIONS, opts, report, progress, _created_line, question_hops)


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


def answer_output(question: dict[str, Any]) -> str:
    """What ``ask`` prints on stdout for an answered question
    (``gate.protocol.question.answer_text``): the text of a free text or single choice answer,
    compact JSON of a multi choice or form answer; "" when there is no answer."""
    answer = question.get("answer")
    if not isinstance(answer, dict):
        return ""
    return answer_text(QuestionSpec.from_json(question["question"]), answer.get("value"))
