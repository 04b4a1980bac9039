"""``hitl-gate serve``: build both apps, own the background workers, bind, run until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gate.clock import Clock, SystemClock
from gate.config import Config, Secrets, UnixListen, load, parse_listen, raw_mapping
from gate.core.service import GateService
from gate.daemon.dispatch import Dispatcher, relay_session
from gate.daemon.expiry import run_expiry
from gate.daemon.sdnotify import Notifier
from gate.errors import ConfigError, Unavailable
from gate.protocol import DECISIONS_PATH
from gate.store import Store
from gate.web import api as api_web
from gate.web import callback as callback_web
from gate.web.api import ApiSettings, create_api_app
from gate.web.callback import CallbackSettings, create_callback_app
from gate.web.common import BODY_TIMEOUT, Handler

log = logging.getLogger(__name__)

STOPPING = web.AppKey("stopping", asyncio.Event)


@contextlib.asynccontextmanager
async def _workers(
    service: GateService, config: Config, secrets: Secrets
) -> AsyncIterator[Dispatcher]:
    """Open the store, settle the receipt key against the audit log (which may refuse the
    start: ``GateService.settle_receipt_key``), and run the dispatcher and the expiry
    scheduler; on exit stop both (an in-flight dispatch is abandoned: its row stays un-acked
    and is sent again after a restart) and close the database last."""
    await service.store.open()
    try:
        await service.settle_receipt_key()
        async with relay_session(config.relay.ca_file) as session:
            dispatcher = Dispatcher(
                service,
                session,
                config.relay.url,
                secrets.relay_secrets[0],
                config.relay.dispatch_timeout,
            )
            tasks = [
                asyncio.create_task(dispatcher.run(), name="dispatcher"),
                asyncio.create_task(run_expiry(service), name="expiry"),
            ]
            try:
                yield dispatcher
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                log.info("event=workers_stopped")
    finally:
        await service.store.close()


def create_apps(
    service: GateService, config: Config, secrets: Secrets
) -> tuple[web.Application, web.Application]:
    """Return ``(api_app, callback_app)`` over one GateService, with ``http.body_timeout``
    set and the API's long-polls answered early once ``app[STOPPING]`` is set."""
    api_app = create_api_app(service, ApiSettings(secrets.api_token, config.api.max_draft_bytes))
    callback_app = create_callback_app(
        service, CallbackSettings(secrets.relay_secrets, config.relay.security.max_skew)
    )
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
    if isinstance(parsed, UnixListen):
        site: web.BaseSite = web.UnixSite(runner, parsed.path)
    else:
        site = web.TCPSite(runner, parsed.host, parsed.port)
    await site.start()
    return site


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
    store: Store | None = None
    try:
        store = Store(config.storage.path, writer_process=True)
        store.on_writer_lost = stop.set  # a lost writer: stop cleanly, exit 1 (a restart)
        service = GateService(
            config,
            secrets.receipt_key,
            store,
            clock or SystemClock(),
            previous_receipt_key=secrets.previous_receipt_key,
        )
        api_app, callback_app = create_apps(service, config, secrets)
        async with _workers(service, config, secrets) as dispatcher:
            api_runner = _runner(api_app, config)
            callback_runner = _runner(callback_app, config)
            await api_runner.setup()
            await callback_runner.setup()
            api_socket: Path | None = None  # a unix socket we bound, removed on stop
            try:
                await _site(callback_runner, config.relay.callback_addr)
                await _site(api_runner, config.api.listen)
                listen = parse_listen(config.api.listen)
                api_socket = Path(listen.path) if isinstance(listen, UnixListen) else None
                callback_bound = _bound(callback_runner)
                dispatcher.callback_url = _callback_url(config, callback_bound)
                dispatcher.ready.set()
                api_url = _api_url(_bound(api_runner))
                log.info(
                    "event=listening callback=http://%s api=%s callback_url=%s db=%s writer_pid=%s",
                    callback_bound,
                    api_url,
                    dispatcher.callback_url,
                    config.storage.path,
                    store.writer_pid,
                )
                serving = f"serving: callback=http://{callback_bound} api={api_url}"
                notifier.ready(serving)
                ready = True
                reloader = Reloader(
                    config,
                    secrets,
                    env,
                    service,
                    api_app[api_web.SETTINGS],
                    callback_app[callback_web.SETTINGS],
                    dispatcher,
                    callback_bound,
                    notifier,
                    serving,
                )
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
    if store is not None and store.writer_lost:
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


# What a reload cannot change in a running daemon: bound sockets, the open database, the
# relay HTTP session (its CA bundle), the runners' timeouts, the app's body limit, and the
# receipt keys (held by GateService; changing the HMAC key mid-log would also split the
# audit trail between two keys). Changing any of them needs a restart.
RESTART_ONLY: tuple[tuple[str, Callable[[Config], Any]], ...] = (
    ("relay.callback_addr", lambda c: c.relay.callback_addr),
    ("api.listen", lambda c: c.api.listen),
    ("storage.path", lambda c: c.storage.path),
    ("relay.ca_file", lambda c: c.relay.ca_file),
    ("api.max_draft_bytes", lambda c: c.api.max_draft_bytes),
    ("http", lambda c: c.http),
    ("receipts", lambda c: c.receipts),
)


