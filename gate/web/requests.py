"""The pipeline API's request routes, one family registered per kind of request (SPEC §3):
``POST``/``GET /v1/<kind>s``, ``GET /v1/<kind>s/{id}[?wait=]``, ``POST
/v1/<kind>s/{id}/cancel`` and, for a kind that has it, ``/revise``. Thin handlers: read,
bound, one service call, ``json_response``. What differs between approvals and questions (their
words, their create and their service calls) is one row each of ``KINDS``."""

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
class Calls:
    """One kind's calls on a ``GateService``: get, wait (the long-poll), list, cancel, and
    revise (None: the kind has no ``/revise``)."""

    get: Callable[[str], Awaitable[View]]
    wait: Callable[[str, float], Awaitable[View]]
    list: Callable[[str, str | None, int, str | None], Awaitable[View]]
    cancel: Callable[[str], Awaitable[View]]
    revise: Callable[[str, Any], Awaitable[View]] | None = None


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of request as the pipeline API serves it: ``name`` its word (``/v1/<name>s``,
    ``<name>_id``, the ``kind`` of ``Metrics.created``/``resolved``), ``cursor_names`` what a
    list cursor is in a message, ``too_large`` the reason code of a body over
    ``ApiSettings.body_limit``, ``create`` its create from the decoded body and the
    Idempotency-Key header, ``calls`` its other calls on the service, and whether it has
    ``/revise`` (``revisable``)."""

    name: str
    cursor_names: str
    too_large: str
    create: Callable[[GateService, ApiSettings, Any, str | None], Awaitable[tuple[View, bool]]]
    calls: Callable[[GateService], Calls]
    revisable: bool = False


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


def _approval_calls(s: GateService) -> Calls:
    return Calls(s.get, s.wait, s.list, s.cancel)


def _question_calls(s: GateService) -> Calls:
    return Calls(
        s.get_question, s.wait_question, s.list_questions, s.cancel_question, s.revise_question
    )


KINDS = (
    Kind("approval", "an approval_id", "draft_too_large", _create_approval, _approval_calls),
    Kind(
        "question",
        "a question_id",
        "question_too_large",
        _create_question,
        _question_calls,
        revisable=True,
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
        calls = self.kind.calls(request.app[SERVICE])
        item_id = request.match_info[self.id_name]
        seconds = wait_seconds(request.query)
        if seconds is None:
            return web.json_response(await calls.get(item_id))
        return web.json_response(await calls.wait(item_id, seconds))

    async def list(self, request: web.Request) -> web.Response:
        """GET /v1/<kind>s?state=&pipeline=&limit=&cursor= -> ``{items, next_cursor}``."""
        q = list_query(request.query, self.kind.cursor_names)
        calls = self.kind.calls(request.app[SERVICE])
        return web.json_response(await calls.list(q.state, q.pipeline, q.limit, q.cursor))

    async def cancel(self, request: web.Request) -> web.Response:
        """POST /v1/<kind>s/{id}/cancel: resolve ``cancelled``; 409 when already resolved."""
        calls = self.kind.calls(request.app[SERVICE])
        view = await calls.cancel(request.match_info[self.id_name])
        request.app[METRICS].resolved(self.kind.name, "cancelled")
        return web.json_response(view)

    async def revise(self, request: web.Request) -> web.Response:
        """POST /v1/<kind>s/{id}/revise: version n+1 of a pending one, dispatched again."""
        raw = await read_body(request, request.app[SETTINGS].body_limit(), self.kind.too_large)
        revise = self.kind.calls(request.app[SERVICE]).revise
        assert revise is not None  # registered only for a kind that has it
        return web.json_response(
            await revise(request.match_info[self.id_name], decode_text_json(raw))
        )


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
        if kind.revisable:
            app.router.add_post(f"{item}/revise", routes.revise)
