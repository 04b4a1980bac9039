"""The inbox's aiohttp application: the routes and the GET pages that only read (waiting,
item, recent, a decision's record, live updates). The state every handler shares is
``gate.inbox.state``; sign-in is ``gate.inbox.signin``, decisions ``gate.inbox.decide``; bulk
approval, question answers and monitoring register their own routes (``add_routes``)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from gate.inbox import answers, bulk, bulk_results, decide, monitoring, pages, signin
from gate.inbox import progress as progress_of
from gate.inbox.auth import current_session, refusal, require_session
from gate.inbox.db import DatabaseUnavailable
from gate.inbox.decided import may_decide, my_part
from gate.inbox.relay import RELAY_PATH, RelayEndpoint
from gate.inbox.state import STATE, InboxState, current_seq, decidable, state_of

log = logging.getLogger(__name__)

BUSY = "The inbox cannot use its database right now. Try again in a moment."
RETRY_AFTER_S = 5


async def waiting(request: web.Request) -> web.Response:
    """GET ``/``: the pending items the signed-in approver may decide."""
    session = await require_session(request)
    state = state_of(request)
    items = [i for i in await state.db.items(state.now_ms(), "pending") if may_decide(session, i)]
    seq = await current_seq(state)
    seen, mine = {}, {}
    for i in items:
        seen[i.approval_id] = await state.db.approvers_recorded(i.approval_id, i.revision)
        recorded = await state.db.recorded_on(i.approval_id)
        mine[i.approval_id] = my_part(session.identity, i, recorded)
    return pages.waiting_page(
        request,
        items=items,
        session=session,
        now_ms=state.now_ms(),
        seq=seq,
        approved_by=seen,
        mine=mine,
    )


async def item(request: web.Request) -> web.Response:
    """GET ``/items/{id}``: an approval's or a question's page (404 when not the session's)."""
    session = await require_session(request)
    state = state_of(request)
    found = await decidable(request, session)
    seq = await current_seq(state)
    recorded = await state.db.recorded_on(found.approval_id)
    seen = await state.db.approvers_recorded(found.approval_id, found.revision)
    page = pages.question_page if found.kind == "question" else pages.item_page
    return page(
        request, item=found, session=session, now_ms=state.now_ms(), seq=seq, approved_by=seen,
        recorded=recorded,
    )  # fmt: skip


async def recent(request: web.Request) -> web.Response:
    """GET ``/recent``: the signed-in approver's decisions, newest first."""
    session = await require_session(request)
    state = state_of(request)
    decisions = await state.db.decisions_of(session.identity)
    items = {d.approval_id: await state.db.item(d.approval_id, state.now_ms()) for d in decisions}
    return pages.recent_page(request, decisions=decisions, session=session, items=items)


async def decision(request: web.Request) -> web.Response:
    """GET ``/decisions/{n}``: one of the session's own decision records in words (404
    for another identity's or an unknown number)."""
    session = await require_session(request)
    state = state_of(request)
    try:
        found = await state.db.decision(int(request.match_info["n"]))
    except ValueError:
        found = None
    if found is None or found.identity != session.identity:
        raise web.HTTPNotFound(text="no such decision", content_type="text/plain")
    item = await state.db.item(found.approval_id, state.now_ms())
    progress = None
    if item is not None and item.kind == "approval" and item.revision == found.revision:
        seen = await state.db.approvers_recorded(item.approval_id, item.revision)
        progress = (progress_of.collected(item, seen), item.quorum_required)
    return pages.message_page(request, record=found, session=session, progress=progress, item=item)


async def live(request: web.Request) -> web.Response:
    """GET ``/live?since=SEQ``: ``{"seq": N, "changed": [[approval_id, state], …]}`` for the
    items the session may decide changed after SEQ (401 JSON ``signed_out`` without one).
    With ``&item=ID`` (an open item page) also ``"progress"``: ``progress.progress`` of that
    approval, when the session may decide it (else left out, nothing disclosed)."""
    session = await require_session(request)
    state = state_of(request)
    try:
        since = max(0, int(request.query.get("since", "0")))
    except ValueError:
        since = 0
    changes = await state.db.changes_since(since)
    seq = max((c.updated_seq for c in changes), default=since)
    changed: list[list[str]] = []
    for change in changes:
        found = await state.db.item(change.approval_id, state.now_ms())
        if found is not None and may_decide(session, found):
            changed.append([change.approval_id, found.state])
    body: dict[str, Any] = {"seq": seq, "changed": changed}
    wanted = request.query.get("item")
    if wanted is not None:
        found = await state.db.item(wanted, state.now_ms())
        if found is not None and found.kind == "approval" and may_decide(session, found):
            seen = await state.db.approvers_recorded(found.approval_id, found.revision)
            body["progress"] = progress_of.progress(found, seen)
    return web.json_response(body)


@web.middleware
async def _unavailable(request: web.Request, handler: Any) -> web.StreamResponse:
    """A database that cannot answer (``DatabaseUnavailable``: another inbox on the file held
    its write lock past the busy timeout, a full disk) is 503 in words with ``Retry-After``:
    a page for a GET or HEAD, a JSON refusal ``database_unavailable`` for anything else (the
    relay endpoint's gate sends again); logged with SQLite's reason, never a traceback."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except DatabaseUnavailable as exc:
        log.warning('event=inbox_database_unavailable path=%s why="%s"', request.path, exc)
        if request.method in ("GET", "HEAD"):
            title = "Try again in a moment"
            answer = pages.plain_page(request, title=title, sentence=BUSY, status=503)
        else:
            answer = refusal(503, "database_unavailable", BUSY, "unavailable")
        answer.headers["Retry-After"] = str(RETRY_AFTER_S)
        return answer


@web.middleware
async def _not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    """A 404 or 405 in words (a page), not aiohttp's bare text."""
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except web.HTTPNotFound:
        session = await current_session(request) if STATE in request.app else None
        return pages.plain_page(
            request,
            title="Not found",
            sentence="There is nothing here for you: it may belong to another approver.",
            status=404,
            session=session,
        )
    except web.HTTPMethodNotAllowed as exc:  # review rev17a finding 7: in words, not bare text
        return _wrong_method(request, exc)


def _wrong_method(request: web.Request, exc: web.HTTPMethodNotAllowed) -> web.Response:
    """405 in words: a page for a GET or HEAD, a JSON refusal ``method_not_allowed`` for
    anything else (fetch routes); ``Allow`` kept."""
    sentence = "This address does not answer that kind of request."
    if request.method in ("GET", "HEAD"):
        answer = pages.plain_page(request, title="Not here", sentence=sentence, status=405)
    else:
        answer = refusal(405, "method_not_allowed", sentence)
    answer.headers["Allow"] = ",".join(sorted(exc.allowed_methods))
    return answer


def create_inbox_app(state: InboxState, endpoint: RelayEndpoint) -> web.Application:
    """The inbox's aiohttp app: the relay endpoint (``POST /hitl/v0/relay``), the templates
    and static files, GET ``/``, ``/signin``, ``/items/{id}``, ``/decisions/{n}``,
    ``/recent``, ``/live`` and POST ``/signin``, ``/signout``, ``/items/{id}/challenge``,
    ``/items/{id}/decide``; bulk (``/bulk/*``, its results ``/bulk/{n}``), answers
    (``/items/{id}/answer``) and ``/healthz`` with ``/metrics`` (``monitoring``) are added by
    their modules. An unknown path answers the 404 page."""
    middlewares = [_unavailable, _not_found]
    app = web.Application(client_max_size=8 * 1024 * 1024, middlewares=middlewares)
    app[STATE] = state
    app.router.add_post(RELAY_PATH, endpoint.receive)
    pages.setup_templates(app)
    app.router.add_get("/", waiting)
    app.router.add_get("/items/{id}", item)
    app.router.add_get("/decisions/{n}", decision)
    app.router.add_get("/recent", recent)
    app.router.add_get("/live", live)
    signin.add_routes(app)
    decide.add_routes(app)
    bulk.add_routes(app)
    bulk_results.add_routes(app)
    answers.add_routes(app)
    monitoring.add_routes(app)
    return app
