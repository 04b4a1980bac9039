"""What the inbox reads from a dispatch: the checks a dispatch must pass before it
is kept, the columns its row stores, and the ``Item`` a stored row stands for. Pure: no I/O;
``now`` is an argument."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gate.inbox.followups import kept_of
from gate.inbox.model import Item
from gate.protocol.canonical import payload_hash
from gate.protocol.followup import skip_reason_required
from gate.protocol.relay_inbound import question_request_hash

UNKNOWN_TO_GATE = "the gate no longer has it"
"""The outcome the inbox gives an item the gate answered 404 ``unknown_approval`` for (its
database restored from a backup taken before the request): closed as cancelled."""
NOTICE_STATES = {
    "approved": "resolved",
    "adjusted": "resolved",
    "skipped": "resolved",
    "answered": "resolved",
    "cancelled": "cancelled",
    "timeout": "expired",
    UNKNOWN_TO_GATE: "cancelled",
}
CLOSED = ("resolved", "cancelled")
WITHHELD = "withheld"  # the stored dispatch is not the one its row says was signed
WITHHELD_WHY = "its stored draft does not match what the gate signed"


class DispatchRefused(ValueError):
    """A signed dispatch the inbox cannot keep: ``reason`` (wire code) and ``field``."""

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason if field is None else f"{reason}: {field}")
        self.reason = reason
        self.field = field

    def body(self) -> dict[str, Any]:
        """The 400 answer's JSON, as the reference relay says it."""
        out: dict[str, Any] = {"status": "invalid", "reason": self.reason}
        if self.field is not None:
            out["field"] = self.field
        return out


@dataclass(frozen=True, slots=True)
class Incoming:
    """The columns of one dispatch: ``approval_id`` (a question's ``question_id``), ``kind``,
    ``revision`` (a question's ``version``), ``nonce``, ``payload_hash`` (a question's
    ``request_hash``), ``body`` (the draft, or the question's text) and ``expires_at`` ms."""

    approval_id: str
    kind: str
    revision: int
    nonce: str
    payload_hash: str
    body: str
    expires_at: int


def iso_ms(text: Any) -> int | None:
    """An ISO 8601 date-time string (``Z`` or an offset) as unix ms, else None."""
    if isinstance(text, str):
        try:
            return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            pass
    return None


def _text(obj: Any, *path: str) -> str:
    value = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, str):
        raise DispatchRefused("invalid_dispatch", ".".join(path))
    return value


