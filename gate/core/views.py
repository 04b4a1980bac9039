"""The approval object of the pipeline API (SPEC §3), built from a loaded approval, and what
every kind's object shares (``api_time``, ``opening``, ``named``)."""

from __future__ import annotations

from typing import Any

from gate.core.approvals.rules import approvers_of, current_revision
from gate.model import Approval, Question
from gate.protocol.times import rfc3339


def api_time(ms: int | None) -> str | None:
    """Unix ms as an API time (``rfc3339``: the fraction only when not zero); None stays."""
    return None if ms is None else rfc3339(int(ms))


def opening(full: Approval | Question) -> dict[str, Any]:
    """The fields every kind's object has after its id, in this order: ``run_id``,
    ``pipeline``, ``step``, ``state``, ``outcome``, ``risk``."""
    return named(full, "run_id", "pipeline", "step", "state", "outcome", "risk")


def named(value: Any, *names: str) -> dict[str, Any]:
    """The attributes ``names`` of ``value`` as a JSON object's fields, in that order (the
    ones an API object shows as its model holds them)."""
    return {name: getattr(value, name) for name in names}


def approval_view(full: Approval) -> dict[str, Any]:
    """Return the SPEC §3 approval object (JSON-ready) for a ``Store.fetch_approval`` result.

    ``final_body`` is set only for ``approved``/``adjusted`` (the action may fire);
    ``payload_hash`` is the current revision's hash; ``created_receipt`` the receipt of the
    approval's ``created`` audit entry (a pipeline keeps it: ``audit verify --expect``
    then shows whether the log still holds that entry); ``permit`` (compact JWS) only for
    ``approved``/``adjusted`` on a gate with a signing key; ``requested_by`` is the
    requesting operator's identity, or None; ``decisions[].on_behalf_of`` is
    ``{"operator_id", "identity"}`` of the principal a delegate decided for,
    else None; ``decisions[].credential_id`` the approver credential that signed the
    decision, else None.
    """
    current = current_revision(full)
    scope = dict(full.scope)
    fired = full.outcome in ("approved", "adjusted")
    out_rows = [o for o in full.outbox if o.revision == full.revision] or list(full.outbox)
    latest = out_rows[-1] if out_rows else None
    return {
        "approval_id": full.approval_id,
        **opening(full),
        "quorum": {
            "required": full.quorum_required,
            # people only: a policy's approval (operator 0) counts toward no quorum
            "collected": len([op for op in approvers_of(full, full.revision) if op != 0]),
        },
        "approvers": [identity for _, identity in full.scope],
        "revision": full.revision,
        "payload_hash": current.payload_hash,
        "content_type": full.content_type,
        "final_body": current.body if fired else None,
        "created_at": api_time(full.created_at),
        "expires_at": api_time(full.expires_at),
        "resolved_at": api_time(full.resolved_at),
        "decisions": [
            {
                **named(d, "operator_id", "identity", "decision", "revision", "payload_hash"),
                **named(d, "channel", "decided_at"),
                "recorded_at": api_time(d.recorded_at),
                "reason": d.reason,
                "on_behalf_of": None
                if d.on_behalf_of is None
                else {"operator_id": d.on_behalf_of, "identity": scope.get(d.on_behalf_of)},
                "credential_id": d.credential_id,
            }
            for d in full.decisions
        ],
        "dispatch": {
            "revision": latest.revision if latest else None,
            "attempts": int(latest.attempts) if latest else 0,  # of this revision
            "delivered_at": api_time(latest.delivered_at) if latest else None,
            "last_error": latest.last_error if latest else None,
        },
        "receipt": full.receipt,
        "created_receipt": full.created_receipt,
        "requested_by": full.requested_by,
        "permit": full.permit if fired else None,
        "reminders_sent": full.reminders_sent,
        "escalation": {
            "level": full.escalation_level,
            "approvers": [identity for _, identity in full.scope],
        }
        if full.escalation_level
        else None,
    }
