"""The pipeline API's question routes: POST/GET /v1/questions, GET
/v1/questions/{id}[?wait=], POST /v1/questions/{id}/cancel and /revise. Thin handlers: read,
bound, one service call, ``json_response``."""

from __future__ import annotations

from aiohttp import web

from gate.core.requests.fields import check_idempotency_key
from gate.protocol.envelope import decode_text_json
from gate.web.api import METRICS, SERVICE, SETTINGS
from gate.web.common import read_body
from gate.web.queries import list_query, wait_seconds


def _body_limit(request: web.Request) -> int:

    # the text's JSON escaping can grow it up to 6x; the text itself is checked by the service
    return request.app[SETTINGS].max_draft_bytes * 6 + 64 * 1024


async def create_question(request: web.Request) -> web.Response:
    """POST /v1/questions: 201 new question, 200 same Idempotency-Key and body."""

    raw = await read_body(request, _body_limit(request), "question_too_large")
    body = decode_text_json(raw)
    key = check_idempotency_key(request.headers.get("Idempotency-Key"))
    view, created = await request.app[SERVICE].questions.create(body, key)
    if created:
        request.app[METRICS].question_created(view["pipeline"], view["step"])
    return web.json_response(view, status=201 if created else 200)


async def get_question(request: web.Request) -> web.Response:
    """GET /v1/questions/{id}[?wait=SECONDS]: long-polls up to 300 s for the resolution."""
    service = request.app[SERVICE]
    question_id = request.match_info["question_id"]
    seconds = wait_seconds(request.query)
    if seconds is None:
        return web.json_response(await service.questions.get(question_id))
    return web.json_response(await service.questions.wait(question_id, seconds))


async def list_questions(request: web.Request) -> web.Response:
    """GET /v1/questions?state=&pipeline=&limit=&cursor= -> ``{items, next_cursor}``."""
    q = list_query(request.query, "a question_id")
    result = await request.app[SERVICE].questions.list(q.state, q.pipeline, q.limit, q.cursor)
    return web.json_response(result)


async def cancel_question(request: web.Request) -> web.Response:
    """POST /v1/questions/{id}/cancel: resolve ``cancelled``; 409 when already resolved."""

    view = await request.app[SERVICE].questions.cancel(request.match_info["question_id"])
    request.app[METRICS].question_resolved("cancelled")
    return web.json_response(view)


async def revise_question(request: web.Request) -> web.Response:
    """POST /v1/questions/{id}/revise: version n+1 of a pending question, dispatched again."""

    raw = await read_body(request, _body_limit(request), "question_too_large")
    view = await request.app[SERVICE].questions.revise(
        request.match_info["question_id"], decode_text_json(raw)
    )
    return web.json_response(view)


def add_question_routes(app: web.Application) -> None:
    """Register the question routes on the pipeline API ``app`` (``create_api_app``)."""
    app.router.add_post("/v1/questions", create_question)
    app.router.add_get("/v1/questions", list_questions)
    app.router.add_get("/v1/questions/{question_id}", get_question)
    app.router.add_post("/v1/questions/{question_id}/cancel", cancel_question)
    app.router.add_post("/v1/questions/{question_id}/revise", revise_question)