def _number(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DispatchRefused("invalid_dispatch", key)
    return value


def _signed(envelope: dict[str, Any], question: bool) -> tuple[int, str, str]:
    """``(revision, nonce, payload_hash)`` of a dispatch (a question's ``version`` and
    ``request_hash``). Raises ``DispatchRefused`` naming the first missing or mistyped field,
    ``payload_hash_mismatch`` when an approval's draft body does not hash to its
    ``payload_hash``."""
    nonce = _text(envelope, "callback", "nonce")
    if question:
        return _number(envelope, "version"), nonce, _text(envelope, "request_hash")
    hashed = _text(envelope, "payload_hash")
    if payload_hash(_text(envelope, "draft", "body")) != hashed:
        raise DispatchRefused("payload_hash_mismatch")
    return _number(envelope, "revision"), nonce, hashed


def read_dispatch(envelope: dict[str, Any]) -> Incoming:
    """The columns of a verified dispatch (SPEC §2 "Dispatch"; a question's per
    docs/protocol.md "Questions"). Raises ``DispatchRefused`` (400 ``invalid_dispatch`` naming
    the first missing or mistyped field; ``payload_hash_mismatch`` when the draft does not
    hash to ``payload_hash``, ``request_hash_mismatch`` when a question's fields do not hash
    to its ``request_hash``, as the reference relay)."""
    question = envelope.get("kind") == "question"
    approval_id = _text(envelope, "question_id" if question else "approval_id")
    _text(envelope, "callback", "nonce")
    _text(envelope, "callback", "url")
    if not isinstance(envelope.get("approvers"), list):
        raise DispatchRefused("invalid_dispatch", "approvers")
    expires_at = iso_ms(envelope.get("expires_at"))
    if expires_at is None:
        raise DispatchRefused("invalid_dispatch", "expires_at")
    body = _text(envelope, *(("question", "text") if question else ("draft", "body")))
    revision, nonce, hashed = _signed(envelope, question)
    if question and question_request_hash(envelope) != hashed:
        raise DispatchRefused("request_hash_mismatch")
    kind = "question" if question else "approval"
    return Incoming(approval_id, kind, revision, nonce, hashed, body, expires_at)


def signed_columns(dispatch: dict[str, Any], question: bool) -> tuple[int, str, str] | None:
    """``(revision, nonce, payload_hash)`` read from ONE stored ``dispatch`` (a question's
    ``version`` and ``request_hash``), or None when a field is missing or an approval's draft
    body does not hash to its ``payload_hash``: what the page shows is what is signed
    (review rev17a finding 1)."""
    try:
        return _signed(dispatch, question)
    except DispatchRefused:
        return None


def same_request(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether a re-send (same approval id and nonce) asks the same thing as the dispatch
    kept: same kind, revision/version, payload_hash/request_hash, draft or question object
    (body, content type…), pipeline, step and actions. Reminder, escalation, approvers,
    delegates, quorum, expires_at and callback may change (docs/protocol.md "Reminders,
    escalation, delegates"); anything else is a conflict (review rev17a finding 1)."""
    fixed = ("kind", "revision", "version", "payload_hash", "request_hash", "draft",
             "question", "pipeline", "step", "actions")  # fmt: skip
    return all(before.get(key) == after.get(key) for key in fixed)


def _mapping(obj: dict[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def item_from(row: dict[str, Any], dispatch: dict[str, Any], now_ms: int) -> Item:
    """The ``Item`` a stored row stands for; a pending item past ``expires_at`` at
    ``now_ms`` reads as ``expired`` (the sweep commits it later)."""
    state = row["state"]
    if state == "pending" and row["expires_at"] <= now_ms:
        state = "expired"
    question = row["kind"] == "question"
    quorum, draft = _mapping(dispatch, "quorum"), _mapping(dispatch, "draft")
    body = _mapping(dispatch, "question").get("text", "") if question else draft.get("body", "")
    signed = signed_columns(dispatch, question)
    if signed is None or signed != (row["revision"], row["nonce"], row["payload_hash"]):
        state, row = WITHHELD, {**row, "outcome": WITHHELD_WHY}
    delegates = [d for d in dispatch.get("delegates") or [] if isinstance(d, dict)]
    return Item(
        approval_id=row["approval_id"],
        kind=row["kind"],
        pipeline=str(dispatch.get("pipeline", "")),
        step=str(dispatch.get("step", "")),
        risk=str(dispatch.get("risk", "")),
        revision=signed[0] if signed else row["revision"],
        nonce=signed[1] if signed else row["nonce"],
        payload_hash=signed[2] if signed else row["payload_hash"],
        content_type="text/plain" if question else str(draft.get("content_type", "text/plain")),
        body=str(body),
        approvers=tuple(a for a in dispatch.get("approvers") or [] if isinstance(a, str)),
        quorum_required=int(quorum.get("required", 1)),
        quorum_collected=int(quorum.get("collected", 0)),
        expires_at=row["expires_at"],
        received_at=row["received_at"],
        state=state,
        updated_seq=row["updated_seq"],
        dispatch=dispatch,
        previous_body=row["previous_body"],
        outcome=row["outcome"],
        budget=dispatch.get("budget") if isinstance(dispatch.get("budget"), dict) else None,
        skip_reason_required=skip_reason_required(dispatch),
        delegates=tuple((str(d.get("identity")), str(d.get("on_behalf_of"))) for d in delegates),
        followups=kept_of(row, dispatch),
    )
