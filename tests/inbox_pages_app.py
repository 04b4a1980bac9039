"""A tiny aiohttp app built from ``gate.inbox.pages`` with hostile item data: what
the page tests and the real-browser test serve. The real templates, static assets and
security headers; the data is made here (no inbox database, no gate)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from aiohttp import web

from gate.inbox import pages
from gate.inbox.model import DecisionRecord, Item, Session

NOW_MS = 1_800_000_000_000
PWN = "window.__pwned=1"
HOSTILE_TEXT = (
    f"<script>{PWN}</script>\n"
    f'<img src=x onerror="{PWN}">\n'
    "Pay 12 EUR to \u202eRUE 00021\u202c ACME\u200b Ltd\r\x1b[2K\n"
    '"><svg onload=alert(1)>\n'
)
FILLER_LINE = "Line of the long draft: 0123456789 abcdefghijklmnopqrstuvwxyz <&> ÄÖÜ\n"
END = "END-OF-DRAFT-7f3a"
BIG_BODY = HOSTILE_TEXT + FILLER_LINE * (200 * 1024 // len(FILLER_LINE) + 1) + END
HIDDEN_IN_BIG = 5  # U+202E, U+202C, U+200B, U+000D, U+001B
MARKDOWN = (
    "# Refund for order 4411\n\n"
    'Dear customer, <b onclick="window.__pwned=1">we refund</b> **12 EUR**.\n\n'
    "[Open your account](javascript:window.__pwned=1) or see [our terms](https://example.com/t).\n\n"
    "![tracking pixel](https://evil.example/p.png)\n\n"
    "<script>window.__pwned=1</script>\n\n"
    "Amount: 12\u200b EUR\n"
)
PREVIOUS_MARKDOWN = MARKDOWN.replace("**12 EUR**", "**1200 EUR**").replace(
    "Amount: 12\u200b", "Amount: 1200"
)
SESSION = Session(
    identity="alice@example.com",
    operator_id=101,
    credential_id="cred-1",
    csrf="csrf-token-0123456789abcdef",
    created_at=NOW_MS - 60_000,
    expires_at=NOW_MS + 3_600_000,
)
FORM_QUESTION = {
    "text": "Which refund should we send?\n<script>window.__pwned=1</script>",
    "reason": "The invoice and the ticket \u202edisagree\u202c.",
    "response_type": "form",
    "schema": {
        "type": "object",
        "properties": {
            "amount": {"type": "number", "title": "Amount (EUR)", "minimum": 0, "maximum": 100},
            "count": {"type": "integer", "title": "Parcels", "minimum": 1, "maximum": 9},
            "email": {
                "type": "string",
                "format": "email",
                "title": "Customer e-mail",
                "maxLength": 200,
            },
            "note": {
                "type": "string",
                "title": "Note",
                "description": "Shown to the customer",
                "minLength": 2,
                "maxLength": 500,
            },
            "urgent": {"type": "boolean", "title": "Urgent", "default": True},
            "channel": {
                "type": "string",
                "title": "Channel",
                "enum": ["mail", "sms"],
                "enumNames": ["E-mail", "Text message"],
            },
            "tags": {
                "type": "array",
                "title": "Tags",
                "items": {"type": "string", "enum": ["vip", "repeat"]},
                "maxItems": 2,
            },
        },
        "required": ["amount", "email", "channel"],
    },
}


def make_item(approval_id: str, **changes: Any) -> Item:
    """A pending approval with plain defaults, then ``changes``."""
    item = Item(
        approval_id=approval_id,
        kind="approval",
        pipeline="billing",
        step="refund",
        risk="normal",
        revision=1,
        nonce="n-" + approval_id,
        payload_hash="sha256:" + "0" * 64,
        content_type="text/plain",
        body="Refund 12 EUR to ACME Ltd.",
        approvers=("alice@example.com", "bob@example.com"),
        quorum_required=2,
        quorum_collected=1,
        expires_at=NOW_MS + 45 * 60_000,
        received_at=NOW_MS - 60_000,
        state="pending",
        updated_seq=1,
        dispatch={},
        budget={"unit": "EUR", "spent_today": 4.12, "cap_today": 20.0, "this_request": 12},
    )
    return replace(item, **changes)


ITEMS = {
    "hostile": make_item(
        "hostile",
        pipeline="pay<b>outs</b>\u202e",
        risk="high",
        body=BIG_BODY,
        skip_reason_required=True,
        expires_at=NOW_MS + 10 * 60_000,
    ),
    "diff": make_item(
        "diff",
        step="customer-mail",
        content_type="text/markdown",
        body=MARKDOWN,
        previous_body=PREVIOUS_MARKDOWN,
        revision=2,
        expires_at=NOW_MS + 3 * 3_600_000,
    ),
    "question": make_item(
        "question",
        kind="question",
        step="ask-refund",
        body="",
        dispatch={"question": FORM_QUESTION, "requested_by": "dave@example.com"},
        quorum_required=1,
        quorum_collected=0,
        budget=None,
        expires_at=NOW_MS + 30 * 60_000,
    ),
}
PLAIN = {
    "plain-a": make_item(
        "plain-a",
        body="\n  Refund 12 EUR to ACME Ltd for order 4411.\nSecond line.",
        dispatch={"run_id": "run-7", "issued_at": "2026-08-02T09:14:22Z", "requested_by": "carol"},
    ),
    "plain-b": make_item("plain-b", body="Refund 99 EUR to Globex for order 9999."),
    "plain-wide": make_item("plain-wide", body="Refund 99 EUR to Globex for order " + "9" * 90),
}
REFERENCES = {
    "refs": make_item(
        "refs",
        step="customer-mail",
        content_type="text/markdown",
        body=(
            "Please [sign in](https://bank.example) to confirm.\n\n"
            '[sign in]: https://evil.example/?q=<script>window.__pwned=1</script> "Bank"\n'
            "[unused]: https://second.example/\u202eexe.txt\n"
        ),
    ),
}  # markdown whose link reference definitions the rendered draft does not show
GATE_RUN = "01J8Z3K4Q5R6S7T8V9W0X1Y2Z3"  # a run id in the gate's own format (a ULID)
DELEGATED = {
    "delegated": make_item(
        "delegated",
        delegates=(("night-shift.delegate.for.the.whole.team@example.com", "bob@example.com"),),
        dispatch={"run_id": GATE_RUN, "issued_at": "2026-08-02T09:14:22Z"},
    ),
}  # a delegate in force and a run id the pipeline may not have given
RECORDS = [
    DecisionRecord(
        "diff",
        1,
        "alice@example.com",
        "adjust",
        200,
        {"status": "recorded", "resolved": False},
        NOW_MS - 120_000,
    ),
    DecisionRecord(
        "old",
        1,
        "alice@example.com",
        "approve",
        409,
        {"status": "conflict", "reason": "superseded"},
        NOW_MS - 60_000,
    ),
]


async def _waiting(request: web.Request) -> web.Response:
    items = [] if request.query.get("empty") else list(ITEMS.values())
    if request.query.get("bulk"):
        items += list(PLAIN.values())
    return pages.waiting_page(request, items=items, session=SESSION, now_ms=NOW_MS, seq=7)


async def _item(request: web.Request) -> web.Response:
    found = request.match_info["id"]
    item = ITEMS.get(found) or PLAIN.get(found) or REFERENCES.get(found) or DELEGATED.get(found)
    if item is None:
        raise web.HTTPNotFound()
    if "closed" in request.query:  # e.g. ?closed=cancelled: the item closed (not expired)
        item = replace(item, state=request.query["closed"])
    if item.kind == "question":
        return pages.question_page(request, item=item, session=SESSION, now_ms=NOW_MS, seq=7)
    challenges = {"approve": "Y2hhbGxlbmdlLWFwcHJvdmU"}
    return pages.item_page(
        request, item=item, session=SESSION, now_ms=NOW_MS, seq=7, challenges=challenges
    )


async def _recent(request: web.Request) -> web.Response:
    return pages.recent_page(request, decisions=RECORDS, session=SESSION)


async def _message(request: web.Request) -> web.Response:
    return pages.message_page(
        request, record=RECORDS[int(request.query.get("n", "0"))], session=SESSION
    )


async def _signin(request: web.Request) -> web.Response:
    return pages.signin_page(request, challenge="c2lnbi1pbg", csrf="pre-session-csrf")


REFUSAL = "This item changed since you opened it: reload to see revision 3."


async def _challenge(request: web.Request) -> web.Response:
    """Every challenge is refused as the inbox refuses one: JSON with a sentence."""
    body = {"status": "refused", "reason": "changed", "message": REFUSAL}
    return web.json_response(body, status=409)


async def _answer_refused(request: web.Request) -> web.Response:
    """The question form posted: shown again with what was sent and an error (422)."""
    sent = await request.post()
    fields = {key: sent.getall(key) for key in set(sent.keys())}
    return pages.question_page(
        request,
        item=ITEMS["question"],
        session=SESSION,
        now_ms=NOW_MS,
        seq=7,
        error="Amount (EUR) must be at most 100.",
        status=422,
        submitted=fields,
    )


async def _live(request: web.Request) -> web.Response:
    return web.json_response({"seq": 7, "changed": []})


def build_app() -> web.Application:
    """The demo app: ``/``, ``/items/{id}``, ``/recent``, ``/message``, ``/signin``, ``/live``,
    and ``POST /items/{id}/challenge`` (always refused 409 with ``REFUSAL``)."""
    app = web.Application()
    pages.setup_templates(app)
    app.router.add_get("/", _waiting)
    app.router.add_get("/items/{id}", _item)
    app.router.add_get("/recent", _recent)
    app.router.add_get("/message", _message)
    app.router.add_get("/signin", _signin)
    app.router.add_get("/live", _live)
    app.router.add_post("/items/{id}/challenge", _challenge)
    app.router.add_post("/items/question/answer", _answer_refused)
    return app


@contextmanager
def serve_in_thread() -> Iterator[str]:
    """Serve ``build_app()`` on 127.0.0.1:0 from a thread with its own loop; yields the base
    URL (``http://localhost:PORT``: a secure context for WebAuthn) and stops it after."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(build_app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        started.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    started.wait(timeout=30)
    try:
        yield f"http://localhost:{holder['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
