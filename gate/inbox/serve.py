"""Runs the inbox (``hitl-gate inbox serve``, issue 17): opens its database, serves its one
listener (the relay endpoint; the pages come next), sweeps expired items, stops cleanly on
SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time

from aiohttp import web

from gate.inbox.config import InboxConfig, InboxSecrets, listen_address
from gate.inbox.db import InboxDb
from gate.inbox.mail import Mailer
from gate.inbox.relay import RELAY_PATH, RelayEndpoint

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 5.0
DB_KEY = web.AppKey("inbox_db", InboxDb)


def create_inbox_app(db: InboxDb, endpoint: RelayEndpoint) -> web.Application:
    """The inbox's aiohttp app: ``POST /hitl/v0/relay`` (the gate's dispatches and notices)."""
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app[DB_KEY] = db
    app.router.add_post(RELAY_PATH, endpoint.receive)
    return app


async def sweep(db: InboxDb, stop: asyncio.Event, every_s: float = SWEEP_EVERY_S) -> None:
    """Mark items past ``expires_at`` expired every ``every_s`` seconds until ``stop``."""
    while not stop.is_set():
        count = await db.expire_due(int(time.time() * 1000))
        if count:
            log.info("event=items_expired count=%d", count)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


async def serve_inbox(config: InboxConfig, secrets: InboxSecrets) -> None:
    """Serve until SIGTERM/SIGINT. Raises OSError when the database cannot be opened or
    the listener cannot bind."""
    db = await InboxDb.open(config.database)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    mailer = (
        None if config.mail is None else Mailer(config.mail, config.base_url, secrets.mail_login)
    )
    endpoint = RelayEndpoint(
        db,
        secrets.relay_secrets,
        config.gate.max_skew,
        on_new=None if mailer is None else mailer.item_arrived,
    )
    runner = web.AppRunner(create_inbox_app(db, endpoint), access_log=None)
    sweeper: asyncio.Task[None] | None = None
    mailing: asyncio.Task[None] | None = None
    try:
        await runner.setup()
        where = listen_address(config)
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
            config.database,
        )
        sweeper = asyncio.create_task(sweep(db, stop))
        if mailer is not None:
            mailing = asyncio.create_task(mailer.run(stop))
        await stop.wait()
    finally:
        stop.set()
        if sweeper is not None:
            await sweeper
        if mailing is not None:
            await mailing
        await runner.cleanup()
        await db.close()
        log.info("event=inbox_stopped")
