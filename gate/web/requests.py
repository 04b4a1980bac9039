"""The pipeline API's request routes, one family registered per kind of request (SPEC §3):
``POST``/``GET /v1/<kind>s``, ``GET /v1/<kind>s/{id}[?wait=]``, ``POST
/v1/<kind>s/{id}/cancel`` and, for a kind that has it, ``/revise``. Thin handlers: read,
bound, one service call, ``json_response``. What differs between approvals and questions (their
words, their create, their lifecycle on the service) is one row each of ``KINDS``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gate.core.approvals.create import parse_create
from gate.core.requests.fields import check_idempotency_key
from gate.core.service import GateService
from gate.protocol.envelope import decode_text_json
from gate.web.common import read_body, too_large
from gate.web.keys import METRICS, SERVICE, SETTINGS, ApiSettings
from gate.web.queries import list_query, wait_seconds

if TYPE_CHECKING:
    from gate.core.requests.service import RequestService

View = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of request as the pipeline API serves it: ``name`` its word (``/v1/<name>s``,
    ``<name>_id``, the ``kind`` of ``Metrics.created``/``resolved``), ``cursor_names`` what a
    list cursor is in a message, ``too_large`` the reason code of a body over
    ``ApiSettings.body_limit``, ``create`` its create from the decoded body and the
    Idempotency-Key header, ``requests`` its lifecycle on the service (get, wait, list,
    cancel) and ``revise`` its revise (None: the kind has no ``/revise``)."""

    name: str
    cursor_names: str
    too_large: str
    create: Callable[[GateService, ApiSettings, Any, str | None], Awaitable[tuple[View, bool]]]
    requests: Callable[[GateService], RequestService[Any]]
    revise: Callable[[GateService, str, Any], Awaitable[View]] | None = None


async def _create_approval(
    service: GateService, settings: ApiSettings, body: Any, key: str | None
) -> tuple[View, bool]:
    """Parse an approval request, bound its draft (413 ``draft_too_large`` over
    ``max_draft_bytes``), check the Idempotency-Key, then ``Approvals.create``."""
    req = parse_create(body)
    if req.draft_bytes() > settings.max_draft_bytes:
        raise too_large("draft_too_large", settings.max_draft_bytes, "draft.body")
    return await service.approvals.create(req, check_idempotency_key(key))


async def _create_question(
    service: GateService, settings: ApiSettings, body: Any, key: str | None
) -> tuple[View, bool]:
    """Check the Idempotency-Key, then ``Questions.create`` (which parses and bounds the
    question against its step)."""
    return await service.questions.create(body, check_idempotency_key(key))


async def _revise_question(service: GateService, question_id: str, body: Any) -> View:
    """``Questions.revise``: version n+1 of a pending question from the decoded body."""
    return await service.questions.revise(question_id, body)


KINDS = (
    Kind("approval", "an approval_id", "draft_too_large", _create_approval, lambda s: s.approvals),
    Kind(
        "question",
        "a question_id",
        "question_too_large",
        _create_question,
        lambda s: s.questions,
        revise=_revise_question,
    ),
)


class RequestRoutes:
    """The handlers of one ``Kind``'s routes (``add_request_routes`` registers them)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.id_name = f"{kind.name}_id"  # the path parameter of one, e.g. approval_id

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
        requests = self.kind.requests(request.app[SERVICE])
        item_id = request.match_info[self.id_name]
        seconds = wait_seconds(request.query)
        if seconds is None:
            return web.json_response(await requests.get(item_id))
        return web.json_response(await requests.wait(item_id, seconds))

    async def list(self, request: web.Request) -> web.Response:
        """GET /v1/<kind>s?state=&pipeline=&limit=&cursor= -> ``{items, next_cursor}``."""
        q = list_query(request.query, self.kind.cursor_names)
        requests = self.kind.requests(request.app[SERVICE])
        return web.json_response(await requests.list(q.state, q.pipeline, q.limit, q.cursor))

    async def cancel(self, request: web.Request) -> web.Response:
        """POST /v1/<kind>s/{id}/cancel: resolve ``cancelled``; 409 when already resolved."""
        requests = self.kind.requests(request.app[SERVICE])
        view = await requests.cancel(request.match_info[self.id_name])
        request.app[METRICS].resolved(self.kind.name, "cancelled")
        return web.json_response(view)

    async def revise(self, request: web.Request) -> web.Response:
        """POST /v1/<kind>s/{id}/revise: version n+1 of a pending one, dispatched again."""
        assert self.kind.revise is not None  # registered only for a kind that has it
        raw = await read_body(request, request.app[SETTINGS].body_limit(), self.kind.too_large)
        item_id = request.match_info[self.id_name]
        view = await self.kind.revise(request.app[SERVICE], item_id, decode_text_json(raw))
        return web.json_response(view)


def add_request_routes(app: web.Application) -> None:
    """Register each kind's route family on the pipeline API ``app`` (``create_api_app``)."""
    for kind in KINDS:
        routes = RequestRoutes(kind)
        path = f"/v1/{kind.name}s"
        item = f"{path}/{{{routes.id_name}}}"
        app.router.add_post(path, routes.create)
        app.router.add_get(path, routes.list)
        app.router.add_get(item, routes.get)
        app.router.add_post(f"{item}/cancel", routes.cancel)
        if kind.revise is not None:
            app.router.add_post(f"{item}/revise", routes.revise)
