"""Bulk approve at the inbox (issue 17): several approvals with one passkey tap, signed as one
batch (docs/protocol.md "Approver signatures", issue 16 §4). The waiting page posts one field
``item:<approval_id>`` = the revision SHOWN per ticked item; the inbox answers the batch
challenge (``batch_digest`` of each item's approve ``decision_digest``, from the STORED
dispatches), then posts one decision per item, each with the same assertion and the batch's
hex digests, and shows each item's answer in words.

The pure part (``picks_from``, ``checked_items``, ``approve_digest``, ``batch_of``) takes no
request; the routes are added by ``add_routes``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gate.inbox.model import Item
from gate.protocol.approver_signature import batch_digest, decision_digest

PREFIX = "item:"
MIN_ITEMS = 2
MAX_ITEMS = 50


class BulkRefused(ValueError):
    """A batch the inbox will not sign or post: HTTP ``status``, wire ``reason`` and the
    ``message`` in words (naming the item when one is the cause); nothing is posted."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True, slots=True)
class Batch:
    """A checked batch: its ``items`` (in the order ticked), each item's approve digest
    (``digests``, same order), the ``hexes`` sent in ``approver_assertion.batch`` and the
    ``challenge`` the passkey signs (``batch_digest``)."""

    items: tuple[Item, ...]
    digests: tuple[bytes, ...]
    hexes: tuple[str, ...]
    challenge: bytes


def picks_from(fields: Mapping[str, Any]) -> list[tuple[str, int]]:
    """The ``(approval_id, revision shown)`` pairs of the ``item:<id>`` fields, in the order
    posted. Raises ``BulkRefused`` 400 ``invalid_batch`` for a revision that is not a
    positive integer, 422 ``batch_size`` for fewer than ``MIN_ITEMS`` or more than
    ``MAX_ITEMS`` items (said in words)."""
    picks: list[tuple[str, int]] = []
    for name, value in fields.items():
        if not name.startswith(PREFIX):
            continue
        approval_id = name[len(PREFIX) :]
        text = value[0] if isinstance(value, list) and len(value) == 1 else value
        if not approval_id or not isinstance(text, str) or not text.isascii():
            raise BulkRefused(
                400, "invalid_batch", "A selected item was not sent as the page does."
            )
        if not text.isdigit() or int(text) < 1:
            raise BulkRefused(
                400, "invalid_batch", "A selected item was not sent as the page does."
            )
        picks.append((approval_id, int(text)))
    if len(picks) < MIN_ITEMS:
        raise BulkRefused(
            422, "batch_size", f"Select at least {MIN_ITEMS} items to approve them together."
        )
    if len(picks) > MAX_ITEMS:
        raise BulkRefused(
            422, "batch_size", f"Select at most {MAX_ITEMS} items to approve them together."
        )
    return picks


def title_of(item: Item) -> str:
    """How a page names ``item``: ``"<pipeline> · <step>"``."""
    return f"{item.pipeline} \u00b7 {item.step}"


def checked_items(
    picks: list[tuple[str, int]],
    stored: Mapping[str, Item | None],
    may_decide: Callable[[Item], bool],
) -> list[Item]:
    """The stored items of ``picks`` once each is an approval the session may decide
    (``may_decide``), still pending, at the revision shown. Raises ``BulkRefused`` 409 naming
    the first item that is not: ``not_available`` (unknown, a question, or not the session's
    to decide: said alike, its existence is not disclosed), ``not_pending`` ("… is now
    expired") or ``changed`` ("… changed since you opened it: reload to see revision N")."""
    items: list[Item] = []
    for approval_id, revision in picks:
        item = stored.get(approval_id)
        if item is None or item.kind != "approval" or not may_decide(item):
            raise BulkRefused(
                409,
                "not_available",
                f"Item {approval_id} is not waiting for you: reload the list and select again.",
            )
        if item.state != "pending":
            raise BulkRefused(
                409, "not_pending", f"{title_of(item)} ({approval_id}) is now {item.state}."
            )
        if item.revision != revision:
            raise BulkRefused(
                409,
                "changed",
                f"{title_of(item)} ({approval_id}) changed since you opened it: reload to see"
                f" revision {item.revision}.",
            )
        items.append(item)
    return items


def approve_digest(item: Item) -> bytes:
    """The approve ``decision_digest`` of ``item``'s stored revision, nonce and payload hash
    (issue 16 §3): no adjust text, no reason."""
    return decision_digest(
        approval_id=item.approval_id,
        revision=item.revision,
        nonce=item.nonce,
        payload_hash=item.payload_hash,
        decision="approve",
    )


def batch_of(items: list[Item]) -> Batch:
    """The batch of checked ``items``: their approve digests and ``batch_digest`` (issue 16
    §4; the same item twice is refused 400 ``invalid_batch``)."""
    digests = tuple(approve_digest(i) for i in items)
    try:
        challenge = batch_digest(digests)
    except ValueError as exc:
        raise BulkRefused(400, "invalid_batch", "An item was selected twice.") from exc
    return Batch(tuple(items), digests, tuple(d.hex() for d in digests), challenge)
