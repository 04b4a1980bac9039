"""One outbox sender: the delivery loop every outbox shares, and the contract a channel
adapter fills in (docs/design.md, "One sender").

``OutboxSender(dispatcher, channel)`` drains one outbox for the dispatcher's loop: it caps the
attempts in flight, launches one task per due row, POSTs what the channel built (signed with
the dispatcher's secret, within its timeout, redirects never followed), computes the retry time
with the dispatcher's backoff, and records the result through the channel. The guarantees are
the loop's, so every channel has all of them:

- an attempt whose result cannot be recorded (storage fault) is kept in memory and recorded
  again without a second POST;
- storage trouble (a GateError while reading or recording) leaves the row due; the task stays
  in flight for ``STORAGE_RETRY_S``, so it is retried without a hot loop;
- a fault while building one send (a bug, or a stored row the envelope cannot carry) is
  recorded as that attempt's failure with the usual backoff, logged with its traceback;
- give-up is the channel's: a channel drops a row by returning a ``Outcome`` with
  ``retry_at_ms`` None from ``build`` (its ``give_up_at`` passed, its target turned off).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import aiohttp

from gate.core.requests.service import RequestService
from gate.daemon.relay_http import SendResult, post_signed
from gate.errors import GateError
from gate.model import Approval, Question
from gate.store.outbox import DueDispatch, OutboxTable

if TYPE_CHECKING:
    from gate.daemon.dispatch import Dispatcher

MAX_IN_FLIGHT = 32
BATCH = 64
STORAGE_RETRY_S = 1.0


class OutboxRow(Protocol):
    """A due row as the store plans it (``gate.store.outbox``): its primary ``key`` and the
    ``attempts`` recorded so far."""

    @property
    def key(self) -> tuple[Any, ...]: ...

    @property
    def attempts(self) -> int: ...


Row = TypeVar("Row", bound=OutboxRow)


@dataclass(frozen=True, slots=True)
class Send:
    """One signed POST to build: ``body`` to ``url``; ``pipeline``/``step`` label metrics,
    ``detail`` is more ``name=value`` fields for the log line of an acked POST."""

    url: str
    body: bytes
    pipeline: str = ""
    step: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Outcome:
    """An attempt's result to record: ``retry_at_ms`` (unix ms) is when to try again after a
    failure; None drops the row unsent as failed (``error`` says why). ``pipeline``/``step``
    label its metric."""

    acked: bool
    error: str | None
    retry_at_ms: int | None
    pipeline: str = ""
    step: str = ""

    def retry_at(self) -> int:
        """``retry_at_ms`` of a channel that never drops a row (its dispatches are retried
        until the request resolves); raises ValueError for a drop."""
        if self.retry_at_ms is None:
            raise ValueError("a dispatch is retried until its request resolves, never dropped")
        return self.retry_at_ms


class Channel(Generic[Row]):
    """What one outbox adds to the loop, and what every channel adapter starts from: its
    ``dispatcher`` (settings, service, metrics) and its store ``table``, whose plan ``due``
    reads. ``event`` names the channel in its log events (``<event>_failed``: its failed
    attempts, storage trouble or a fault while building; ``sent_as`` and
    ``attempt_failed_as``, each a format of ``event``: a POST acked or not, with
    ``retry_in_log`` that line says when it is retried), all logged through ``log``, the
    channel's own logger. An adapter fills in ``build``, ``record`` and ``what``."""

    table: OutboxTable[Row]
    event: str
    log: logging.Logger
    retry_in_log = False
    sent_as = "{}_sent"
    attempt_failed_as = "{}_attempt_failed"

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    async def due(self, now_ms: int, limit: int) -> tuple[list[Row], int | None]:
        """Up to ``limit`` rows of ``table`` due at ``now_ms`` and the earliest next attempt
        (unix ms) of any unsent row, due or not (None: none). Raises GateError when the
        store cannot be read."""
        reads = self.dispatcher.service.store.reads
        return await reads.outbox_plan(self.table, now_ms, limit)

    async def build(self, row: Row) -> Send | Outcome | None:
        """The POST of ``row``; an ``Outcome`` to record without one (a drop); or None when
        nothing is to be sent or recorded (resolved, superseded or acked meanwhile)."""
        raise NotImplementedError

    async def record(self, row: Row, outcome: Outcome) -> str | None:
        """Record ``outcome``; return the row's state when it ended (``"delivered"``,
        ``"failed"``), ``"retry"``, or None."""
        raise NotImplementedError

    def ended(self, row: Row, state: str | None, outcome: Outcome) -> None:
        """Log and count a recorded attempt in state ``state`` (``record``'s answer); by
        default nothing (a dispatch is counted when sent)."""

    def what(self, row: Row) -> str:
        """What a send of ``row`` is called in ``last_error`` (``dispatch``, ``notice``...)."""
        raise NotImplementedError

    def log_id(self, row: Row) -> str:
        """The ``name=value`` fields that name ``row`` in log lines: its primary key."""
        names = self.table.columns[: self.table.key]
        return " ".join(f"{name}={value}" for name, value in zip(names, row.key, strict=True))

    def post_id(self, row: Row) -> str:
        """The fields that name a POST of ``row`` in its log line (``log_id``'s)."""
        return self.log_id(row)

    def sent(
        self, row: Row, send: Send, result: SendResult, attempt: int, retry_at_ms: int
    ) -> None:
        """Log (and count) the ``result`` of POSTing ``send``, attempt number ``attempt``."""
        if result.error is None:
            self.log.info(
                "event=%s %s%s attempt=%d status=%s",
                self.sent_as.format(self.event),
                self.post_id(row),
                f" {send.detail}" if send.detail else "",
                attempt,
                result.status,
            )
        else:
            retry_in_s = (retry_at_ms - self.dispatcher.service.clock.now_ms()) / 1000
            self.log.warning(
                "event=%s %s attempt=%d error=%r%s",
                self.attempt_failed_as.format(self.event),
                self.post_id(row),
                attempt,
                result.error,
                f" retry_in_s={retry_in_s:.1f}" if self.retry_in_log else "",
            )


