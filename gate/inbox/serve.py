"""Runs the inbox (``hitl-gate inbox serve``): opens its database, fetches the
approvers' credentials from the gate, serves its one listener (the relay endpoint and the
pages), sweeps (expired items, sessions and sign-in challenges every 5 s, credentials every
60 s), stops cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path

from aiohttp import web

from gate.config.values import TcpListen, parse_listen
from gate.inbox.app import create_inbox_app
from gate.inbox.config import InboxConfig, InboxSecrets, relying_party
from gate.inbox.credentials_cache import FETCH_FAILURES, CredentialsCache
from gate.inbox.db import DatabaseUnavailable
from gate.inbox.gate_client import fetch_credentials
from gate.inbox.mail import Mailer
from gate.inbox.metrics import InboxMetrics
from gate.inbox.relay import RELAY_PATH, RelayEndpoint
from gate.inbox.state import InboxState
from gate.postgres.target import PgTarget
from gate.protocol.credentials import CredentialsAnswer

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 5.0

__all__ = ["SWEEP_EVERY_S", "create_inbox_app", "serve_inbox", "sweep"]


async def sweep(state: InboxState, stop: asyncio.Event, every_s: float = SWEEP_EVERY_S) -> None:
    """Every ``every_s`` seconds until ``stop``: mark items past ``expires_at`` expired, end
    expired sessions, delete expired challenges, batches and old sign-in tries (a database
    that cannot answer is logged and tried again next round), refresh the credentials when
    older than 60 s (or never fetched)."""
    while not stop.is_set():
        now = int(time.time() * 1000)
        try:
            count = await state.db.expire_due(now)
            if count:
                log.info("event=items_expired count=%d", count)
            await state.db.end_sessions(now)
            await state.shortlived.prune(now)
        except DatabaseUnavailable as exc:  # e.g. another inbox held the file's write lock
            log.warning('event=inbox_sweep_failed why="%s"', exc)
        await state.credentials.refresh_if_due()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def credentials_cache(
    config: InboxConfig, secrets: InboxSecrets, metrics: InboxMetrics
) -> CredentialsCache:
    """The cache of the gate's credentials for this config (signed with the relay secret);
    a fetch that fails counts as a ``credentials`` gate error in ``metrics``."""

    async def fetch() -> CredentialsAnswer:
        try:
            return await fetch_credentials(
                config.gate.callback_url, secrets.relay_secrets, config.gate.max_skew
            )
        except FETCH_FAILURES:
            metrics.gate_failed("credentials")
            raise

    return CredentialsCache(fetch, relying_party(config))


def database_of(config: InboxConfig, secrets: InboxSecrets) -> Path | PgTarget:
    """Where the inbox keeps its state: ``database`` (a SQLite file), or the PostgreSQL
    database of ``storage.url`` with the password ``storage.password_env`` names."""
    if config.storage is None or config.storage.url is None:
        return config.database
    return PgTarget(config.storage.url, secrets.database_password)


async def serve_inbox(config: InboxConfig, secrets: InboxSecrets) -> None:
    """Serve until SIGTERM/SIGINT. Raises OSError when the database cannot be opened or
    the listener cannot bind. An unreachable gate is logged and retried by the sweep."""
    from gate.inbox.db import InboxDb  # noqa: PLC0415 - only when serving

    db = await InboxDb.open(database_of(config, secrets))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = InboxMetrics()
    mailer: Mailer | None = None
    if config.mail is not None:
        mailer = Mailer(config.mail, config.base_url, secrets.mail_login, on_result=metrics.mailed)
    tell = None if mailer is None else mailer.tell
    endpoint = RelayEndpoint(db, secrets.relay_secrets, config.gate.max_skew, tell=tell)
    cache = credentials_cache(config, secrets, metrics)
    state = InboxState(db, config, secrets, relying_party(config), cache, metrics=metrics)
    runner = web.AppRunner(create_inbox_app(state, endpoint), access_log=None)
    sweeper: asyncio.Task[None] | None = None
    mailing: asyncio.Task[None] | None = None
    try:
        await cache.refresh()
        await runner.setup()
        where = parse_listen(config.listen)
        assert isinstance(where, TcpListen)  # validated by check_tcp_addr
        await web.TCPSite(runner, where.host, where.port).start()
        host, port = runner.addresses[0][:2]
        url = config.base_url
        if config.public_url is None and where.port == 0:
            url = url.rsplit(":", 1)[0] + f":{port}"
        log.info(
            "event=inbox_ready url=%s relay_url=http://%s:%d%s database=%s",
            url,
            host if ":" not in host else f"[{host}]",
            port,
            RELAY_PATH,
            config.describe_database,
        )
        sweeper = asyncio.create_task(sweep(state, stop))
        if mailer is not None:
            mailing = asyncio.create_task(mailer.run(stop))
        await stop.wait()
    finally:
        stop.set()
        if sweeper is not None:
            await sweeper
        if mailing is not None:  # best effort: a mail being sent is not waited for
            mailing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await mailing
        await runner.cleanup()
        await db.close()
        log.info("event=inbox_stopped")
