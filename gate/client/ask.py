"""What ``hitl-gate ask`` does on the pipeline's side: create a question, then wait for its
answer and report each hop. The create and the wait are ``request``'s own
(``create_with_retry``, ``wait_for_outcome``): one retry policy, one deadline rule."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gate.client.api import ApiClient
from gate.client.request import Report, create_with_retry, wait_for_outcome
from gate.protocol.question import QuestionSpec, answer_text

# a question ends answered, timeout or cancelled (no 3: nobody "skips" a question)
EXIT_CODES = {"answered": 0, "timeout": 4, "cancelled": 5}


@dataclass(frozen=True, slots=True)
class AskOptions:
    """One ``hitl-gate ask``: where the gate is, what to ask, how long to wait.

    ``response_type`` is ``free_text``, ``single_choice``, ``multi_choice`` or ``form``;
    ``options`` go with the choices, ``schema`` (a JSON object) with a form. ``timeout_s``
    (seconds, None: no limit) is one deadline for the create (retried) and the wait after
    it. With ``wait`` the ``idempotency_key`` must be set (``request_key`` makes one).
    """

    api_base: str
    token: str
    pipeline: str
    step: str
    text: str
    response_type: str = "free_text"
    reason: str | None = None
    options: tuple[str, ...] = ()
    schema: dict[str, Any] | None = None
    run_id: str | None = None
    requested_by: str | None = None
    idempotency_key: str | None = None
    wait: bool = False
    timeout_s: float | None = None

    def create_body(self) -> dict[str, Any]:
        """The JSON body of ``POST /v1/questions``;
        absent optional fields are left out, never null."""
        body: dict[str, Any] = {
            "pipeline": self.pipeline,
            "step": self.step,
            "text": self.text,
            "response_type": self.response_type,
        }
        if self.run_id:
            body["run_id"] = self.run_id
        if self.reason is not None:
            body["reason"] = self.reason
        if self.options:
            body["options"] = list(self.options)
        if self.schema is not None:
            body["schema"] = self.schema
        if self.requested_by is not None:
            body["requested_by"] = self.requested_by
        return body


@dataclass(slots=True)
class AskProgress:
    """How far an ask got, for a caller interrupted mid-way (Ctrl-C): the id of the question
    the gate created (or found again), None until then."""

    question_id: str | None = None


async def run_ask(
    opts: AskOptions, report: Report, progress: AskProgress | None = None
) -> dict[str, Any] | None:
    """Create the question (with ``wait``: retried with its Idempotency-Key), report it as
    new or found again, then with ``wait`` wait for the outcome. One deadline,
    ``opts.timeout_s`` from now, covers both.

    Returns the last question object seen (still ``pending`` when ``timeout_s`` passed
    first), or None when the gate did not take the create within ``timeout_s``. Records the
    question id in ``progress``. Raises ClientError for what the gate refuses (400 naming
    the field, 404 unknown pipeline/step, 409 ``idempotency_key_reused``, ...).
    """
    progress = progress if progress is not None else AskProgress()
    deadline = None if opts.timeout_s is None else time.monotonic() + opts.timeout_s

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    async with ApiClient(opts.api_base, opts.token) as api:
        if opts.wait:
            assert opts.idempotency_key is not None
            answered = await create_with_retry(
                api, opts.create_body(), opts.idempotency_key, left(), report, api.create_question
            )
            if answered is None:
                return None
            question, new = answered
        else:
            question, new = await api.create_question(opts.create_body(), opts.idempotency_key)
        progress.question_id = question["question_id"]
        report(_created_line(opts, question, new))
        if not opts.wait:
            return dict(question)
        return await wait_for_outcome(api, question, left(), report, kind="question")


def _created_line(opts: AskOptions, question: dict[str, Any], new: bool) -> str:
    """The line reporting a create: a new question, or one the same key made before."""
    if new:
        return (
            f"asked question {question['question_id']} ({opts.response_type}) on "
            f"{opts.pipeline}/{opts.step} ({question.get('request_hash')})"
        )
    state = question["state"] + (
        f", outcome {question['outcome']}" if question["state"] == "resolved" else ""
    )
    return (
        f"already asked: question {question['question_id']} on {opts.pipeline}/{opts.step} "
        f"(the same question with Idempotency-Key {opts.idempotency_key} was asked before; "
        f"state {state})"
    )


def answer_output(question: dict[str, Any]) -> str:
    """What ``ask`` prints on stdout for an answered question
    (``gate.protocol.question.answer_text``): the text of a free text or single choice answer,
    compact JSON of a multi choice or form answer; "" when there is no answer."""
    answer = question.get("answer")
    if not isinstance(answer, dict):
        return ""
    return answer_text(QuestionSpec.from_json(question["question"]), answer.get("value"))
