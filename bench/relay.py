"""A fast local relay for the benchmarks, run as its own process.

    python -m bench.relay capture
    python -m bench.relay auto --secret-env VAR

Both modes answer every dispatch ``202`` at once. ``capture`` keeps, per approval, what a
decision needs (``approval_id``, ``revision``, ``nonce``, ``payload_hash``, ``approvers``)
and hands it out on ``GET /captured`` (a reminder is not captured: ``GET /reminders`` lists
each one's ``approval_id``, ``n`` and arrival time, unix seconds); ``auto`` approves: right
after the ack it signs a decision (approver chosen round-robin from the envelope's
``approvers``) and POSTs it to the envelope's callback URL. ``GET /stats`` reports
counters. Prints
``listening http://127.0.0.1:PORT/relay`` on stdout. Signatures of dispatches are not
checked (the relay's own cost is not what is measured). Imports nothing from the gate.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web


class BenchRelay:
    """State of one relay process."""

    def __init__(self, mode: str, secret: bytes | None) -> None:
        self.mode = mode
        self.secret = secret
        self.captured: dict[str, dict[str, Any]] = {}
        self.reminders: list[dict[str, Any]] = []
        self.counters: Counter[str] = Counter()
        self.session: aiohttp.ClientSession | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.turn = 0

    async def dispatch(self, request: web.Request) -> web.Response:
        raw = await request.read()
        self.counters["dispatches"] += 1
        envelope = json.loads(raw)
        if "reminder" in envelope:
            approval_id, n = envelope["approval_id"], envelope["reminder"]
            self.reminders.append({"approval_id": approval_id, "n": n, "at": time.time()})
        elif self.mode == "capture":
            self.captured[envelope["approval_id"]] = {
                "approval_id": envelope["approval_id"],
                "revision": envelope.get("revision", 1),
                "nonce": envelope["callback"]["nonce"],
                "payload_hash": envelope["payload_hash"],
                "approvers": envelope["approvers"],
                "callback_url": envelope["callback"]["url"],
            }
        else:
            task = asyncio.create_task(self.decide(envelope))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return web.json_response({"status": "accepted"}, status=202)

    async def decide(self, envelope: dict[str, Any]) -> None:
        assert self.session is not None and self.secret is not None
        approvers = envelope["approvers"]
        identity = approvers[self.turn % len(approvers)]
        self.turn += 1
        body = json.dumps(
            {
                "protocol": "hitl/v0",
                "approval_id": envelope["approval_id"],
                "nonce": envelope["callback"]["nonce"],
                "decision": "approve",
                "payload_hash": envelope["payload_hash"],
                "approver": {"id": identity, "display": None, "channel": "bench"},
                "adjust_text": None,
                "decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            separators=(",", ":"),
            ensure_ascii=False,
        ).encode("utf-8")
        t = int(time.time())
        sig = hmac.new(
            self.secret, str(t).encode("ascii") + b"." + body, hashlib.sha256
        ).hexdigest()
        headers = {
            "Content-Type": "application/json",
            "X-Hitl-Protocol": "hitl/v0",
            "X-Draftcat-Signature": f"t={t},v1={sig}",
        }
        try:
            async with self.session.post(
                envelope["callback"]["url"], data=body, headers=headers
            ) as resp:
                await resp.read()
                self.counters[f"decision_{resp.status}"] += 1
        except (aiohttp.ClientError, TimeoutError):
            self.counters["decision_error"] += 1

    async def get_captured(self, request: web.Request) -> web.Response:
        return web.json_response(list(self.captured.values()))

    async def get_reminders(self, request: web.Request) -> web.Response:
        return web.json_response(self.reminders)

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response({"captured": len(self.captured), **self.counters})


async def serve(mode: str, secret: bytes | None) -> None:
    """Bind 127.0.0.1 on a free port, print the URL, serve until SIGTERM/SIGINT."""
    relay = BenchRelay(mode, secret)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    relay.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=512),
        trust_env=False,
        timeout=aiohttp.ClientTimeout(total=60),
    )
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_get("/captured", relay.get_captured)
    app.router.add_get("/stats", relay.get_stats)
    app.router.add_get("/reminders", relay.get_reminders)
    app.router.add_post("/{tail:.*}", relay.dispatch)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    host, port = runner.addresses[0][:2]
    sys.stdout.write(f"listening http://{host}:{port}/relay\n")
    sys.stdout.flush()
    await stop.wait()
    await runner.cleanup()
    for task in list(relay.tasks):
        task.cancel()
    await relay.session.close()


def main() -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.relay")
    parser.add_argument("mode", choices=["capture", "auto"])
    parser.add_argument("--secret-env", default=None)
    args = parser.parse_args()
    secret = None
    if args.mode == "auto":
        if not args.secret_env:
            parser.error("auto needs --secret-env")
        secret = os.environ[args.secret_env].encode("utf-8")
    asyncio.run(serve(args.mode, secret))
    return 0


if __name__ == "__main__":
    sys.exit(main())
