"""The relay callback listener: POST /hitl/v0/decisions (SPEC §2)."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from gate.core.service import GateService
from gate.errors import GateError
from gate.metrics import Metrics
from gate.protocol import DECISIONS_PATH, MAX_DECISION_BYTES
from gate.protocol.answer import Answer, parse_callback
from gate.protocol.envelope import Decision
from gate.web.common import ULID_RE, error_middleware, read_signed
from gate.web.credentials import add_credentials_routes
from gate.web.enrol import add_enrol_routes
from gate.web.keys import CALLBACK_SETTINGS, METRICS, SERVICE, CallbackSettings

log = logging.getLogger(__name__)
DETAIL_RE = re.compile(r"[a-z_]{1,40}")
T = TypeVar("T")


async def post_decision(request: web.Request) -> web.Response:
    """Run SPEC §2 checks 1-5 here, 6-14 in ``Approvals.record_decision``; answer per the table.

    Counts every answer: accepted by decision verb, refused by reason (logged at INFO as
    ``event=decision_refused``, with the approval_id once the body parsed; never the body).
    A decision that resolves counts the resolution and its time to decision (from the
    decision's own transaction: no second read).
    """
    metrics = request.app[METRICS]
    parsed = await _counted(metrics, None, _checked_decision(request))
    if isinstance(parsed, Answer):  # counted once, as an answer (Metrics.answer)
        return await _answer(request, parsed)
    decision = parsed
    record = request.app[SERVICE].approvals.record_decision(decision)
    result = await _counted(metrics, decision, record)
    metrics.accepted(decision.decision)
    if result.delegated is not None:
        metrics.delegated(*result.delegated)
    if result.resolution is not None:
        metrics.resolved_by_decision(result.resolution)
    return web.json_response(result.answer)


async def _answer(request: web.Request, answer: Answer) -> web.Response:
    """Checks 6-13 of the answer table in ``Questions.record_answer``; counted once,
    as answers (``Metrics.answer``: not in the decisions' refusals), logged with the
    question_id, never the value."""
    metrics = request.app[METRICS]
    try:
        result = await request.app[SERVICE].questions.record_answer(answer)
    except GateError as exc:
        metrics.answer(exc.code)
        if ULID_RE.fullmatch(answer.question_id):
            log.info(
                "event=answer_refused status=%d reason=%s question_id=%s",
                exc.status,
                exc.code,
                answer.question_id,
            )
        raise
    except Exception:
        metrics.answer("internal_error")
        raise
    metrics.answer("accepted")
    metrics.resolved("question", "answered")
    return web.json_response(result.answer)


async def _counted(metrics: Metrics, decision: Decision | None, step: Awaitable[T]) -> T:
    """``await step``; a refusal it raises (a GateError, anything else as 500
    ``internal_error``) is counted by its reason and logged at INFO as
    ``event=decision_refused``, then raised on. Only an approval_id shaped like a ULID is
    logged: a relay-chosen string never reaches a log line, so it cannot forge fields or
    lines there; a ``detail`` (an approver_signature_invalid: revoked, wrong_operator, ...),
    once the decision is known, is one of the gate's own words."""
    try:
        return await step
    except Exception as exc:
        refusal = exc if isinstance(exc, GateError) else GateError("internal_error", status=500)
        metrics.refused(refusal.code)
        detail = None if decision is None else refusal.extra.get("detail")
        tail = (
            f" detail={detail}" if isinstance(detail, str) and DETAIL_RE.fullmatch(detail) else ""
        )
        if decision is not None and ULID_RE.fullmatch(decision.approval_id):
            tail = f" approval_id={decision.approval_id}{tail}"
        log.info("event=decision_refused status=%d reason=%s%s", refusal.status, refusal.code, tail)
        raise


async def _checked_decision(request: web.Request) -> Decision | Answer:
    """SPEC §2 checks 1-5: size, signature, window, HMAC, then the parsed envelope (a
    decision, or a question's answer: ``parse_callback``)."""
    clock = request.app[SERVICE].clock
    settings = request.app[CALLBACK_SETTINGS]
    raw, _ = await read_signed(request, settings, lambda: clock.now_ms() / 1000)  # checks 1-4
    return parse_callback(raw)  # check 5


def create_callback_app(
    service: GateService,
    settings: CallbackSettings,
    metrics: Metrics,
    outer_middlewares: Sequence[Middleware] = (),
) -> web.Application:
    """Return the callback app: one route, the error middleware, bodies read by the handler.

    ``outer_middlewares`` run outside the error middleware (they see every final answer);
    ``hitl-gate verify`` uses one to observe what a relay sent. ``metrics`` is the gate's one
    ``Metrics``, shared with the API app (``gate.daemon.app.build_gate`` wires them).
    """
    app = web.Application(
        middlewares=[*outer_middlewares, error_middleware], client_max_size=MAX_DECISION_BYTES * 4
    )
    app[SERVICE] = service
    app[CALLBACK_SETTINGS] = settings
    app[METRICS] = metrics
    app.router.add_post(DECISIONS_PATH, post_decision)
    add_enrol_routes(app)  # passkey invites
    add_credentials_routes(app)  # opt-in, relay.credentials
    return app
