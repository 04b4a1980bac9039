"""The callbacks a relay sends ``hitl-gate verify``'s ephemeral gate (SPEC §6): recorded by an
observer middleware, picked by the id they name, waited for after a dispatch (``Run``), and
replayed or re-signed for the gate probes."""

from __future__ import annotations

import asyncio
import json
import secrets as pysecrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from gate.core.service import GateService
from gate.daemon.relay_http import SendResult, post_signed
from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.canonical import wire_json
from gate.tools.conformance.checks import (
    Awaited,
    CheckResult,
    Observed,
    judge_ack,
    judge_arrival,
    judge_refusal,
    not_run,
    probe,
)
from gate.tools.conformance.ephemeral import ACK_TIMEOUT_S
from gate.web.common import Handler

Refused = tuple[str, SendResult, str, str]
"""A bad dispatch the relay must refuse: its check name, the relay's answer to it, what is
wrong with it (``a bad signature``) and the id it was for."""


@dataclass(frozen=True, slots=True)
class Run:
    """One ``hitl-gate verify`` run: the ephemeral gate's ``service``, the HTTP ``session``,
    the relay under test (``relay_url``, the shared ``secret``, the ``approver`` it decides
    as), the gate's decision endpoint as this host reaches it (``local_url``) and as the
    relay does (``callback``), what reached that endpoint (``seen``; ``changed`` is set on
    each arrival) and how long a human may take (``timeout_s``, seconds)."""

    service: GateService
    session: aiohttp.ClientSession
    relay_url: str
    secret: str
    approver: str
    local_url: str
    callback: str
    seen: list[Observed]
    changed: asyncio.Event
    timeout_s: float

    async def send(
        self, body: bytes, timeout_s: float, t: int | None = None, forged: bool = False
    ) -> SendResult:
        """POST ``body`` (a dispatch or a notice) to the relay as the gate sends it, signed
        at unix second ``t`` (default now) with the shared secret, or with ``forged`` with
        a random other secret (a relay must refuse it); ``timeout_s`` bounds the ack."""
        t = int(time.time()) if t is None else t
        signature = None
        if forged:
            signature = signing.sign("not-the-shared-secret-" + pysecrets.token_hex(8), t, body)
        return await post_signed(
            self.session, self.relay_url, body, self.secret, t, timeout_s, signature=signature
        )

    async def exchange(
        self,
        awaited: Awaited,
        request_id: str,
        body: bytes,
        bad: Sequence[Refused],
        judge: Callable[[Observed], list[CheckResult]],
        grace_s: float,
    ) -> tuple[list[CheckResult], Observed | None]:
        """Send ``body``, the dispatch of ``request_id``, to the relay and judge what follows,
        in report order: the ack (check ``awaited.ack``), the callback's arrival
        (``judge_arrival``) and, when it came, the callback itself (``judge``); then, after
        ``grace_s`` more seconds, each of the ``bad`` dispatches sent before it refused with
        no callback for it (``judge_refusal``). Returns the checks and the callback (None
        when none came)."""
        sent_at = time.time()
        ack = await self.send(body, ACK_TIMEOUT_S)
        checks = [replace(judge_ack(ack.status, ack.error, ack.elapsed_s), name=awaited.ack)]
        found = await self.arrival(awaited.key, request_id, ack, grace_s)
        acked = ack.error is None
        checks += judge_arrival(awaited, found, acked, sent_at, self.timeout_s, self.callback)
        if found is not None:
            checks += judge(found)
        # give a relay that wrongly forwarded the bad dispatches time to answer them too
        await asyncio.sleep(grace_s)
        answers = (ack, *(result for _, result, _, _ in bad))
        answered = any(result.status is not None for result in answers)
        for name, result, what, bad_id in bad:
            seen = callbacks_for(self.seen, bad_id, awaited.key)
            checks.append(judge_refusal(name, result.status, result.error, what, seen, answered))
        return checks, found

    async def arrival(
        self, key: str, request_id: str, ack: SendResult, grace_s: float
    ) -> Observed | None:
        """The first callback naming ``request_id`` as ``key`` (``callbacks_for``) after its
        dispatch was answered ``ack``: waited for up to ``timeout_s`` (a human may need it)
        when acked, ``grace_s`` when the relay answered non-2xx (it may still have passed it
        on), not at all without an HTTP answer. Woken by ``changed``; None when none came."""
        wait_s = self.timeout_s if ack.error is None else grace_s if ack.status is not None else 0.0
        deadline = time.monotonic() + wait_s
        while wait_s:
            found = callbacks_for(self.seen, request_id, key)
            if found:
                return found[0]
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), timeout=left)
            except TimeoutError:
                return None
        return None


