"""Reference relay (``hitl-gate relay``): an honest relay for demos, tests and terminals.

It verifies every dispatch's signature and timestamp, acks at once (202) without
holding the connection, shows the draft to a human (or decides by ``--auto``), signs
one decision per approver and posts it to the dispatch's callback URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import threading
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiohttp
from aiohttp import web

from gate.config import parse_listen
from gate.errors import GateError
from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.canonical import payload_hash, wire_json
from gate.protocol.envelope import build_decision, decode_json
from gate.protocol.whitespace import identity_key

log = logging.getLogger(__name__)

MAX_DISPATCH_BYTES = 4 * 1024 * 1024
CHANNEL = "terminal"
RETRY_CAP_S = 30.0
# answers after which no one else needs to be asked about this approval
FINAL = frozenset({"already_resolved", "expired", "unknown_approval"})


@dataclass(frozen=True, slots=True)
class AutoDecision:
    """What ``--auto`` decides: ``verb`` approve|skip|adjust and, for adjust, ``text``."""

    verb: str
    text: str | None = None

    @classmethod
    def parse(cls, spec: str) -> AutoDecision:
        """Parse ``approve``, ``skip`` or ``adjust:TEXT``; raises ValueError otherwise."""
        if spec in ("approve", "skip"):
            return cls(spec)
        if spec.startswith("adjust:") and spec[len("adjust:"):].strip():
            return cls("adjust", spec[len("adjust:"):])
        raise ValueError("use approve, skip or adjust:TEXT")


class Relay:
    """Holds the relay's secret, who it decides as, and the dispatches already handled."""

    def __init__(self, secret: str, identities: Sequence[str], auto: AutoDecision | None,
                 max_skew: float, session: aiohttp.ClientSession) -> None:
        self.secret = secret
        self.identities = tuple(identities)
        self.auto = auto
        self.max_skew = max_skew
        self.session = session
        self.handled: set[str] = set()
        self.closed: set[str] = set()  # approvals the gate says are resolved
        self.latest: dict[str, int] = {}  # newest revision seen per approval
        self.stdin_closed = False
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def receive(self, request: web.Request) -> web.Response:
        """Verify and ack a dispatch (202), queue it for a human; 401/400 when refused."""
        raw = await request.content.read(MAX_DISPATCH_BYTES + 1)
        if len(raw) > MAX_DISPATCH_BYTES:
            return web.json_response({"status": "invalid", "reason": "body_too_large"},
                                     status=413)
        try:
            signing.verify(request.headers.get(SIGNATURE_HEADER), raw, [self.secret],
                           time.time(), self.max_skew)
            envelope = decode_json(raw)
        except GateError as exc:
            log.warning("event=dispatch_refused reason=%s", exc.code)
            return web.json_response(exc.body(), status=exc.status)
        if not isinstance(envelope, dict) or envelope.get("protocol") != PROTOCOL:
            return web.json_response({"status": "invalid", "reason": "invalid_protocol"},
                                     status=400)
        missing = _missing_field(envelope)
        if missing is not None:  # say what is wrong, not a hash mismatch (new-user review)
            log.warning("event=dispatch_refused reason=invalid_dispatch field=%s", missing)
            return web.json_response({"status": "invalid", "reason": "invalid_dispatch",
                                      "field": missing}, status=400)
        body = envelope["draft"]["body"]
        if payload_hash(body) != envelope["payload_hash"]:
            log.warning("event=dispatch_refused reason=payload_hash_mismatch")
            return web.json_response({"status": "invalid", "reason": "payload_hash_mismatch"},
                                     status=400)
        nonce = (envelope.get("callback") or {}).get("nonce")
        if nonce in self.handled:  # the gate re-sent a dispatch whose ack it missed
            return web.json_response({"status": "accepted", "duplicate": True}, status=202)
        self.handled.add(str(nonce))
        approval_id = str(envelope.get("approval_id"))
        revision = envelope.get("revision")
        self.latest[approval_id] = max(self.latest.get(approval_id, 0),
                                       revision if isinstance(revision, int) else 1)
        await self.queue.put(envelope)
        return web.json_response({"status": "accepted"}, status=202)

    def deciders(self, envelope: dict[str, Any]) -> list[str]:
        """Return who decides this dispatch: ``--as`` identities in scope, else the first approver."""
        approvers = [a for a in envelope.get("approvers") or [] if isinstance(a, str)]
        if not self.identities:
            return approvers[:1]
        keys = {identity_key(a) for a in approvers}
        chosen = [i for i in self.identities if identity_key(i) in keys]
        for other in set(self.identities) - set(chosen):
            log.warning("event=not_in_scope identity=%s approval_id=%s", other,
                        envelope.get("approval_id"))
        if not chosen and self.auto is None:  # the human would otherwise see nothing at all
            print(f"\nApproval {visible(str(envelope.get('approval_id')))[0]}: none of "
                  f"{', '.join(self.identities)} is among its approvers "
                  f"({visible(', '.join(approvers))[0]}); not shown, nobody here can decide it "
                  "(start the relay with --as one of them).", flush=True)
        return chosen

    async def post_decision(self, envelope: dict[str, Any], identity: str, verb: str,
                            text: str | None) -> tuple[int, Any]:
        """Sign and POST one decision to the dispatch's callback URL; return (status, answer).

        Raises aiohttp.ClientError or TimeoutError when the gate cannot be reached.
        """
        decision = build_decision(
            approval_id=envelope["approval_id"], nonce=envelope["callback"]["nonce"],
            decision=verb, payload_hash=envelope["payload_hash"], approver_id=identity,
            decided_at_ms=int(time.time() * 1000),
            channel="auto" if self.auto is not None else CHANNEL,
            adjust_text=text if verb == "adjust" else None)
        body = wire_json(decision)
        headers = {"Content-Type": "application/json; charset=utf-8", PROTOCOL_HEADER: PROTOCOL,
                   SIGNATURE_HEADER: signing.sign(self.secret, int(time.time()), body)}
        async with self.session.post(envelope["callback"]["url"], data=body, headers=headers,
                                     allow_redirects=False) as resp:
            text_answer = await resp.text()
            try:
                answer = json.loads(text_answer)
            except ValueError:
                answer = text_answer
            return resp.status, answer

    async def deliver(self, envelope: dict[str, Any], identity: str, verb: str,
                      text: str | None) -> tuple[int, Any] | None:
        """POST a decision, retrying with backoff while the gate is unreachable or answers 5xx,
        until the dispatch's ``expires_at``. Returns the last answer, or None if it never came."""
        deadline = _expiry(envelope)
        delay = 1.0
        while True:
            try:
                status, answer = await self.post_decision(envelope, identity, verb, text)
                if status < 500:
                    return status, answer
                problem = f"HTTP {status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.time() + delay >= deadline:
                log.error("event=decision_lost approval_id=%s approver=%s error=%r (the approval "
                          "expires at the gate)", envelope.get("approval_id"), identity, problem)
                return None
            log.warning("event=decision_retry approval_id=%s approver=%s error=%r retry_in_s=%.0f",
                        envelope.get("approval_id"), identity, problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)

    async def work(self) -> None:
        """Handle queued dispatches one at a time (a terminal shows one prompt at a time)."""
        while True:
            envelope = await self.queue.get()
            try:
                await self._handle(envelope)
            except (KeyError, TypeError) as exc:
                log.error("event=decision_failed approval_id=%s error=%r",
                          envelope.get("approval_id"), exc)

    def _stale(self, envelope: dict[str, Any]) -> bool:
        approval_id = envelope.get("approval_id")
        return approval_id in self.closed or self.latest.get(str(approval_id), 0) > int(
            envelope.get("revision") or 1)

    async def _handle(self, envelope: dict[str, Any]) -> None:
        approval_id = envelope.get("approval_id")
        log.info("event=dispatch_received approval_id=%s revision=%s payload_hash=%s "
                 "quorum=%s", approval_id, envelope.get("revision"), envelope.get("payload_hash"),
                 envelope.get("quorum"))
        for identity in self.deciders(envelope):
            if self._stale(envelope):
                log.info("event=dispatch_stale approval_id=%s revision=%s (resolved or a newer "
                         "revision arrived)", approval_id, envelope.get("revision"))
                return
            result = await self._decide(envelope, identity)
            if result is None:
                return
            status, answer = result
            reason = answer.get("reason") if isinstance(answer, dict) else None
            if (isinstance(answer, dict) and answer.get("resolved")) or reason in FINAL:
                self.closed.add(str(approval_id))
                return
            if reason == "superseded":
                return
            if status == 200 and isinstance(answer, dict) and isinstance(
                    (envelope.get("quorum") or {}).get("collected"), int):
                # recorded, not resolved: the next approver's prompt shows the new count
                quorum = dict(envelope["quorum"])
                quorum["collected"] += 1
                envelope = {**envelope, "quorum": quorum}

    async def _decide(self, envelope: dict[str, Any], identity: str) -> tuple[int, Any] | None:
        """Ask (or auto-decide) until the gate takes an answer; None when nobody can answer."""
        while True:
            if self.auto is not None:
                verb, text = self.auto.verb, self.auto.text
            elif self.stdin_closed:
                return None
            else:
                expires = _expiry(envelope)
                if time.time() >= expires:  # queued behind another prompt until too late
                    log.info("event=dispatch_expired approval_id=%s (not shown)",
                             envelope.get("approval_id"))
                    print(f"\nApproval {visible(str(envelope.get('approval_id')))[0]} expired "
                          f"at {visible(str(envelope.get('expires_at')))[0]} before its turn; "
                          "not shown.", flush=True)
                    return None
                try:
                    verb, text = await ask_terminal(envelope, identity)
                except EOFError:
                    self.stdin_closed = True
                    log.warning("event=stdin_closed reason=%r", "no human can answer on this "
                                "terminal; dispatches stay undecided and expire at the gate")
                    return None
            result = await self.deliver(envelope, identity, verb, text)
            if result is None:
                return None
            status, answer = result
            log.info("event=decision_sent approval_id=%s approver=%s decision=%s answer=%s %s",
                     envelope.get("approval_id"), identity, verb, status,
                     json.dumps(answer, ensure_ascii=False))
            reason = answer.get("reason") if isinstance(answer, dict) else None
            if status == 422 and self.auto is None:
                print(f"The gate refused that answer ({reason}); please answer again.", flush=True)
                continue
            if self.auto is None:
                print(_verdict(verb, status, answer), flush=True)
            return status, answer


