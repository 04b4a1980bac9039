"""The lines ``hitl-gate request --wait`` and ``ask --wait`` report on stderr: one per change
between two views of an approval (dispatched, decided, resolved, receipted; ``hops``) or of a
question (revised, dispatched, answered, resolved, receipted; ``question_hops``), and a
skip's reason. What a relay chose (identity, channel, its error) stays on one line, hidden
characters shown as ``<U+XXXX>`` (``one_line``)."""

from __future__ import annotations

import json
from typing import Any

from gate.protocol.display import display_time, hanging_indent, marked

# the operator id of a policy's decision (gate.audit.entries.POLICY_OPERATOR)
POLICY_OPERATOR = 0


def one_line(text: object) -> str:
    """``str(text)`` (chosen by a relay: an identity, a display name, a channel, an error it
    answered) for a hop line: every character a terminal would not show as itself as
    ``<U+XXXX>`` (``marked``), newline and tab too, so it stays on its line and cannot fake
    one of ours (new-user finding 8; the relay's own view shows a question's options so)."""
    return marked(str(text), keep="")


def skip_reason_lines(approval: dict[str, Any]) -> list[str]:
    """``skipped by IDENTITY: REASON`` for the skip of a ``skipped`` approval object that
    carries a reason (``marked``: hidden characters as ``<U+XXXX>``; a reason over several
    lines has the later ones set in by ``hanging_indent``); [] for any other outcome or a
    skip without one (so such a skip reports exactly as before)."""
    if approval.get("outcome") != "skipped":
        return []
    return [
        f"skipped by {one_line(d['identity'])}: {hanging_indent(marked(d['reason']))}"
        for d in approval.get("decisions") or []
        if d.get("decision") == "skip" and isinstance(d.get("reason"), str)
    ]


def reason_summary(approval: dict[str, Any]) -> str:
    """One line for ``hitl-gate list``: ``  reason "TEXT"`` (JSON-quoted, ``marked``) of the
    approval's last decision with a reason, or "" when none has one."""
    reasons = [
        d["reason"] for d in approval.get("decisions") or [] if isinstance(d.get("reason"), str)
    ]
    if not reasons:
        return ""
    return "  reason " + json.dumps(marked(reasons[-1]), ensure_ascii=False)


def hops(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """Return one human line per change between two approval objects (dispatch, decisions)."""
    old_dispatch = (before or {}).get("dispatch") or {}
    new_dispatch = after.get("dispatch") or {}
    revision, old_revision = new_dispatch.get("revision"), old_dispatch.get("revision")
    lines = _dispatched(old_dispatch, new_dispatch, "revision", revision, old_revision)
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
    if (old_revision or 1) < (revision or 1):
        lines[:0] = decided  # an adjust made the revision just dispatched: cause first
    else:
        lines.extend(decided)
    return lines + _resolved(before, after, "revision", "payload_hash")


def _on_behalf_of(decision: dict[str, Any]) -> str:
    """`` on behalf of IDENTITY`` for a delegate's decision, else ""."""
    principal = decision.get("on_behalf_of")
    if not isinstance(principal, dict):
        return ""
    who = principal.get("identity") or f"operator {principal.get('operator_id')}"
    return f" on behalf of {one_line(who)}"


def question_hops(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """One human line per change from ``before`` (None: nothing seen yet) to ``after``, two
    question objects of ``GET /v1/questions/{id}``: revised, dispatched, answered, resolved,
    receipted. Never the question's text nor the answer's value (treated like a draft; the
    answer goes to stdout only)."""
    lines: list[str] = []
    if before is not None and after.get("version") != before.get("version"):
        # a revise changed what the answer will be to (new-user finding 16): never the text
        line = f"question revised to version {after.get('version')}"
        was = (before.get("question") or {}).get("response_type")
        now = (after.get("question") or {}).get("response_type")
        if was is not None and now is not None and now != was:
            # what stdout will hold changes with it (second new-user pass, finding 1)
            line += f" (the answer is now {one_line(now)}, was {one_line(was)})"
        lines.append(line)
    old = (before or {}).get("dispatch") or {}
    new = after.get("dispatch") or {}
    version = new.get("version") or after.get("version")
    old_version = old.get("version") or (before or {}).get("version")
    lines += _dispatched(old, new, "question version", version, old_version)
    answer = after.get("answer")
    if isinstance(answer, dict) and not isinstance((before or {}).get("answer"), dict):
        lines.append(
            f"answered by {one_line(answer.get('identity'))} (operator "
            f"{answer.get('operator_id')}, version {answer.get('version')}, via "
            f"{one_line(answer.get('channel') or 'relay')})"
        )
    return lines + _resolved(before, after, "version", "request_hash")


def _dispatched(
    old: dict[str, Any], new: dict[str, Any], label: str, version: Any, old_version: Any
) -> list[str]:
    """The dispatch's hop, for either kind: ``dispatched <label> N to the relay`` once it is
    acked (again, for a new ``version``), else a new error the relay answered; [] if none."""
    if new.get("delivered_at") and (
        new.get("delivered_at") != old.get("delivered_at") or version != old_version
    ):
        return [
            f"dispatched {label} {version} to the relay (attempt {new.get('attempts')}, "
            f"acked {display_time(new['delivered_at'])})"
        ]
    if new.get("last_error") and new.get("last_error") != old.get("last_error"):
        return [f"dispatch not acked yet: {one_line(new['last_error'])} (retrying)"]
    return []


def _resolved(
    before: dict[str, Any] | None, after: dict[str, Any], version: str, digest: str
) -> list[str]:
    """``resolved: OUTCOME (<version> N, <digest>)`` and the receipt's line, for either kind,
    when ``after`` is the first resolved view; else []."""
    if after["state"] != "resolved" or (before or {}).get("state") == "resolved":
        return []
    lines = [f"resolved: {after['outcome']} ({version} {after.get(version)}, {after.get(digest)})"]
    receipt = after.get("receipt") or {}
    if receipt:
        lines.append(
            f"receipt: audit entry {receipt.get('seq')} "
            f"{receipt.get('alg')}={receipt.get('receipt')}"
        )
    return lines
