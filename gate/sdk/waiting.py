"""The one retry and long-poll loop of the pipeline API (SPEC §3, §8): the SDK's, and through
it ``hitl-gate request``'s and ``ask``'s.

``create`` POSTs a create until the gate takes it, always with the same Idempotency-Key (an
attempt that landed although its answer was lost is found again, never made twice);
``fetch`` GETs an object that exists, ``settle`` long-polls it until it resolves or the
deadline passes (it is durable on the gate). All three retry what passes by itself (no
connection, 502/503/504) with backoff, ``RETRY_BASE_S`` doubling to ``RETRY_CAP_S``, never
past the deadline. Deadlines are ``time.monotonic()`` values (None: no limit). A ``Watch``
says how one caller bounds an attempt, paces the polls and tells about them: this module's
is the SDK's (hops of ``HOP_S``, one warning logged per outage); the CLI's reports each hop
on stderr (gate.client.progress).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from gate.sdk.errors import GateRequestError, GateUnavailable, HitlGateError
from gate.sdk.transport import CALL_TIMEOUT_S, MARGIN_S, Kind, Transport

log = logging.getLogger(__name__)

T = TypeVar("T")
Obj = dict[str, Any]
Failure = GateUnavailable | GateRequestError  # what a call of the transport raises

# one long-poll hop (seconds): well under the gate's limit (300) and any proxy's idle timeout
HOP_S = 50.0
# pauses while the gate cannot be reached: 0.5 s doubling to 5 s
RETRY_BASE_S = 0.5
RETRY_CAP_S = 5.0


def transient(exc: HitlGateError) -> bool:
    """True for a failure that passes by itself: no connection, or 502/503/504."""
    return isinstance(exc, GateUnavailable) or (
        isinstance(exc, GateRequestError) and exc.status in (502, 503, 504)
    )


def pause(outage: int, deadline: float | None) -> float:
    """Seconds to wait after the ``outage``-th failed try in a row: ``RETRY_BASE_S``
    doubling to ``RETRY_CAP_S``, never past ``deadline``."""
    pause = min(RETRY_CAP_S, RETRY_BASE_S * float(2 ** (outage - 1)))
    return pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))


def deadline_after(wait: float | None) -> float | None:
    """The monotonic time a wait of ``wait`` seconds ends (None: no limit). Raises
    ValueError for a wait that is not None nor seconds >= 0 (NaN too)."""
    if wait is not None and not wait >= 0:
        raise ValueError(f"wait must be None or seconds >= 0, got {wait!r}")
    return None if wait is None else time.monotonic() + wait


def bound(deadline: float | None) -> float:
    """The timeout (seconds) of one plain request made before ``deadline``: what is left of
    the wait + MARGIN_S, at most CALL_TIMEOUT_S."""
    if deadline is None:
        return CALL_TIMEOUT_S
    return min(CALL_TIMEOUT_S, max(0.0, deadline - time.monotonic()) + MARGIN_S)


class Watch:
    """How one caller runs the loop; this base is the SDK's. Each hook has one job."""

    async def attempt(
        self, post: Callable[[float | None], Awaitable[T]], deadline: float | None
    ) -> T:
        """One create attempt, ``post(timeout)``: bounded by what is left of the wait +
        MARGIN_S (at most CALL_TIMEOUT_S), so a gate that hangs never holds the caller
        past it."""
        return await post(bound(deadline))

    def hop_s(self, obj: Obj, remaining: float | None) -> float:
        """The ``wait`` of the next long-poll of ``obj`` with ``remaining`` seconds left of
        the deadline (None: no limit): ``HOP_S`` at most."""
        return HOP_S if remaining is None else min(HOP_S, remaining)

    def create_failed(self, exc: Failure, key: str, outage: int, giving_up: bool) -> None:
        """A create attempt failed with a transient ``exc`` (the ``outage``-th in a row);
        ``giving_up``: the deadline passed, the failure is raised next."""
        if outage == 1 and not giving_up:
            log.warning("gate_unavailable retrying=create idempotency_key=%s", key)

    def wait_failed(self, exc: Failure, kind: Kind, item_id: str, outage: int) -> None:
        """A poll of ``item_id`` failed with a transient ``exc`` (the ``outage``-th in a
        row); the loop pauses and polls again."""
        if outage == 1:
            log.warning("gate_unavailable retrying=wait %s=%s", kind.id_key, item_id)

    def seen(self, before: Obj | None, after: Obj, outage: int) -> None:
        """A view of the object arrived: the first (``before`` None) or a poll's, after
        ``outage`` failed polls in a row. The SDK says nothing."""


async def create(
    transport: Transport, kind: Kind, body: Obj, key: str, deadline: float | None, watch: Watch
) -> tuple[Obj, bool]:
    """POST the create of ``kind`` until the gate takes it; returns ``(object, created)``
    (``Transport.create_in``). A transient failure is retried with ``key`` after a pause
    unless the wait is 0 or ``deadline`` passed: then it is raised. Any other failure is
    raised at once (GateRequestError), as is what ``watch.attempt`` raises."""
    wait = None if deadline is None else deadline - time.monotonic()
    outage = 0
    while True:
        try:
            obj, created = await watch.attempt(
                lambda timeout: transport.create_in(kind, body, key, timeout), deadline
            )
            return dict(obj), created
        except (GateUnavailable, GateRequestError) as exc:
            if not transient(exc):
                raise
            outage += 1
            giving_up = (wait is not None and wait <= 0) or (
                deadline is not None and time.monotonic() >= deadline
            )
            watch.create_failed(exc, key, outage, giving_up)
            if giving_up:
                raise
            await asyncio.sleep(pause(outage, deadline))


async def fetch(
    transport: Transport, kind: Kind, item_id: str, deadline: float | None, watch: Watch
) -> Obj:
    """GET the object ``item_id`` of ``kind`` (the first view a wait starts from). A
    transient failure is retried with backoff, as ``settle``'s polls are, until ``deadline``
    passes: then it is raised (at once for a wait of 0). Others are raised at once
    (GateRequestError, e.g. 404 ``not_found``)."""
    outage = 0
    while True:
        try:
            return dict(await transport.get_in(kind, item_id, timeout=bound(deadline)))
        except (GateUnavailable, GateRequestError) as exc:
            if not transient(exc) or (deadline is not None and time.monotonic() >= deadline):
                raise
            outage += 1
            watch.wait_failed(exc, kind, item_id, outage)
            await asyncio.sleep(pause(outage, deadline))


async def settle(
    transport: Transport, kind: Kind, obj: Obj, deadline: float | None, watch: Watch
) -> Obj:
    """Long-poll ``obj`` (an object of ``kind``) until it resolves or ``deadline`` passes;
    returns the last view (still ``pending`` when the deadline came first). Transient
    failures are retried with backoff; others are raised (GateRequestError)."""
    outage = 0  # failed polls in a row
    watch.seen(None, obj, outage)
    while obj["state"] != "resolved":
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            break
        item_id = obj[kind.id_key]
        try:
            nxt = dict(await transport.get_in(kind, item_id, wait=watch.hop_s(obj, remaining)))
        except (GateUnavailable, GateRequestError) as exc:
            if not transient(exc):
                raise
            outage += 1
            watch.wait_failed(exc, kind, item_id, outage)
            await asyncio.sleep(pause(outage, deadline))
            continue
        watch.seen(obj, nxt, outage)
        outage = 0
        obj = nxt
    return obj
