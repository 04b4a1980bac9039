"""``hitl-gate serve``: build both apps, own the background workers, bind, run until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gate.clock import Clock, SystemClock
from gate.config import Config, Secrets, parse_listen
from gate.core.scheduler import run_expiry
from gate.core.service import GateService
from gate.dispatch import Dispatcher, relay_session
from gate.protocol import DECISIONS_PATH
from gate.store import Store
from gate.web.api import ApiSettings, create_api_app
from gate.web.callback import CallbackSettings, create_callback_app
from gate.web.common import BODY_TIMEOUT, Handler

log = logging.getLogger(__name__)

STOPPING = web.AppKey("stopping", asyncio.Event)


@contextlib.asynccontextmanager
async def _workers(service: GateService, config: Config,
                   secrets: Secrets) -> AsyncIterator[Dispatcher]:
    """Open the store and run the dispatcher and the expiry scheduler; on exit stop both
    (an in-flight dispatch is abandoned: its row stays un-acked and is sent again after a
    restart) and close the database last."""
    await service.store.open()
    try:
        async with relay_session(config.relay.ca_file) as session:
            dispatcher = Dispatcher(service, session, config.relay.url,
                                    secrets.relay_secrets[0], config.relay.dispatch_timeout)
            tasks = [asyncio.create_task(dispatcher.run(), name="dispatcher"),
                     asyncio.create_task(run_expiry(service), name="expiry")]
            try:
                yield dispatcher
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                log.info("event=workers_stopped")
    finally:
        await service.store.close()


def create_apps(service: GateService, config: Config,
                secrets: Secrets) -> tuple[web.Application, web.Application]:
    """Return ``(api_app, callback_app)`` over one GateService, with ``http.body_timeout``
    set and the API's long-polls answered early once ``app[STOPPING]`` is set."""
    api_app = create_api_app(service, ApiSettings(secrets.api_token, config.api.max_draft_bytes))
    callback_app = create_callback_app(
        service, CallbackSettings(secrets.relay_secrets, config.relay.security.max_skew))
    stopping = asyncio.Event()
    for app in (api_app, callback_app):
        app[BODY_TIMEOUT] = config.http.body_timeout
        app[STOPPING] = stopping
    api_app.middlewares.append(_end_long_polls_on_stop)
    return api_app, callback_app


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


def _bound(runner: web.AppRunner) -> str:
    addr: Any = runner.addresses[0]
    if isinstance(addr, str):
        return f"unix:{addr}"
    host, port = addr[0], addr[1]
    return f"{host}:{port}"


async def _site(runner: web.AppRunner, listen: str) -> web.BaseSite:
    parsed = parse_listen(listen)
    if parsed[0] == "unix":
        site: web.BaseSite = web.UnixSite(runner, parsed[1])
    else:
        site = web.TCPSite(runner, parsed[1], parsed[2])
    await site.start()
    return site


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's per-connection logger. A malformed request (bad request line, header too
    long, broken chunking) is the client's problem: one ``event=bad_request`` line without
    traceback and without the offending bytes (they may hold a token). Anything else keeps
    its traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True,
                  **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError):
            peer = args[0] if args else None
            self.logger.info("event=bad_request peer=%s status=%s error=%s", peer, exc.code,
                             type(exc).__name__)
        else:
            self.logger.error(msg, *args, exc_info=exc_info, **kwargs)


_SERVER_LOG = _ServerLog(logging.getLogger("aiohttp.server"), {})


def _runner(app: web.Application, config: Config) -> web.AppRunner:
    """An AppRunner whose connections must deliver complete headers within
    ``http.header_timeout`` (aiohttp's keep-alive timer: it closes a connection still
    waiting for a complete request, from connect or from the previous answer), and which
    gives in-flight requests ``http.shutdown_timeout`` to finish on stop. aiohttp already
    bounds a header line to 8190 bytes and a request to 128 headers (400 beyond)."""
    return web.AppRunner(app, access_log=None, keepalive_timeout=config.http.header_timeout,
                         shutdown_timeout=config.http.shutdown_timeout, logger=_SERVER_LOG)


async def serve(config: Config, secrets: Secrets, clock: Clock | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run the gate until SIGTERM/SIGINT (or ``stop`` is set), then stop cleanly.

    Order: open the store and workers, bind the callback and API listeners, log
    ``event=listening``, then dispatch. On stop: both listeners stop accepting at once;
    waiting long-polls are answered with the current state; in-flight requests get
    ``http.shutdown_timeout`` to finish (a decision's transaction commits whole or not at
    all); then the dispatcher and the expiry scheduler stop and the database closes last.
    Raises Unavailable when the database cannot be opened, OSError when a bind fails.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        service = GateService(config, secrets.receipt_key, Store(config.storage.path),
                              clock or SystemClock())
        api_app, callback_app = create_apps(service, config, secrets)
        async with _workers(service, config, secrets) as dispatcher:
            api_runner = _runner(api_app, config)
            callback_runner = _runner(callback_app, config)
            await api_runner.setup()
            await callback_runner.setup()
            try:
                await _site(callback_runner, config.relay.callback_addr)
                await _site(api_runner, config.api.listen)
                callback_bound = _bound(callback_runner)
                base = config.relay.public_url or f"http://{callback_bound}"
                dispatcher.callback_url = base.rstrip("/") + DECISIONS_PATH
                dispatcher.ready.set()
                log.info("event=listening callback=http://%s api=%s callback_url=%s db=%s",
                         callback_bound, _api_url(_bound(api_runner)), dispatcher.callback_url,
                         config.storage.path)
                await stop.wait()
                log.info("event=stopping")
            finally:
                api_app[STOPPING].set()
                await asyncio.gather(callback_runner.cleanup(), api_runner.cleanup())
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("event=stopped")


def _api_url(bound: str) -> str:
    return bound if bound.startswith("unix:") else f"http://{bound}"