class RequestDispatch(Channel[DueDispatch]):
    """The dispatches of one kind of request (its outbox ``table``, whose ``request`` is the
    kind): the current version of each pending request POSTed to ``url()`` as
    ``envelope(full, version)``, retried until the request resolves (``Outcome.retry_at``),
    counted when sent as ``metrics_kind`` (a kind of ``gate.metrics.KINDS``), recorded by the
    kind's service (``requests().dispatch_result``). Nothing is sent for a request resolved,
    revised, acked or expired since the plan was read (``still_due``), nor while ``url()``
    is None."""

    metrics_kind = "approval"
    sent_as = "{}ed"  # dispatched, question_dispatched
    attempt_failed_as = "{}_failed"

    def url(self) -> str | None:
        """Where the dispatches go, as the config in force says now."""
        raise NotImplementedError

    def envelope(self, full: Any, version: int) -> bytes:
        """The body of the dispatch of ``version`` of ``full`` (the caller signs it)."""
        raise NotImplementedError

    def requests(self) -> RequestService[Any]:
        """The service of this kind of request (``GateService.approvals``, ``.questions``),
        which records an attempt in its write transaction."""
        raise NotImplementedError

    async def build(self, row: DueDispatch) -> Send | None:
        service = self.dispatcher.service
        assert self.table.request is not None  # a dispatch belongs to a request
        full = await service.store.reads.fetch(self.table.request, row.request_id)
        url = self.url()
        if full is None or url is None or not still_due(full, row.version, service.clock.now_ms()):
            return None
        return Send(url, self.envelope(full, row.version))

    def sent(
        self, row: DueDispatch, send: Send, result: SendResult, attempt: int, retry_at_ms: int
    ) -> None:
        d = self.dispatcher
        now = d.service.clock.now_ms()
        d.metrics.dispatch_result(
            result.error is None, result.elapsed_s, result.failure, now, kind=self.metrics_kind
        )
        super().sent(row, send, result, attempt, retry_at_ms)

    async def record(self, row: DueDispatch, outcome: Outcome) -> str | None:
        await self.requests().dispatch_result(
            row.request_id,
            row.version,
            acked=outcome.acked,
            error=outcome.error,
            retry_at_ms=outcome.retry_at(),
        )
        return None

    def what(self, row: DueDispatch) -> str:
        return "dispatch"


def resolution(full: Approval | Question) -> dict[str, Any]:
    """What every resolution notice says of its request, as ``build_notice`` and
    ``build_question_notice`` take it: its id (``approval_id``, ``question_id``), ``run_id``,
    ``pipeline``, ``step``, ``outcome`` and ``resolved_at_ms``. Raises ValueError when the
    request is not resolved."""
    if isinstance(full, Approval):
        kind, request_id = "approval", full.approval_id
    else:
        kind, request_id = "question", full.question_id
    if full.outcome is None or full.resolved_at is None:
        raise ValueError(f"{kind} {request_id} is not resolved")
    return {
        f"{kind}_id": request_id,
        "run_id": full.run_id,
        "pipeline": full.pipeline,
        "step": full.step,
        "outcome": full.outcome,
        "resolved_at_ms": full.resolved_at,
    }


