"""Reference relay (``hitl-gate relay``): an honest relay for demos, tests and terminals.
This module receives (``Relay.receive``: signature, window, shape, ack) and hands each dispatch
to its desk: approvals (``approvals``), questions (``questions``), which send through
``Relay.deliver`` (``gate.relay.delivery``); running it is ``server``.

It verifies every dispatch's signature and timestamp, acks at once (202) without
holding the connection, shows the draft to a human (or decides by ``--auto``), signs
one decision per approver and posts it to the dispatch's callback URL. Nobody is asked
about a revision known to be stale (superseded, resolved, expired), nor an identity whose
decision on it is recorded; a prompt that goes stale on screen is withdrawn, as is one whose
approval a signed resolution notice says ended elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from gate.protocol.canonical import wire_json
from gate.protocol.relay_inbound import INVALID_PROTOCOL, is_notice, notice_subject
from gate.protocol.whitespace import identity_key, is_blank
from gate.relay.delivery import Courier, GateUnreachable
from gate.relay.inbound import open_request
from gate.tools.reference_relay.approvals import ApprovalDesk
from gate.tools.reference_relay.approver_key import ApproverKey
from gate.tools.reference_relay.question_view import OMIT
from gate.tools.reference_relay.questions import QuestionDesk
from gate.tools.reference_relay.state import (
    Knowledge,
    expiry_of,
    missing_field,
    revision_of,
    settle,
)
from gate.tools.reference_relay.terminal import Terminal, Withdrawn
from gate.tools.reference_relay.view import (
    APPROVAL,
    QUESTION,
    Kind,
    kind_of,
    resolved_elsewhere,
    shown,
)

log = logging.getLogger(__name__)

Desk = ApprovalDesk | QuestionDesk
"""What the relay hands a dispatch of one kind to: the same methods and fields on both. A
reply is a decision's ``(verb, text)`` or an answer's value; ``OMIT`` when none comes."""


@dataclass(frozen=True, slots=True)
class AutoDecision:
    """What ``--auto`` decides: ``verb`` approve|skip|adjust and ``text``: for adjust the
    new text, for skip its reason (None: a skip without one)."""

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
    """Holds the relay's secret, who it decides as, the approver key that signs its
    decisions (``--approver-key``; None: unsigned), the dispatches already
    handled, what it knows of each approval (``Knowledge``) and the prompt on screen
    (``asking``)."""

    def __init__(
        self,
        secret: str,
        identities: Sequence[str],
        auto: AutoDecision | None,
        max_skew: float,
        session: aiohttp.ClientSession,
        terminal: Terminal,
        auto_answer: str | None = None,
        approver_key: ApproverKey | None = None,
    ) -> None:
        self.secret = secret
        self.approver_key = approver_key  # signs each decision when set
        self.identities = tuple(identities)
        self.auto = auto
        self.max_skew = max_skew
        self.courier = Courier(session, secret)  # the session's timeout bounds an attempt
        self.terminal = terminal
        self.handled: set[str] = set()
        self.known = Knowledge()
        self.asking: tuple[str, int, asyncio.Future[str]] | None = None  # prompt on screen
        self.stdin_closed = False
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.desks: dict[Kind, Desk] = {
            APPROVAL: ApprovalDesk(self),
            QUESTION: QuestionDesk(self, auto_answer),  # never reads an approval
        }

    async def receive(self, request: web.Request) -> web.Response:
        """Verify a dispatch, check its kind's ``Desk.FIELDS`` and ``Desk.HASHED``, ack it (202)
        and queue it for a human; 401/400 when refused, 503 when nobody here can answer
        (``Desk.unable``; relay review item C: the gate keeps it, retries and shows why)."""
        opened = await open_request(
            request, [self.secret], time.time, self.max_skew, log, quiet=(INVALID_PROTOCOL,)
        )  # an invalid_protocol is answered, as ever, without a log line
        if isinstance(opened, web.Response):
            return opened
        envelope = opened[1]
        if is_notice(envelope):  # never shown as a request
            return self._notice(envelope)
        desk = self.desks[kind_of(envelope)]
        tag = " kind=question" if kind_of(envelope) is QUESTION else ""
        missing = missing_field(envelope, desk.FIELDS)
        if missing is not None:  # say what is wrong, not a hash mismatch (new-user review)
            desk.log.warning(
                "event=dispatch_refused reason=invalid_dispatch%s field=%s", tag, missing
            )
            return web.json_response(
                {"status": "invalid", "reason": "invalid_dispatch", "field": missing}, status=400
            )
        hashed, digest = desk.HASHED
        if digest(envelope) != envelope[hashed]:
            desk.log.warning("event=dispatch_refused reason=%s_mismatch%s", hashed, tag)
            return web.json_response(
                {"status": "invalid", "reason": f"{hashed}_mismatch"}, status=400
            )
        return self._accept(envelope, desk)

    def _accept(self, envelope: dict[str, Any], desk: Desk) -> web.Response:
        """Ack (202) a checked dispatch and queue it; a re-send of one handled (its nonce) is
        acked as a duplicate; 503 with the ``unable`` reason when nobody here can answer it
        (acked, it would wait here unseen)."""
        key = kind_of(envelope).key
        nonce = envelope["callback"]["nonce"]
        if nonce in self.handled:  # the gate re-sent a dispatch whose ack it missed
            return web.json_response({"status": "accepted", "duplicate": True}, status=202)
        unable = desk.unable(envelope)
        if unable is not None:
            desk.log.warning("event=dispatch_refused reason=%s %s=%s", unable, key, envelope[key])
            return web.json_response({"status": "unavailable", "reason": unable}, status=503)
        self.handled.add(nonce)
        self._newer(envelope)
        self.queue.put_nowait(envelope)
        return web.json_response({"status": "accepted"}, status=202)

    @contextlib.contextmanager
    def asking_about(self, envelope: dict[str, Any], expired: str) -> Iterator[asyncio.Future[str]]:
        """While the block runs, a prompt about the dispatch (its id and revision) is on screen
        (``asking``): the future it waits on is settled, which withdraws it, with ``expired``
        at the dispatch's ``expires_at``, or by a newer revision or a notice."""
        loop = asyncio.get_running_loop()
        stale: asyncio.Future[str] = loop.create_future()
        left = max(0.0, expiry_of(envelope, time.time()) - time.time())
        timer = loop.call_later(left, settle, stale, expired)
        self.asking = (envelope[kind_of(envelope).key], revision_of(envelope), stale)
        try:
            yield stale
        finally:
            timer.cancel()
            self.asking = None

    def nobody_here(self) -> bool:
        """True when no human can answer a dispatch here: input ended (a prompt read its
        end, or a script's stdin is at its end with no line left) and no ``--auto``."""
        return self.auto is None and (self.stdin_closed or self.terminal.lines.ended())

    def _notice(self, notice: dict[str, Any]) -> web.Response:
        """A signed resolution notice (docs/protocol.md "Notices"): the approval (question)
        is closed here (nothing queued about it is shown) and its prompt on screen, if any, is
        dropped with a line saying how it ended. Acked 200; 400 ``invalid_notice`` without
        its ``approval_id`` (``question_id``) or ``outcome``. A repeat is the same notice."""
        read = notice_subject(notice)
        if read is None:
            kind = " kind=question" if notice.get("kind") == "question" else ""
            log.warning("event=notice_refused reason=invalid_notice%s", kind)
            return web.json_response({"status": "invalid", "reason": "invalid_notice"}, status=400)
        key, subject, outcome = read
        log.info("event=notice_received %s=%s outcome=%s", key, subject, shown(outcome))
        self.known.closed.setdefault(subject, f"was resolved elsewhere ({shown(outcome)})")
        if self.asking is not None and self.asking[0] == subject:
            settle(self.asking[2], f"{resolved_elsewhere(notice)}; not asking any more.")
        return web.json_response({"status": "accepted"}, status=200)

    def _newer(self, envelope: dict[str, Any]) -> None:
        """Note that the dispatch's revision (a question's version) exists; a prompt on
        screen about an older one is withdrawn, said in its kind's words."""
        kind, revision = kind_of(envelope), revision_of(envelope)
        subject = envelope[kind.key]
        if (
            self.known.newer(subject, revision)
            and self.asking is not None
            and self.asking[0] == subject
            and self.asking[1] < revision
        ):
            settle(
                self.asking[2],
                f"{kind.noun} {shown(subject)} {kind.step} {self.asking[1]} "
                f"was superseded by {kind.step} {revision}; not asking again.",
            )

    def _tell(self, text: str) -> None:
        """A line for the human at the terminal (nothing with ``--auto``)."""
        if self.auto is None:
            self.terminal.say(text)

    def in_scope(self, envelope: dict[str, Any]) -> list[str]:
        """The ``--as`` identities among the dispatch's approvers (compared as the gate does),
        else (no ``--as``) its first approver."""
        approvers = [a for a in envelope.get("approvers") or [] if isinstance(a, str)]
        if not self.identities:
            return approvers[:1]
        keys = {identity_key(a) for a in approvers}
        return [i for i in self.identities if identity_key(i) in keys]

    def deciders(self, envelope: dict[str, Any]) -> list[str]:
        """Return who decides this dispatch (``in_scope``); each ``--as`` identity out of
        scope is logged, and the human told when none is in it."""
        chosen = self.in_scope(envelope)
        if not self.identities:
            return chosen
        approvers = [a for a in envelope.get("approvers") or [] if isinstance(a, str)]
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

    async def deliver(
        self, envelope: dict[str, Any], identity: str, message: dict[str, Any]
    ) -> tuple[int, Any] | None:
        """Sign ``message`` (``identity``'s decision or answer) with this relay's secret and
        deliver it to the dispatch's callback URL (``gate.relay.delivery``: retried while
        the gate is unreachable or answers 5xx) until the dispatch's ``expires_at``. Returns
        (status, decoded answer), or None when no answer below 500 came in time."""
        key = kind_of(envelope).key
        subject = f"{key}={envelope.get(key)}"

        def retrying(_: int, problem: str, delay: float) -> None:
            log.warning(
                "event=decision_retry %s approver=%s error=%r retry_in_s=%.0f",
                subject,
                identity,
                problem,
                delay,
            )

        deadline = expiry_of(envelope, time.time())
        url, body = envelope["callback"]["url"], wire_json(message)
        try:
            answer = await self.courier.deliver(url, body, deadline, retrying)
            if answer.status < 500:
                return answer.status, answer.decoded()
            problem = f"HTTP {answer.status}"
        except GateUnreachable as exc:
            problem = exc.problem
        log.error(
            "event=decision_lost %s approver=%s error=%r (it expires at the gate)",
            subject,
            identity,
            problem,
        )
        return None

    async def exchange(
        self, desk: Desk, envelope: dict[str, Any], identity: str
    ) -> tuple[Any, int, Any] | None:
        """Deliver ``identity``'s reply from ``desk`` (``--auto``'s, or asked on the terminal)
        until the gate takes one (``Desk.answered``: a 422 asks a human again) and return
        ``(reply, status, answer)``; None when none came: the prompt was withdrawn, input
        ended (``Desk.ENDED`` says so once), the gate could not be reached."""
        while True:
            reply: Any = OMIT
            if self.auto is not None or not self.stdin_closed:
                try:
                    reply = await desk.reply(envelope, identity)
                except Withdrawn as exc:
                    about = f"{kind_of(envelope).key}={envelope[kind_of(envelope).key]}"
                    if kind_of(envelope) is APPROVAL:
                        about += f" revision={revision_of(envelope)} approver={identity}"
                    desk.log.info("event=prompt_withdrawn %s reason=%r", about, str(exc))
                except EOFError:
                    self.stdin_closed = True
                    desk.log.warning("event=stdin_closed reason=%r", desk.ENDED[0])
                    self.terminal.say(desk.ENDED[1])
            if reply is OMIT:
                return None
            result = await self.deliver(envelope, identity, desk.message(envelope, identity, reply))
            if result is None:
                return None
            verdict = desk.answered(envelope, identity, reply, *result)
            if verdict is not None:
                self._tell(verdict)
                return reply, *result

    async def work(self) -> None:
        """Handle queued dispatches one at a time (a terminal shows one prompt at a time)."""
        while True:
            envelope = await self.queue.get()
            try:
                await self.desks[kind_of(envelope)].handle(envelope)
            except (KeyError, TypeError) as exc:
                log.error(
                    "event=decision_failed approval_id=%s question_id=%s error=%r",
                    envelope.get("approval_id"),
                    envelope.get("question_id"),
                    exc,
                )
