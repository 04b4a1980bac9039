"""An approver's decision through the inbox: the challenge
to sign (the decision digest of the revision SHOWN) and the signed decision, built
from the stored dispatch, recorded BEFORE it is posted to the gate and updated with the
gate's answer after (nothing the gate answered is lost; a kill -9 in between leaves the row
"sent; the gate's answer was not received")."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from gate.inbox import auth
from gate.inbox.gate_client import GateUnreachable, post_decision
from gate.inbox.items import UNKNOWN_TO_GATE
from gate.inbox.model import DecisionRecord, Item, Session
from gate.inbox.state import InboxState, decidable, state_of
from gate.inbox.words import gate_code
from gate.protocol import PROTOCOL
from gate.protocol.approver_signature import (
    VERBS,
    ApproverAssertion,
    b64url,
    decision_digest,
    parse_approver_assertion,
)
from gate.protocol.errors import ProtocolError
from gate.protocol.times import rfc3339_ms
from gate.protocol.whitespace import trim

log = logging.getLogger(__name__)


class Refused(Exception):
    """A decision, answer or batch the inbox refuses before anything is posted: HTTP
    ``status``, wire ``reason`` and the ``message`` in words (naming the item when one of a
    batch is the cause)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message

    def response(self) -> web.Response:
        """The JSON refusal for inbox.js."""
        return auth.refusal(self.status, self.reason, self.message)