def still_due(full: Approval | Question, version: int, now_ms: int) -> bool:
    """Whether ``version`` of the request ``full`` is still to be sent: the request is
    pending (not resolved since the plan was read), ``version`` is current and not acked
    meanwhile (the due rows were read before that ack was recorded), and ``expires_at`` has
    not passed (the scheduler resolves it as timeout; nothing is dispatched after). A row not
    sent stays as it is: the plan reads only pending requests' current version."""
    current = full.revision if isinstance(full, Approval) else full.version
    if full.state != "pending" or current != version or now_ms >= full.expires_at:
        return False
    return not any(o.revision == version and o.delivered_at is not None for o in full.outbox)


class OutboxSender(Generic[Row]):
    """Drains ``channel``'s outbox for ``dispatcher`` (its session, secret, timeout, backoff,
    clock and wake-up, all as reconfigured by SIGHUP): the loop in this module's docstring."""

    def __init__(self, dispatcher: Dispatcher, channel: Channel[Row]) -> None:
        self.dispatcher = dispatcher
        self.channel = channel
        self._in_flight: dict[tuple[Any, ...], asyncio.Task[None]] = {}
        self._unrecorded: dict[tuple[Any, ...], Outcome] = {}

    async def launch_due(self, session: aiohttp.ClientSession, now_ms: int) -> int | None:
        """Start an attempt for each row due at ``now_ms`` (unix ms) that is not in flight;
        return when the loop should look again (unix ms), or None to wait for a wake-up (a
        finished attempt sets ``dispatch_wakeup``). Raises GateError when the store cannot
        be read."""
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            return None
        due, next_at = await self.channel.due(now_ms, BATCH)
        for row in due:
            key = row.key
            if key in self._in_flight or len(self._in_flight) >= MAX_IN_FLIGHT:
                continue
            task = asyncio.create_task(self._attempt(session, row))
            self._in_flight[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        if next_at is not None and next_at <= now_ms and self._in_flight:
            return None  # what is due is in flight (or waits for room): a finish wakes us
        return next_at

    async def stop(self) -> None:
        """Cancel the attempts in flight (their rows stay due: sent again after a restart)."""
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, key: tuple[Any, ...], _task: asyncio.Task[None]) -> None:
        """Done-callback of an attempt's task: forget it and wake the loop."""
        self._in_flight.pop(key, None)
        self.dispatcher.service.dispatch_wakeup.set()

    async def _attempt(self, session: aiohttp.ClientSession, row: Row) -> None:
        channel = self.channel
        try:
            outcome = self._unrecorded.pop(row.key, None)
            if outcome is None:
                outcome = await self._send(session, row)
            if outcome is None:
                return
            self._unrecorded[row.key] = outcome  # until recorded
            state = await channel.record(row, outcome)
            self._unrecorded.pop(row.key, None)
            channel.ended(row, state, outcome)
        except GateError as exc:  # storage trouble: logged; the row stays due and is retried
            channel.log.error(
                "event=%s %s reason=%s message=%s",
                f"{channel.event}_failed",
                channel.log_id(row),
                exc.code,
                exc.message,
            )
            await asyncio.sleep(STORAGE_RETRY_S)  # stays in flight: no hot loop while it lasts
        except Exception as exc:  # a fault building this one send: a failed attempt
            await self._record_fault(row, exc)

    async def _send(self, session: aiohttp.ClientSession, row: Row) -> Outcome | None:
        """Build and POST one attempt; return what to record (None: nothing)."""
        d = self.dispatcher
        built = await self.channel.build(row)
        if not isinstance(built, Send):
            return built
        now = d.service.clock.now_ms()
        result = await post_signed(
            session, built.url, built.body, d.secret, now // 1000, d.timeout_s
        )
        attempt = row.attempts + 1
        retry_at = d.service.clock.now_ms() + d.backoff_ms(attempt)
        self.channel.sent(row, built, result, attempt, retry_at)
        return Outcome(result.error is None, result.error, retry_at, built.pipeline, built.step)

    async def _record_fault(self, row: Row, exc: Exception) -> None:
        """Record an attempt that failed before anything was sent as a failed attempt with
        the usual backoff: it is retried, ``last_error`` says so, and other rows go on.
        Logged with its traceback; when it cannot be recorded either, the row waits
        ``STORAGE_RETRY_S`` before it is read again."""
        clock = self.dispatcher.service.clock
        attempt = row.attempts + 1
        retry_at = clock.now_ms() + self.dispatcher.backoff_ms(attempt)
        self.channel.log.error(
            "event=%s %s attempt=%d reason=internal_error retry_in_s=%.1f",
            f"{self.channel.event}_failed",
            self.channel.log_id(row),
            attempt,
            (retry_at - clock.now_ms()) / 1000,
            exc_info=exc,
        )
        error = f"the {self.channel.what(row)} could not be built ({type(exc).__name__})"
        try:
            await self.channel.record(row, Outcome(False, error, retry_at))
        except Exception:  # cannot record it either: wait before the row is read again
            await asyncio.sleep(STORAGE_RETRY_S)
