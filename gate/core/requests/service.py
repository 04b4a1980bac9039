"""The lifecycle every kind of request shares, on the event loop: get, wait (long-poll and
wake-ups), list, cancel, expire and the dispatch bookkeeping, for any ``Kind``. The kinds'
services (``gate.core.approvals.service``, ``gate.core.questions.service``) extend it with
create and their verdicts. No HTTP, no SQL."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Generic

from gate.config import Config
from gate.config.model import StepConfig
from gate.core.longpoll import Waiters, long_poll, wake
from gate.core.requests.fields import not_an_operator
from gate.core.requests.kind import Full, Kind
from gate.core.requests.lifecycle_tx import EXPIRE_BATCH, Cancel, DispatchResult, Expire, unknown
from gate.errors import Conflict, GateError, NotFound, refused
from gate.store import Store


def step_is(kind: str, step: str) -> GateError:
    """400 ``step_is_question``/``step_is_approval`` (field ``step``): a request for the other
    kind of step, with a ``message`` naming the command and endpoint to use."""
    command = "ask" if kind == "question" else "request"
    message = f"step {step!r} is {'a' if kind == 'question' else 'an'} {kind} step: use"
    message += f" hitl-gate {command} (POST /v1/{kind}s)"
    return refused(f"step_is_{kind}", "step", message)


@dataclass
class Shared:
    """What the services of one gate share: the ``config`` in force (replaced on a reload),
    the ``store``, the events that tell the workers there is new work (``dispatch_wakeup``,
    ``expiry_wakeup``) and the long-polls waiting per request id (``waiters``)."""

    config: Config
    store: Store
    dispatch_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    expiry_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    waiters: Waiters = field(default_factory=dict)


class RequestService(Generic[Full]):
    """The shared lifecycle of one ``kind`` of request over the gate's ``Shared`` state;
    its write transactions are the lifecycle's commands for ``kind`` (``Cancel``, ...)."""

    def __init__(self, kind: Kind[Full, Any], shared: Shared) -> None:
        self.kind = kind
        self.shared = shared
        self.store = shared.store
        self.log = logging.getLogger(kind.logger)

    @property
    def config(self) -> Config:
        """The config in force."""
        return self.shared.config

    def step(self, pipeline: str, step: str) -> StepConfig:
        """The configured step a new request goes to. Raises NotFound 404
        ``unknown_pipeline``/``unknown_step``, 400 ``step_is_<other kind>`` for a step of the
        other kind."""
        if not any(p.name == pipeline for p in self.config.pipelines):
            raise NotFound("unknown_pipeline", f"pipeline {pipeline!r} is not configured")
        found = self.config.find_step(pipeline, step)
        if found is None:
            raise NotFound("unknown_step", f"step {step!r} is not configured in {pipeline!r}")
        step_kind = "question" if found[1].is_question else "approval"
        if step_kind != self.kind.name:
            raise step_is(step_kind, step)
        return found[1]

    def requester(self, identity: str | None) -> tuple[int, str] | None:
        """``(operator id, configured identity)`` of ``requested_by``, None when not given;
        raises 400 ``invalid_requested_by`` (``not_an_operator``) when it names nobody."""
        if identity is None:
            return None
        op = self.config.operator_by_identity(identity)
        if op is None:
            raise not_an_operator(
                identity, [(o.id, o.identity) for o in self.config.relay.operators]
            )
        return op.id, op.identity

    def opened(self, full: Full, more: str, *values: object) -> dict[str, Any]:
        """After a create: log ``event=<kind>created`` with the request's id, pipeline, step
        and ``more`` (a ``%`` format of ``values``), wake the dispatcher and the expiry
        scheduler for a pending request; return its object."""
        kind, view = self.kind, self.kind.view(full)
        self.log.info(
            "event=%screated %s=%s pipeline=%s step=%s " + more,
            *(kind.event, kind.id_field, view[kind.id_field], view["pipeline"], view["step"]),
            *values,
        )
        if full.state == "pending":
            self.shared.dispatch_wakeup.set()
            self.shared.expiry_wakeup.set()
        return view

    def wake(self, request_id: str) -> None:
        """Wake the long-polls waiting on ``request_id`` (``longpoll.wake``) and, notices on,
        the dispatcher: the resolution notice was queued with the resolution."""
        if self.kind.notices_on(self.config):
            self.shared.dispatch_wakeup.set()
        wake(self.shared.waiters, request_id)

    def resolved(self, request_id: str, outcome: str) -> None:
        """Log ``event=<kind>resolved`` and wake what waits on ``request_id``."""
        kind = self.kind
        self.log.info(
            "event=%sresolved %s=%s outcome=%s", kind.event, kind.id_field, request_id, outcome
        )
        self.wake(request_id)

    async def get(self, request_id: str) -> dict[str, Any]:
        """Return the request's object; raises NotFound 404 ``unknown_<kind>``."""
        full = await self.store.reads.fetch(self.kind.tables, request_id)
        if full is None:
            raise unknown(self.kind)
        return self.kind.view(full)

    async def wait(self, request_id: str, seconds: float) -> dict[str, Any]:
        """Return the request's object once resolved or after ``seconds``, whichever comes
        first (woken early by ``wake``)."""
        return await long_poll(self.shared.waiters, request_id, self.get, seconds)

    async def list(
        self, state: str, pipeline: str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """Return ``{items, next_cursor}``; ``next_cursor`` is None on the last page."""
        rows = await self.store.reads.page(self.kind.tables, state, pipeline, limit + 1, cursor)
        more = len(rows) > limit
        rows = rows[:limit]
        items = [self.kind.view(r) for r in rows]
        return {
            "items": items,
            "next_cursor": items[-1][self.kind.id_field] if more and items else None,
        }

    async def cancel(self, request_id: str) -> dict[str, Any]:
        """Resolve a pending request as ``cancelled`` (the pipeline withdrew).

        One already past its ``expires_at`` on the gate's clock is resolved ``timeout``
        instead, and the answer is 409 ``already_resolved`` with that outcome. Raises
        NotFound 404 ``unknown_<kind>``; Conflict 409 ``already_resolved``.
        """
        outcome, full = await self.store.transact(Cancel(self.kind, request_id))
        self.resolved(request_id, outcome)
        if outcome == "timeout":
            raise Conflict(
                "already_resolved",
                f"the {self.kind.name} expired before it was cancelled",
                extra={"outcome": "timeout"},
            )
        return self.kind.view(full)

    async def expire_due(self) -> int:
        """Resolve every pending request whose ``expires_at`` has passed as ``timeout``, in
        batches of ``EXPIRE_BATCH`` per transaction; return how many were resolved."""
        total = 0
        while True:
            ids = await self.store.transact(Expire(self.kind))
            for request_id in ids:
                self.resolved(request_id, "timeout")
            total += len(ids)
            if len(ids) < EXPIRE_BATCH:
                return total

    async def dispatch_result(
        self, request_id: str, version: int, *, acked: bool, error: str | None, retry_at_ms: int
    ) -> None:
        """Record one dispatch attempt of ``version``; an ack writes the kind's
        dispatch-ack audit entry (``dispatch_ack``, ``question_dispatch_ack``)."""
        await self.store.transact(
            DispatchResult(self.kind, request_id, version, acked, error, retry_at_ms)
        )
