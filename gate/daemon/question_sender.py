"""The sender of ``question_outbox``: each pending question's current version is
POSTed to ``relay.question_target`` with the dispatch's signing, timeout, backoff and ack rules
(``gate.daemon.dispatch``); drained by the dispatcher's loop as a side outbox."""

from __future__ import annotations

import asyncio
import functools
import logging

import aiohttp

from gate.core.model import Question
from gate.daemon.dispatch import Dispatcher, post_signed
from gate.errors import GateError
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, build_question_dispatch

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (question_id, version)
MAX_IN_FLIGHT = 32
BATCH = 64
STORAGE_RETRY_S = 1.0


def still_due(full: Question, version: int, now_ms: int) -> bool:
    """Whether ``version`` of ``full`` is still to be sent, as the approvals' dispatcher
    decides (``Dispatcher._send``): the question is pending (not answered, cancelled or
    expired since the plan was read), ``version`` is current, not acked meanwhile, and
    ``expires_at`` has not passed (the expiry scheduler resolves it; never sent after). A row
    not sent stays as it is: the plan reads only pending questions' current version."""
    if full.state != "pending" or full.version != version or now_ms >= full.expires_at:
        return False
    return not any(o.revision == version and o.delivered_at is not None for o in full.outbox)


class QuestionSender:
    """Sends the due rows of ``question_outbox`` for ``dispatcher`` (its secret, timeout,
    callback URL and backoff). Not acked: retried with ``Dispatcher.backoff_ms`` until the
    question resolves or expires (the plan reads only pending questions' current version).
    With no question target configured (a reload removed it) nothing is sent."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._in_flight: dict[Key, asyncio.Task[None]] = {}

    async def launch_due(self, session: aiohttp.ClientSession, now_ms: int) -> int | None:
        """Start an attempt for each due row not in flight; return when to look again (unix
        ms), or None to wait for a wake-up. Raises GateError when the store cannot be read."""
        service = self.dispatcher.service
        if service.config.relay.question_target is None or len(self._in_flight) >= MAX_IN_FLIGHT:
            return None
        due, next_at = await service.store.reads.question_dispatch_plan(now_ms, BATCH)
        for row in due:
            key: Key = (str(row["question_id"]), int(row["version"]))
            if key in self._in_flight or len(self._in_flight) >= MAX_IN_FLIGHT:
                continue
            task = asyncio.create_task(self._attempt(session, key, int(row["attempts"])))
            self._in_flight[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        if next_at is not None and next_at <= now_ms and self._in_flight:
            return None
        return next_at

    async def stop(self) -> None:
        """Cancel the attempts in flight (their rows stay due: sent again after a restart)."""
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, key: Key, _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(key, None)
        self.dispatcher.service.dispatch_wakeup.set()

    def envelope(self, full: Question) -> bytes:
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

    async def _attempt(self, session: aiohttp.ClientSession, key: Key, attempts: int) -> None:
        d = self.dispatcher
        service = d.service
        question_id, version = key
        try:
            full = await service.store.reads.fetch_question(question_id)
            url = service.config.relay.question_target
            if full is None or url is None or not still_due(full, version, service.clock.now_ms()):
                return
            body = self.envelope(full)
            now = service.clock.now_ms()
            result = await post_signed(session, url, body, d.secret, now // 1000, d.timeout_s)
            d.metrics.dispatch_result(
                result.error is None,
                result.elapsed_s,
                result.failure,
                service.clock.now_ms(),
                question=True,
            )
            retry_at = service.clock.now_ms() + d.backoff_ms(attempts + 1)
            if result.error is None:
                log.info(
                    "event=question_dispatched question_id=%s version=%d attempt=%d status=%s",
                    question_id,
                    version,
                    attempts + 1,
                    result.status,
                )
            else:
                log.warning(
                    "event=question_dispatch_failed question_id=%s version=%d attempt=%d error=%r",
                    question_id,
                    version,
                    attempts + 1,
                    result.error,
                )
            await service.question_dispatch_result(
                question_id,
                version,
                acked=result.error is None,
                error=result.error,
                retry_at_ms=retry_at,
            )
        except GateError as exc:  # storage trouble: the row stays due and is tried again
            log.error(
                "event=question_dispatch_failed question_id=%s version=%d reason=%s",
                question_id,
                version,
                exc.code,
            )
            await asyncio.sleep(STORAGE_RETRY_S)
