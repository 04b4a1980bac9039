"""What a waiting-list row says about an item besides its pipeline and step:
enough to tell 14 rows of one "pipeline · step" apart, and whether the item may
be bulk-approved at all. Pure: reads the stored ``Item`` and its dispatch only."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

from gate.inbox.items import iso_ms
from gate.inbox.model import DecisionRecord, Item
from gate.inbox.render import first_line
from gate.inbox.seen import bulk_eligibility, whole_draft_html


def _text(dispatch: dict[str, Any], key: str) -> str | None:
    value = dispatch.get(key)
    return value if isinstance(value, str) and value else None


GATE_RUN_ID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")  # a ULID, as the gate writes one
GATE_FORMAT = ", in the gate's own id format: the gate makes one when the pipeline names no run"


def run_words(item: Item) -> str | None:
    """The dispatch's ``run_id`` as a page shows it, None when it has none. The gate makes a
    run id (a ULID) when the pipeline names none, and the dispatch does not say which it is:
    an id in that format (26 upper-case Crockford base32 characters) is labelled so, never
    shown bare as if the pipeline had named it."""
    run_id = _text(item.dispatch, "run_id")
    if run_id is None or not GATE_RUN_ID.fullmatch(run_id):
        return run_id
    return run_id + GATE_FORMAT


def requested_by(item: Item) -> str | None:
    """Who asked: the dispatch's ``requested_by`` (an operator's identity), None when the
    pipeline named nobody."""
    return _text(item.dispatch, "requested_by")


def requested_at(item: Item) -> str:
    """When the item was requested, ``"YYYY-MM-DD HH:MM UTC"``: the dispatch's
    ``issued_at`` (RFC 3339, docs/protocol.md "Dispatch") when it parses, else when the
    inbox received it (``received_at`` ms)."""
    issued = iso_ms(item.dispatch.get("issued_at"))
    when = item.received_at if issued is None else issued
    return datetime.fromtimestamp(when / 1000, UTC).strftime("%Y-%m-%d %H:%M UTC")


def row_facts(item: Item) -> dict[str, Any]:
    """A waiting row's extra facts: ``first_line`` (of the draft as the item page shows it,
    ``seen.visible_text``, ≤ 80 characters; the question's text for a question),
    ``requested`` (``requested_at``), ``run_id`` (``run_words``: None when there is none),
    ``review`` (why it must be opened, ``seen.bulk_eligibility``, approvals only),
    ``bulkable`` (an approval with no ``review``: it gets a checkbox) and ``whole`` (the whole
    draft as the row shows it when ``bulkable``, else "")."""
    facts = {"requested": requested_at(item), "run_id": run_words(item)}
    if item.kind != "approval":
        return {"first_line": first_line(item.body), **facts, "review": None, "bulkable": False,
                "whole": Markup("")}  # fmt: skip
    seen = bulk_eligibility(item.body, item.content_type)
    return {
        "first_line": first_line(seen.text),
        **facts,
        "review": seen.reason,
        "bulkable": seen.bulkable,
        "whole": whole_draft_html(seen),
    }


def decided_facts(record: DecisionRecord, item: Item | None) -> dict[str, Any]:
    """How a page names the item ``record`` decided, as the waiting list names it:
    ``first_line``, ``requested`` and ``run_id`` (``row_facts``: "", "" and None when the
    inbox no longer has the item), the ``revision`` decided and ``changed_to``: the item's
    revision now when it is another one (None when the same or unknown; then
    ``first_line`` is "": the stored draft is not the one decided)."""
    facts = row_facts(item) if item is not None else {}
    changed_to = item.revision if item is not None and item.revision != record.revision else None
    return {
        "first_line": facts.get("first_line", "") if changed_to is None else "",
        "revision": record.revision,
        "changed_to": changed_to,
        "requested": facts.get("requested", ""),
        "run_id": facts.get("run_id"),
    }
