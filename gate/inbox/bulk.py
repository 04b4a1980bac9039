"""Bulk approve at the inbox: several approvals with one passkey tap, signed as one
batch (docs/protocol.md "Approver signatures"). The waiting page posts one field
``item:<approval_id>`` = the revision SHOWN per ticked item; the inbox answers the batch
challenge (``batch_digest`` of each item's approve ``decision_digest``, from the STORED
dispatches), then posts one decision per item, each with the same assertion and the batch's
hex digests; ``bulk_results`` shows each item's answer in words.

A challenged batch is kept in the inbox database (``gate.inbox.shortlived``) until its
decide, which any replica of the inbox may serve. The pure part (``picks_from``,
``checked_items``, ``batch_of``, ``as_signed``) takes no request; the routes are added by
``add_routes``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from aiohttp import web

from gate.inbox import auth
from gate.inbox.decide import (
    Refused,
    check_open,
    decision_body,
    digest_of,
    own_assertion,
    send_recorded,
)
from gate.inbox.decided import may_decide
from gate.inbox.model import NOT_SENT, DecisionRecord, Item
from gate.inbox.seen import bulk_eligibility
from gate.inbox.shortlived import Picked
from gate.inbox.state import InboxState, state_of
from gate.protocol.approver_signature import b64url, batch_digest
from gate.protocol.numbers import ascii_int

log = logging.getLogger(__name__)

PREFIX = "item:"
MIN_ITEMS = 2
MAX_ITEMS = 50
KEPT_MS = 5 * 60_000  # a challenged batch is kept this long for its decide (in the database)
MAX_KEPT = 1000


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
    posted. Raises ``Refused`` 400 ``invalid_batch`` for a revision that is not a
    positive integer, 422 ``batch_size`` for fewer than ``MIN_ITEMS`` or more than
    ``MAX_ITEMS`` items (said in words)."""
    picks: list[tuple[str, int]] = []
    for name, value in fields.items():
        if not name.startswith(PREFIX):
            continue
        approval_id = name[len(PREFIX) :]
        text = value[0] if isinstance(value, list) and len(value) == 1 else value
        sent = approval_id and isinstance(text, str) and text.isascii()
        revision = ascii_int(text) if sent else None
        if revision is None or revision < 1:
            raise Refused(400, "invalid_batch", "A selected item was not sent as the page does.")
        picks.append((approval_id, revision))
    if not MIN_ITEMS <= len(picks) <= MAX_ITEMS:
        bound = f"at least {MIN_ITEMS}" if len(picks) < MIN_ITEMS else f"at most {MAX_ITEMS}"
        raise Refused(422, "batch_size", f"Select {bound} items to approve them together.")
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
    (``may_decide``), still pending, at the revision shown. Raises ``Refused`` 409 naming
    the first item that is not: ``not_available`` (unknown, a question, or not the session's
    to decide: said alike, its existence is not disclosed), ``not_pending`` ("… is now
    expired"), ``changed`` ("… changed since you opened it: reload to see revision N") or
    ``open_to_review`` (a draft its row cannot show whole, ``seen.bulk_eligibility``:
    bulk approve signs only what the approver saw)."""
    items: list[Item] = []
    for approval_id, revision in picks:
        item = stored.get(approval_id)
        if item is None or item.kind != "approval" or not may_decide(item):
            raise Refused(
                409,
                "not_available",
                f"Item {approval_id} is not waiting for you: reload the list and select again.",
            )
        named = f"{title_of(item)} ({approval_id})"
        check_open(item, "approval", revision, named)
        why = bulk_eligibility(item.body, item.content_type).reason
        if why is not None:
            raise Refused(
                409,
                "open_to_review",
                f"{named} must be opened before it is approved: its draft has {why}.",
            )
        items.append(item)
    return items


def batch_of(items: list[Item]) -> Batch:
    """The batch of checked ``items``: their approve digests and ``batch_digest`` (the
    same item twice is refused 400 ``invalid_batch``)."""
    digests = tuple(digest_of(i, "approve") for i in items)
    try:
        challenge = batch_digest(digests)
    except ValueError as exc:
        raise Refused(400, "invalid_batch", "An item was selected twice.") from exc
    return Batch(tuple(items), digests, tuple(d.hex() for d in digests), challenge)


def batch_key(identity: str, picks: list[tuple[str, int]]) -> str:
    """Where a challenged batch is kept: the SHA-256 hex of the identity and its picks (a
    batch is decided by whom it was challenged for, with the same items ticked)."""
    return hashlib.sha256(json.dumps([identity, picks]).encode("utf-8")).hexdigest()


def signed_items(batch: Batch) -> list[Picked]:
    """What a challenged batch signed, item by item: approval_id, revision, nonce and
    payload_hash (all its approve digests are made of)."""
    return [(i.approval_id, i.revision, i.nonce, i.payload_hash) for i in batch.items]


def as_signed(stored: Mapping[str, Item | None], signed: list[Picked]) -> Batch:
    """The batch that was challenged, from the items as stored now and what was ``signed``
    (each item at the revision, nonce and hash signed, even when it changed since: decide
    posts exactly the digests signed and the gate says what changed)."""
    items = []
    for approval_id, revision, nonce, digest in signed:
        now = stored.get(approval_id)
        if now is None:
            raise Refused(409, "not_available", "An item is no longer waiting for you.")
        items.append(replace(now, revision=revision, nonce=nonce, payload_hash=digest))
    return batch_of(items)


async def _stored(state: InboxState, picks: list[tuple[str, int]]) -> dict[str, Item | None]:
    return {a: await state.db.item(a, state.now_ms()) for a, _ in picks}


async def challenge(request: web.Request) -> web.Response:
    """POST ``/bulk/challenge`` (JSON from inbox.js: the waiting page's form): 2..50 ticked
    approvals the session may decide, each pending at the revision shown -> ``{"challenge":
    b64url(batch_digest)}``; else the refusal in words naming the item (409), 422 for the
    count, 401/403 from ``auth``. Nothing is posted or stored."""
    session = await auth.require_session(request)
    fields = await auth.read_post(request, session)
    state = state_of(request)
    try:
        picks = picks_from(fields)
        items = checked_items(picks, await _stored(state, picks), partial(may_decide, session))
        batch = batch_of(items)
    except Refused as refused:
        return refused.response()
    now = state.now_ms()
    key = batch_key(session.identity, picks)
    await state.shortlived.keep_batch(key, signed_items(batch), now + KEPT_MS, now, MAX_KEPT)
    return web.json_response({"challenge": b64url(batch.challenge)})


async def decide(request: web.Request) -> web.Response:
    """POST ``/bulk/decide`` (JSON: the form's fields + ``assertion``): the batch challenged
    for these items (or, when none is kept, checked again as ``challenge`` checks it), the
    assertion's credential one of the session identity's (else 403 ``wrong_credential``,
    nothing posted); then a row per item, all at once before any post (status 0, the batch's
    id, ``NOT_SENT``: an inbox stopped mid-batch leaves the rest "not sent"); per item the
    row marked sent, the approve posted with
    the same assertion plus ``"batch": [hex digests]``, the row updated with the gate's
    answer (an item resolved elsewhere in between: the gate's answer, in words on the
    results page); 200 ``{"location": "/bulk/<batch id>"}``."""
    session = await auth.require_session(request)
    fields = await auth.read_post(request, session)
    state = state_of(request)
    try:
        picks = picks_from(fields)
        key = batch_key(session.identity, picks)
        signed = await state.shortlived.take_batch(key, state.now_ms())
        stored = await _stored(state, picks)
        if signed is None:
            batch = batch_of(checked_items(picks, stored, partial(may_decide, session)))
        else:
            if any(s is None or not may_decide(session, s) for s in stored.values()):
                raise Refused(409, "not_available", "An item is no longer waiting for you.")
            batch = as_signed(stored, signed)
        unsigned = "Sign the approvals with your passkey."
        assertion = own_assertion(fields, session, state, unsigned).credential_id_b64
    except Refused as refused:
        return refused.response()
    posted = dict(fields["assertion"]) | {"batch": list(batch.hexes)}
    batch_id = secrets.token_urlsafe(12)
    now = state.now_ms()
    records = [
        DecisionRecord(i.approval_id, i.revision, session.identity, "approve", 0, NOT_SENT, now)
        for i in batch.items
    ]
    numbers = await state.db.add_batch(records, batch_id)  # every item ticked, before any post
    for item, record, number in zip(batch.items, records, numbers, strict=True):
        body = decision_body(item, record, posted)
        await send_recorded(state, item, record, body, batch_id, number)
    log.info(
        "event=inbox_bulk batch_id=%s items=%d credential_id=%s",
        batch_id,
        len(batch.items),
        assertion,
    )
    return web.json_response({"location": f"/bulk/{batch_id}"})


def add_routes(app: web.Application) -> None:
    """POST ``/bulk/challenge``, ``/bulk/decide`` (GET ``/bulk/{n}`` is ``bulk_results``)."""
    app.router.add_post("/bulk/challenge", challenge)
    app.router.add_post("/bulk/decide", decide)
