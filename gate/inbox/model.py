"""What the inbox keeps and shows: plain, immutable values shared by its storage
(``gate.inbox.db``), its relay endpoint and its pages (``gate.inbox.pages``). Times are unix
milliseconds, UTC. No I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gate.inbox.followups import FollowUps


@dataclass(frozen=True, slots=True)
class Item:
    """One approval or question waiting at the inbox, as its newest dispatch made it.

    ``dispatch`` is the dispatch JSON object exactly as received (the source of truth: the
    decision digest and the callback come from it); the other fields are read from it for
    listing. ``kind`` is ``approval`` or ``question``; ``previous_body`` the draft of the
    revision before an adjust (None before any); ``state`` pending, resolved, cancelled,
    expired or withheld, and ``outcome`` the notice's outcome once closed; ``updated_seq``
    the inbox-wide change counter at its last change (live updates); ``followups`` the
    highest reminder and escalation any of its dispatches carried, and whom the escalations
    added."""

    approval_id: str
    kind: str
    pipeline: str
    step: str
    risk: str
    revision: int
    nonce: str
    payload_hash: str
    content_type: str
    body: str
    approvers: tuple[str, ...]
    quorum_required: int
    quorum_collected: int
    expires_at: int
    received_at: int
    state: str
    updated_seq: int
    dispatch: dict[str, Any] = field(hash=False, compare=False)
    previous_body: str | None = None
    outcome: str | None = None
    budget: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    skip_reason_required: bool = False
    delegates: tuple[tuple[str, str], ...] = ()  # (delegate identity, on behalf of)
    followups: FollowUps = FollowUps()  # reminders and escalations it has had


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A decision the inbox posted for ``identity``: the gate's HTTP ``status`` and JSON
    ``answer`` (what the page says in words), ``decided_at`` ms, and the ``reason`` the
    approver gave with it, as posted (None when none; shown to them, never logged), and
    ``sent``: an adjust's text, or an answer's value as JSON text (None for the others);
    ``batch_id``: the bulk approval it is one item of (None alone)."""

    approval_id: str
    revision: int
    identity: str
    decision: str
    status: int
    answer: dict[str, Any] = field(hash=False, compare=False)
    decided_at: int = 0
    reason: str | None = None
    sent: str | None = None
    batch_id: str | None = None


NOT_SENT = {"error": "not_sent"}
"""The answer kept on an item of a bulk approval until the inbox posts it (status 0): an
inbox stopped mid-batch leaves it, and the batch page says it was never sent."""


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in approver: ``identity`` (as the gate's operators name them), their
    ``operator_id``, the ``credential_id`` they signed in with, the per-session ``csrf``
    token, and the session's ``expires_at`` ms. The cookie holds a random id; only its
    SHA-256 is stored."""

    identity: str
    operator_id: int
    credential_id: str
    csrf: str
    created_at: int
    expires_at: int


@dataclass(frozen=True, slots=True)
class Change:
    """One item's change since a given ``updated_seq`` (live updates): its new ``state``
    and ``revision``."""

    approval_id: str
    state: str
    revision: int
    updated_seq: int
