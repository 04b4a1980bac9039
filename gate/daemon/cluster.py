"""One gate's part in a cluster of gates on one PostgreSQL database: its heartbeat
(``gate_instances``), the ``timers`` lease that picks the one gate running the timers and the
senders, and the change feed that wakes its long-polls and workers when another gate wrote.

Nothing here makes anything happen once: a resolution, a reminder level, a dispatch are
guarded inside their serialised transactions (``WHERE state = 'pending'``, the follow-up
outbox's key), so two gates running the timers at once, as when a deposed holder has not
noticed yet, still resolve once and remind once per level. The lease saves the work and
the duplicate POSTs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ulid import ULID

import gate
from gate.audit.entries import DECISION, DISPATCH_ACK, RESOLVED
from gate.audit.question_entries import (
    QUESTION_ANSWERED,
    QUESTION_DISPATCH_ACK,
    QUESTION_RESOLVED,
    QUESTION_REVISED,
)
from gate.clock import Clock, PinnedClock
from gate.config.fingerprint import config_hash
from gate.core.approvals.kind import APPROVALS
from gate.core.questions.kind import QUESTIONS
from gate.core.requests.kind import Kind
from gate.core.service import GateService
from gate.errors import Unavailable
from gate.store.pg_feed import Change, Feed, head_entry
from gate.store.pg_instances import ClusterHealth, Instance, assess, beat, live
from gate.store.pg_instances import clock_offset_ms as measure_offset
from gate.store.pg_instances import leave as leave_cluster
from gate.store.pg_lease import TIMERS, Term, claim, current, release
from gate.store.pg_session import close_quietly, connect

log = logging.getLogger(__name__)

LEASE_TTL_S = 10.0  # a holder that stops renewing loses the lease after this
RENEW_S = 3.0  # the holder renews (and every gate beats) this often
# the holder stops trusting its lease this part of the TTL before it would lapse (2 s of 10)
MARGIN = 0.2
LEAVE_S = 2.0  # the longest a clean stop waits to release the lease and remove its row
# the longest a start waits for the first heartbeat before it listens anyway (/healthz: 503)
JOIN_S = 5.0
# what wakes a long-poll on a request (the others only wake the workers)
WAKING = frozenset({RESOLVED, QUESTION_ANSWERED, QUESTION_RESOLVED, QUESTION_REVISED})
# what gives the timers and the senders no work: a dispatch acked (its sender knows), a
# decision that made no new revision (what it resolved is an entry of its own)
IDLE = frozenset({DISPATCH_ACK, QUESTION_DISPATCH_ACK, DECISION})
# a resolution: work for the senders alone, when its kind queues a resolution notice
NOTICES: dict[str, Kind[Any, Any]] = {
    RESOLVED: APPROVALS,
    QUESTION_ANSWERED: QUESTIONS,
    QUESTION_RESOLVED: QUESTIONS,
}

Work = Callable[[], Coroutine[Any, Any, None]]


class Cluster:
    """This gate among the gates on the database at ``url`` (``password``: its password, or
    None), for ``service`` (the gate's: each heartbeat records the hash of the config in
    force, ``config_hash``, so a SIGHUP reload shows at the next beat);
    ``instance_id`` is its id in ``gate_instances`` and its sessions' names (default: a new
    ULID); ``clock`` is the one whose offset to the database's it measures (default the
    service's; the daemon gives this host's, never pinned to the database's).

    ``run(work)`` beats every ``renew_s`` (its clock's offset to the database's measured each
    time), claims or renews the ``timers`` lease (``ttl_s``), runs ``work`` (the timers and
    the senders) only while it holds it, and follows the change feed (``poll_s``). The
    holder trusts its lease until its last successful renewal's start + ``ttl_s`` less
    MARGIN of it, and stops the work when that passes without a renewal, or at once when
    another gate holds the lease. A gate without the lease tries again when the lease would
    lapse, so a killed holder is replaced within ``ttl_s``. A gate that may write no more
    (``Store.fenced``) releases it and claims it no more. On a clean stop it releases the
    lease and removes its row.
    """

    def __init__(
        self,
        url: str,
        password: str | None,
        service: GateService,
        *,
        ttl_s: float = LEASE_TTL_S,
        renew_s: float = RENEW_S,
        poll_s: float = 1.0,
        instance_id: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.url = url
        self.password = password
        self.service = service
        self.clock = clock or service.clock
        self.ttl_s = ttl_s
        self.renew_s = renew_s
        self.instance_id = instance_id or str(ULID())
        self.feed = Feed(url, self.instance_id, self.changed, poll_s, password=password)
        self.health: ClusterHealth | None = None
        self.term: Term | None = None
        self.joined = asyncio.Event()  # set by the first heartbeat (``health`` is known)
        self.held = asyncio.Event()
        self.not_held = asyncio.Event()
        self.not_held.set()
        self._trusted_until = 0.0  # time.monotonic() until which the held lease is trusted
        self._offset_ms: int | None = None  # this host's clock minus the database's, last known

    def instance(self, offset_ms: int) -> Instance:
        """This gate's row, its clock ``offset_ms`` off the database's (times: the
        database's)."""
        return Instance(
            self.instance_id,
            gate.__version__,
            config_hash(self.service.config),
            socket.gethostname(),
            os.getpid(),
            offset_ms,
            0,
            0,
        )

    async def join(self, timeout: float = JOIN_S) -> None:
        """Wait (``run`` being started) until the first heartbeat is written, at most
        ``timeout`` seconds: a gate that listens after it answers ``/healthz`` 200 from the
        start; one that could not beat in time listens anyway, its ``/healthz`` 503
        ``cluster_joining`` until it does."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.joined.wait()

    def status(self) -> dict[str, Any]:
        """What ``/healthz`` and ``/metrics`` add on PostgreSQL: this gate's id, whether it
        holds the ``timers`` lease, how many gates are live, its clock's offset to the
        database's (ms, at its last heartbeat; None before it) and the problems the live
        gates show (``config_divergent``, ``clock_skew``: ``GateService.cluster``)."""
        health = self.health
        offset = (
            next(
                (g.clock_offset_ms for g in health.live if g.instance_id == self.instance_id), None
            )
            if health is not None
            else None
        )
        return {
            "instance": self.instance_id,
            "lease_holder": self.held.is_set(),
            "live_gates": len(health.live) if health is not None else 0,
            "clock_offset_ms": offset,
            "problems": list(health.problems) if health is not None else [],
        }

    async def run(self, work: Sequence[Work]) -> None:
        """Run until cancelled (the class's docstring)."""
        tasks = [
            asyncio.create_task(self._keep(), name="cluster"),
            asyncio.create_task(self.feed.run(), name="feed"),
            asyncio.create_task(self._lead(work), name="leader-work"),
        ]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._leave()

    def changed(self, changes: list[Change]) -> None:
        """The feed's callback: wake the long-polls of requests resolved (or a question
        revised) on any gate; on the lease holder, also the senders when an entry queued a
        delivery (a new request or revision, a resolution with its notice) and the timers
        when it may bring a deadline nearer (a new request or revision). An acked dispatch
        or a decision that made no revision wakes neither, an entry of any other kind both.
        A gate without the lease runs neither, and they read everything afresh when they
        start."""
        for change in changes:
            if change.kind in WAKING and change.request_id is not None:
                self.service.wake(change.request_id)
        if not self.held.is_set():
            return
        dispatch = expiry = False
        for change in changes:
            kind = NOTICES.get(change.kind)
            if kind is not None:
                dispatch = dispatch or kind.notices_on(self.service.config)
            elif change.revised or change.kind not in IDLE:
                dispatch = expiry = True
        if dispatch:
            self.service.dispatch_wakeup.set()
        if expiry:
            self.service.expiry_wakeup.set()

    async def _keep(self) -> None:
        """Beat and claim every ``renew_s`` on one session (reconnected after a failure);
        without the lease, try again as soon as it would lapse."""
        conn = None
        lost = False  # the session failed and has not been opened again since
        try:
            while True:
                started = time.monotonic()
                self._distrust(started)  # first: a gate thawed after a freeze stops at once
                try:
                    if conn is None:
                        conn = await connect(self.url, "cluster", self.instance_id, self.password)
                    await self._beat(conn)
                    await self._check_key(conn)
                    if self.service.store.fenced is None:
                        delay = await self._claim(conn, started)
                    else:
                        delay = await self._stand_aside(conn)
                except Unavailable as exc:
                    if not lost:  # once per outage
                        log.warning("event=cluster_unavailable message=%s", exc.message)
                    await close_quietly(conn)
                    conn, lost = None, True
                    delay = min(self.renew_s, 1.0)
                else:
                    if lost:
                        log.info("event=cluster_reconnected")
                    lost = False
                self._distrust(time.monotonic())
                await asyncio.sleep(delay)
        finally:
            await close_quietly(conn)

    async def _beat(self, conn: Any) -> None:
        clock = self.clock  # this host's: a pinned one read unpinned, its offset left out
        offset = await measure_offset(
            conn, clock.local_ms if isinstance(clock, PinnedClock) else clock.now_ms
        )
        if offset is None:  # no prompt reading: the last offset stands
            offset = self._offset_ms
        if offset is None:
            raise Unavailable("storage_unavailable", "the database's clock answered too slowly")
        self._offset_ms = offset
        if isinstance(self.service.clock, PinnedClock):  # its senders read the database's time
            self.service.clock.offset_ms = offset
        await beat(conn, self.instance(offset))
        health = assess(self.instance_id, await live(conn))
        before = set(self.health.problems) if self.health is not None else set()
        for problem, detail in zip(health.problems, health.details, strict=True):
            if problem not in before:
                log.warning("event=%s message=%s", problem, detail)
        for problem in before - set(health.problems):
            log.info("event=%s_ended", problem)
        self.health = health
        self.joined.set()

    async def _check_key(self, conn: Any) -> None:
        """Fence the store (``/healthz`` 503, the lease left to another gate: ``_keep``)
        when the newest audit entry is receipted with a key not this gate's: another gate
        rotated the receipt key (``receipt_key_retired``), so no write here could succeed.
        Found at the heartbeat, a quiet gate leaves the balancer and the timers without
        waiting for a write to be refused."""
        if self.service.store.fenced is not None:
            return
        head = await head_entry(conn)
        transactions = self.service.transactions
        if head is not None and not transactions.follows(*head):
            self.service.store.fence(transactions.retired())

    async def _claim(self, conn: Any, started: float) -> float:
        """Claim or renew the lease; return the seconds until the next attempt."""
        term = await claim(conn, TIMERS, self.instance_id, int(self.ttl_s * 1000))
        if term is not None:
            self._trusted_until = started + self.ttl_s * (1 - MARGIN)
            if not self.held.is_set() or self.term is None or self.term.term != term.term:
                log.info("event=lease_acquired lease=%s term=%d", TIMERS, term.term)
            self.term = term
            self.held.set()
            self.not_held.clear()
            return self.renew_s
        self._step_down("another gate holds it")
        other = await current(conn, TIMERS)
        if other is None:
            return 0.0
        lapses_s = max(0.0, (other.expires_at - other.now) / 1000) + 0.05
        return min(self.renew_s, lapses_s)

    async def _stand_aside(self, conn: Any) -> float:
        """This gate writes no more until it restarts (``Store.fenced``: another gate rotated
        the receipt key): it gives up the lease, so another gate runs the timers and the
        senders; returns the seconds until the next beat."""
        self._let_go()
        await release(conn, TIMERS, self.instance_id)
        return self.renew_s

    def _distrust(self, now: float) -> None:
        """Stop the work when the held lease was not renewed in time (``now``: monotonic)."""
        if self.held.is_set() and now >= self._trusted_until:
            self._step_down("not renewed in time")

    def _step_down(self, why: str) -> None:
        if self.held.is_set():
            log.warning("event=lease_lost lease=%s reason=%s", TIMERS, why.replace(" ", "_"))
        self.held.clear()
        self.not_held.set()

    def _let_go(self) -> None:
        """Stop the work and say the lease is given up (its row is the caller's to release)."""
        if self.held.is_set():
            log.info("event=lease_released lease=%s", TIMERS)
        self.held.clear()
        self.not_held.set()

    async def _lead(self, work: Sequence[Work]) -> None:
        """Run ``work`` while the lease is held; stop it when it is lost."""
        while True:
            await self.held.wait()
            tasks = [asyncio.create_task(job()) for job in work]
            lost = asyncio.create_task(self.not_held.wait())
            try:
                await asyncio.wait([lost, *tasks], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (lost, *tasks):
                    task.cancel()
                await asyncio.gather(lost, *tasks, return_exceptions=True)
            ended = [t for t in tasks if not t.cancelled()]
            for task in ended:  # a job that ended by itself (it should not): say so
                log.error("event=leader_work_ended error=%r", task.exception())
            if ended:
                await asyncio.sleep(1.0)  # then start them again, without a hot loop

    async def _leave(self) -> None:
        """A clean stop: give up the lease (another gate takes it at its next attempt) and
        remove this gate's row; best effort, for at most LEAVE_S (a database out of reach
        does not hold the stop: the lease then lapses, the row ages out)."""
        self._let_go()
        with contextlib.suppress(Unavailable, TimeoutError):
            async with asyncio.timeout(LEAVE_S):
                conn = await connect(self.url, "cluster", self.instance_id, self.password)
                try:
                    await release(conn, TIMERS, self.instance_id)
                    await leave_cluster(conn, self.instance_id)
                finally:
                    await close_quietly(conn)
