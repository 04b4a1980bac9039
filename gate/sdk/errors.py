"""The SDK's exceptions: one per way a call or an approval can end without a yes.

``HitlGateError`` is the base of all. The gate refused a call: ``GateRequestError``; it could
not be reached: ``GateUnavailable``. An approval resolved without permission to act:
``ApprovalNotGranted`` (``ApprovalDenied``, ``ApprovalTimedOut``, ``ApprovalCancelled``, and
``ApprovalPending`` for a wait that ended first: pending is never a yes). A question that was
not answered: ``QuestionNotAnswered``. An adjusted draft the decorator cannot turn back into
arguments: ``AdjustNotApplicable`` (the function does not run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gate.sdk.models import Approval, Question


class HitlGateError(Exception):
    """Base of every exception the SDK raises on purpose."""


class GateUnavailable(HitlGateError):
    """The gate could not be reached (no connection, a refused or broken socket). Nothing is
    known to have changed on the gate; a create retried with the same Idempotency-Key joins
    the approval if one was made."""


class GateRequestError(HitlGateError):
    """The gate answered with an error (SPEC §3): ``status`` (HTTP), ``reason`` (the stable
    code, e.g. ``unknown_step``, ``idempotency_key_reused``; ``bad_answer`` when the answer
    was not JSON), ``field`` (the request field named, or None), ``answer`` (the decoded JSON
    error object, or None) and ``message`` (one human line)."""

    def __init__(
        self,
        status: int,
        reason: str,
        field: str | None = None,
        *,
        message: str | None = None,
        answer: dict[str, Any] | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.field = field
        self.answer = answer
        self.message = message or f"the gate answered HTTP {status} {reason}" + (
            f" (field {field})" if field else ""
        )
        super().__init__(self.message)


class ApprovalNotGranted(HitlGateError):
    """The approval does not allow the action; ``approval`` is the Approval as last seen.
    The message is ``message``, else the class's ``template`` with the approval's ``{id}``."""

    template = "approval {id} was not granted"

    def __init__(self, approval: Approval, message: str | None = None) -> None:
        self.approval = approval
        super().__init__(message or self.template.format(id=approval.id))


class ApprovalDenied(ApprovalNotGranted):
    """A person (or a policy) skipped the approval; ``reason`` is the skip's reason, or None;
    ``skipped_by`` the identities whose decision was a skip."""

    def __init__(self, approval: Approval) -> None:
        self.reason = approval.reason
        self.skipped_by = tuple(
            str(d.get("identity"))
            for d in approval.raw.get("decisions") or []
            if isinstance(d, dict) and d.get("decision") == "skip"
        )
        who = ", ".join(self.skipped_by) or "an approver"
        text = f"approval {approval.id} was skipped by {who}"
        super().__init__(approval, text + (f": {self.reason}" if self.reason else ""))


class ApprovalTimedOut(ApprovalNotGranted):
    """The approval expired on the gate (outcome ``timeout``): nobody decided in time."""

    template = "approval {id} timed out: nobody decided in time"


class ApprovalCancelled(ApprovalNotGranted):
    """The approval was cancelled (outcome ``cancelled``) before anyone decided."""

    template = "approval {id} was cancelled"


class ApprovalPending(ApprovalNotGranted):
    """The wait ended before the approval resolved: it is still pending on the gate, which
    means "not yet", never "yes". Ask again with ``get_approval(approval.id, wait=...)``."""

    template = "approval {id} is still pending (not yet decided)"


class QuestionNotAnswered(HitlGateError):
    """The question ended without an answer (``timeout`` or ``cancelled``) or is still
    pending; ``question`` is the Question as last seen, ``outcome`` its outcome (None while
    pending)."""

    def __init__(self, question: Question) -> None:
        self.question = question
        self.outcome = question.outcome
        state = question.outcome or "still pending"
        super().__init__(f"question {question.id} was not answered ({state})")


class AdjustNotApplicable(HitlGateError):
    """An approver adjusted the draft but the edited body cannot be turned back into the
    function's arguments (``why`` says what is wrong); the function did not run."""

    def __init__(self, approval: Approval, why: str) -> None:
        self.approval = approval
        self.why = why
        super().__init__(
            f"approval {approval.id} was adjusted, but the edit cannot be applied: {why}"
        )


class ArgumentsChanged(AdjustNotApplicable):
    """The call was approved, but its arguments changed while it waited (the agent's code
    mutated an object it passed): rendering them now no longer gives the approved draft, so
    the function did not run. ``names`` the arguments."""

    def __init__(self, approval: Approval, names: list[str]) -> None:
        shown = ", ".join(names) if names else "?"
        super().__init__(approval, f"the arguments changed while waiting ({shown})")
        self.names = names
        self.args = (
            f"approval {approval.id} was approved, but the arguments changed while waiting "
            f"({shown}); the function did not run",
        )
