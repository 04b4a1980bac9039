"""The question object of the pipeline API, built from a loaded question."""

from __future__ import annotations

from typing import Any

from gate.core.views import api_time
from gate.model import Question


def question_view(full: Question) -> dict[str, Any]:
    """The question object (JSON-ready; docs/openapi.yaml):
    the current version's ``question`` and ``request_hash``, the winning ``answer`` (None
    unless answered; its ``request_hash`` is that of the version answered), times as RFC
    3339 UTC, ``dispatch`` of the current version, the ``receipt`` of the resolution and
    ``created_receipt`` of the ``question_created`` entry."""
    current = full.current
    rows = [o for o in full.outbox if o.revision == full.version]
    latest = rows[-1] if rows else None
    answer = None
    if full.answer is not None:
        won = full.answer
        answered = full.version_row(won.version)
        answer = {
            "value": won.value,
            "operator_id": won.operator_id,
            "identity": won.identity,
            "display": won.display,
            "channel": won.channel,
            "version": won.version,
            "request_hash": answered.request_hash if answered is not None else None,
            "decided_at": won.decided_at,
            "recorded_at": api_time(won.recorded_at),
        }
    return {
        "question_id": full.question_id,
        "run_id": full.run_id,
        "pipeline": full.pipeline,
        "step": full.step,
        "state": full.state,
        "outcome": full.outcome,
        "risk": full.risk,
        "approvers": [identity for _, identity in full.scope],
        "version": full.version,
        "request_hash": current.request_hash,
        "question": current.question,
        "answer": answer,
        "created_at": api_time(full.created_at),
        "expires_at": api_time(full.expires_at),
        "resolved_at": api_time(full.resolved_at),
        "requested_by": full.requested_by,
        "dispatch": {
            "attempts": int(latest.attempts) if latest else 0,
            "delivered_at": api_time(latest.delivered_at) if latest else None,
            "last_error": latest.last_error if latest else None,
        },
        "receipt": full.receipt,
        "created_receipt": full.created_receipt,
    }
