"""The lines ``hitl-gate request --wait`` reports on stderr: one per change between two views
of an approval (dispatched, decided, resolved, receipted)."""

from __future__ import annotations

from typing import Any


def hops(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """Return one human line per change between two approval objects (dispatch, decisions)."""
    lines: list[str] = []
    old_dispatch = (before or {}).get("dispatch") or {}
    new_dispatch = after.get("dispatch") or {}
    if new_dispatch.get("delivered_at") and (
        new_dispatch.get("delivered_at") != old_dispatch.get("delivered_at")
        or new_dispatch.get("revision") != old_dispatch.get("revision")
    ):
        lines.append(
            f"dispatched revision {new_dispatch.get('revision')} to the relay "
            f"(attempt {new_dispatch.get('attempts')}, acked {new_dispatch['delivered_at']})"
        )
    elif new_dispatch.get("last_error") and new_dispatch.get("last_error") != old_dispatch.get(
        "last_error"
    ):
        lines.append(f"dispatch not acked yet: {new_dispatch['last_error']} (retrying)")
    seen = len((before or {}).get("decisions") or [])
    new_decisions = (after.get("decisions") or [])[seen:]
    if (
        new_decisions
        and not lines
        and not new_dispatch.get("delivered_at")
        and not (old_dispatch.get("delivered_at"))
        and not seen
    ):
        # the relay answered before the gate had recorded its ack: the decision proves delivery
        lines.append(
            f"dispatched revision {new_decisions[0]['revision']} to the relay "
            "(decision arrived before the ack was recorded)"
        )
    decided = [
        f"decision {d['decision']} by {d['identity']}{_on_behalf_of(d)} (operator "
        f"{d['operator_id']}, revision {d['revision']}, via {d.get('channel') or 'relay'})"
        for d in new_decisions
    ]
    if (old_dispatch.get("revision") or 1) < (new_dispatch.get("revision") or 1):
        lines[:0] = decided  # an adjust made the revision just dispatched: cause first
    else:
        lines.extend(decided)
    if after["state"] == "resolved" and (before or {}).get("state") != "resolved":
        receipt = after.get("receipt") or {}
        lines.append(
            f"resolved: {after['outcome']} (revision {after['revision']}, {after['payload_hash']})"
        )
        if receipt:
            lines.append(
                f"receipt: audit entry {receipt.get('seq')} "
                f"{receipt.get('alg')}={receipt.get('receipt')}"
            )
    return lines


def _on_behalf_of(decision: dict[str, Any]) -> str:
    """`` on behalf of IDENTITY`` for a delegate's decision (issue 14 §3), else ""."""
    principal = decision.get("on_behalf_of")
    if not isinstance(principal, dict):
        return ""
    who = principal.get("identity") or f"operator {principal.get('operator_id')}"
    return f" on behalf of {who}"
