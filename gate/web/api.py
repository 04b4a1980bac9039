"""The pipeline API listener (SPEC §3): create, get, long-poll, list, cancel, healthz, metrics."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gate.core.approvals.create import parse_create
from gate.core.requests.fields import check_idempotency_key
from gate.core.service import GateService
from gate.errors import GateError
from gate.metrics import Metrics
from gate.protocol.bearer import bearer_problem
from gate.protocol.envelope import decode_text_json
from gate.web.common import Handler, api_error_middleware, read_body
from gate.web.queries import list_query, wait_seconds


@dataclass(slots=True)
class ApiSettings:
    """The bearer token pipelines present and the largest draft body accepted (bytes, UTF-8).

    Mutable: a config reload (SIGHUP) replaces ``token`` (``reconfigure``); each request
    reads it anew.
    """

    token: str
    max_draft_bytes: int
    # the admin token (``api.admin_token_env``): the only key to ``/v1/admin/``;
    # None: those routes answer 404
    admin_token: str | None = None

    def reconfigure(self, token: str, admin_token: str | None = None) -> None:
        """Accept ``token`` (and ``admin_token`` on the admin routes) from the next request
        on (SIGHUP reload); the draft limit needs a restart."""
        self.token = token
        self.admin_token = admin_token


SERVICE = web.AppKey("service", GateService)
SETTINGS = web.AppKey("api_settings", ApiSettings)
METRICS = web.AppKey("metrics", Metrics)
OPEN_PATHS = frozenset({"/healthz"})
ADMIN_PREFIX = "/v1/admin/"  # only the admin token opens these, never the pipeline's


def _unauthorized(reason: str, message: str) -> GateError:
    return GateError(reason, message, status=401, kind="unauthorized")


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Require ``Authorization: Bearer <token>`` (constant-time compare) except on /healthz:
    the pipeline token, or under ``/v1/admin/`` the admin token (two disjoint
    tokens; without an admin token configured those routes answer 404)."""
    if request.path in OPEN_PATHS:
        return await handler(request)
    settings = request.app[SETTINGS]
    admin = request.path.startswith(ADMIN_PREFIX)
    if admin and settings.admin_token is None:
        raise GateError(
            "not_found",
            "no admin API: api.admin_token_env is not set",
            status=404,
            kind="not_found",
        )
    expected = (settings.admin_token if admin else settings.token) or ""
    problem = bearer_problem(request.headers.get("Authorization", ""), expected)
    if problem == "token_missing":
        raise _unauthorized(problem, "Authorization: Bearer <token> is required")
    if problem is not None:
        raise _unauthorized(problem, "the API token is not valid")
    return await handler(request)


async def create_approval(request: web.Request) -> web.Response:
    """POST /v1/approvals: 201 new approval, 200 same Idempotency-Key and body (SPEC §3)."""
    settings = request.app[SETTINGS]
    # a draft's JSON escaping can grow it up to 6x (\uXXXX); the draft itself is checked below
    raw = await read_body(request, settings.max_draft_bytes * 6 + 64 * 1024, "draft_too_large")
    req = parse_create(decode_text_json(raw))
    if req.draft_bytes() > settings.max_draft_bytes:
        raise GateError(
            "draft_too_large",
            f"draft.body is larger than {settings.max_draft_bytes} bytes",
            status=413,
            kind="invalid",
        )
    key = check_idempotency_key(request.headers.get("Idempotency-Key"))
    view, created = await request.app[SERVICE].approvals.create(req, key)
    if created:
        request.app[METRICS].approvals_created.labels(req.pipeline, req.step).inc()
        if view["state"] == "resolved":  # a policy decided it at once
            request.app[METRICS].resolved(view["outcome"])
    return web.json_response(view, status=201 if created else 200)


async def get_approval(request: web.Request) -> web.Response:
    """GET /v1/approvals/{id}[?wait=SECONDS]: long-polls up to 300 s for the resolution."""
    service = request.app[SERVICE]
    approval_id = request.match_info["approval_id"]
    seconds = wait_seconds(request.query)
    if seconds is None:
        return web.json_response(await service.approvals.get(approval_id))
    return web.json_response(await service.approvals.wait(approval_id, seconds))


async def list_approvals(request: web.Request) -> web.Response:
    """GET /v1/approvals?state=&pipeline=&limit=&cursor= -> ``{items, next_cursor}``."""
    q = list_query(request.query, "an approval_id")
    result = await request.app[SERVICE].approvals.list(q.state, q.pipeline, q.limit, q.cursor)
    return web.json_response(result)


async def cancel_approval(request: web.Request) -> web.Response:
    """POST /v1/approvals/{id}/cancel: resolve ``cancelled``; 409 when already resolved."""
    view = await request.app[SERVICE].approvals.cancel(request.match_info["approval_id"])
    request.app[METRICS].resolved("cancelled")
    return web.json_response(view)


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz (no auth): ``{"status": "ok", "schema_version": N}``; 503 if the DB is gone."""
    version = await request.app[SERVICE].health()
    return web.json_response({"status": "ok", "schema_version": version})


async def get_metrics(request: web.Request) -> web.Response:
    """GET /metrics (bearer token, like /v1): Prometheus text, or OpenMetrics when the
    ``Accept`` header asks for it; pending approvals are read at scrape time."""
    body, content_type = await request.app[METRICS].render(
        request.app[SERVICE], request.headers.get("Accept")
    )
    return web.Response(body=body, headers={"Content-Type": content_type})


def create_api_app(
    service: GateService, settings: ApiSettings, metrics: Metrics
) -> web.Application:
    """Return the pipeline API app with its routes, auth and error middleware.

    ``metrics`` is the gate's one ``Metrics``, the one the callback app, the dispatcher and
    the expiry scheduler count in too (``gate.daemon.app.build_gate`` wires them).
    """
    app = web.Application(
        middlewares=[api_error_middleware, auth_middleware],
        client_max_size=settings.max_draft_bytes * 6 + 128 * 1024,
    )
    app[SERVICE] = service
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app.router.add_post("/v1/approvals", create_approval)
    app.router.add_get("/v1/approvals", list_approvals)
    app.router.add_get("/v1/approvals/{approval_id}", get_approval)
    app.router.add_post("/v1/approvals/{approval_id}/cancel", cancel_approval)
    from gate.web.questions import add_question_routes  # it imports this module's keys

    add_question_routes(app)
    from gate.web.admin import add_admin_routes

    add_admin_routes(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", get_metrics)
    return app
