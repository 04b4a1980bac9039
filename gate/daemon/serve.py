"""``hitl-gate serve``: bind the built gate's listeners, run its workers, handle signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gate.clock import Clock
from gate.config import Config, Secrets, UnixListen, parse_listen
from gate.daemon.app import STOPPING, Gate, build_gate, callback_url
from gate.daemon.reload import Reloader
from gate.daemon.sdnotify import Notifier
from gate.errors import Unavailable

log = logging.getLogger(__name__)


def _bound(runner: web.AppRunner) -> str:
    addr: Any = runner.addresses[0]
    return f"unix:{addr}" if isinstance(addr, str) else f"{addr[0]}:{addr[1]}"


async def _site(runner: web.AppRunner, listen: str) -> Path | None:
    """Bind ``runner`` to ``listen``; return the path of the unix socket it bound (removed
    on stop), None for a TCP address."""
    parsed = parse_listen(listen)
    if isinstance(parsed, UnixListen):
        await web.UnixSite(runner, parsed.path).start()
        return Path(parsed.path)
    await web.TCPSite(runner, parsed.host, parsed.port).start()
    return None


class _ServerLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's per-connection logger. A malformed request (bad request line, header too
    long, broken chunking) is the client's problem: one ``event=bad_request`` line without
    traceback and without the offending bytes (they may hold a token). Anything else keeps
    its traceback."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError):
            peer = args[0] if args else None
            self.logger.info(
                "event=bad_request peer=%s status=%s error=%s", peer, exc.code, type(exc).__name__
            )
        else:
            self.logger.error(msg, *args, exc_info=exc_info, **kwargs)


_SERVER_LOG = _ServerLog(logging.getLogger("aiohttp.server"), {})


def _runner(app: web.Application, config: Config) -> web.AppRunner:
    """An AppRunner whose connections must deliver complete headers within
    ``http.header_timeout`` (aiohttp's keep-alive timer: it closes a connection still
    waiting for a complete request, from connect or from the previous answer), and which
    gives in-flight requests ``http.shutdown_timeout`` to finish on stop. aiohttp already
    bounds a header line to 8190 bytes and a request to 128 headers (400 beyond)."""
    return web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=config.http.header_timeout,
        shutdown_timeout=config.http.shutdown_timeout,
        logger=_SERVER_LOG,
    )


async def serve(
    config: Config,
    secrets: Secrets,
    clock: Clock | None = None,
    stop: asyncio.Event | None = None,
    environ: Mapping[str, str] | None = None,
) -> None:
    """Run the gate until SIGTERM/SIGINT (or ``stop`` is set), then stop cleanly.

    Order: open the store and workers, bind the callback and API listeners, log
    ``event=listening``, tell systemd ``READY=1`` (when ``NOTIFY_SOCKET`` is set), then
    dispatch. SIGHUP re-reads the config file and its secrets (``Reloader``). On stop:
    ``STOPPING=1``; both listeners stop accepting at once; waiting long-polls are answered
    with the current state; in-flight requests get ``http.shutdown_timeout`` to finish (a
    decision's transaction commits whole or not at all); then the dispatcher and the expiry
    scheduler stop and the database closes last. ``WATCHDOG=1`` is sent every
    ``WATCHDOG_USEC``/2 while the event loop runs. ``environ`` (default ``os.environ``)
    holds ``NOTIFY_SOCKET``, ``WATCHDOG_*`` and the secrets read again on reload.
    Raises Unavailable when the database cannot be opened, OSError when a bind fails.
    """
    stop = stop or asyncio.Event()
    env = os.environ if environ is None else environ
    notifier = Notifier(env)
    hup = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # from the start: SIGHUP's default action would kill a daemon still starting up
    loop.add_signal_handler(signal.SIGHUP, hup.set)
    watchdog = asyncio.create_task(notifier.run_watchdog(), name="watchdog")
    notifier.status("starting: opening the database")
    ready = False
    gate: Gate | None = None
    try:
        gate = build_gate(config, secrets, writer_process=True, clock=clock)
        gate.store.on_writer_lost = stop.set  # a lost writer: stop cleanly, exit 1 (a restart)
        api_app, callback_app, dispatcher = gate.api_app, gate.callback_app, gate.dispatcher
        async with gate.workers():
            api_runner = _runner(api_app, config)
            callback_runner = _runner(callback_app, config)
            await api_runner.setup()
            await callback_runner.setup()
            api_socket: Path | None = None  # a unix socket we bound, removed on stop
            try:
                await _site(callback_runner, config.relay.callback_addr)
                api_socket = await _site(api_runner, config.api.listen)
                callback_bound = _bound(callback_runner)
                gate.service.invites.callback_bound = callback_bound  # passkeys on localhost
                dispatcher.start(callback_url(config, callback_bound))
                api_bound = _bound(api_runner)
                api_url = api_bound if api_bound.startswith("unix:") else f"http://{api_bound}"
                log.info(
                    "event=listening callback=http://%s api=%s callback_url=%s db=%s writer_pid=%s",
                    callback_bound,
                    api_url,
                    dispatcher.callback_url,
                    config.storage.describe(),
                    gate.store.writer_pid,
                )
                serving = f"serving: callback=http://{callback_bound} api={api_url}"
                notifier.ready(serving)
                ready = True
                reloader = Reloader(gate, env, callback_bound, notifier, serving)
                await _until_stopped(stop, hup, reloader.reload)
                log.info("event=stopping")
            finally:
                notifier.stopping()
                api_app[STOPPING].set()
                await asyncio.gather(callback_runner.cleanup(), api_runner.cleanup())
                if api_socket is not None:
                    with contextlib.suppress(OSError):
                        api_socket.unlink()
    except BaseException as exc:
        if not ready:
            notifier.status(f"failed to start: {type(exc).__name__}")
        raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        watchdog.cancel()
        await asyncio.gather(watchdog, return_exceptions=True)
    log.info("event=stopped")
    if gate is not None and gate.store.writer_lost:
        raise Unavailable(
            "storage_unavailable",
            "the database writer process exited; the gate stopped (a restart starts a new writer)",
        )


async def _until_stopped(
    stop: asyncio.Event, hup: asyncio.Event, reload: Callable[[], Any]
) -> None:
    """Wait for ``stop``; each time ``hup`` is set meanwhile, clear it and ``await reload()``.
    SIGHUPs arriving during a reload coalesce into one more reload after it."""
    while not stop.is_set():
        stopped = asyncio.ensure_future(stop.wait())
        hupped = asyncio.ensure_future(hup.wait())
        try:
            await asyncio.wait({stopped, hupped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            hupped.cancel()
        if stop.is_set():
            return
        hup.clear()
        await reload()
