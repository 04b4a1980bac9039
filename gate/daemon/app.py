"""The one composition root: ``build_gate`` wires store, service, metrics, dispatcher and both
apps, for ``hitl-gate serve``, ``hitl-gate verify``'s ephemeral gate and in-process tests."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Middleware
from ulid import ULID

from gate.clock import Clock, PinnedClock, SystemClock
from gate.config import Config, Secrets
from gate.core.service import GateService
from gate.daemon.approval_dispatch import ApprovalDispatch
from gate.daemon.cluster import Cluster, Work
from gate.daemon.delivery import OutboxSender
from gate.daemon.dispatch import BACKOFF_BASE_S, BACKOFF_CAP_S, Dispatcher
from gate.daemon.followups import FollowUps
from gate.daemon.question_notices import QuestionNotices
from gate.daemon.question_sender import QuestionDispatch
from gate.daemon.relay_http import relay_session
from gate.daemon.timers import Timers
from gate.metrics import Metrics
from gate.postgres.target import PgTarget
from gate.protocol import DECISIONS_PATH
from gate.store import Store
from gate.web.api import create_api_app
from gate.web.callback import create_callback_app
from gate.web.common import BODY_TIMEOUT, Handler
from gate.web.keys import ApiSettings, CallbackSettings

log = logging.getLogger(__name__)

# set when the gate stops: the API's waiting long-polls are answered at once
STOPPING = web.AppKey("stopping", asyncio.Event)


@dataclass(frozen=True, slots=True)
class Gate:
    """One gate, wired and not yet running (``build_gate``).

    ``config`` and ``secrets`` are the ones it was built with: a SIGHUP reload
    (``gate.daemon.reload.Reloader``) changes the running settings through the objects'
    ``reconfigure`` methods, not these fields, so read only restart-only settings here.
    ``api_settings`` and ``callback_settings`` are the apps' own (``api_app[SETTINGS]``).
    """

    config: Config
    secrets: Secrets
    store: Store
    service: GateService
    metrics: Metrics
    dispatcher: Dispatcher
    api_settings: ApiSettings
    callback_settings: CallbackSettings
    api_app: web.Application
    callback_app: web.Application
    cluster: Cluster | None = None  # on PostgreSQL: the gates on the database

    @contextlib.asynccontextmanager
    async def storage(self) -> AsyncIterator[None]:
        """Open the store (raises Unavailable when the database cannot be opened); close it
        on exit."""
        await self.store.open()
        try:
            yield
        finally:
            await self.store.close()

    @contextlib.asynccontextmanager
    async def workers(self) -> AsyncIterator[None]:
        """Open the store, settle the receipt key against the audit log (which may refuse
        the start: ``GateService.settle_receipt_key``), and run the dispatcher (idle until
        ``dispatcher.start``) and the scheduler of everything timed (``Timers``); on exit
        stop both (an in-flight dispatch is abandoned: its row stays un-acked and is sent
        again after a restart) and close the database last. With a ``cluster`` the two run
        only while this gate holds the timers' lease (``Cluster.run``), beside the
        heartbeat and the change feed, and the first heartbeat is awaited (``Cluster.join``)."""
        async with self.storage():
            await self.service.settle_receipt_key()
            async with relay_session(self.config.relay.ca_file) as session:
                timers = Timers(self.service, self.metrics)
                if self.cluster is None:
                    tasks = [
                        asyncio.create_task(self.dispatcher.run(session), name="dispatcher"),
                        asyncio.create_task(timers.run(), name="expiry"),
                    ]
                else:
                    work: list[Work] = [functools.partial(self.dispatcher.run, session), timers.run]
                    tasks = [asyncio.create_task(self.cluster.run(work), name="cluster")]
                    await self.cluster.join()  # /healthz is 200 once the gate listens
                try:
                    yield
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    log.info("event=workers_stopped")


def _store(
    config: Config, secrets: Secrets, writer_process: bool, clock: Clock
) -> tuple[Store, Clock]:
    """The store ``config.storage`` names, and the clock the gate runs on: ``clock`` on
    SQLite; on PostgreSQL ``clock`` pinned to the database's time inside each write batch
    (``PinnedClock``: one clock for every gate on the database)."""
    storage = config.storage
    if storage.url is None:
        return Store(storage.sqlite_file(), writer_process=writer_process), clock
    pinned = PinnedClock(clock)
    # the instance id: in gate_instances (gate.daemon.cluster) and in every session's name
    target = PgTarget(storage.url, secrets.storage_password, str(ULID()))
    return Store(target, writer_process=writer_process, clock=pinned), pinned


def build_gate(
    config: Config,
    secrets: Secrets,
    *,
    writer_process: bool,
    clock: Clock | None = None,
    callback_middlewares: Sequence[Middleware] = (),
    dispatch_backoff_s: tuple[float, float] = (BACKOFF_BASE_S, BACKOFF_CAP_S),
) -> Gate:
    """Wire one gate over ``config`` and ``secrets``; nothing is opened or bound yet.

    ``writer_process``: the store's writer runs in a forked process (``serve``) or a thread.
    ``clock`` defaults to the system clock. ``callback_middlewares`` run outside the callback
    app's error middleware (``hitl-gate verify`` observes what a relay sent with one). Both
    apps share one ``Metrics`` (in its own registry), have ``http.body_timeout`` set, and
    share ``STOPPING``: once set, the API's long-polls are answered early.
    ``dispatch_backoff_s`` is the dispatcher's retry backoff ``(base, cap)`` in seconds
    (``gate.daemon.dispatch.backoff_s``); ``serve`` and ``verify`` keep the default (0.5 s
    doubling to 60 s: no config key sets it), in-process tests pass a small one.
    Raises ConfigError when a receipt key file in ``config.receipts`` cannot be used;
    ValueError unless ``0 < base <= cap``.
    """
    own_clock = clock or SystemClock()  # this host's (never pinned to the database's)
    store, clock = _store(config, secrets, writer_process, own_clock)
    service = GateService(
        config,
        secrets.receipt_key,
        store,
        clock,
        previous_receipt_key=secrets.previous_receipt_key,
    )
    metrics = Metrics(config.pipelines)
    store.on_batch = metrics.batch  # each write batch's size and lock hold time
    api_settings = ApiSettings(secrets.api_token, config.api.max_draft_bytes, secrets.admin_token)
    callback_settings = CallbackSettings(secrets.relay_secrets, config.relay.security.max_skew)
    api_app = create_api_app(service, api_settings, metrics)
    callback_app = create_callback_app(service, callback_settings, metrics, callback_middlewares)
    stopping = asyncio.Event()
    for app in (api_app, callback_app):
        app[BODY_TIMEOUT] = config.http.body_timeout
        app[STOPPING] = stopping
    api_app.middlewares.append(_end_long_polls_on_stop)
    dispatcher = Dispatcher(
        service,
        metrics,
        config.relay.url,
        secrets.relay_secrets[0],
        config.relay.dispatch_timeout,
        backoff_base_s=dispatch_backoff_s[0],
        backoff_cap_s=dispatch_backoff_s[1],
    )
    # approvals' dispatches; their reminders, escalations and notices; questions' dispatches
    # and their resolution notices: one delivery loop, one channel adapter each
    dispatcher.outboxes = (
        OutboxSender(dispatcher, ApprovalDispatch(dispatcher)),
        OutboxSender(dispatcher, FollowUps(dispatcher)),
        OutboxSender(dispatcher, QuestionDispatch(dispatcher)),
        OutboxSender(dispatcher, QuestionNotices(dispatcher)),
    )
    return Gate(
        config,
        secrets,
        store,
        service,
        metrics,
        dispatcher,
        api_settings,
        callback_settings,
        api_app,
        callback_app,
        _cluster(config, secrets, service, own_clock),
    )


def _cluster(
    config: Config, secrets: Secrets, service: GateService, clock: Clock
) -> Cluster | None:
    """On PostgreSQL (``storage.url``), this gate's part among the gates on the database
    (under its store's instance id; its offset measured on ``clock``, this host's), its
    status on the service (``/healthz``, ``/metrics``); None on SQLite."""
    where = service.store.where
    if config.storage.url is None or not isinstance(where, PgTarget):
        return None
    cluster = Cluster(
        config.storage.url,
        secrets.storage_password,
        service,
        instance_id=where.instance,
        clock=clock,
    )
    service.cluster_status = cluster.status
    return cluster


def callback_url(config: Config, callback_bound: str) -> str:
    """The decisions URL relays post to: ``relay.public_url`` (default
    ``http://<callback_bound>``, the bound ``host:port``) plus ``/hitl/v0/decisions``."""
    base = config.relay.public_url or f"http://{callback_bound}"
    return base.rstrip("/") + DECISIONS_PATH


@web.middleware
async def _end_long_polls_on_stop(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A long-poll (``GET ...?wait=``) still waiting when the gate stops is answered at once
    with the approval as it stands (the client polls again), instead of holding the stop.

    Runs innermost (after auth): ``handler`` is the route's own handler.
    """
    if request.method != "GET" or "wait" not in request.query:
        return await handler(request)
    poll = asyncio.ensure_future(handler(request))
    stop = asyncio.ensure_future(request.app[STOPPING].wait())
    try:
        await asyncio.wait({poll, stop}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        poll.cancel()
        raise
    finally:
        stop.cancel()
    if poll.done():
        return poll.result()
    poll.cancel()
    try:
        return await poll  # it may have finished before the cancel reached it
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
    rest = [(key, value) for key, value in request.query.items() if key != "wait"]
    return await handler(request.clone(rel_url=request.rel_url.with_query(rest)))
