"""The inbox's operator endpoints, as the gate has them: ``GET /healthz`` (no sign-in; the
database readable and the gate answering) and ``GET /metrics`` (Prometheus text behind the
metrics token, ``metrics_token_env``; 404 ``metrics_off`` without one)."""

from __future__ import annotations

import logging
import math

from aiohttp import web

from gate.inbox.auth import refusal
from gate.inbox.schema import MIGRATIONS
from gate.inbox.state import state_of
from gate.protocol.bearer import bearer_problem

log = logging.getLogger(__name__)

UNAUTHORIZED = {
    "token_missing": "Authorization: Bearer <token> is required.",
    "token_invalid": "The metrics token is not valid.",
}


async def healthz(request: web.Request) -> web.Response:
    """GET ``/healthz``: 200 ``{"status": "ok", "schema_version": N}`` when the database
    answers a read and the gate answered the credentials request within the last 5 s (asked
    again when older); else 503 ``{"status": "unavailable", "reason", "message"}`` with
    ``database_unavailable``, ``schema_too_new`` (a newer inbox migrated the database under
    this one), ``gate_unreachable`` (no answer, or a 5xx) or ``gate_refused`` (another
    answer: a wrong secret, the credentials channel off). Nothing else: no identity, no
    item, no secret."""
    state = state_of(request)
    try:
        version, _ = await state.db.health(state.now_ms())
    except OSError as exc:
        log.warning('event=inbox_health_failed reason=database_unavailable why="%s"', exc)
        return refusal(503, "database_unavailable", str(exc), "unavailable")
    if version > len(MIGRATIONS):  # a newer inbox migrated it under this one
        return refusal(
            503,
            "schema_too_new",
            f"The database's schema is version {version}; this inbox knows up to"
            f" {len(MIGRATIONS)} (a newer hitl-inbox migrated it: replace this inbox by the"
            " newer version).",
            "unavailable",
        )
    failure = await state.credentials.reachability()
    if failure is not None:
        return refusal(503, *failure, "unavailable")
    return web.json_response({"status": "ok", "schema_version": version})


async def metrics(request: web.Request) -> web.Response:
    """GET ``/metrics``: the ``InboxMetrics`` in Prometheus text with ``Authorization: Bearer
    <metrics token>`` (401 ``token_missing``/``token_invalid`` otherwise); 404 ``metrics_off``
    when the config names no token. A database that cannot be read leaves the waiting gauge
    NaN in that scrape (the counters still answer)."""
    state = state_of(request)
    token = state.secrets.metrics_token
    if token is None:
        return refusal(
            404,
            "metrics_off",
            "Metrics are off: set metrics_token_env in the inbox's config to the variable"
            " that holds their token.",
        )
    problem = bearer_problem(request.headers.get("Authorization", ""), token)
    if problem is not None:
        return refusal(401, problem, UNAUTHORIZED[problem])
    waiting: float
    try:
        _, waiting = await state.db.health(state.now_ms())
    except OSError:
        waiting = math.nan
    body, content_type = state.metrics.render(waiting)
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_routes(app: web.Application) -> None:
    """GET ``/healthz`` and ``/metrics``."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
