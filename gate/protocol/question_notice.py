"""The resolution notice of a question (gate -> question relay, with notices on): the
approvals' resolution notice, additive, naming a ``question_id`` instead of an
``approval_id``. Pure."""

from __future__ import annotations

from typing import Any

from gate.protocol import PROTOCOL
from gate.protocol.times import rfc3339

QUESTION_OUTCOMES = ("answered", "timeout", "cancelled")


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
    "Notices") as a dict: ``type: "notice"``, ``kind: "question"``, the ``question_id`` and
    no ``approval_id``, ``outcome`` (``answered``, ``timeout``, ``cancelled``), ``version``
    and ``request_hash`` of the final version, ``answered_by`` the identity whose answer won
    (None unless answered). Never the answer's value. Raises ValueError for another outcome.
    """
    if outcome not in QUESTION_OUTCOMES:
        raise ValueError(f"unknown question outcome {outcome!r}")
    return {
        "protocol": PROTOCOL,
        "type": "notice",
        "kind": "question",
        "question_id": question_id,
        "run_id": run_id,
        "pipeline": pipeline,
        "step": step,
        "outcome": outcome,
        "resolved_at": rfc3339(resolved_at_ms),
        "version": version,
        "request_hash": request_hash,
        "answered_by": answered_by,
    }
