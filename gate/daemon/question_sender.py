"""The channel of ``question_outbox``: each pending question's current version is
POSTed to ``relay.question_target`` with the dispatch's signing, timeout, backoff and ack rules;
drained by ``gate.daemon.delivery.OutboxSender``."""

from __future__ import annotations

import logging
from typing import Any

from gate.core.requests.service import RequestService
from gate.daemon.delivery import RequestDispatch
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, build_question_dispatch
from gate.store.outbox import QUESTION_DISPATCHES, DueDispatch

log = logging.getLogger(__name__)


class QuestionDispatch(RequestDispatch):
    """The channel of ``question_outbox`` for ``dispatcher`` (its callback URL and metrics).
    Not acked: retried until the question resolves or expires (the plan reads only pending
    questions' current version). With no question target configured (a reload removed it)
    nothing is read or sent."""

    table = QUESTION_DISPATCHES
    event = "question_dispatch"
    metrics_kind = "question"
    log = log

    def url(self) -> str | None:
        return self.dispatcher.service.config.relay.question_target

    async def due(self, now_ms: int, limit: int) -> tuple[list[DueDispatch], int | None]:
        if self.url() is None:
            return [], None
        return await super().due(now_ms, limit)

    def envelope(self, full: Question, version: int) -> bytes:
        """The body of the dispatch of ``full``'s current version (``build_question_dispatch``;
        the caller signs it)."""
        current = full.current
        return wire_json(
            build_question_dispatch(
                question_id=full.question_id,
                run_id=full.run_id,
                pipeline=full.pipeline,
                step=full.step,
                issued_at_ms=self.dispatcher.service.clock.now_ms(),
                expires_at_ms=full.expires_at,
                risk=full.risk,
                version=current.version,
                spec=QuestionSpec.from_json(current.question),
                request_hash=current.request_hash,
                approvers=[identity for _, identity in full.scope],
                callback_url=self.dispatcher.callback_url,
                nonce=current.nonce,
                requested_by=full.requested_by,
            )
        )

    def requests(self) -> RequestService[Any]:
        return self.dispatcher.service.questions
