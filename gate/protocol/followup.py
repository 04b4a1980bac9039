"""The hitl/v0 additions that go out from the gate: the follow-up fields of a dispatch
(reminder, escalation, delegates, a required skip reason) and the resolution notices of
approvals and of questions (with notices on). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gate.protocol import PROTOCOL
from gate.protocol.times import rfc3339


@dataclass(frozen=True, slots=True)
class FollowUp:
    """The additive dispatch fields; each is left out when it has its default.

    ``reminder``: n >= 1 for the n-th reminder, with ``awaiting`` (identities in scope that
    have not decided this revision); ``escalation``: the approver scope's level (>= 1 once
    widened); ``delegates``: (delegate identity, principal identity) pairs in force, the
    delegates also added to ``approvers``; ``skip_reason_required`` marks the skip action.
    """

    reminder: int = 0
    awaiting: tuple[str, ...] = ()
    escalation: int = 0
    delegates: tuple[tuple[str, str], ...] = ()
    skip_reason_required: bool = False

    def apply(self, envelope: dict[str, Any]) -> None:
        """Add the fields to a dispatch ``envelope`` (a dict from ``build_dispatch``)."""
        if self.skip_reason_required:
            for action in envelope["actions"]:
                if action["verb"] == "skip":
                    action["reason"] = "required"
        if self.delegates:
            approvers = envelope["approvers"]
            for delegate, _ in self.delegates:
                if delegate not in approvers:
                    approvers.append(delegate)
            envelope["delegates"] = [
                {"identity": delegate, "on_behalf_of": principal}
                for delegate, principal in self.delegates
            ]
        if self.escalation:
            envelope["escalation"] = self.escalation
        if self.reminder:
            envelope["reminder"] = self.reminder
            envelope["awaiting"] = list(self.awaiting)


def skip_reason_required(envelope: dict[str, Any]) -> bool:
    """Whether a dispatch's skip action says ``"reason": "required"`` (``FollowUp`` marks it
    for a step with ``skip_reason: required``; a skip without a reason is refused 422), read
    from a dispatch of any shape (the relay's and the inbox's one reading)."""
    actions = envelope.get("actions")
    return isinstance(actions, list) and any(
        isinstance(a, dict) and a.get("verb") == "skip" and a.get("reason") == "required"
        for a in actions
    )


OUTCOMES = ("approved", "adjusted", "skipped", "timeout", "cancelled")
QUESTION_OUTCOMES = ("answered", "timeout", "cancelled")


def _notice(
    subject: dict[str, str],
    run_id: str,
    pipeline: str,
    step: str,
    outcome: str,
    resolved_at_ms: int,
) -> dict[str, Any]:
    """The fields every resolution notice begins with, approval or question alike, in wire
    order: ``protocol``, ``type: "notice"``, the ``subject`` (its kind and id), ``run_id``,
    ``pipeline``, ``step``, ``outcome`` and ``resolved_at`` (RFC 3339)."""
    return {
        "protocol": PROTOCOL,
        "type": "notice",
        **subject,
        "run_id": run_id,
        "pipeline": pipeline,
        "step": step,
        "outcome": outcome,
        "resolved_at": rfc3339(resolved_at_ms),
    }


def build_notice(
    *,
    approval_id: str,
    run_id: str,
    pipeline: str,
    step: str,
    outcome: str,
    resolved_at_ms: int,
    revision: int,
    payload_hash: str,
    decided_by: Sequence[dict[str, Any]],
    reason: str | None,
) -> dict[str, Any]:
    """Return a resolution notice (docs/protocol.md "Notices") as a dict.

    ``outcome`` is one of ``OUTCOMES``; ``payload_hash`` is the final revision's;
    ``decided_by`` lists ``{"identity", "decision", "on_behalf_of"}`` of the decisions on the
    final revision; ``reason`` is the resolving decision's (a skip's), else None. It has
    ``type: "notice"`` and no ``callback``, ``nonce`` or ``draft``: it cannot be taken for a
    dispatch. Raises ValueError for an unknown outcome.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}")
    return {
        **_notice({"approval_id": approval_id}, run_id, pipeline, step, outcome, resolved_at_ms),
        "revision": revision,
        "payload_hash": payload_hash,
        "decided_by": [dict(item) for item in decided_by],
        "reason": reason,
    }


def build_question_notice(
    *,
    question_id: str,
    run_id: str,
    pipeline: str,
    step: str,
    outcome: str,
    resolved_at_ms: int,
    version: int,
    request_hash: str,
    answered_by: str | None,
) -> dict[str, Any]:
    """Return the resolution notice of a question (docs/protocol.md "Questions",
    "Notices") as a dict: the approvals' notice, additive, with ``kind: "question"``, the
    ``question_id`` and no ``approval_id``, ``outcome`` (``answered``, ``timeout``,
    ``cancelled``), ``version`` and ``request_hash`` of the final version, ``answered_by`` the
    identity whose answer won (None unless answered). Never the answer's value. Raises
    ValueError for another outcome.
    """
    if outcome not in QUESTION_OUTCOMES:
        raise ValueError(f"unknown question outcome {outcome!r}")
    subject = {"kind": "question", "question_id": question_id}
    return {
        **_notice(subject, run_id, pipeline, step, outcome, resolved_at_ms),
        "version": version,
        "request_hash": request_hash,
        "answered_by": answered_by,
    }