def _verdict(verb: str, status: int, answer: Any) -> str:
    """One line telling the human at the terminal what the gate did with their answer."""
    if status == 200 and isinstance(answer, dict):
        if answer.get("resolved"):
            return f"Recorded: the approval is resolved {answer.get('outcome')}."
        return "Recorded; the quorum is not complete yet."
    reason = answer.get("reason") if isinstance(answer, dict) else None
    outcome = answer.get("outcome") if isinstance(answer, dict) else None
    tail = (f"; the approval is resolved {outcome} without it." if outcome else
            "; the approval timed out without it." if reason == "expired" else
            "; the approval is resolved without it." if reason in FINAL else ".")
    return f"The gate did not record your {verb}: {reason or 'refused'} (HTTP {status}){tail}"


def _expiry(envelope: dict[str, Any]) -> float:
    """Return the dispatch's ``expires_at`` as unix seconds (now + 1 h when unreadable)."""
    try:
        text = str(envelope.get("expires_at"))
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return time.time() + 3600


# Unicode categories a terminal does not show as themselves: controls (C0, DEL, C1: carriage
# return, escape sequences), format characters (bidi overrides, zero-width), line and paragraph
# separators, surrogates and unassigned code points. Newline and tab are shown as they are.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})


def visible(text: str) -> tuple[str, int]:
    """Return ``(text, count)``: ``text`` with every character a terminal would not show as
    itself (a control, format, line/paragraph-separator, surrogate or unassigned code point;
    newline and tab excepted) replaced by a visible ``<U+XXXX>`` mark, and how many were.

    A draft of ``"pay 12000 to X\r\x1b[2Kpay 12 to Y"`` would otherwise show as its second
    half only (security review); the human must see what the payload hash covers.
    """
    out: list[str] = []
    count = 0
    for char in text:
        if char not in "\n\t" and unicodedata.category(char) in _HIDDEN_CATEGORIES:
            out.append(f"<U+{ord(char):04X}>")
            count += 1
        else:
            out.append(char)
    return "".join(out), count


