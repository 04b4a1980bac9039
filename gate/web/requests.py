"""The pipeline API's request routes, one family registered per kind of request (SPEC §3):
``POST``/``GET /v1/<kind>s``, ``GET /v1/<kind>s/{id}[?wait=]``, ``POST
/v1/<kind>s/{id}/cancel`` and, for a kind that has it, ``/revise``. Thin handlers: read,
bound, one service call, ``json_response``. What differs between approvals and questions (their
words and the service calls) is one row each of ``KINDS``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gate.core.requests import check_idempotency_key, parse_create
from gate.core.service import GateService
from gate.errors import GateError
from gate.protocol.envelope import decode_text_json
from gate.web.common import read_body
from gate.web.keys import METRICS, SERVICE, SETTINGS, ApiSettings
from gate.web.queries import list_query, wait_seconds

View = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of request as the pipeline API serves it. ``name`` is the kind's word
    (``/v1/<name>s``, ``<name>_id``, the ``kind`` of ``Metrics.created``/``resolved``);
    ``cursor_names`` what a list cursor is in a message; ``too_large`` the reason code of a
    body over ``ApiSettings.body_limit``. The rest are its ``GateService`` calls (unbound:
    the service is the first argument); ``revise`` None: the kind has no ``/revise``."""

    name: str
    cursor_names: str
    too_large: str
    create: Callable[[GateService, ApiSettings, Any, str | None], Awaitable[tuple[View, bool]]]
    get: Callable[[GateService, str], Awaitable[View]]
    wait: Callable[[GateService, str, float], Awaitable[View]]
    list: Callable[[GateService, str, str | None, int, str | None], Awaitable[View]]
    cancel: Callable[[GateService, str], Awaitable[View]]
    revise: Callable[[GateService, str, Any], Awaitable[View]] | None = None

    @property
    def path(self) -> str:
        """The collection's path, e.g. ``/v1/approvals``."""
        return f"/v1/{self.name}s"

    @property
    def id_name(self) -> str:
        """The path parameter of one item, e.g. ``approval_id``."""
        return f"{self.name}_id"


async def _create_approval(
    service: GateService, settings: ApiSettings, body: Any, key: str | None
) -> tuple[View, bool]:
    """Parse an approval request, bound its draft (413 ``draft_too_large`` over
    ``max_draft_bytes``), check the Idempotency-Key, then ``GateService.create``."""
    req = parse_create(body)
    if req.draft_bytes() > settings.max_draft_bytes:
        raise GateError(
            "draft_too_large",
            f"draft.body is larger than {settings.max_draft_bytes} bytes",
            status=413,
            kind="invalid",
        )
    return await service.create(req, check_idempotency_key(key))


async def _create_question(
    service: GateService, settings: ApiSettings, body: Any, key: str | None
) -> tuple[View, bool]:
    """Check the Idempotency-Key, then ``GateService.create_question`` (which parses and
    bounds the question against its step)."""
    return await service.create_question(body, check_idempotency_key(key))


KINDS = (
    Kind(
        "approval",
        "an approval_id",
        "draft_too_large",
        create=_create_approval,
        get=GateService.get,
        wait=GateService.wait,
        list=GateService.list,
        cancel=GateService.cancel,
    ),
    Kind(
        "question",
        "a question_id",
        "question_too_large",
        create=_create_question,
        get=GateService.get_question,
        wait=GateService.wait_question,
        list=GateService.list_questions,
        cancel=GateService.cancel_question,
        revise=GateService.revise_question,
    ),
)


class RequestRoutes:
    """The handlers of one ``Kind``'s routes (``add_request_routes`` registers them)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind

    async def create(self, request: web.Request) -> web.Response:
        """POST /v1/<kind>s: 201 a new one, 200 the same Idempotency-Key and body (SPEC §3).
        Counts a creation, and the resolution of one a policy decided at once."""
        settings = request.app[SETTINGS]
        raw = await read_body(request, settings.body_limit(), self.kind.too_large)
        header = request.headers.get("Idempotency-Key")
        view, created = await self.kind.create(
            request.app[SERVICE], settings, decode_text_json(raw), header
        )
        if created:
            metrics = request.app[METRICS]
            metrics.created(self.kind.name, view["pipeline"], view["step"])
            if view["state"] == "resolved":
                metrics.resolved(self.kind.name, view["outcome"])
        return web.json_response(view, status=201 if created else 200)

    async def get(self, request: web.Request) -> web.Response:
        """GET /v1/<kind>s/{id}[?wait=SECONDS]: long-polls up to 300 s for the resolution."""
        service = request.app[SERVICE]
        item_id = request.match_info[self.kind.id_name]
        seconds = wait_seconds(request.query)
        if seconds is None:
            return web.json_response(await self.kind.get(service, item_id))
        return web.json_response(await self.kind.wait(service, item_id, seconds))

    async def list(self, request: web.Request) -> web.Response:
        """GET /v1/<kind>s?state=&pipeline=&limit=&cursor= -> ``{items, next_cursor}``."""
        q = list_query(request.query, self.kind.cursor_names)
        page = await self.kind.list(request.app[SERVICE], q.state, q.pipeline, q.limit, q.cursor)
        return web.json_response(page)

    async def cancel(self, request: web.Request) -> web.Response:
        """POST /v1/<kind>s/{id}/cancel: resolve ``cancelled``; 409 when already resolved."""
        item_id = request.match_info[self.kind.id_name]
        view = await self.kind.cancel(request.app[SERVICE], item_id)
        request.app[METRICS].resolved(self.kind.name, "cancelled")
        return web.json_response(view)

    async def revise(self, request: web.Request) -> web.Response:
        """POST /v1/<kind>s/{id}/revise: version n+1 of a pending one, dispatched again."""
        assert self.kind.revise is not None  # registered only for a kind that has it
        raw = await read_body(request, request.app[SETTINGS].body_limit(), self.kind.too_large)
        item_id = request.match_info[self.kind.id_name]
        view = await self.kind.revise(request.app[SERVICE], item_id, decode_text_json(raw))
        return web.json_response(view)


def add_request_routes(app: web.Application) -> None:
    """Register each kind's route family on the pipeline API ``app`` (``create_api_app``)."""
    for kind in KINDS:
        routes = RequestRoutes(kind)
        item = f"{kind.path}/{{{kind.id_name}}}"
        app.router.add_post(kind.path, routes.create)
        app.router.add_get(kind.path, routes.list)
        app.router.add_get(item, routes.get)
        app.router.add_post(f"{item}/cancel", routes.cancel)
        if kind.revise is not None:
            app.router.add_post(f"{item}/revise", routes.revise)
