"""``hitl-gate serve``: build both apps, own the background workers, bind, run until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web

from gate.clock import Clock, SystemClock
from gate.config import Config, Secrets, parse_listen
from gate.core.scheduler import run_expiry
from gate.core.service import GateService
from gate.dispatch import Dispatcher
from gate.protocol import DECISIONS_PATH
from gate.store import Store
from gate.web.api import ApiSettings, create_api_app
from gate.web.callback import CallbackSettings, create_callback_app

log = logging.getLogger(__name__)

DISPATCHER = web.AppKey("dispatcher", Dispatcher)
SHUTDOWN_TIMEOUT_S = 10.0


def _workers_ctx(service: GateService, config: Config, secrets: Secrets) -> Callable[
        [web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        await service.store.open()
        session = aiohttp.ClientSession(trust_env=False)
        dispatcher = Dispatcher(service, session, config.relay.url, secrets.relay_secrets[0],
                                config.relay.dispatch_timeout)
        app[DISPATCHER] = dispatcher
        tasks = [asyncio.create_task(dispatcher.run(), name="dispatcher"),
                 asyncio.create_task(run_expiry(service), name="expiry")]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await session.close()
            await service.store.close()
    return ctx


def create_apps(config: Config, secrets: Secrets,
                clock: Clock | None = None) -> tuple[web.Application, web.Application]:
    """Return ``(api_app, callback_app)`` sharing one GateService.

    The api app's cleanup_ctx owns the store, the HTTP client session, the dispatcher
    and the expiry scheduler; set it up before the callback app and clean it up after.
    """
    service = GateService(config, secrets.receipt_key, Store(config.storage.path),
                          clock or SystemClock())
    api_app = create_api_app(service, ApiSettings(secrets.api_token, config.api.max_draft_bytes))
    api_app.cleanup_ctx.append(_workers_ctx(service, config, secrets))
    callback_app = create_callback_app(
        service, CallbackSettings(secrets.relay_secrets, config.relay.security.max_skew))
    return api_app, callback_app


def _bound(runner: web.AppRunner) -> str:
    addr: Any = runner.addresses[0]
    if isinstance(addr, str):
        return f"unix:{addr}"
    host, port = addr[0], addr[1]
    return f"{host}:{port}"


async def _site(runner: web.AppRunner, listen: str) -> web.BaseSite:
    parsed = parse_listen(listen)
    if parsed[0] == "unix":
        site: web.BaseSite = web.UnixSite(runner, parsed[1], shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    else:
        site = web.TCPSite(runner, parsed[1], parsed[2], shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await site.start()
    return site


async def serve(config: Config, secrets: Secrets, clock: Clock | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run the gate until SIGTERM/SIGINT (or ``stop`` is set), then stop cleanly.

    Order: open the store and workers, bind the callback and API listeners, log
    ``event=listening``, then dispatch. On stop: close the callback listener (finishing
    in-flight decisions), then the API, then the workers and the database.
    Raises Unavailable when the database cannot be opened, OSError when a bind fails.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    api_app, callback_app = create_apps(config, secrets, clock)
    api_runner = web.AppRunner(api_app, access_log=None)
    callback_runner = web.AppRunner(callback_app, access_log=None)
    await api_runner.setup()
    try:
        await callback_runner.setup()
        await _site(callback_runner, config.relay.callback_addr)
        await _site(api_runner, config.api.listen)
        callback_bound = _bound(callback_runner)
        base = config.relay.public_url or f"http://{callback_bound}"
        dispatcher = api_app[DISPATCHER]
        dispatcher.callback_url = base.rstrip("/") + DECISIONS_PATH
        dispatcher.ready.set()
        log.info("event=listening callback=http://%s api=%s callback_url=%s db=%s",
                 callback_bound, _api_url(_bound(api_runner)), dispatcher.callback_url,
                 config.storage.path)
        await stop.wait()
        log.info("event=stopping")
    finally:
        await callback_runner.cleanup()
        await api_runner.cleanup()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    log.info("event=stopped")


def _api_url(bound: str) -> str:
    return bound if bound.startswith("unix:") else f"http://{bound}"