def _show(envelope: dict[str, Any], identity: str) -> None:
    draft = envelope.get("draft") or {}
    quorum = envelope.get("quorum") or {}

    def field(value: object) -> str:
        return visible(str(value))[0]

    print("\n" + "=" * 72)
    print(f"Approval {field(envelope.get('approval_id'))}  {field(envelope.get('pipeline'))}/"
          f"{field(envelope.get('step'))}  risk={field(envelope.get('risk'))}  revision="
          f"{field(envelope.get('revision', 1))}")
    print(f"quorum {field(quorum.get('collected'))}/{field(quorum.get('required'))}  expires "
          f"{field(envelope.get('expires_at'))}  you are {identity}")
    if envelope.get("budget"):
        print(f"budget: {field(json.dumps(envelope['budget'], ensure_ascii=False))}")
    body, hidden = visible(str(draft.get("body", "")))
    if hidden:
        print(f"warning: the draft holds {hidden} control or invisible characters, shown as "
              "<U+XXXX>; the draft approved is exactly as sent, with them")
    print("-" * 72)
    print(body)
    print("-" * 72)


def _read_line(prompt: str) -> str:
    print(prompt, end="", flush=True)
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\n")


def _prompt(envelope: dict[str, Any], identity: str) -> tuple[str, str | None]:
    _show(envelope, identity)
    while True:
        answer = _read_line("[a]pprove, [s]kip or [e]dit (adjust)? ").strip().lower()
        if answer in ("a", "approve"):
            return "approve", None
        if answer in ("s", "skip"):
            return "skip", None
        if answer in ("e", "edit", "adjust"):
            print("Type the new text; end with a line holding only '.'")
            lines = []
            while (line := _read_line("")) != ".":
                lines.append(line)
            return "adjust", "\n".join(lines) + "\n"


