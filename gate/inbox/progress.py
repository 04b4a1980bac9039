"""Quorum progress as the inbox knows it: how many approvals an item's current
revision has, from what the gate sent (the dispatch's ``quorum.collected``, a reminder's
``awaiting``) and the approvals the inbox itself saw recorded, counting each once. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gate.inbox.model import Item
from gate.inbox.words import quorum
from gate.protocol.display import code_point, is_hidden


def shown(value: object) -> str:
    """One-line plain text (a name, a page title): hidden characters as ``U+XXXX`` text."""
    return "".join(code_point(c) if is_hidden(c) else c for c in str(value))


def collected(item: Item, approved_by: Sequence[str] = ()) -> int:
    """Approvals of ``item``'s current revision, at most the quorum: the stored dispatch's
    ``quorum.collected`` (the gate's count when it sent it) plus the distinct identities the
    inbox saw recorded (``db.approvers_recorded``) that it did not count yet. A reminder
    carries ``awaiting`` (who had not decided then): only those of them count on top. An
    escalation says neither: the larger of the two counts, never both (the gate sends no
    count after each decision; docs/protocol.md "Reminders, escalation, delegates")."""
    recorded = set(approved_by)
    awaiting = item.dispatch.get("awaiting")
    if isinstance(awaiting, list):
        count = item.quorum_collected + len(recorded & {str(who) for who in awaiting})
    elif "escalation" in item.dispatch:
        count = max(item.quorum_collected, len(recorded))
    else:
        count = item.quorum_collected + len(recorded)
    return min(item.quorum_required, count)


def progress(item: Item, approved_by: Sequence[str] = ()) -> dict[str, Any]:
    """An open item page's quorum progress for ``/live?item=…``: ``{"approval_id",
    "revision", "quorum": "1 of 2", "approved_by": [identities recorded through the inbox,
    first first, hidden characters as ``U+XXXX`` text]}`` (what the page's facts show,
    ``collected``)."""
    return {
        "approval_id": item.approval_id,
        "revision": item.revision,
        "quorum": quorum(collected(item, approved_by), item.quorum_required),
        "approved_by": [shown(who) for who in approved_by],
    }
