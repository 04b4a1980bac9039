"""Runs the reference relay (``hitl-gate relay``): the listener that takes every POST to
``Relay.receive``, the signals that stop it, the terminal and the worker that handles the
queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from gate.config import TcpListen, parse_listen
from gate.protocol.relay_inbound import MAX_DISPATCH_BYTES
from gate.tools.reference_relay.approver_key import ApproverKey
from gate.tools.reference_relay.relay import AutoDecision, Relay
from gate.tools.reference_relay.terminal import LogHold, Terminal
from gate.tools.reference_relay.view import greeting

# the relay's log lines keep the logger name they had before this module was split out
log = logging.getLogger("gate.tools.reference_relay.relay")


async def run_relay(
    listen: str,
    secret: str,
    identities: Sequence[str],
    auto: AutoDecision | None,
    max_skew: float,
    auto_answer: str | None = None,
    approver_key: ApproverKey | None = None,
) -> None:
    """Serve the relay on ``listen`` (``host:port``) until SIGINT/SIGTERM; with ``auto``,
    ``auto_answer`` answers every question; with ``approver_key`` every decision
    is signed by it."""
    import signal

    parsed = parse_listen(listen)
    if not isinstance(parsed, TcpListen):
        raise OSError("the reference relay listens on host:port only")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=30), trust_env=False
    ) as session:
        hold = LogHold.install() if auto is None else None
        terminal = Terminal.open(loop, hold) if auto is None else Terminal.for_auto(loop)
        relay = Relay(
            secret, identities, auto, max_skew, session, terminal, auto_answer, approver_key
        )
        app = web.Application(client_max_size=MAX_DISPATCH_BYTES + 1024)
        app.router.add_post("/{tail:.*}", relay.receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, parsed.host, parsed.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        log.info(
            "event=relay_listening url=http://%s:%d/ mode=%s",
            host,
            port,
            f"auto:{auto.verb}" if auto else "terminal",
        )
        if approver_key is not None:
            log.info("event=approver_key credential_id=%s", approver_key.credential_id)
        if auto is None:
            terminal.say(greeting(f"http://{host}:{port}/", identities, terminal.interactive))
        worker = asyncio.create_task(relay.work())
        try:
            await stop.wait()
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await runner.cleanup()
            terminal.close()
