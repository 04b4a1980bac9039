"""Misbehaving relays and a permissive "gate" for ``hitl-gate verify`` tests.

Each server is a real aiohttp application on 127.0.0.1 port 0, run in its own thread and
event loop (like ``tests.support.CaptureRelay``). The relays sign and verify with hashlib/hmac
directly, not with gate code, so ``verify`` is judged against an independent implementation.

``BadRelay(Misbehaviour(...))`` behaves like an honest relay (verify the dispatch, ack 202 at
once, decide approve as the first approver, sign, POST to ``callback.url``) except for the
one thing its ``Misbehaviour`` changes. ``PermissiveServer`` answers every request with the
same canned status and JSON (by default ``200 recorded``), to show that checks can fail.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from tests.support import DEADLINE_S, SECRET

SIGNATURE_HEADER = "X-Draftcat-Signature"
PROTOCOL_HEADER = "X-Hitl-Protocol"
MAX_SKEW_S = 300


def hmac_hex(secret: str, t: int, body: bytes) -> str:
    """Lowercase hex HMAC-SHA256(secret, ASCII t + '.' + body), computed independently."""
    return hmac.new(
        secret.encode("utf-8"), str(t).encode("ascii") + b"." + body, hashlib.sha256
    ).hexdigest()


def parse_signature(header: str | None) -> tuple[int, list[str]] | None:
    """Return ``(t, [v1, ...])`` from a signature header, or None when it is unusable."""
    if not header:
        return None
    t: int | None = None
    v1: list[str] = []
    for part in header.split(","):
        key, _, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if key == "t" and value.isdigit():
            t = int(value)
        elif key == "v1":
            v1.append(value.lower())
    return (t, v1) if t is not None and v1 else None


def signature_valid(header: str | None, body: bytes, secret: str) -> bool:
    """True when some ``v1`` of ``header`` is the HMAC of ``body`` under ``secret``."""
    parsed = parse_signature(header)
    if parsed is None:
        return False
    t, v1 = parsed
    expected = hmac_hex(secret, t, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in v1)


def sha256_hash(text: str) -> str:
    """``"sha256:" + hex(SHA-256(text as UTF-8))``."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