def verb_fields(item: Item, fields: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """The posted form's ``(verb, adjust_text, reason)`` on ``item``: ``reason`` is the text
    when not blank (Unicode White_Space only) else None; ``adjust_text`` only for adjust
    (exactly as typed). Raises Refused 400 ``invalid_decision`` for another verb or a non-text
    field, then ``check_open``'s 409s (an approval, pending, at the ``revision`` posted)."""
    verb = fields.get("decision")
    if verb not in VERBS:
        raise Refused(400, "invalid_decision", "Choose approve, skip or adjust.")
    for name, what in (("reason", "The reason"), ("adjust_text", "The adjusted draft")):
        if fields.get(name) is not None and not isinstance(fields[name], str):
            raise Refused(400, "invalid_decision", f"{what} must be text.")
    check_open(item, "approval", fields.get("revision", ""))
    reason = fields.get("reason")
    return (
        str(verb),
        fields.get("adjust_text") if verb == "adjust" else None,
        reason if reason is not None and trim(reason) else None,
    )


OPEN_WORDS = {
    # kind: the refusal of the other kind, what ends "is now <state>", the number shown
    "approval": ("This item is a question: answer it on its page.", ".", "revision"),
    "question": (
        "This item is an approval: decide it on its page.",
        "; nothing was sent.",
        "version",
    ),
}


def check_open(item: Item, kind: str, shown: object, named: str = "This item") -> None:
    """``item`` is of ``kind`` (else 409 ``not_an_approval``/``not_a_question``), pending
    (else 409 ``not_pending``, its state in words) and ``shown``, the revision (a question's
    version) the page showed, is the stored one (else 409 ``changed``): an approver never
    signs or answers a revision they did not see. ``named`` is how the words name the item."""
    other, after, number = OPEN_WORDS[kind]
    if item.kind != kind:
        raise Refused(409, "not_an_approval" if kind == "approval" else "not_a_question", other)
    if item.state != "pending":
        raise Refused(409, "not_pending", f"{named} is now {item.state}{after}")
    if str(shown) != str(item.revision):
        raise Refused(
            409,
            "changed",
            f"{named} changed since you opened it: reload to see {number} {item.revision}.",
        )


def digest_of(
    item: Item, verb: str, adjust_text: str | None = None, reason: str | None = None
) -> bytes:
    """The 32-byte decision digest of ``item``'s stored revision, nonce and payload hash (an
    approve of a batch: no adjust text, no reason)."""
    return decision_digest(
        approval_id=item.approval_id,
        revision=item.revision,
        nonce=item.nonce,
        payload_hash=item.payload_hash,
        decision=verb,
        adjust_text=adjust_text,
        reason=reason,
    )


async def checked_request(request: web.Request) -> tuple[Session, Item, dict[str, Any]]:
    """A POST's session (else 401 ``signed_out``), its fields once Origin and CSRF are
    checked (``auth.read_post``: else 403) and the item ``{id}`` it may decide (else 404)."""
    session = await auth.require_session(request)
    fields = await auth.read_post(request, session)
    item = await decidable(request, session)
    return session, item, fields


async def challenge(request: web.Request) -> web.Response:
    """POST ``/items/{id}/challenge``: ``{"challenge": b64url(decision_digest)}`` for the
    posted verb, texts and revision (401 signed out, 403 Origin/CSRF, 404 not the
    session's, 409 not pending or changed)."""
    _, item, fields = await checked_request(request)
    try:
        verb, adjust_text, reason = verb_fields(item, fields)
    except Refused as refused:
        return refused.response()
    return web.json_response({"challenge": b64url(digest_of(item, verb, adjust_text, reason))})


def own_assertion(
    fields: Mapping[str, Any], session: Session, state: InboxState, unsigned: str
) -> ApproverAssertion:
    """The posted ``assertion``, parsed, once its credential is one of the session
    identity's; else Refused 400 ``invalid_assertion`` (malformed, or none: ``unsigned``
    says what to do) or 403 ``wrong_credential``."""
    try:
        parsed = parse_approver_assertion(fields.get("assertion"))
    except ProtocolError as exc:
        raise Refused(400, "invalid_assertion", "The passkey's answer is malformed.") from exc
    if parsed is None:
        raise Refused(400, "invalid_assertion", unsigned)
    own = {c.credential_id for c in state.credentials.of_identity(session.identity)}
    if parsed.credential_id_b64 not in own:
        raise Refused(403, "wrong_credential", "Sign with your own passkey.")
    return parsed


def decision_body(item: Item, record: DecisionRecord, assertion: dict[str, Any]) -> dict[str, Any]:
    """The hitl/v0 decision (docs/protocol.md "Decision") ``record`` stands for (its verb,
    approver identity, reason, adjust text and ``decided_at``) on the stored dispatch, signed
    by ``assertion``; ``approver.channel`` is ``inbox``."""
    return {
        "protocol": PROTOCOL,
        "approval_id": item.approval_id,
        "nonce": item.nonce,
        "decision": record.decision,
        "payload_hash": item.payload_hash,
        "approver": {"id": record.identity, "channel": "inbox"},
        "adjust_text": record.sent,
        "reason": record.reason,
        "decided_at": rfc3339_ms(record.decided_at),
        "approver_assertion": assertion,
    }


async def decide(request: web.Request) -> web.Response:
    """POST ``/items/{id}/decide`` (JSON: the form's fields + ``assertion``): the checks of
    ``challenge``, the assertion's credential one of the session identity's (else 403
    ``wrong_credential``), not recorded already for this identity (409 ``already_decided``;
    a row the gate's answer never reached does not count: the gate itself says);
    then a row (status 0; the reason kept as posted: shown to the approver, never logged),
    the post to the dispatch's callback, the row updated with the gate's answer; 200
    ``{"location": "/decisions/<n>"}``. 502 ``gate_unreachable`` when the gate could not be
    reached (the row keeps status 0, its answer says so)."""
    session, item, fields = await checked_request(request)
    state = state_of(request)
    try:
        verb, adjust_text, reason = verb_fields(item, fields)
        own_assertion(fields, session, state, "Sign the decision with your passkey.")
        mine = await state.db.decisions_of(session.identity, limit=500)
        same = (d for d in mine if (d.approval_id, d.revision) == (item.approval_id, item.revision))
        if any(200 <= d.status < 300 for d in same):
            raise Refused(409, "already_decided", "You already decided this item.")
    except Refused as refused:
        return refused.response()
    now = state.now_ms()
    record = DecisionRecord(
        item.approval_id, item.revision, session.identity, verb, 0, {}, now, reason, adjust_text
    )
    body = decision_body(item, record, fields["assertion"])
    number, answered = await send_recorded(state, item, record, body)
    if answered is None:
        await state.db.set_decision_answer(number, 0, {"error": "gate_unreachable"})
        return auth.refusal(
            502,
            "gate_unreachable",
            "The gate could not be reached: your decision was not recorded. Try again.",
        )
    log.info(
        "event=inbox_decision approval_id=%s decision=%s status=%d",
        item.approval_id,
        verb,
        answered[0],
    )
    return web.json_response({"location": f"/decisions/{number}"})


async def send_recorded(
    state: InboxState,
    item: Item,
    record: DecisionRecord,
    body: dict[str, Any],
    batch_id: str | None = None,
    number: int | None = None,
) -> tuple[int, tuple[int, dict[str, Any]] | None]:
    """The one signed send of a decision or an answer: ``record`` kept first (status 0; one
    of batch ``batch_id`` when given; row ``number`` when kept already, ``db.add_batch``:
    marked sent), then ``body`` posted to ``item``'s callback signed
    with the current relay secret (``gate_client.post_decision``; the gate's status counted
    by ``record.decision``, an unreachable gate as a gate error), then the gate's answer on
    the row; a 404 ``unknown_approval`` (the gate restored from an older backup) closes the
    item (``items.UNKNOWN_TO_GATE``).
    Returns the row's number and the gate's ``(status, answer)``, None when the gate could
    not be reached (the row keeps status 0; logged as ``event=inbox_decision_unsent``, an
    answer's as ``event=inbox_answer_unsent``)."""
    if number is None:
        number = await state.db.add_decision(record, batch_id)
    else:
        await state.db.set_decision_answer(number, 0, {})  # sent from now on
    try:
        answered = await post_decision(
            str(item.dispatch["callback"]["url"]), body, state.secrets.relay_secrets[0]
        )
    except GateUnreachable:
        state.metrics.gate_failed("decision")
        event = "answer" if record.decision == "answer" else "decision"
        key = "question_id" if event == "answer" else "approval_id"
        batch = "" if batch_id is None else f" batch_id={batch_id}"
        log.warning("event=inbox_%s_unsent %s=%s%s", event, key, item.approval_id, batch)
        return number, None
    state.metrics.gate_answered(record.decision, answered[0])
    await state.db.set_decision_answer(number, *answered)
    if answered[0] == 404 and gate_code(answered[1]) == "unknown_approval":
        # the gate lost the request (a restore): nothing can be decided on it any more
        await state.db.close_item(item.approval_id, UNKNOWN_TO_GATE)
    return number, answered


def add_routes(app: web.Application) -> None:
    """POST ``/items/{id}/challenge`` and ``/items/{id}/decide``."""
    app.router.add_post("/items/{id}/challenge", challenge)
    app.router.add_post("/items/{id}/decide", decide)