async def ask_terminal(envelope: dict[str, Any], identity: str) -> tuple[str, str | None]:
    """Show the draft on the terminal and read approve/skip/adjust from stdin.

    The read runs in a daemon thread, so Ctrl-C or SIGTERM stops the relay at once even
    while a prompt waits for a line. Raises EOFError when stdin is closed.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[tuple[str, str | None]] = loop.create_future()

    def settle(result: tuple[str, str | None] | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result(result)

    def read() -> None:
        try:
            result = _prompt(envelope, identity)
        except (EOFError, OSError, ValueError) as exc:
            loop.call_soon_threadsafe(settle, None, EOFError(str(exc)))
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=read, name="terminal-prompt", daemon=True).start()
    return await future


async def run_relay(listen: str, secret: str, identities: Sequence[str],
                    auto: AutoDecision | None, max_skew: float) -> None:
    """Serve the relay on ``listen`` (``host:port``) until SIGINT/SIGTERM."""
    import signal

    parsed = parse_listen(listen)
    if parsed[0] != "tcp":
        raise OSError("the reference relay listens on host:port only")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                     trust_env=False) as session:
        relay = Relay(secret, identities, auto, max_skew, session)
        app = web.Application()
        app.router.add_post("/{tail:.*}", relay.receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, parsed[1], parsed[2])
        await site.start()
        host, port = runner.addresses[0][:2]
        log.info("event=relay_listening url=http://%s:%d/ mode=%s", host, port,
                 f"auto:{auto.verb}" if auto else "terminal")
        worker = asyncio.create_task(relay.work())
        try:
            await stop.wait()
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await runner.cleanup()


def _missing_field(envelope: dict[str, Any]) -> str | None:
    """The first field a dispatch envelope (SPEC §2 "Dispatch") lacks or has of the wrong
    type, as a dotted path, or None when the fields this relay uses are all there."""
    for name in ("approval_id", "payload_hash"):
        if not isinstance(envelope.get(name), str):
            return name
    for parent, child in (("draft", "body"), ("callback", "url"), ("callback", "nonce")):
        section = envelope.get(parent)
        if not isinstance(section, dict) or not isinstance(section.get(child), str):
            return f"{parent}.{child}"
    if not isinstance(envelope.get("approvers"), list):
        return "approvers"
    return None
