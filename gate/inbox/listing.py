"""What a waiting-list row says about an item besides its pipeline and step (issue 17
finding 2): enough to tell 14 rows of one "pipeline · step" apart, and whether the item may
be bulk-approved at all. Pure: reads the stored ``Item`` and its dispatch only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gate.inbox.model import Item
from gate.inbox.render import first_line, review_reason


def _text(dispatch: dict[str, Any], key: str) -> str | None:
    value = dispatch.get(key)
    return value if isinstance(value, str) and value else None


def requested_by(item: Item) -> str | None:
    """Who asked: the dispatch's ``requested_by`` (an operator's identity), None when the
    pipeline named nobody."""
    return _text(item.dispatch, "requested_by")


def requested_at(item: Item) -> str:
    """When the item was requested, ``"YYYY-MM-DD HH:MM UTC"``: the dispatch's
    ``issued_at`` (RFC 3339, docs/protocol.md "Dispatch") when it parses, else when the
    inbox received it (``received_at`` ms)."""
    issued = _text(item.dispatch, "issued_at")
    when: datetime | None = None
    if issued is not None:
        try:
            when = datetime.fromisoformat(issued.replace("Z", "+00:00")).astimezone(UTC)
        except ValueError:
            when = None
    if when is None:
        when = datetime.fromtimestamp(item.received_at / 1000, UTC)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def row_facts(item: Item) -> dict[str, Any]:
    """A waiting row's extra facts: ``first_line`` (the draft's, ≤ 80 characters; the
    question's text for a question), ``requested`` (``requested_at``), ``run_id`` (None
    when the dispatch has none), ``review`` (why it must be opened,
    ``render.review_reason``, approvals only) and ``bulkable`` (an approval with no
    ``review``: it gets a checkbox)."""
    review = review_reason(item.body, item.content_type) if item.kind == "approval" else None
    return {
        "first_line": first_line(item.body),
        "requested": requested_at(item),
        "run_id": _text(item.dispatch, "run_id"),
        "review": review,
        "bulkable": item.kind == "approval" and review is None,
    }
