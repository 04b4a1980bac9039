"""Reference relay (``hitl-gate relay``): an honest relay for demos, tests and terminals.

It verifies every dispatch's signature and timestamp, acks at once (202) without
holding the connection, shows the draft to a human (or decides by ``--auto``), signs
one decision per approver and posts it to the dispatch's callback URL. Nobody is asked
about a revision known to be stale (superseded, resolved, expired), nor an identity whose
decision on it is recorded; a prompt that goes stale on screen is withdrawn, as is one whose
approval a signed resolution notice (issue 14) says ended elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from gate.config import TcpListen, parse_listen
from gate.errors import GateError
from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.canonical import payload_hash, wire_json
from gate.protocol.envelope import build_decision, decode_json
from gate.protocol.whitespace import identity_key, is_blank
from gate.tools.reference_relay.questions import QuestionDesk
from gate.tools.reference_relay.state import Knowledge, Sent, expiry_of, revision_of
from gate.tools.reference_relay.terminal import LogHold, Terminal, Withdrawn
from gate.tools.reference_relay.view import greeting, resolved_elsewhere, shown, verdict

log = logging.getLogger(__name__)

MAX_DISPATCH_BYTES = 4 * 1024 * 1024
CHANNEL = "terminal"
RETRY_CAP_S = 30.0


@dataclass(frozen=True, slots=True)
class AutoDecision:
    """What ``--auto`` decides: ``verb`` approve|skip|adjust and ``text``: for adjust the
    new text, for skip its reason (issue 14; None: a skip without one)."""

    verb: str
    text: str | None = None

    @classmethod
    def parse(cls, spec: str) -> AutoDecision:
        """Parse ``approve``, ``skip``, ``skip:REASON`` or ``adjust:TEXT``; raises ValueError
        otherwise (also for an empty or blank REASON or TEXT)."""
        if spec in ("approve", "skip"):
            return cls(spec)
        for verb in ("adjust", "skip"):
            prefix = verb + ":"
            if spec.startswith(prefix) and not is_blank(spec[len(prefix) :]):
                return cls(verb, spec[len(prefix) :])
        raise ValueError("use approve, skip, skip:REASON or adjust:TEXT")


class Relay:
    """Holds the relay's secret, who it decides as, the dispatches already handled, what
    it knows of each approval (``Knowledge``) and the prompt on screen (``asking``)."""

    def __init__(
        self,
        secret: str,
        identities: Sequence[str],
        auto: AutoDecision | None,
        max_skew: float,
        session: aiohttp.ClientSession,
        terminal: Terminal,
        auto_answer: str | None = None,
    ) -> None:
        self.secret = secret
        self.identities = tuple(identities)
        self.auto = auto
        self.max_skew = max_skew
        self.session = session
        self.terminal = terminal
        self.handled: set[str] = set()
        self.known = Knowledge()
        self.asking: tuple[str, int, asyncio.Future[str]] | None = None  # prompt on screen
        self.stdin_closed = False
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.questions = QuestionDesk(self, auto_answer)  # issue 15: questions, apart

    async def receive(self, request: web.Request) -> web.Response:
        """Verify and ack a dispatch (202), queue it for a human; 401/400 when refused, 503
        ``no_human_at_terminal`` once input ended and no ``--auto`` answers (relay review
        item C: the gate keeps it, retries and shows the reason)."""
        raw = await request.content.read(MAX_DISPATCH_BYTES + 1)
        if len(raw) > MAX_DISPATCH_BYTES:
            return web.json_response({"status": "invalid", "reason": "body_too_large"}, status=413)
        try:
            signing.verify(
                request.headers.get(SIGNATURE_HEADER),
                raw,
                [self.secret],
                time.time(),
                self.max_skew,
            )
            envelope = decode_json(raw)
        except GateError as exc:
            log.warning("event=dispatch_refused reason=%s", exc.code)
            return web.json_response(exc.body(), status=exc.status)
        if not isinstance(envelope, dict) or envelope.get("protocol") != PROTOCOL:
            return web.json_response(
                {"status": "invalid", "reason": "invalid_protocol"}, status=400
            )
        if envelope.get("type") == "notice":  # issue 14 §4: never shown as a request
            return self._notice(envelope)
        if envelope.get("kind") == "question":  # issue 15: never read as an approval
            return self.questions.receive(envelope)
        missing = _missing_field(envelope)
        if missing is not None:  # say what is wrong, not a hash mismatch (new-user review)
            log.warning("event=dispatch_refused reason=invalid_dispatch field=%s", missing)
            return web.json_response(
                {"status": "invalid", "reason": "invalid_dispatch", "field": missing}, status=400
            )
        body = envelope["draft"]["body"]
        if payload_hash(body) != envelope["payload_hash"]:
            log.warning("event=dispatch_refused reason=payload_hash_mismatch")
            return web.json_response(
                {"status": "invalid", "reason": "payload_hash_mismatch"}, status=400
            )
        nonce = envelope["callback"]["nonce"]
        if nonce in self.handled:  # the gate re-sent a dispatch whose ack it missed
            return web.json_response({"status": "accepted", "duplicate": True}, status=202)
        if self.stdin_closed and self.auto is None:  # acked, it would wait here unseen
            log.warning(
                "event=dispatch_refused reason=no_human_at_terminal approval_id=%s",
                envelope["approval_id"],
            )
            return web.json_response(
                {"status": "unavailable", "reason": "no_human_at_terminal"}, status=503
            )
        self.handled.add(nonce)
        self._newer(envelope["approval_id"], revision_of(envelope))
        await self.queue.put(envelope)
        return web.json_response({"status": "accepted"}, status=202)

    def _notice(self, notice: dict[str, Any]) -> web.Response:
        """A signed resolution notice (docs/protocol.md "Notices"): the approval is closed
        here (nothing queued about it is shown) and its prompt on screen, if any, is dropped
        with a line saying how it ended. Acked 200; 400 ``invalid_notice`` without an
        ``approval_id`` or ``outcome``. A repeat is the same notice."""
        approval_id, outcome = notice.get("approval_id"), notice.get("outcome")
        if not isinstance(approval_id, str) or not isinstance(outcome, str):
            log.warning("event=notice_refused reason=invalid_notice")
            return web.json_response({"status": "invalid", "reason": "invalid_notice"}, status=400)
        log.info("event=notice_received approval_id=%s outcome=%s", approval_id, shown(outcome))
        line = resolved_elsewhere(notice)
        self.known.closed.setdefault(approval_id, f"was resolved elsewhere ({shown(outcome)})")
        if self.asking is not None and self.asking[0] == approval_id:
            _settle(self.asking[2], f"{line}; not asking any more.")
        return web.json_response({"status": "accepted"}, status=200)

    def _newer(self, approval_id: str, revision: int) -> None:
        """Note that ``revision`` of the approval exists; a prompt on screen about an older
        one is withdrawn (issue 12 item 2)."""
        if (
            self.known.newer(approval_id, revision)
            and self.asking is not None
            and self.asking[0] == approval_id
            and self.asking[1] < revision
        ):
            _settle(
                self.asking[2],
                f"Approval {shown(approval_id)} revision {self.asking[1]} "
                f"was superseded by revision {revision}; not asking again.",
            )

    def _tell(self, text: str) -> None:
        """A line for the human at the terminal (nothing with ``--auto``)."""
        if self.auto is None:
            self.terminal.say(text)

    def deciders(self, envelope: dict[str, Any]) -> list[str]:
        """Return who decides this dispatch: ``--as`` identities in scope, else the first
        approver."""
        approvers = [a for a in envelope.get("approvers") or [] if isinstance(a, str)]
        if not self.identities:
            return approvers[:1]
        keys = {identity_key(a) for a in approvers}
        chosen = [i for i in self.identities if identity_key(i) in keys]
        for other in set(self.identities) - set(chosen):
            log.warning(
                "event=not_in_scope identity=%s approval_id=%s", other, envelope.get("approval_id")
            )
        if not chosen:  # the human would otherwise see nothing at all
            self._tell(
                f"\nApproval {shown(envelope.get('approval_id'))}: none of "
                f"{', '.join(self.identities)} is among its approvers "
                f"({shown(', '.join(approvers))}); not shown, nobody here can decide "
                "it (start the relay with --as one of them)."
            )
        return chosen

    async def post_decision(
        self, envelope: dict[str, Any], identity: str, verb: str, text: str | None
    ) -> tuple[int, Any]:
        """Sign and POST one decision to the dispatch's callback URL; return (status, answer).
        ``text`` is an adjust's new text or a skip's reason (issue 14), else ignored.

        Raises aiohttp.ClientError or TimeoutError when the gate cannot be reached.
        """
        decision = build_decision(
            approval_id=envelope["approval_id"],
            nonce=envelope["callback"]["nonce"],
            decision=verb,
            payload_hash=envelope["payload_hash"],
            approver_id=identity,
            decided_at_ms=int(time.time() * 1000),
            channel="auto" if self.auto is not None else CHANNEL,
            adjust_text=text if verb == "adjust" else None,
            reason=text if verb == "skip" else None,
        )
        return await self.post_signed(envelope["callback"]["url"], decision)

    async def post_signed(self, url: str, message: dict[str, Any]) -> tuple[int, Any]:
        """Sign ``message`` (a decision or an answer) with a fresh ``t`` and POST it to
        ``url`` without following redirects; return (status, decoded answer or its text).

        Raises aiohttp.ClientError or TimeoutError when the gate cannot be reached.
        """
        body = wire_json(message)
        headers = {
            "Content-Type": "application/json; charset=utf-8",
            PROTOCOL_HEADER: PROTOCOL,
            SIGNATURE_HEADER: signing.sign(self.secret, int(time.time()), body),
        }
        async with self.session.post(
            url, data=body, headers=headers, allow_redirects=False
        ) as resp:
            text_answer = await resp.text()
            try:
                answer = json.loads(text_answer)
            except ValueError:
                answer = text_answer
            return resp.status, answer

    async def deliver(
        self, envelope: dict[str, Any], identity: str, verb: str, text: str | None
    ) -> tuple[int, Any] | None:
        """POST a decision, retrying with backoff while the gate is unreachable or answers 5xx,
        until the dispatch's ``expires_at``. Returns the last answer, or None if it never came."""
        return await self.deliver_with(
            envelope, identity, lambda: self.post_decision(envelope, identity, verb, text)
        )

    async def deliver_with(
        self,
        envelope: dict[str, Any],
        identity: str,
        send: Callable[[], Awaitable[tuple[int, Any]]],
    ) -> tuple[int, Any] | None:
        """``send()`` (a decision's or an answer's POST) until the gate answers below 500,
        retrying with backoff while it is unreachable or answers 5xx, until the dispatch's
        ``expires_at``. Returns the last answer, or None if it never came."""
        subject = (
            f"question_id={envelope.get('question_id')}"
            if envelope.get("kind") == "question"
            else f"approval_id={envelope.get('approval_id')}"
        )
        deadline = expiry_of(envelope, time.time())
        delay = 1.0
        while True:
            try:
                status, answer = await send()
                if status < 500:
                    return status, answer
                problem = f"HTTP {status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.time() + delay >= deadline:
                log.error(
                    "event=decision_lost %s approver=%s error=%r (it expires at the gate)",
                    subject,
                    identity,
                    problem,
                )
                return None
            log.warning(
                "event=decision_retry %s approver=%s error=%r retry_in_s=%.0f",
                subject,
                identity,
                problem,
                delay,
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_CAP_S)

    async def work(self) -> None:
        """Handle queued dispatches one at a time (a terminal shows one prompt at a time)."""
        while True:
            envelope = await self.queue.get()
            try:
                if envelope.get("kind") == "question":
                    await self.questions.handle(envelope)
                else:
                    await self._handle(envelope)
            except (KeyError, TypeError) as exc:
                log.error(
                    "event=decision_failed approval_id=%s question_id=%s error=%r",
                    envelope.get("approval_id"),
                    envelope.get("question_id"),
                    exc,
                )

    async def _handle(self, envelope: dict[str, Any]) -> None:
        approval_id, revision = envelope["approval_id"], revision_of(envelope)
        log.info(
            "event=dispatch_received approval_id=%s revision=%d payload_hash=%s quorum=%s",
            approval_id,
            revision,
            envelope["payload_hash"],
            _quorum_field(envelope),
        )
        asked = False
        for identity in self.deciders(envelope):
            stale = self.known.stale(envelope, time.time())
            if stale is not None:
                log.info(
                    "event=dispatch_stale approval_id=%s revision=%d reason=%r",
                    approval_id,
                    revision,
                    stale,
                )
                self._tell(
                    f"{stale}; not asking {identity}."
                    if asked
                    else f"\n{stale} before its turn; not shown."
                )
                return
            if self.known.recorded(envelope, identity):
                log.info(
                    "event=already_recorded approval_id=%s revision=%d approver=%s",
                    approval_id,
                    revision,
                    identity,
                )
                self._tell(
                    f"Approval {shown(approval_id)} revision {revision}: not asking "
                    f"{identity}, whose decision on it is recorded (an edit counts as "
                    "its editor's approval)."
                )
                continue
            asked = True
            sent = await self._decide(envelope, identity)
            if sent is None:
                return
            self.known.learn(envelope, identity, sent)
            quorum = envelope.get("quorum")
            if (
                sent.status == 200
                and isinstance(quorum, dict)
                and isinstance(quorum.get("collected"), int)
            ):
                # recorded, not resolved: the next approver's prompt shows the new count
                envelope = {**envelope, "quorum": {**quorum, "collected": quorum["collected"] + 1}}

    async def _decide(self, envelope: dict[str, Any], identity: str) -> Sent | None:
        """Ask (or auto-decide) until the gate takes an answer; None when nobody can answer
        (input ended, the prompt was withdrawn, the gate could not be reached)."""
        while True:
            if self.auto is not None:
                verb, text = self.auto.verb, self.auto.text
            elif self.stdin_closed:
                return None
            else:
                try:
                    verb, text = await self._ask(envelope, identity)
                except Withdrawn as exc:
                    log.info(
                        "event=prompt_withdrawn approval_id=%s revision=%d approver=%s reason=%r",
                        envelope["approval_id"],
                        revision_of(envelope),
                        identity,
                        str(exc),
                    )
                    return None
                except EOFError:
                    self.stdin_closed = True
                    log.warning(
                        "event=stdin_closed reason=%r",
                        "no human can answer on this terminal; new dispatches are refused "
                        "(503 no_human_at_terminal, the gate retries them), those already "
                        "acked stay undecided until they expire or are cancelled",
                    )
                    self.terminal.say(
                        "Input ended: nobody can answer here any more; new dispatches are "
                        "refused (the gate retries them), this one waits for its timeout. "
                        "Ctrl-C stops."
                    )
                    return None
            result = await self.deliver(envelope, identity, verb, text)
            if result is None:
                return None
            sent = Sent(verb, text, *result)
            log.info(
                "event=decision_sent approval_id=%s approver=%s decision=%s answer=%s %s",
                envelope.get("approval_id"),
                identity,
                verb,
                sent.status,
                json.dumps(sent.answer, ensure_ascii=False),
            )
            if sent.status == 422 and self.auto is None:
                self.terminal.say(
                    f"The gate refused that answer ({sent.fields.get('reason')}); "
                    "please answer again."
                )
                continue
            self._tell(verdict(verb, sent.status, sent.answer))
            return sent

    async def _ask(self, envelope: dict[str, Any], identity: str) -> tuple[str, str | None]:
        """One prompt on the terminal, withdrawn (Withdrawn) when it goes stale while shown:
        a newer revision arrives (``_newer``) or the dispatch's ``expires_at`` passes."""
        approval_id, revision = envelope["approval_id"], revision_of(envelope)
        loop = asyncio.get_running_loop()
        stale: asyncio.Future[str] = loop.create_future()
        now_stale = self.known.stale(envelope, time.time())
        if now_stale is not None:  # asked again (after a 422) about what went stale meanwhile
            self.terminal.say(f"{now_stale}; not asking again.")
            raise Withdrawn(now_stale)
        timer = loop.call_later(
            max(0.0, expiry_of(envelope, time.time()) - time.time()),
            _settle,
            stale,
            f"Approval {shown(approval_id)} expired at {shown(envelope.get('expires_at'))} "
            "while waiting for an answer; not asking any more.",
        )
        self.asking = (approval_id, revision, stale)
        try:
            return await self.terminal.ask(envelope, identity, stale)
        finally:
            timer.cancel()
            self.asking = None


def _settle(future: asyncio.Future[str], reason: str) -> None:
    if not future.done():
        future.set_result(reason)


def _quorum_field(envelope: dict[str, Any]) -> str:
    """``collected/required`` for a log line (``0/2``)."""
    quorum = envelope.get("quorum")
    quorum = quorum if isinstance(quorum, dict) else {}
    return f"{quorum.get('collected')}/{quorum.get('required')}"


async def run_relay(
    listen: str,
    secret: str,
    identities: Sequence[str],
    auto: AutoDecision | None,
    max_skew: float,
    auto_answer: str | None = None,
) -> None:
    """Serve the relay on ``listen`` (``host:port``) until SIGINT/SIGTERM; with ``auto``,
    ``auto_answer`` answers every question (issue 15)."""
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
        relay = Relay(secret, identities, auto, max_skew, session, terminal, auto_answer)
        app = web.Application()
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
