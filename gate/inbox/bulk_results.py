"""The page of one bulk approval's results (``GET /bulk/{n}``): each item with the
gate's answer in words, named as the waiting list names it (pipeline · step, the draft's
first line, when it was requested and its run id), so items of one step are told apart."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gate.inbox import auth
from gate.inbox.bulk import title_of
from gate.inbox.listing import decided_facts
from gate.inbox.model import DecisionRecord, Item
from gate.inbox.pages import item_url, render
from gate.inbox.state import state_of
from gate.inbox.words import answer_words, bulk_heading


def result_row(record: DecisionRecord, item: Item | None) -> dict[str, Any]:
    """One line of the results: ``title`` (``title_of``; the approval id when the inbox no
    longer has the item), the item named by ``listing.decided_facts`` (first line, when it
    was requested, run id, the revision decided and ``changed_to``), the answer's ``kind``
    and ``sentence`` (``words.answer_words``) and the item's ``url``."""
    kind, sentence = answer_words(record.status, record.answer)
    return {
        "title": title_of(item) if item is not None else record.approval_id,
        **decided_facts(record, item),
        "kind": kind,
        "sentence": sentence,
        "url": item_url(record.approval_id),
    }


async def results(request: web.Request) -> web.Response:
    """GET ``/bulk/{n}``: each item of the session's own bulk approval ``n`` with the gate's
    answer in words (404 for another identity's or an unknown one)."""
    session = await auth.require_session(request)
    state = state_of(request)
    records = await state.db.batch(request.match_info["n"])
    if not records or any(r.identity != session.identity for r in records):
        raise web.HTTPNotFound(text="no such batch", content_type="text/plain")
    rows = [
        result_row(record, await state.db.item(record.approval_id, state.now_ms()))
        for record in records
    ]
    heading = bulk_heading([str(r["kind"]) for r in rows])
    return render(request, "bulk.html", {"rows": rows, "heading": heading, "session": session})


def add_routes(app: web.Application) -> None:
    """GET ``/bulk/{n}``."""
    app.router.add_get("/bulk/{n}", results)
