"""What the SDK returns: ``Approval`` and ``Question``, frozen views of the
pipeline API's objects (SPEC §3), with the raw JSON kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gate.sdk.errors import (
    ApprovalCancelled,
    ApprovalDenied,
    ApprovalPending,
    ApprovalTimedOut,
    QuestionNotAnswered,
)

GRANTED = ("approved", "adjusted")


def _common(obj: dict[str, Any], id_key: str) -> dict[str, Any]:
    """The fields every kind's view has, from its JSON object (``id_key``: its id field)."""
    receipt = obj.get("receipt")
    return {
        "id": str(obj[id_key]),
        "state": str(obj["state"]),
        "outcome": obj.get("outcome"),
        "receipt": receipt if isinstance(receipt, dict) else None,
        "pipeline": obj.get("pipeline"),
        "step": obj.get("step"),
        "run_id": obj.get("run_id"),
        "raw": dict(obj),
    }


@dataclass(frozen=True, slots=True)
class Approval:
    """One approval as the gate last showed it.

    ``state`` is ``pending`` or ``resolved``; ``outcome`` (None while pending) is
    ``approved``, ``adjusted``, ``skipped``, ``timeout`` or ``cancelled``. ``body`` is the
    final body, set only when the action may go ahead (approved/adjusted; on adjust the
    approver's edited text, which is what must be acted on), else None. ``payload_hash`` is
    the current revision's ``sha256:…``; ``reason`` the skip's reason (None otherwise or when
    none was given); ``decided_by`` the identities of every decision in order (a policy
    decides as ``policy:<rule id>``); ``receipt`` the resolution's audit receipt object and
    ``permit`` the signed permit (compact JWS) when the gate issues them, else None; ``raw``
    the whole JSON object.
    """

    id: str
    state: str
    outcome: str | None
    body: str | None
    content_type: str | None
    payload_hash: str | None
    reason: str | None
    decided_by: tuple[str, ...]
    receipt: dict[str, Any] | None
    permit: str | None
    pipeline: str | None = None
    step: str | None = None
    run_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Approval:
        """Build from the pipeline API's approval object (SPEC §3)."""
        decisions = [d for d in obj.get("decisions") or [] if isinstance(d, dict)]
        reasons = [
            d["reason"]
            for d in decisions
            if d.get("decision") == "skip" and isinstance(d.get("reason"), str)
        ]
        return cls(
            **_common(obj, "approval_id"),
            body=obj.get("final_body"),
            content_type=obj.get("content_type"),
            payload_hash=obj.get("payload_hash"),
            reason=reasons[-1] if obj.get("outcome") == "skipped" and reasons else None,
            decided_by=tuple(str(d.get("identity")) for d in decisions),
            permit=obj.get("permit"),
        )

    def __bool__(self) -> bool:
        """Refused: ``if approval:`` would act on a pending one ("not yet"). Raises TypeError
        pointing to ``granted`` or ``raise_for_outcome()``."""
        raise TypeError("use approval.granted or raise_for_outcome()")

    @property
    def granted(self) -> bool:
        """True only for a resolved ``approved`` or ``adjusted`` approval: the action may go
        ahead (with ``body``). Pending is never a yes."""
        return self.state == "resolved" and self.outcome in GRANTED

    def raise_for_outcome(self) -> Approval:
        """Return self when approved or adjusted; else raise: ApprovalDenied (skipped, with the
        reason), ApprovalTimedOut, ApprovalCancelled, or ApprovalPending (not resolved yet).
        All are ApprovalNotGranted."""
        if self.granted:
            return self
        if self.state != "resolved":
            raise ApprovalPending(self)
        ended = {"skipped": ApprovalDenied, "timeout": ApprovalTimedOut}
        raise ended.get(self.outcome or "", ApprovalCancelled)(self)


@dataclass(frozen=True, slots=True)
class Question:
    """One question as the gate last showed it.

    ``state`` is ``pending`` or ``resolved``; ``outcome`` (None while pending) ``answered``,
    ``timeout`` or ``cancelled``. ``answer`` is the answer's value (a string for free text
    and single choice, a list for multi choice, an object for a form), None unless
    answered; ``answered_by`` the identity that answered; ``text`` and ``response_type``
    what was asked; ``receipt`` the resolution's audit receipt; ``raw`` the whole JSON.
    """

    id: str
    state: str
    outcome: str | None
    answer: Any
    answered_by: str | None
    text: str | None
    response_type: str | None
    receipt: dict[str, Any] | None
    pipeline: str | None = None
    step: str | None = None
    run_id: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Question:
        """Build from the pipeline API's question object."""
        answer = obj.get("answer")
        answer = answer if isinstance(answer, dict) else None
        asked = obj.get("question")
        asked = asked if isinstance(asked, dict) else {}
        return cls(
            **_common(obj, "question_id"),
            answer=None if answer is None else answer.get("value"),
            answered_by=None if answer is None else answer.get("identity"),
            text=asked.get("text"),
            response_type=asked.get("response_type"),
        )

    def __bool__(self) -> bool:
        """Refused, as for Approval: a pending question is no answer. Raises TypeError."""
        raise TypeError("use question.outcome or raise_for_outcome()")

    def raise_for_outcome(self) -> Question:
        """Return self when answered; else raise QuestionNotAnswered (timeout, cancelled, or
        still pending)."""
        if self.state == "resolved" and self.outcome == "answered":
            return self
        raise QuestionNotAnswered(self)
