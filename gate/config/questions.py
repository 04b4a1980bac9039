"""Config checks of question steps: approval-only keys refused, the question relay.

Every error is a ``"<yaml.path>: <message>"`` line like the rest of ``gate.config``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gate.config.model import Config, StepConfig

NEEDS_RELAY = (
    "a question step needs a relay that declared question support:"
    " set relay.questions: true or relay.question_url"
)
# keys of an approval step that a question step refuses when present at all, even at their
# default (config.example.yaml says they are refused; new-user finding A3)
_APPROVAL_ONLY = (
    "allow_self_approval",
    "allow_empty_draft",
    "skip_reason",
    "approver_signature",
    "policy",
    "remember_approval",
)
_FOLLOWUPS = ("remind_after", "remind_every", "escalate")
# keys of a question step that an approval step refuses when present
_QUESTION_ONLY = ("max_options", "max_answer_chars")


def check_question_step(where: str, step: StepConfig, config: Config) -> list[str]:
    """Errors of one step's question-related keys (``where`` is its YAML path,
    ``pipelines[i].steps[j]``). On a question step quorum must
    be 1 (``quorum: 1`` written out is harmless), reminders/escalation and approval-only keys
    are refused when present at all, and a question relay must be configured
    (``relay.question_target``); on an approval step ``max_options`` and
    ``max_answer_chars`` are refused."""
    if not step.is_question:
        return [
            f"{where}.{key}: only for type: question"
            for key in _QUESTION_ONLY
            if key in step.model_fields_set
        ]
    errors: list[str] = []
    if config.relay.question_target is None:
        errors.append(f"{where}.type: {NEEDS_RELAY}")
    if step.quorum != 1:
        errors.append(
            f"{where}.quorum: a question is answered once (first valid answer wins);"
            f" quorum must be 1, got {step.quorum}"
        )
    for key in _FOLLOWUPS:
        if key in step.model_fields_set:
            errors.append(f"{where}.{key}: reminders/escalation are for approval steps")
    for key in _APPROVAL_ONLY:
        if key in step.model_fields_set:
            errors.append(f"{where}.{key}: only for approval steps (a question step refuses it)")
    return errors
