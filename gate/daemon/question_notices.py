"""The sender of ``question_notices``: a question's resolution notice POSTed to
``relay.question_notice_target`` with the dispatch's signing, timeout, backoff and redirect
rules (``gate.daemon.dispatch``); drained by the dispatcher's loop as a side outbox."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

import aiohttp

from gate.core.model import Question
from gate.daemon.dispatch import Dispatcher, post_signed
from gate.errors import GateError
from gate.protocol.canonical import wire_json
from gate.protocol.question_notice import build_question_notice

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 32
BATCH = 64
STORAGE_RETRY_S = 1.0


def question_notice_envelope(full: Question) -> dict[str, Any]:
    """The resolution notice of a resolved question (``build_question_notice``): the final
    version's ``request_hash``, ``answered_by`` the winning answer's identity. Raises
    ValueError when the question is not resolved."""
    if full.outcome is None or full.resolved_at is None:
        raise ValueError(f"question {full.question_id} is not resolved")
    return build_question_notice(
        question_id=full.question_id,
        run_id=full.run_id,
        pipeline=full.pipeline,
        step=full.step,
        outcome=full.outcome,
        resolved_at_ms=full.resolved_at,
        version=full.version,
        request_hash=full.current.request_hash,
        answered_by=full.answer.identity if full.answer is not None else None,
    )


class QuestionNoticeSender:
    """Sends the due rows of ``question_notices`` for ``dispatcher`` (its secret, timeout and
    backoff). Dropped as failed when notices or the question relay were turned off by a
    reload; retried until the row's ``give_up_at``; delivered and failed ones are counted in
    ``hitl_gate_notices_total`` like approvals' notices."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._in_flight: dict[str, asyncio.Task[None]] = {}

    async def launch_due(self, session: aiohttp.ClientSession, now_ms: int) -> int | None:
        """Start an attempt for each due notice not in flight; return when to look again
        (unix ms), or None to wait for a wake-up. Raises GateError when the store cannot be
        read."""
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            return None
        reads = self.dispatcher.service.store.reads
        due, next_at = await reads.question_notice_plan(now_ms, BATCH)
        for row in due:
            key = str(row["question_id"])
            if key in self._in_flight or len(self._in_flight) >= MAX_IN_FLIGHT:
                continue
            task = asyncio.create_task(self._attempt(session, key, row))
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

    def _forget(self, key: str, _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(key, None)
        self.dispatcher.service.dispatch_wakeup.set()

    async def _attempt(self, session: aiohttp.ClientSession, qid: str, row: dict[str, Any]) -> None:
        d = self.dispatcher
        service = d.service
        try:
            acked, error, retry_at = await self._send(session, qid, row)
            state = await service.question_notice_result(
                qid, acked=acked, error=error, retry_at_ms=retry_at
            )
        except GateError as exc:  # storage trouble: the row stays due and is tried again
            log.error("event=question_notice_failed question_id=%s reason=%s", qid, exc.code)
            await asyncio.sleep(STORAGE_RETRY_S)
            return
        except Exception as exc:  # a fault building this one notice: a failed attempt
            log.error(
                "event=question_notice_failed question_id=%s reason=internal_error",
                qid,
                exc_info=exc,
            )
            retry_at = service.clock.now_ms() + d.backoff_ms(int(row["attempts"]) + 1)
            with contextlib.suppress(Exception):
                await service.question_notice_result(
                    qid,
                    acked=False,
                    error=f"the notice could not be built ({type(exc).__name__})",
                    retry_at_ms=retry_at,
                )
                return
            await asyncio.sleep(STORAGE_RETRY_S)
            return
        if state == "delivered":
            d.metrics.followups.notice("delivered")
        elif state == "failed":
            log.warning("event=question_notice_given_up question_id=%s error=%r", qid, error)
            d.metrics.followups.notice("failed")

    async def _send(
        self, session: aiohttp.ClientSession, qid: str, row: dict[str, Any]
    ) -> tuple[bool, str | None, int | None]:
        """POST one attempt, or decide to drop it; ``(acked, error, retry_at_ms)``."""
        d = self.dispatcher
        url = d.service.config.relay.question_notice_target
        now = d.service.clock.now_ms()
        if url is None:
            return False, "notices are turned off", None
        if now >= int(row["give_up_at"]):
            return False, "not delivered before it was given up", None
        full = await d.service.store.reads.fetch_question(qid)
        if full is None or full.state != "resolved":
            return False, "unknown question", None
        body = wire_json(question_notice_envelope(full))
        result = await post_signed(session, url, body, d.secret, now // 1000, d.timeout_s)
        attempt = int(row["attempts"]) + 1
        if result.error is None:
            log.info(
                "event=question_notice_sent question_id=%s outcome=%s attempt=%d status=%s",
                qid,
                full.outcome,
                attempt,
                result.status,
            )
        else:
            log.warning(
                "event=question_notice_attempt_failed question_id=%s attempt=%d error=%r",
                qid,
                attempt,
                result.error,
            )
        retry_at = d.service.clock.now_ms() + d.backoff_ms(attempt)
        return result.error is None, result.error, retry_at
