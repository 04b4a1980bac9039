"""Load generator, run as its own process; prints one JSON object with the figures.

    python -m bench.loadgen decisions --url URL --bodies FILE --concurrency C --secret-env VAR
    python -m bench.loadgen roundtrip --api URL --token-env VAR --concurrency C --count N \
        --pipeline P --step S

``decisions``: every line of FILE is one decision body (compact JSON). All of them are
signed *before* the clock starts (signing is not measured); then C workers POST them, one
request at a time each, over keep-alive connections opened beforehand (C unsigned POSTs
answered 401 warm the connection pool up). OK = HTTP 200 whose body says ``recorded``.

``roundtrip``: each of C workers loops: POST /v1/approvals, then GET /v1/approvals/{id}?wait=
until it is resolved (the relay decides); one round trip = create → resolved, measured.

Latency is per request (per round trip), ``time.perf_counter`` around it; throughput is
OK requests / wall time from the first send to the last answer. Deliberately imports nothing
from the gate.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import sys
import time
from collections import Counter
from typing import Any

import aiohttp

SIGNATURE_HEADER = "X-Draftcat-Signature"


def _stats(latencies: list[float]) -> dict[str, float]:
    values = sorted(latencies)
    if not values:
        return {}

    def pct(q: float) -> float:
        rank = max(1, min(len(values), int(-(-q * len(values) // 100))))
        return values[rank - 1] * 1000

    return {
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "mean": sum(values) / len(values) * 1000,
        "min": values[0] * 1000,
        "max": values[-1] * 1000,
    }


def _sign(secret: bytes, t: int, body: bytes) -> str:
    digest = hmac.new(secret, str(t).encode("ascii") + b"." + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


async def _warm(session: aiohttp.ClientSession, method: str, url: str, n: int) -> None:
    """Open ``n`` keep-alive connections (answers ignored; nothing changes on the server)."""

    async def one() -> None:
        async with session.request(method, url, data=b"") as resp:
            await resp.read()

    await asyncio.gather(*(one() for _ in range(n)))


def _connector(concurrency: int) -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(
        limit=concurrency,
        limit_per_host=concurrency,
        force_close=False,
        enable_cleanup_closed=False,
    )


async def run_decisions(
    url: str, bodies: list[bytes], concurrency: int, secret: bytes
) -> dict[str, Any]:
    """POST every pre-signed decision with ``concurrency`` workers; return the figures."""
    t = int(time.time())
    requests = [
        (
            body,
            {
                "Content-Type": "application/json",
                "X-Hitl-Protocol": "hitl/v0",
                SIGNATURE_HEADER: _sign(secret, t, body),
            },
        )
        for body in bodies
    ]
    latencies = [0.0] * len(requests)
    statuses: Counter[str] = Counter()
    ok = 0
    errors: list[str] = []
    next_index = 0
    workers = max(1, min(concurrency, len(requests)))
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        connector=_connector(concurrency), timeout=timeout, trust_env=False
    ) as session:
        await _warm(session, "POST", url, workers)

        async def worker() -> None:
            nonlocal next_index, ok
            while next_index < len(requests):
                i = next_index
                next_index += 1
                body, headers = requests[i]
                started = time.perf_counter()
                try:
                    async with session.post(url, data=body, headers=headers) as resp:
                        raw = await resp.read()
                        status = resp.status
                    latencies[i] = time.perf_counter() - started
                    statuses[str(status)] += 1
                    if status == 200 and b'"recorded"' in raw:
                        ok += 1
                    elif len(errors) < 5:
                        errors.append(f"{status} {raw[:200].decode('utf-8', 'replace')}")
                except (aiohttp.ClientError, TimeoutError) as exc:
                    latencies[i] = time.perf_counter() - started
                    statuses["error"] += 1
                    if len(errors) < 5:
                        errors.append(f"{type(exc).__name__}: {exc}")

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        elapsed = time.perf_counter() - began
    return {
        "mode": "decisions",
        "concurrency": concurrency,
        "requests": len(requests),
        "ok": ok,
        "statuses": dict(statuses),
        "errors": errors,
        "elapsed_s": elapsed,
        "rps": ok / elapsed if elapsed > 0 else 0.0,
        "latency_ms": _stats(latencies),
    }


async def run_roundtrip(
    api: str, token: str, count: int, concurrency: int, pipeline: str, step: str, wait_s: float
) -> dict[str, Any]:
    """Create → wait until resolved, ``count`` times with ``concurrency`` workers."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    create_url = api.rstrip("/") + "/v1/approvals"
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()
    errors: list[str] = []
    next_index = 0
    workers = max(1, min(concurrency, count))
    bodies = [
        json.dumps(
            {
                "pipeline": pipeline,
                "step": step,
                "run_id": f"bench-rt-{i}",
                "draft": {
                    "content_type": "text/plain",
                    "body": f"Round trip {i}: Rechnung über 1.240,00 € — bitte freigeben.\n",
                },
            },
            ensure_ascii=False,
        ).encode("utf-8")
        for i in range(count)
    ]
    timeout = aiohttp.ClientTimeout(total=wait_s + 60)
    async with aiohttp.ClientSession(
        connector=_connector(concurrency), timeout=timeout, trust_env=False
    ) as session:
        await _warm(session, "GET", api.rstrip("/") + "/healthz", workers)

        async def worker() -> None:
            nonlocal next_index
            while next_index < count:
                i = next_index
                next_index += 1
                started = time.perf_counter()
                try:
                    async with session.post(create_url, data=bodies[i], headers=headers) as resp:
                        created = await resp.json(content_type=None)
                        if resp.status != 201:
                            raise RuntimeError(f"create answered {resp.status}: {created}")
                    poll = f"{create_url}/{created['approval_id']}?wait={wait_s:g}"
                    while True:
                        async with session.get(poll, headers=headers) as resp:
                            view = await resp.json(content_type=None)
                            if resp.status != 200:
                                raise RuntimeError(f"wait answered {resp.status}: {view}")
                        if view["state"] == "resolved":
                            break
                    latencies.append(time.perf_counter() - started)
                    outcomes[str(view["outcome"])] += 1
                except (aiohttp.ClientError, TimeoutError, RuntimeError, KeyError) as exc:
                    outcomes["error"] += 1
                    if len(errors) < 5:
                        errors.append(f"{type(exc).__name__}: {exc}")

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(workers)))
        elapsed = time.perf_counter() - began
    ok = outcomes.get("approved", 0)
    return {
        "mode": "roundtrip",
        "concurrency": concurrency,
        "requests": count,
        "ok": ok,
        "outcomes": dict(outcomes),
        "errors": errors,
        "elapsed_s": elapsed,
        "rps": ok / elapsed if elapsed > 0 else 0.0,
        "latency_ms": _stats(latencies),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run one load, print its JSON figures on stdout."""
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen")
    sub = parser.add_subparsers(dest="mode", required=True)
    dec = sub.add_parser("decisions")
    dec.add_argument("--url", required=True)
    dec.add_argument("--bodies", required=True, help="file: one decision body per line")
    dec.add_argument("--concurrency", type=int, required=True)
    dec.add_argument("--secret-env", required=True)
    rt = sub.add_parser("roundtrip")
    rt.add_argument("--api", required=True)
    rt.add_argument("--token-env", required=True)
    rt.add_argument("--count", type=int, required=True)
    rt.add_argument("--concurrency", type=int, required=True)
    rt.add_argument("--pipeline", required=True)
    rt.add_argument("--step", required=True)
    rt.add_argument("--wait", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.mode == "decisions":
        with open(args.bodies, "rb") as fh:
            bodies = [line for line in fh.read().splitlines() if line.strip()]
        secret = os.environ[args.secret_env].encode("utf-8")
        result = asyncio.run(run_decisions(args.url, bodies, args.concurrency, secret))
    else:
        result = asyncio.run(
            run_roundtrip(
                args.api,
                os.environ[args.token_env],
                args.count,
                args.concurrency,
                args.pipeline,
                args.step,
                args.wait,
            )
        )
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
