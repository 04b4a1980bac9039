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

from gate.protocol.canonical import payload_hash, wire_json
from gate.protocol.relay_inbound import INVALID_PROTOCOL, is_notice, notice_subject
from gate.protocol.whitespace import identity_key, is_blank
from gate.relay.delivery import Courier, GateUnreachable
from gate.relay.inbound import open_request
from gate.tools.reference_relay.approvals import ApprovalDesk
from gate.tools.reference_relay.approver_key import ApproverKey
from gate.tools.reference_relay.questions import QuestionDesk
from gate.tools.reference_relay.state import Knowledge, expiry_of, revision_of, settle
from gate.tools.reference_relay.terminal import Terminal
from gate.tools.reference_relay.view import resolved_elsewhere, shown

log = logging.getLogger(__name__)


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
        self.session = session
        self.courier = Courier(session, secret)  # the session's timeout bounds an attempt
        self.terminal = terminal
        self.handled: set[str] = set()
        self.known = Knowledge()
        self.asking: tuple[str, int, asyncio.Future[str]] | None = None  # prompt on screen
        self.stdin_closed = False
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.questions = QuestionDesk(self, auto_answer)  # questions, apart
        self.approvals = ApprovalDesk(self)

    async def receive(self, request: web.Request) -> web.Response:
        """Verify and ack a dispatch (202), queue it for a human; 401/400 when refused, 503
        ``no_human_at_terminal`` once input ended and no ``--auto`` answers (relay review
        item C: the gate keeps it, retries and shows the reason)."""
        opened = await open_request(
            request, [self.secret], time.time, self.max_skew, log, quiet=(INVALID_PROTOCOL,)
        )  # an invalid_protocol is answered, as ever, without a log line
        if isinstance(opened, web.Response):
            return opened
        envelope = opened[1]
        if is_notice(envelope):  # never shown as a request
            return self._notice(envelope)
        if envelope.get("kind") == "question":  # never read as an approval
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
        unable = "no_human_at_terminal" if self.nobody_here() else None  # acked, it would wait
        return self.accept(envelope, "approval", revision_of(envelope), unable)  # here unseen

    def accept(
        self,
        envelope: dict[str, Any],
        kind: str,
        revision: int,
        unable: str | None,
        desk_log: logging.Logger = log,
    ) -> web.Response:
        """Ack (202) a checked dispatch of ``kind`` (approval, question) at ``revision`` and
        queue it; a re-send of one handled (its nonce) is acked as a duplicate; 503 with the
        ``unable`` reason when nobody here can answer it (the gate keeps it and retries),
        logged on the desk's ``desk_log``."""
        key = f"{kind}_id"
        nonce = envelope["callback"]["nonce"]
        if nonce in self.handled:  # the gate re-sent a dispatch whose ack it missed
            return web.json_response({"status": "accepted", "duplicate": True}, status=202)
        if unable is not None:
            desk_log.warning("event=dispatch_refused reason=%s %s=%s", unable, key, envelope[key])
            return web.json_response({"status": "unavailable", "reason": unable}, status=503)
        self.handled.add(nonce)
        self._newer(envelope[key], revision, kind)
        self.queue.put_nowait(envelope)
        return web.json_response({"status": "accepted"}, status=202)

    @contextlib.contextmanager
    def asking_about(
        self, envelope: dict[str, Any], subject: str, revision: int, expired: str
    ) -> Iterator[asyncio.Future[str]]:
        """While the block runs, a prompt about ``subject`` (an approval's or a question's id)
        at ``revision`` is on screen (``asking``): the future it waits on is settled, which
        withdraws it, with ``expired`` at the dispatch's ``expires_at``, or by a newer
        revision or a notice."""
        loop = asyncio.get_running_loop()
        stale: asyncio.Future[str] = loop.create_future()
        left = max(0.0, expiry_of(envelope, time.time()) - time.time())
        timer = loop.call_later(left, settle, stale, expired)
        self.asking = (subject, revision, stale)
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
        """A signed resolution notice (docs/protocol.md "Notices"): the approval is closed
        here (nothing queued about it is shown) and its prompt on screen, if any, is dropped
        with a line saying how it ended. Acked 200; 400 ``invalid_notice`` without an
        ``approval_id`` or ``outcome``. A repeat is the same notice. A question's notice
        (``kind: "question"``) names its ``question_id`` and closes it the same way.
        """
        read = notice_subject(notice)
        if read is None:
            kind = " kind=question" if notice.get("kind") == "question" else ""
            log.warning("event=notice_refused reason=invalid_notice%s", kind)
            return web.json_response({"status": "invalid", "reason": "invalid_notice"}, status=400)
        key, approval_id, outcome = read
        if key == "question_id":
            return self._question_notice(notice, approval_id, outcome)
        log.info("event=notice_received approval_id=%s outcome=%s", approval_id, shown(outcome))
        line = resolved_elsewhere(notice)
        self.known.closed.setdefault(approval_id, f"was resolved elsewhere ({shown(outcome)})")
        if self.asking is not None and self.asking[0] == approval_id:
            settle(self.asking[2], f"{line}; not asking any more.")
        return web.json_response({"status": "accepted"}, status=200)

    def _question_notice(
        self, notice: dict[str, Any], question_id: str, outcome: str
    ) -> web.Response:
        """A question (``question_id``) resolved elsewhere with ``outcome``: closed
        here, its prompt dropped."""
        log.info("event=notice_received question_id=%s outcome=%s", question_id, shown(outcome))
        by = notice.get("answered_by")
        line = f"Question {shown(question_id)} resolved elsewhere: {shown(outcome)}"
        line += f" by {shown(by)}" if isinstance(by, str) else ""
        self.known.closed.setdefault(question_id, f"was resolved elsewhere ({shown(outcome)})")
        if self.asking is not None and self.asking[0] == question_id:
            settle(self.asking[2], f"{line}; not asking any more.")
        return web.json_response({"status": "accepted"}, status=200)

    def _newer(self, approval_id: str, revision: int, kind: str = "approval") -> None:
        """Note that ``revision`` of the approval exists; a prompt on screen about an older
        one is withdrawn. With ``kind="question"`` it is a question's
        version, said in a question's words."""
        if (
            self.known.newer(approval_id, revision)
            and self.asking is not None
            and self.asking[0] == approval_id
            and self.asking[1] < revision
        ):
            noun, step = ("Question", "version") if kind == "question" else ("Approval", "revision")
            settle(
                self.asking[2],
                f"{noun} {shown(approval_id)} {step} {self.asking[1]} "
                f"was superseded by {step} {revision}; not asking again.",
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

    async def deliver(
        self, envelope: dict[str, Any], identity: str, message: dict[str, Any]
    ) -> tuple[int, Any] | None:
        """Sign ``message`` (``identity``'s decision or answer) with this relay's secret and
        deliver it to the dispatch's callback URL (``gate.relay.delivery``: retried while
        the gate is unreachable or answers 5xx) until the dispatch's ``expires_at``. Returns
        (status, decoded answer), or None when no answer below 500 came in time."""
        key = "question_id" if envelope.get("kind") == "question" else "approval_id"
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

    async def work(self) -> None:
        """Handle queued dispatches one at a time (a terminal shows one prompt at a time)."""
        while True:
            envelope = await self.queue.get()
            try:
                if envelope.get("kind") == "question":
                    await self.questions.handle(envelope)
                else:
                    await self.approvals.handle(envelope)
            except (KeyError, TypeError) as exc:
                log.error(
                    "event=decision_failed approval_id=%s question_id=%s error=%r",
                    envelope.get("approval_id"),
                    envelope.get("question_id"),
                    exc,
                )


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