def observer(seen: list[Observed], changed: asyncio.Event, now: Callable[[], float]) -> Middleware:
    """A callback-listener middleware that records every request (raw body, headers,
    ``now()`` seconds at receipt, the gate's status and decoded answer) in ``seen`` and sets
    ``changed``."""

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPException:
            raw = b""
        received = now()
        response = await handler(request)
        answer: Any = None
        if isinstance(response, web.Response) and response.body is not None:
            try:
                answer = json.loads(bytes(response.body))  # type: ignore[arg-type]
            except (ValueError, TypeError):
                answer = None
        headers = {k.lower(): v for k, v in request.headers.items()}
        seen.append(Observed(raw, headers, received, response.status, answer))
        changed.set()
        return response

    return observe


def callbacks_for(seen: list[Observed], id_: str, key: str = "approval_id") -> list[Observed]:
    """The callbacks in ``seen`` whose body names ``id_`` as ``key`` (``approval_id``, or
    ``question_id`` for a question's answers)."""
    return [obs for obs in seen if (obs.body() or {}).get(key) == id_]


Probe = tuple[str, dict[str, Any], tuple[str, ...], int, tuple[str, ...]]
"""A gate probe: its check name, the changes to the template and the keys it drops, the
status and the reasons the gate must refuse it with."""


async def run_probes(
    run: Run, template: dict[str, Any], probes: Sequence[Probe]
) -> list[CheckResult]:
    """Each of ``probes`` in order: ``template`` (an accepted callback) without the keys it
    drops, updated with its changes, signed now with ``run.secret`` and POSTed to the gate
    at ``run.local_url`` (``probe``: it passes only when refused with its status and one of
    its reasons)."""
    results = []
    for name, changes, drop, status, reasons in probes:
        raw = wire_json({**{k: v for k, v in template.items() if k not in drop}, **changes})
        headers = {
            "Content-Type": "application/json",
            PROTOCOL_HEADER: PROTOCOL,
            SIGNATURE_HEADER: signing.sign(run.secret, int(time.time()), raw),
        }
        results.append(await probe(run.session, run.local_url, raw, headers, name, status, reasons))
    return results


async def probe_gate(
    run: Run,
    callback: Observed | None,
    awaited: Awaited,
    names: Sequence[str],
    replayed: tuple[str, ...],
    aim: Callable[[dict[str, Any]], Awaitable[list[Probe]]],
) -> list[CheckResult]:
    """The gate-side checks ``names`` of the relay's ``callback`` (an ``awaited.noun``),
    POSTed to the gate at ``run.local_url``: the callback replayed as received (``names[0]``,
    refused 409 with one of ``replayed``), then the probes ``aim`` builds from its body
    (``run_probes``, re-signed with ``run.secret``). Without a callback the gate accepted,
    all reported not run (fix the last of ``awaited.judged`` first)."""
    template = callback.body() if callback is not None and callback.status == 200 else None
    if callback is None or template is None:
        why = f"no accepted {awaited.noun} to use as a template"
        fix = f"make the relay's {awaited.noun} acceptable first ({awaited.judged[-1]})"
        return [not_run(name, why, fix) for name in names]
    # a replay keeps the callback's signature, protocol and content type
    kept = (SIGNATURE_HEADER.lower(), PROTOCOL_HEADER.lower(), "content-type")
    headers = {k: v for k, v in callback.headers.items() if k in kept}
    replay = await probe(run.session, run.local_url, callback.raw, headers, names[0], 409, replayed)
    return [replay, *await run_probes(run, template, await aim(template))]


def mutated(digest: str) -> str:
    """``digest`` with its last character changed (a hash a probe aims at)."""
    return digest[:-1] + ("0" if digest[-1] != "0" else "1")
