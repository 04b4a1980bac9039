"""The lines ``hitl-gate ask --wait`` reports on stderr: one per change between two views of
a question (revised, dispatched, answered, resolved, receipted). What a relay chose (identity,
channel, its error) stays on one line, hidden characters shown as ``<U+XXXX>`` (``one_line``).
Never the question's text nor the answer's value (treated like a draft; the answer
goes to stdout only)."""

from __future__ import annotations

from typing import Any

from gate.client.hops import one_line
from gate.protocol.display import display_time


def question_hops(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """One human line per change from ``before`` (None: nothing seen yet) to ``after``, two
    question objects of ``GET /v1/questions/{id}``."""
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
    if new.get("delivered_at") and (
        new.get("delivered_at") != old.get("delivered_at") or version != old_version
    ):
        lines.append(
            f"dispatched question version {version} to the relay "
            f"(attempt {new.get('attempts')}, acked {display_time(new['delivered_at'])})"
        )
    elif new.get("last_error") and new.get("last_error") != old.get("last_error"):
        lines.append(f"dispatch not acked yet: {one_line(new['last_error'])} (retrying)")
    answer = after.get("answer")
    if isinstance(answer, dict) and not isinstance((before or {}).get("answer"), dict):
        lines.append(
            f"answered by {one_line(answer.get('identity'))} (operator "
            f"{answer.get('operator_id')}, version {answer.get('version')}, via "
            f"{one_line(answer.get('channel') or 'relay')})"
        )
    if after["state"] == "resolved" and (before or {}).get("state") != "resolved":
        lines.append(
            f"resolved: {after['outcome']} (version {after.get('version')}, "
            f"{after.get('request_hash')})"
        )
        receipt = after.get("receipt") or {}
        if receipt:
            lines.append(
                f"receipt: audit entry {receipt.get('seq')} "
                f"{receipt.get('alg')}={receipt.get('receipt')}"
            )
    return lines
