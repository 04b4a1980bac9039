"""Reminders and escalations as the inbox keeps and shows them: what a dispatch of the gate's
follow-ups (docs/protocol.md "Reminders, escalation, delegates") adds to what an item has
had so far, whom it should tell (mail), and the words a waiting row and the item page say
("Reminder 3", "Escalated to you", "Escalated: level 1"). Pure: no I/O.

The gate's reminder re-sends the revision's dispatch with ``reminder`` and ``awaiting`` and no
``escalation``; its escalation with ``escalation`` and no ``reminder``; a new revision with
neither. So the item keeps the highest of each seen (``FollowUps``) rather than reading
them from its latest dispatch alone."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NEW, ESCALATION, REMINDER = "new", "escalation", "reminder"  # what may be mailed (``mail.on``)


@dataclass(frozen=True, slots=True)
class FollowUps:
    """What an item has had: the highest ``reminder`` number and ``escalation`` level any of
    its dispatches carried (0: none), and ``escalated_to``: the identities an escalation
    added to its approvers while the inbox held it (in the order added; an item first seen
    already escalated has none: the inbox cannot tell who was added)."""

    reminder: int = 0
    escalation: int = 0
    escalated_to: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class News:
    """Whom a kept dispatch should tell what: ``kind`` (``NEW``, ``ESCALATION`` or
    ``REMINDER``), ``n`` the reminder number or escalation level (0 for a new item) and the
    ``identities`` concerned (every approver of a new item; those an escalation added; those
    a reminder says it awaits)."""

    kind: str
    n: int
    identities: tuple[str, ...]


def count_of(dispatch: Mapping[str, Any], key: str) -> int:
    """The dispatch's ``reminder`` or ``escalation`` number (an integer >= 1), else 0."""
    value = dispatch.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _names(dispatch: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = dispatch.get(key)
    found = value if isinstance(value, list) else []
    return tuple(dict.fromkeys(who for who in found if isinstance(who, str)))


def kept_of(row: Mapping[str, Any], dispatch: Mapping[str, Any]) -> FollowUps:
    """An item's ``FollowUps`` from its row (columns ``reminder``, ``escalation`` and
    ``escalated_to``, a JSON list; absent in a row read before they existed) and its stored
    ``dispatch`` (whichever says more)."""
    try:
        listed = json.loads(row.get("escalated_to") or "[]")
    except ValueError:
        listed = []
    return FollowUps(
        max(int(row.get("reminder") or 0), count_of(dispatch, REMINDER)),
        max(int(row.get("escalation") or 0), count_of(dispatch, ESCALATION)),
        _names({"who": listed}, "who"),
    )


def first_seen(dispatch: Mapping[str, Any]) -> tuple[FollowUps, list[News]]:
    """The follow-ups of an item whose first dispatch is ``dispatch``, and its news: every
    approver is told of a NEW item (reminded or escalated before the inbox held it or not)."""
    kept = FollowUps(count_of(dispatch, REMINDER), count_of(dispatch, ESCALATION))
    return kept, [News(NEW, 0, _names(dispatch, "approvers"))]


def advance(
    kept: FollowUps, before: Mapping[str, Any], after: Mapping[str, Any]
) -> tuple[FollowUps, list[News]]:
    """What ``kept`` becomes once dispatch ``after`` replaces ``before`` (same item), and
    its news: a higher escalation level tells the approvers ``after`` names that ``before``
    did not (they join ``escalated_to``); a higher reminder number tells whom it awaits. A
    re-send of a lower or the same number tells nobody and lowers nothing."""
    reminder, level = count_of(after, REMINDER), count_of(after, ESCALATION)
    news: list[News] = []
    escalated_to = kept.escalated_to
    if level > kept.escalation:
        had = set(_names(before, "approvers"))
        added = tuple(who for who in _names(after, "approvers") if who not in had)
        escalated_to += tuple(who for who in added if who not in escalated_to)
        if added:
            news.append(News(ESCALATION, level, added))
    if reminder > kept.reminder:
        awaited = _names(after, "awaiting")
        if awaited:
            news.append(News(REMINDER, reminder, awaited))
    merged = FollowUps(max(kept.reminder, reminder), max(kept.escalation, level), escalated_to)
    return merged, news


def followup_words(kept: FollowUps, viewer: str) -> tuple[str, ...]:
    """What a waiting row and the item page say of an item's follow-ups to ``viewer`` (an
    identity): "Reminder 3" after the gate's third reminder; "Escalated to you" when an
    escalation added the viewer, else "Escalated: level 1" once escalated; () for neither."""
    words: list[str] = []
    if kept.reminder:
        words.append(f"Reminder {kept.reminder}")
    if kept.escalation:
        mine = viewer.casefold() in {who.casefold() for who in kept.escalated_to}
        words.append("Escalated to you" if mine else f"Escalated: level {kept.escalation}")
    return tuple(words)