class LoopServer:
    """An aiohttp server on 127.0.0.1 port 0 in its own thread and event loop."""

    def __init__(self) -> None:
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._cond = threading.Condition()

    def start(self) -> Any:
        """Start the server thread; returns self once bound."""
        self._thread.start()
        assert self._started.wait(DEADLINE_S), f"{type(self).__name__} did not start"
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.run_forever()

    async def _serve(self) -> None:
        await self._setup()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/"
        self._started.set()

    async def _setup(self) -> None:
        """Hook: create what the handler needs inside the server's loop."""

    async def _teardown(self) -> None:
        """Hook: release what ``_setup`` created."""

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server and its loop."""

        async def shutdown() -> None:
            await self._teardown()
            if self._runner is not None:
                await self._runner.cleanup()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(DEADLINE_S)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(DEADLINE_S)
        self._loop.close()


@dataclass(frozen=True)
class Misbehaviour:
    """What a ``BadRelay`` does wrong; the defaults make an honest relay.

    - ``verify_hmac`` / ``verify_window``: refuse (401) a dispatch whose HMAC does not match,
      or whose ``t`` is more than 300 s away.
    - ``forward_refused``: still show a refused dispatch to the "human" and answer it.
    - ``hold_s``: hold the dispatch connection this long before acking (deciding meanwhile,
      like a relay that waits for the human inside the request).
    - ``answer``: False acks and never posts a decision (the human never answers).
    - ``secret``: the secret the relay verifies dispatches with; ``sign_secret``: the one it
      signs decisions with (both default to the shared test secret).
    - ``approver``: identity to answer as (default the dispatch's first approver).
    - ``payload_hash`` / ``nonce``: values to send instead of echoing the dispatch's.
    - ``ms_timestamps``: sign with ``t`` in milliseconds instead of seconds.
    - ``ack_status``: the status a verified dispatch is answered with (a 5xx still decides).
    - ``clock_offset_s``: how far the relay's clock is off (seconds, + ahead): it judges the
      dispatch's ``t`` and signs its decisions by that clock.
    - ``blind_notices``: ack any body with ``"type":"notice"`` at once, unverified
      (a relay that does not understand notices and acks what it does not know).
    - Questions (``kind: "question"``) are answered with the first option (free
      text: a fixed text) unless ``answer_questions`` is False; ``request_hash`` / ``value``:
      what to send instead of the dispatch's hash and the honest value.
    """

    verify_hmac: bool = True
    verify_window: bool = True
    forward_refused: bool = False
    hold_s: float = 0.0
    answer: bool = True
    secret: str = SECRET
    sign_secret: str | None = None
    approver: str | None = None
    payload_hash: str | None = None
    nonce: str | None = None
    ms_timestamps: bool = False
    ack_status: int = 202
    clock_offset_s: float = 0.0
    blind_notices: bool = False
    answer_questions: bool = True
    request_hash: str | None = None
    value: Any = None


class BadRelay(LoopServer):
    """A relay following ``Misbehaviour``; records dispatches and the gate's answers."""

    def __init__(self, misbehaviour: Misbehaviour | None = None) -> None:
        super().__init__()
        self.m = misbehaviour or Misbehaviour()
        # {"envelope", "refused" (reason or None), "status" answered, "at" (monotonic s)}
        self.dispatches: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []  # {"body", "status", "answer"}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def _setup(self) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=20), trust_env=False
        )

    async def _teardown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _now(self) -> float:
        """The relay's clock: unix seconds, ``clock_offset_s`` off."""
        return time.time() + self.m.clock_offset_s

    def _problem(self, header: str | None, raw: bytes) -> str | None:
        parsed = parse_signature(header)
        if parsed is None:
            return "signature_malformed"
        if self.m.verify_window and abs(self._now() - parsed[0]) > MAX_SKEW_S:
            return "timestamp_out_of_window"
        if self.m.verify_hmac and not signature_valid(header, raw, self.m.secret):
            return "signature_mismatch"
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            envelope = json.loads(raw)
        except ValueError:
            return web.json_response({"status": "invalid", "reason": "not_json"}, status=400)
        if self.m.blind_notices and isinstance(envelope, dict) and envelope.get("type") == "notice":
            return web.json_response({"status": "accepted"}, status=200)
        problem = self._problem(request.headers.get(SIGNATURE_HEADER), raw)
        status = 401 if problem else self.m.ack_status
        with self._cond:
            self.dispatches.append(
                {"envelope": envelope, "refused": problem, "status": status, "at": time.monotonic()}
            )
        question = isinstance(envelope, dict) and envelope.get("kind") == "question"
        answers = self.m.answer_questions if question else self.m.answer
        if answers and (problem is None or self.m.forward_refused):
            act = self._answer(envelope) if question else self._decide(envelope)
            task = asyncio.get_running_loop().create_task(act)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if problem:
            return web.json_response({"status": "unauthorized", "reason": problem}, status=401)
        if self.m.hold_s:
            await asyncio.sleep(self.m.hold_s)
        return web.json_response({"status": "accepted"}, status=self.m.ack_status)

    async def _answer(self, envelope: dict[str, Any]) -> None:
        """Answer a question: ``decision: "answer"`` with a typed value."""
        question = envelope["question"]
        options = question.get("options") or []
        honest: Any = "ok" if not options else options[0]
        if question["response_type"] == "multi_choice":
            honest = [options[0]]
        body = {
            "protocol": "hitl/v0",
            "kind": "question",
            "question_id": envelope["question_id"],
            "nonce": self.m.nonce or envelope["callback"]["nonce"],
            "decision": "answer",
            "request_hash": self.m.request_hash or envelope["request_hash"],
            "value": honest if self.m.value is None else self.m.value,
            "approver": self._approver(envelope),
            "decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        await self._post(envelope, body)

    def _approver(self, envelope: dict[str, Any]) -> dict[str, Any]:
        approvers = envelope.get("approvers") or ["nobody@example.com"]
        return {
            "id": self.m.approver or approvers[0],
            "display": "Test Human",
            "channel": "bad-relay",
        }

    async def _decide(self, envelope: dict[str, Any]) -> None:
        body = {
            "protocol": "hitl/v0",
            "approval_id": envelope["approval_id"],
            "nonce": self.m.nonce or envelope["callback"]["nonce"],
            "decision": "approve",
            "payload_hash": self.m.payload_hash or envelope["payload_hash"],
            "approver": self._approver(envelope),
            "adjust_text": None,
            "decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        await self._post(envelope, body)

    async def _post(self, envelope: dict[str, Any], body: dict[str, Any]) -> None:
        raw = json.dumps(body, ensure_ascii=False).encode("utf-8")
        t = int(self._now() * 1000) if self.m.ms_timestamps else int(self._now())
        secret = self.m.sign_secret or self.m.secret
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            PROTOCOL_HEADER: "hitl/v0",
            SIGNATURE_HEADER: f"t={t},v1={hmac_hex(secret, t, raw)}",
        }
        assert self._session is not None
        try:
            async with self._session.post(
                envelope["callback"]["url"], data=raw, headers=headers, allow_redirects=False
            ) as resp:
                text = await resp.text()
                status = resp.status
        except aiohttp.ClientError as exc:
            text, status = repr(exc), None
        with self._cond:
            self.decisions.append({"body": body, "status": status, "answer": text})

    def decided(self) -> list[dict[str, Any]]:
        """Return the decisions posted so far with the gate's answers."""
        with self._cond:
            return list(self.decisions)


class PermissiveServer(LoopServer):
    """Answers every request with ``status`` and JSON ``answer``; records what it received.

    The default answers ``200 {"status":"recorded","resolved":true}``: a "gate" that accepts
    everything, against which every gate-side negative check must fail.
    """

    def __init__(self, status: int = 200, answer: Any = None) -> None:
        super().__init__()
        self.status = status
        self.answer = (
            {"status": "recorded", "resolved": True, "outcome": "approved"}
            if answer is None
            else answer
        )
        self.received: list[dict[str, Any]] = []  # {"method", "path", "headers", "raw"}

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        with self._cond:
            self.received.append(
                {
                    "method": request.method,
                    "path": request.path,
                    "headers": {k.lower(): v for k, v in request.headers.items()},
                    "raw": raw,
                }
            )
        if isinstance(self.answer, str):
            return web.Response(status=self.status, text=self.answer)
        return web.json_response(self.answer, status=self.status)

    def requests(self) -> list[dict[str, Any]]:
        """Return the requests received so far."""
        with self._cond:
            return list(self.received)
