"""What the reference relay knows of each approval (and question), and so whom not to ask
about what; and what a dispatch must carry to be read at all (``missing_field``).

hitl/v0 tells a relay only what dispatches carry, what the gate answers to the relay's own
decisions and, to a relay that opted in, how an approval ended (a resolution notice):
that is all this remembers. The rules mirror SPEC §2 "Quorum and outcomes" as seen from one relay.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gate.protocol.display import display_time
from gate.protocol.whitespace import identity_key  # as the gate compares (SPEC §2 check 11)
from gate.tools.reference_relay.question_view import line
from gate.tools.reference_relay.view import APPROVAL, kind_of, shown


def revision_of(envelope: dict[str, Any]) -> int:
    """An approval dispatch's ``revision`` (an additive hitl/v0 field), a question dispatch's
    ``version`` (``Kind.step``); 1 when absent or not an integer."""
    revision = envelope.get(kind_of(envelope).step)
    return revision if isinstance(revision, int) and not isinstance(revision, bool) else 1


def expiry_of(envelope: dict[str, Any], now: float) -> float:
    """The dispatch's ``expires_at`` as unix seconds (``now`` + 1 h when unreadable)."""
    try:
        text = str(envelope.get("expires_at"))
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return now + 3600


Fields = tuple[tuple[str, type | Callable[[Any], bool]], ...]
"""The fields a kind of dispatch must carry, in the order they are checked: a dotted path and
the type its value must have (or the check it must pass)."""


def missing_field(envelope: dict[str, Any], fields: Fields) -> str | None:
    """The first of ``fields`` the dispatch lacks or has of the wrong type (SPEC §2
    "Dispatch"), as its dotted path, or None when the fields this relay uses are all there."""
    for path, check in fields:
        value: Any = envelope
        for name in path.split("."):
            value = value.get(name) if isinstance(value, dict) else None
        if not (isinstance(value, check) if isinstance(check, type) else check(value)):
            return path
    return None


@dataclass(slots=True)
class Knowledge:
    """Per approval or question: how it ended (``closed``, a phrase), its newest revision or
    version known (``latest``); per (approval, revision) the identities whose decision on it
    the gate recorded (``decided``: approved it, or made it with an edit, which counts as
    approval)."""

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
        """Why nobody should be asked about this dispatch (an approval or a question) any
        more (resolved, superseded, past ``expires_at`` at unix time ``now``), as the start of
        a sentence; None while it is current. A question's words are written with ``line``."""
        kind, revision = kind_of(envelope), revision_of(envelope)
        subject, say = envelope[kind.key], shown if kind is APPROVAL else line
        if subject in self.closed:
            return f"{kind.noun} {say(subject)} {self.closed[subject]}"
        newest = self.latest.get(subject, 0)
        if newest > revision:
            newer = f"revision {newest}" if kind is APPROVAL else "a newer version"
            return f"{kind.noun} {say(subject)} {kind.step} {revision} was superseded by {newer}"
        if now >= expiry_of(envelope, now):
            expires = display_time(envelope.get("expires_at"))
            return f"{kind.noun} {say(subject)} expired at {say(expires)}"
        return None

    def recorded(self, envelope: dict[str, Any], identity: str) -> bool:
        """True when ``identity``'s decision on this dispatch's revision is recorded."""
        at = (envelope["approval_id"], revision_of(envelope))
        return identity_key(identity) in self.decided.get(at, ())

    def learn(
        self,
        envelope: dict[str, Any],
        identity: str,
        reply: tuple[str, str | None],
        status: int,
        answer: Any,
    ) -> None:
        """Remember what the gate's answer (HTTP ``status``, the decoded ``answer``: a dict,
        or the raw text when it was no JSON) to ``identity``'s decision ``reply`` (verb, and
        an adjust's text or a skip's reason) on this dispatch says: resolved (200 with
        ``resolved``, 409 ``already_resolved``, 410, 404); recorded on this revision (200, 409
        ``duplicate``/``already_decided``), or on the next one for an edit that changed the
        text (it made revision n+1); superseded (409: n+1 exists)."""
        approval_id, revision = envelope["approval_id"], revision_of(envelope)
        fields = answer if isinstance(answer, dict) else {}
        reason, outcome = fields.get("reason"), shown(fields.get("outcome"))
        if (status == 200 and fields.get("resolved")) or reason == "already_resolved":
            self.closed[approval_id] = f"was resolved ({outcome})"
        elif status == 200 and reply[0] == "adjust" and reply[1] != envelope["draft"]["body"]:
            self.decided.setdefault((approval_id, revision + 1), set()).add(identity_key(identity))
            self.newer(approval_id, revision + 1)
        elif status == 200 or reason in ("duplicate", "already_decided"):
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
