"""Config checks of question steps (issue 15): approval-only keys refused, the question relay.

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
# keys of an approval step that a question step refuses when set to a non-default value
_APPROVAL_ONLY = {
    "allow_self_approval": False,
    "allow_empty_draft": False,
    "skip_reason": "optional",
}
_FOLLOWUPS = ("remind_after", "remind_every", "escalate")


def check_question_step(where: str, step: StepConfig, config: Config) -> list[str]:
    """Errors of one step of ``type: question`` (``where`` is its YAML path,
    ``pipelines[i].steps[j]``); [] for an approval step. Contract of issue 15 §Config:
    quorum must be 1, reminders/escalation and approval-only keys are refused, and a
    question relay must be configured (``relay.question_target``)."""
    if not step.is_question:
        return []
    errors: list[str] = []
    if config.relay.question_target is None:
        errors.append(f"{where}.type: {NEEDS_RELAY}")
    if step.quorum != 1:
        errors.append(
            f"{where}.quorum: a question is answered once (first valid answer wins);"
            f" quorum must be 1, got {step.quorum}"
        )
    for key in _FOLLOWUPS:
        if key in step.model_fields_set and getattr(step, key) not in (None, ()):
            errors.append(f"{where}.{key}: reminders/escalation are for approval steps")
    for key, default in _APPROVAL_ONLY.items():
        if getattr(step, key) != default:
            errors.append(f"{where}.{key}: only for approval steps (a question step refuses it)")
    return errors
