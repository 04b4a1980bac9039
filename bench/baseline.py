"""The baseline: a bare aiohttp endpoint that reads the body and verifies the HMAC, nothing else.

    python -m bench.baseline --secret-env VAR

It is the ceiling of our stack (same aiohttp server, same request, same signature check, no
JSON parsing, no database): ``POST /hitl/v0/decisions`` answers 200
``{"status":"recorded",...}`` when the signature is valid and inside ±300 s, 401 otherwise,
413 over 64 KiB. Prints ``listening http://127.0.0.1:PORT`` on stdout, then serves until
SIGTERM. Deliberately imports nothing from the gate. Its process gets the garbage-collector
settings the daemon's ``serve`` process gets (``gate.cli.daemon.tune_gc``, repeated here): the same
stack, tuned the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import hmac
import os
import signal
import sys
import time

from aiohttp import web

MAX_BODY = 64 * 1024
MAX_SKEW_S = 300


def make_app(secret: bytes) -> web.Application:
    """The one-route app."""
    unauthorized = {"status": "unauthorized", "reason": "signature_mismatch"}
    recorded = {"status": "recorded", "resolved": True, "outcome": "approved"}

    async def decisions(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_BODY:
            return web.json_response({"status": "invalid", "reason": "body_too_large"}, status=413)
        raw = await request.read()
        header = request.headers.get("X-Draftcat-Signature", "")
        t_text, v1 = "", []
        for part in header.split(","):
            key, _, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if key == "t":
                t_text = value
            elif key == "v1":
                v1.append(value.lower())
        if not t_text.isdigit() or not v1 or abs(time.time() - int(t_text)) > MAX_SKEW_S:
            return web.json_response(unauthorized, status=401)
        expected = hmac.new(secret, t_text.encode("ascii") + b"." + raw, hashlib.sha256).hexdigest()
        ok = False
        for candidate in v1:
            ok |= hmac.compare_digest(expected, candidate)
        if not ok:
            return web.json_response(unauthorized, status=401)
        return web.json_response(recorded)

    app = web.Application(client_max_size=MAX_BODY * 4)
    app.router.add_post("/hitl/v0/decisions", decisions)
    return app


async def serve(secret: bytes) -> None:
    """Bind 127.0.0.1 on a free port, print the URL, serve until SIGTERM/SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(make_app(secret), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    sys.stdout.write(f"listening http://{host}:{port}/hitl/v0/decisions\n")
    sys.stdout.flush()
    await stop.wait()
    await runner.cleanup()


def main() -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m bench.baseline")
    parser.add_argument("--secret-env", required=True)
    args = parser.parse_args()
    gc.collect()  # as gate.cli.daemon.tune_gc does for the daemon
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
    asyncio.run(serve(os.environ[args.secret_env].encode("utf-8")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
