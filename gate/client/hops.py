"""The lines ``hitl-gate request --wait`` reports on stderr: one per change between two views
of an approval (dispatched, decided, resolved, receipted), and a skip's reason."""

from __future__ import annotations

import json
from typing import Any

from gate.protocol.display import display_time, hanging_indent, marked

# the operator id of a policy's decision (gate.audit.entries.POLICY_OPERATOR)
POLICY_OPERATOR = 0


def visible(text: str) -> str:
    """``text`` (a reason: untrusted, from a relay) with every character a terminal would not
    show as itself replaced by ``<U+XXXX>``; newline and tab are kept."""
    return marked(text)


def one_line(text: object) -> str:
    """``str(text)`` (chosen by a relay: an identity, a display name, a channel, an error it
    answered) for a hop line: ``visible`` with newline and tab shown as ``<U+000A>`` and
    ``<U+0009>`` too, so it stays on its line and cannot fake one of ours (new-user finding
    8; the relay's own view shows a question's options so)."""
    return visible(str(text)).replace("\n", "<U+000A>").replace("\t", "<U+0009>")


def skip_reason_lines(approval: dict[str, Any]) -> list[str]:
    """``skipped by IDENTITY: REASON`` for the skip of a ``skipped`` approval object that
    carries a reason (``visible``; a reason over several lines has the later ones set in by
    ``hanging_indent``); [] for any other outcome or a skip without one (so such a skip
    reports exactly as before)."""
    if approval.get("outcome") != "skipped":
        return []
    return [
        f"skipped by {one_line(d['identity'])}: {hanging_indent(visible(d['reason']))}"
        for d in approval.get("decisions") or []
        if d.get("decision") == "skip" and isinstance(d.get("reason"), str)
    ]


def reason_summary(approval: dict[str, Any]) -> str:
    """One line for ``hitl-gate list``: ``  reason "TEXT"`` (JSON-quoted, ``visible``) of the
    approval's last decision with a reason, or "" when none has one."""
    reasons = [
        d["reason"] for d in approval.get("decisions") or [] if isinstance(d.get("reason"), str)
    ]
    if not reasons:
        return ""
    return "  reason " + json.dumps(visible(reasons[-1]), ensure_ascii=False)


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
            f"(attempt {new_dispatch.get('attempts')}, acked "
            f"{display_time(new_dispatch['delivered_at'])})"
        )
    elif new_dispatch.get("last_error") and new_dispatch.get("last_error") != old_dispatch.get(
        "last_error"
    ):
        lines.append(f"dispatch not acked yet: {one_line(new_dispatch['last_error'])} (retrying)")
    seen = len((before or {}).get("decisions") or [])
    new_decisions = (after.get("decisions") or [])[seen:]
    # a policy's decision (operator 0) is made at creation; nothing was dispatched
    by_people = [d for d in new_decisions if d.get("operator_id") != POLICY_OPERATOR]
    if (
        by_people
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
        f"decision {one_line(d['decision'])} by {one_line(d['identity'])}{_on_behalf_of(d)} "
        f"(operator {d['operator_id']}, revision {d['revision']}, via "
        f"{one_line(d.get('channel') or 'relay')})"
        if d.get("operator_id") != POLICY_OPERATOR
        else f"decision {one_line(d['decision'])} by {one_line(d['identity'])} at creation"
        " (a policy rule of the step: no person was asked)"
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
    """`` on behalf of IDENTITY`` for a delegate's decision, else ""."""
    principal = decision.get("on_behalf_of")
    if not isinstance(principal, dict):
        return ""
    who = principal.get("identity") or f"operator {principal.get('operator_id')}"
    return f" on behalf of {one_line(who)}"