_RESTART_ERROR = "{}: cannot change while running (restart to apply it)"


def _raw_restart_changes(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    """``RESTART_ONLY`` settings whose YAML differs between two versions of the file (for a
    file that does not validate, so its typed values cannot be compared)."""
    if old is None or new is None:
        return []

    def at(data: Any, dotted: str) -> Any:
        for key in dotted.split("."):
            data = data.get(key) if isinstance(data, dict) else None
        return data

    return [
        _RESTART_ERROR.format(path) for path, _ in RESTART_ONLY if at(old, path) != at(new, path)
    ]


class Reloader:
    """SIGHUP: re-read the config file and its secrets; apply them to new work, or refuse.

    Applied on success (all at once, between two requests): operators, pipelines, steps,
    budgets and limits (``service.config``), the rate limit, the relay secrets accepted on
    decisions and the skew window, the API token, and the relay URL, signing secret,
    timeout and public callback URL of future dispatches. A pending approval keeps the
    scope and quorum frozen at its creation. Refused, with every error logged as
    ``event=reload_refused`` and the running config kept: anything ``check-config`` or a
    start would refuse (including missing secrets), and a change of a ``RESTART_ONLY``
    setting or of the receipt key. systemd sees ``RELOADING=1`` then ``READY=1`` either way.
    """

    def __init__(
        self,
        config: Config,
        secrets: Secrets,
        environ: Mapping[str, str],
        service: GateService,
        api_settings: ApiSettings,
        callback_settings: CallbackSettings,
        dispatcher: Dispatcher,
        callback_bound: str,
        notifier: Notifier,
        serving: str,
    ) -> None:
        self.config = config
        self.secrets = secrets
        self.environ = environ
        self.service = service
        self.api_settings = api_settings
        self.callback_settings = callback_settings
        self.dispatcher = dispatcher
        self.callback_bound = callback_bound
        self.notifier = notifier
        self.serving = serving
        # the running config's file as plain YAML, to name restart-only changes even in a
        # new file that does not validate
        self._raw = raw_mapping(config.source) if config.source is not None else None
        self._checked_raw: dict[str, Any] | None = self._raw

    def check(self) -> tuple[Config, Secrets] | list[str]:
        """Load and validate the config file again; return it with its secrets, or errors."""
        source = self.config.source
        if source is None:
            return ["the running config was not read from a file; nothing to reload"]
        raw = raw_mapping(source)
        try:
            config, secrets = load(source, self.environ)
        except ConfigError as exc:
            return list(exc.errors) + _raw_restart_changes(self._raw, raw)
        errors = [
            _RESTART_ERROR.format(path)
            for path, get in RESTART_ONLY
            if get(config) != get(self.config)
        ]
        if not hmac.compare_digest(secrets.receipt_key, self.secrets.receipt_key):
            errors.append(
                f"receipts.key_env: the receipt key ({config.receipts.key_env})"
                " cannot change while running (restart to apply it)"
            )
        if not errors:
            self._checked_raw = raw  # becomes the running file's YAML once applied
        return errors or (config, secrets)

    async def reload(self) -> bool:
        """Apply the config file as it is now; True if applied, False if refused."""
        self.notifier.reloading()
        log.info("event=reloading config=%s", self.config.source)
        result = await asyncio.to_thread(self.check)
        if isinstance(result, list):
            for error in result:
                log.error("event=reload_refused error=%s", error)
            log.error("event=reload_refused errors=%d kept=running_config", len(result))
            self.notifier.ready(
                f"{self.serving} (last reload refused: {len(result)} "
                "errors, see the log; running config kept)"
            )
            return False
        config, secrets = result
        for warning in secrets.warnings:
            log.warning("event=weak_secret warning=%s", warning)
        self.apply(config, secrets)
        steps = sum(len(p.steps) for p in config.pipelines)
        log.info(
            "event=reloaded pipelines=%d steps=%d operators=%d relay_secrets=%d",
            len(config.pipelines),
            steps,
            len(config.relay.operators),
            len(secrets.relay_secrets),
        )
        self.notifier.ready(f"{self.serving} (config reloaded)")
        return True

    def apply(self, config: Config, secrets: Secrets) -> None:
        """Swap the settings in place; no await, so no request sees half of them."""
        self.service.reconfigure(config)
        self.callback_settings.relay_secrets = secrets.relay_secrets
        self.callback_settings.max_skew_s = config.relay.security.max_skew
        self.api_settings.token = secrets.api_token
        self.dispatcher.relay_url = config.relay.url
        self.dispatcher.secret = secrets.relay_secrets[0]
        self.dispatcher.timeout_s = config.relay.dispatch_timeout
        self.dispatcher.callback_url = _callback_url(config, self.callback_bound)
        self.config, self.secrets = config, secrets
        self._raw = self._checked_raw


def _callback_url(config: Config, callback_bound: str) -> str:
    base = config.relay.public_url or f"http://{callback_bound}"
    return base.rstrip("/") + DECISIONS_PATH


def _api_url(bound: str) -> str:
    return bound if bound.startswith("unix:") else f"http://{bound}"
