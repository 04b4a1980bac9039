"""The inbox's relay endpoint ``POST /hitl/v0/relay``: the gate's dispatches and
notices arrive here. Each is checked as the reference relay checks it (size, signature,
window, shape: the same answers), kept in the inbox's database, and acked 200
``{"status":"ok"}`` only after its row committed: nothing acked is lost."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gate.inbox.db import InboxDb
from gate.inbox.followups import News
from gate.inbox.items import DispatchRefused, read_dispatch
from gate.protocol.relay_inbound import is_notice, notice_subject
from gate.relay.inbound import open_request

log = logging.getLogger(__name__)

RELAY_PATH = "/hitl/v0/relay"
OK = {"status": "ok"}
CONFLICT = "dispatch_conflict"  # a re-send (same nonce) asking another thing (review rev17a)


@dataclass(frozen=True, slots=True)
class RelayEndpoint:
    """Holds the database, the gate's relay ``secrets`` (current first), the signature
    window ``max_skew`` (seconds) and the clock (``now_s``: unix seconds);
    ``tell(approval_id, dispatch, expires_at_ms, news)`` is called, after the row committed,
    once per ``News`` of a kept dispatch: a NEW item, approvers an escalation added, a new
    reminder (mail; it must not block or raise)."""

    db: InboxDb
    secrets: tuple[str, ...] = field(repr=False)
    max_skew: float
    now_s: Callable[[], float] = time.time
    tell: Callable[[str, dict[str, Any], int, News], None] | None = None

    async def receive(self, request: web.Request) -> web.Response:
        """Check a dispatch or notice and keep it. Answers: 413 ``body_too_large``; 401
        ``unauthorized`` with the signature's reason (SPEC §2 checks 2-4, as the reference
        relay answers); 400 ``invalid`` (no JSON object, not hitl/v0: ``invalid_protocol``; a
        field missing: ``invalid_dispatch``/``invalid_notice`` naming it; a draft that does
        not hash to ``payload_hash``); 409 ``dispatch_conflict`` (a re-send with the nonce
        kept but another revision, hash, draft or question: nothing changes); 200
        ``{"status":"ok"}`` once committed."""
        opened = await open_request(request, self.secrets, self.now_s, self.max_skew, log)
        if isinstance(opened, web.Response):
            return opened
        raw, envelope = opened
        if is_notice(envelope):
            return await self._notice(envelope)
        try:
            incoming = read_dispatch(envelope)
        except DispatchRefused as exc:
            log.warning("event=dispatch_refused reason=%s field=%s", exc.reason, exc.field)
            return web.json_response(exc.body(), status=400)
        text = raw.decode("utf-8-sig")  # decode_json took it: UTF-8 (a BOM is no content)
        now_ms = int(self.now_s() * 1000)
        what, news = await self.db.receive(incoming, text, now_ms)
        if what == "conflict":
            log.warning(
                "event=dispatch_conflict approval_id=%s revision=%d payload_hash=%s",
                incoming.approval_id,
                incoming.revision,
                incoming.payload_hash,
            )
            return web.json_response({"status": "invalid", "reason": CONFLICT}, status=409)
        log.info(
            "event=dispatch_kept %s=%s kind=%s revision=%d change=%s payload_hash=%s",
            "question_id" if incoming.kind == "question" else "approval_id",
            incoming.approval_id,
            incoming.kind,
            incoming.revision,
            what,
            incoming.payload_hash,
        )
        if self.tell is not None:
            for told in news:
                self.tell(incoming.approval_id, envelope, incoming.expires_at, told)
        return web.json_response(OK, status=200)

    async def _notice(self, notice: dict[str, Any]) -> web.Response:
        """A resolution notice (docs/protocol.md "Notices"; a question's names its
        ``question_id``) closes the item with its ``outcome``; 400 ``invalid_notice`` without
        them. One for an item the inbox does not hold is acked too (nothing to close)."""
        read = notice_subject(notice)
        if read is None:
            log.warning("event=notice_refused reason=invalid_notice")
            return web.json_response({"status": "invalid", "reason": "invalid_notice"}, status=400)
        key, subject, outcome = read
        closed = await self.db.close_item(subject, outcome)
        log.info(
            "event=notice_kept %s=%s outcome=%s closed=%s",
            key,
            subject,
            outcome if outcome.isascii() and outcome.isprintable() else "?",
            str(closed).lower(),
        )
        return web.json_response(OK, status=200)
