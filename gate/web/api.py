"""The pipeline API listener (SPEC §3): its app factory, bearer auth, healthz and metrics; the
routes of each kind of request (``requests``) and the admin routes (``admin``) register on it."""

from __future__ import annotations

from aiohttp import web

from gate.core.service import GateService
from gate.errors import GateError, NotFound
from gate.metrics import Metrics
from gate.protocol.bearer import bearer_problem
from gate.web.admin import add_admin_routes
from gate.web.common import Handler, api_error_middleware
from gate.web.keys import METRICS, SERVICE, SETTINGS, ApiSettings
from gate.web.requests import add_request_routes

OPEN_PATHS = frozenset({"/healthz"})
# the formats ``Metrics.render`` writes
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
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
        raise NotFound("not_found", "no admin API: api.admin_token_env is not set")
    expected = (settings.admin_token if admin else settings.token) or ""
    problem = bearer_problem(request.headers.get("Authorization", ""), expected)
    if problem == "token_missing":
        raise _unauthorized(problem, "Authorization: Bearer <token> is required")
    if problem is not None:
        raise _unauthorized(problem, "the API token is not valid")
    return await handler(request)


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz (no auth): ``{"status": "ok", "schema_version": N}``; 503 if the DB is gone.
    On PostgreSQL also ``"cluster"`` (``GateService.cluster``), and 503 ``clock_skew`` when
    this gate's clock is off the database's."""
    service = request.app[SERVICE]
    version = await service.health()
    body: dict[str, object] = {"status": "ok", "schema_version": version}
    cluster = service.cluster()
    if cluster is not None:
        body["cluster"] = cluster
    return web.json_response(body)


async def get_metrics(request: web.Request) -> web.Response:
    """GET /metrics (bearer token, like /v1): Prometheus text, or OpenMetrics when the
    ``Accept`` header asks for it; pending approvals are read at scrape time."""
    openmetrics_text = wants_openmetrics(request.headers.get("Accept"))
    body = await request.app[METRICS].render(request.app[SERVICE], openmetrics_text)
    content_type = OPENMETRICS_CONTENT_TYPE if openmetrics_text else TEXT_CONTENT_TYPE
    return web.Response(body=body, headers={"Content-Type": content_type})


def wants_openmetrics(accept: str | None) -> bool:
    """True when ``Accept`` lists ``application/openmetrics-text`` (any version, q > 0).

    Deliberately simpler than prometheus_client's ``choose_encoder``, which fails on a
    malformed version parameter: any Accept header gets an answer, never a 500.
    """
    for item in (accept or "").split(","):
        media, *params = (part.strip() for part in item.split(";"))
        if media.lower() != "application/openmetrics-text":
            continue
        q = next((p.partition("=")[2] for p in params if p.lower().startswith("q=")), "1")
        try:
            if float(q) > 0:
                return True
        except ValueError:
            return True
    return False


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
    add_request_routes(app)  # approvals and questions
    add_admin_routes(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", get_metrics)
    return app
