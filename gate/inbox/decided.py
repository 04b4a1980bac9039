"""What the inbox knows was decided on an item, said to the approver: who may decide it
(``may_decide``), whether their own decision already counts on the revision waiting (so it
waits for others, not for them), the text an adjust made final, and what an answer or an
adjust sent, in words. Pure: reads ``Item`` values and the decision records the gate
answered 2xx (``db.recorded_on``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gate.inbox.model import DecisionRecord, Item, Session
from gate.protocol.whitespace import identity_key


def on_behalf_of(identity: str, item: Item) -> tuple[str, ...]:
    """Whom a decision by ``identity`` on ``item`` counts for when they decide as a delegate
    (the dispatch's ``delegates``: identity and ``on_behalf_of``; the gate names no one in
    its own scope there, as they decide as themselves): the principals, in the dispatch's
    order; () for anyone else. Identities compare as SPEC §2 check 11 does."""
    key = identity_key(identity)
    found = [who for delegate, who in item.delegates if identity_key(delegate) == key]
    return tuple(dict.fromkeys(found))


def my_part(identity: str, item: Item, recorded: Sequence[DecisionRecord]) -> str | None:
    """``"approved"`` when ``identity``'s approve of ``item``'s current revision is recorded,
    ``"adjusted"`` when their adjust made the current revision (the gate counts whoever
    adjusted as approving the revision it made), else None: the item still waits for them."""
    for record in recorded:
        if record.identity != identity:
            continue
        if record.decision == "approve" and record.revision == item.revision:
            return "approved"
        if record.decision == "adjust" and record.revision == item.revision - 1:
            return "adjusted"
    return None


def standing(part: str, item: Item, collected: int) -> tuple[str, str]:
    """``(short, sentence)`` saying that ``part`` (``my_part``) counts and how many more
    approvals the item needs (``collected`` of ``item.quorum_required``): "You approved; 1
    more needed" for the waiting list, a full sentence for the item page."""
    needed = item.quorum_required - collected
    more = f"{needed} more needed" if needed > 0 else "the gate has yet to resolve it"
    approvals = "approval" if needed == 1 else "approvals"
    full = f"{needed} more {approvals} needed." if needed > 0 else "the gate has yet to resolve it."
    if part == "adjusted":
        return (
            f"You adjusted it to revision {item.revision}; {more}",
            f"You adjusted this item to revision {item.revision}, which counts as your"
            f" approval; {full}",
        )
    return f"You approved; {more}", f"You approved revision {item.revision}; {full}"


def final_text(item: Item, recorded: Sequence[DecisionRecord]) -> str | None:
    """The text an adjust recorded through the inbox made final for a resolved ``item``:
    the newest recorded adjust of the revision the inbox keeps (whose body it shows as what
    was asked); None when there is none (not resolved, or adjusted elsewhere)."""
    if item.state != "resolved":
        return None
    adjusts = [
        r for r in recorded
        if r.decision == "adjust" and r.revision == item.revision and r.sent is not None
    ]  # fmt: skip
    return adjusts[-1].sent if adjusts else None


def _titles(item: Item | None) -> Mapping[str, Any]:
    question = item.dispatch.get("question") if item is not None else None
    schema = question.get("schema") if isinstance(question, dict) else None
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _value_words(value: Any, props: Mapping[str, Any]) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ", ".join(_value_words(v, {}) for v in value)
    if isinstance(value, dict):
        parts = []
        for name, field in value.items():
            prop = props.get(name)
            title = prop.get("title") if isinstance(prop, dict) else None
            parts.append(f"{title or name}: {_value_words(field, {})}")
        return "; ".join(parts)
    return json.dumps(value, ensure_ascii=False)


def sent_words(record: DecisionRecord, item: Item | None = None) -> str | None:
    """What ``record`` sent besides its verb, in words: an adjust's text as typed; an
    answer's value (text; an option; options joined by ", "; a form's fields as
    "Title: value" joined by "; ", titles from ``item``'s schema when the inbox still has
    it); None for the others (and rows kept before the inbox stored it)."""
    if record.sent is None:
        return None
    if record.decision != "answer":
        return record.sent
    try:
        value = json.loads(record.sent)
    except ValueError:
        return record.sent
    return _value_words(value, _titles(item))


def may_decide(session: Session, item: Item) -> bool:
    """True when the session's identity (trimmed of White_Space and casefolded, as SPEC §2
    check 11 compares) is one of ``item.approvers`` or a delegate identity of the item."""
    key = identity_key(session.identity)
    mine = any(identity_key(a) == key for a in item.approvers)
    return mine or bool(on_behalf_of(session.identity, item))
