"""What the reference relay knows of each approval, and so whom not to ask about what.

hitl/v0 tells a relay only what dispatches carry, what the gate answers to the relay's own
decisions and, to a relay that opted in, how an approval ended (a resolution notice):
that is all this remembers. The rules mirror SPEC §2 "Quorum and outcomes" as seen from one relay.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gate.protocol.display import display_time
from gate.protocol.whitespace import identity_key  # as the gate compares (SPEC §2 check 11)
from gate.tools.reference_relay.view import shown


@dataclass(frozen=True, slots=True)
class Sent:
    """A decision the gate answered: ``verb``, ``text`` (an adjust's text, a skip's reason),
    HTTP ``status`` and the decoded ``answer`` (a dict, or the raw text when it was no JSON)."""

    verb: str
    text: str | None
    status: int
    answer: Any

    @property
    def fields(self) -> dict[str, Any]:
        """The answer's JSON object (empty when it was none)."""
        return self.answer if isinstance(self.answer, dict) else {}


def revision_of(envelope: dict[str, Any]) -> int:
    """The dispatch's ``revision`` (an additive hitl/v0 field; 1 when absent)."""
    revision = envelope.get("revision")
    return revision if isinstance(revision, int) and not isinstance(revision, bool) else 1


def version_of(envelope: dict[str, Any]) -> int:
    """The question dispatch's ``version`` (1 when absent or not an integer)."""
    version = envelope.get("version")
    return version if isinstance(version, int) and not isinstance(version, bool) else 1


def expiry_of(envelope: dict[str, Any], now: float) -> float:
    """The dispatch's ``expires_at`` as unix seconds (``now`` + 1 h when unreadable)."""
    try:
        text = str(envelope.get("expires_at"))
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return now + 3600


@dataclass(slots=True)
class Knowledge:
    """Per approval: how it ended (``closed``, a phrase), its newest revision known
    (``latest``), and per (approval, revision) the identities whose decision on it the gate
    recorded (``decided``: approved it, or made it with an edit, which counts as approval)."""

    closed: dict[str, str] = field(default_factory=dict)
    latest: dict[str, int] = field(default_factory=dict)
    decided: dict[tuple[str, int], set[str]] = field(default_factory=dict)

    def newer(self, approval_id: str, revision: int) -> bool:
        """Note that ``revision`` exists; True when it is newer than any known before."""
        if revision <= self.latest.get(approval_id, 0):
            return False
        self.latest[approval_id] = revision
        return True

    def stale(self, envelope: dict[str, Any], now: float) -> str | None:
        """Why nobody should be asked about this dispatch any more (resolved, superseded,
        past ``expires_at`` at unix time ``now``), as the start of a sentence; None while it
        is current."""
        approval_id, revision = envelope["approval_id"], revision_of(envelope)
        if approval_id in self.closed:
            return f"Approval {shown(approval_id)} {self.closed[approval_id]}"
        newest = self.latest.get(approval_id, 0)
        if newest > revision:
            return (
                f"Approval {shown(approval_id)} revision {revision} was superseded by "
                f"revision {newest}"
            )
        if now >= expiry_of(envelope, now):
            expires = display_time(envelope.get("expires_at"))
            return f"Approval {shown(approval_id)} expired at {shown(expires)}"
        return None

    def recorded(self, envelope: dict[str, Any], identity: str) -> bool:
        """True when ``identity``'s decision on this dispatch's revision is recorded."""
        at = (envelope["approval_id"], revision_of(envelope))
        return identity_key(identity) in self.decided.get(at, ())

    def learn(self, envelope: dict[str, Any], identity: str, sent: Sent) -> None:
        """Remember what the gate's answer to ``identity``'s decision on this dispatch says:
        resolved (200 with ``resolved``, 409 ``already_resolved``, 410, 404); recorded on this
        revision (200, 409 ``duplicate``/``already_decided``), or on the next one for an edit
        that changed the text (it made revision n+1); superseded (409: n+1 exists)."""
        approval_id, revision = envelope["approval_id"], revision_of(envelope)
        reason, outcome = sent.fields.get("reason"), shown(sent.fields.get("outcome"))
        if (sent.status == 200 and sent.fields.get("resolved")) or reason == "already_resolved":
            self.closed[approval_id] = f"was resolved ({outcome})"
        elif (
            sent.status == 200 and sent.verb == "adjust" and sent.text != envelope["draft"]["body"]
        ):
            self.decided.setdefault((approval_id, revision + 1), set()).add(identity_key(identity))
            self.newer(approval_id, revision + 1)
        elif sent.status == 200 or reason in ("duplicate", "already_decided"):
            self.decided.setdefault((approval_id, revision), set()).add(identity_key(identity))
        elif reason == "superseded":
            self.newer(approval_id, revision + 1)
        elif reason == "expired":
            self.closed[approval_id] = "timed out"
        elif reason == "unknown_approval":
            self.closed[approval_id] = "is not known to the gate"


def settle(future: asyncio.Future[str], reason: str) -> None:
    """Withdraw a prompt: set ``reason`` (why it went stale) on its future, unless already
    set."""
    if not future.done():
        future.set_result(reason)
