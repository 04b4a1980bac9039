"""The reference relay's questions: take a signed question dispatch (its signature
and window were checked by ``Relay.receive``, as for approvals), ack it at once, ask the one
answerer in scope on the terminal (or answer with ``--auto-answer``), check the answer with
``gate.protocol.question.check_value`` before sending it, post it signed (``build_answer``)
and ask again when the gate refuses the value (422). Nothing here ever decides an approval.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gate.errors import GateError
from gate.protocol.display import display_time
from gate.protocol.question import QuestionSpec, build_answer
from gate.protocol.relay_inbound import question_request_hash
from gate.protocol.whitespace import identity_key
from gate.tools.reference_relay.question_prompt import auto_value, prompt_value
from gate.tools.reference_relay.question_view import (
    OMIT,
    gate_refusal,
    line,
)
from gate.tools.reference_relay.state import expiry_of, version_of
from gate.tools.reference_relay.terminal import Withdrawn

if TYPE_CHECKING:
    from gate.tools.reference_relay.relay import Relay

log = logging.getLogger(__name__)


def _invalid(field: str) -> web.Response:
    log.warning("event=dispatch_refused reason=invalid_dispatch kind=question field=%s", field)
    return web.json_response(
        {"status": "invalid", "reason": "invalid_dispatch", "field": field}, status=400
    )


class QuestionDesk:
    """The questions side of a ``Relay``: receives, asks, answers. ``auto_answer`` is the
    ``--auto-answer`` VALUE (None: ask on the terminal, or refuse with ``--auto`` alone)."""

    def __init__(self, relay: Relay, auto_answer: str | None) -> None:
        self.relay = relay
        self.auto_answer = auto_answer

    def receive(self, envelope: dict[str, Any]) -> web.Response:
        """Check a question dispatch's fields and hash, ack it (202) and queue it; 400
        ``invalid_dispatch`` naming the field, 400 ``request_hash_mismatch``, 503 when nobody
        here can answer (``_unable``: input ended, ``--auto`` without ``--auto-answer``, or
        one that does not fit the question)."""
        relay = self.relay
        for name in ("question_id", "request_hash"):
            if not isinstance(envelope.get(name), str):
                return _invalid(name)
        question, callback = envelope.get("question"), envelope.get("callback")
        if not isinstance(question, dict):
            return _invalid("question")
        try:
            QuestionSpec.from_json(question)
        except (KeyError, TypeError, ValueError):
            return _invalid("question")
        for child in ("url", "nonce"):
            if not isinstance(callback, dict) or not isinstance(callback.get(child), str):
                return _invalid(f"callback.{child}")
        if not isinstance(envelope.get("approvers"), list):
            return _invalid("approvers")
        if question_request_hash(envelope) != envelope["request_hash"]:
            log.warning("event=dispatch_refused reason=request_hash_mismatch kind=question")
            return web.json_response(
                {"status": "invalid", "reason": "request_hash_mismatch"}, status=400
            )
        unable = self._unable(envelope)
        return relay.accept(envelope, "question", version_of(envelope), unable, log)

    def _unable(self, envelope: dict[str, Any]) -> str | None:
        """Why nobody here will answer this question, checked before it is acked (so the
        gate keeps it, retries and shows why), or None: ``no_auto_answer`` (``--auto`` without
        ``--auto-answer``), ``auto_answer_does_not_fit`` (``check_value`` refuses the
        ``--auto-answer`` VALUE for it: new-user finding 5), ``no_human_at_terminal`` (input
        ended: finding 14)."""
        relay = self.relay
        if relay.auto is None:
            return "no_human_at_terminal" if relay.nobody_here() else None
        if self.auto_answer is None:
            return "no_auto_answer"
        try:
            auto_value(QuestionSpec.from_json(envelope["question"]), self.auto_answer)
        except GateError:
            return "auto_answer_does_not_fit"  # never the value or why (it names the value)
        return None

    def _stale(self, envelope: dict[str, Any]) -> str | None:
        """Why nobody should answer this dispatch any more, or None while it is current."""
        known, qid, version = self.relay.known, envelope["question_id"], version_of(envelope)
        if qid in known.closed:
            return f"Question {line(qid)} {known.closed[qid]}"
        if known.latest.get(qid, 0) > version:
            return f"Question {line(qid)} version {version} was superseded by a newer version"
        if time.time() >= expiry_of(envelope, time.time()):
            expires = display_time(envelope.get("expires_at"))
            return f"Question {line(qid)} expired at {line(expires)}"
        return None

    def _answerer(self, envelope: dict[str, Any]) -> str | None:
        """Who answers: the first ``--as`` identity in scope, else the first approver."""
        approvers = [a for a in envelope["approvers"] if isinstance(a, str)]
        if not self.relay.identities:
            return approvers[0] if approvers else None
        keys = {identity_key(a) for a in approvers}
        return next((i for i in self.relay.identities if identity_key(i) in keys), None)

    async def handle(self, envelope: dict[str, Any]) -> None:
        """Ask (or auto-answer) until the gate records an answer or says nobody needs one."""
        relay, qid = self.relay, envelope["question_id"]
        spec = QuestionSpec.from_json(envelope["question"])
        log.info(
            "event=question_received question_id=%s version=%d request_hash=%s type=%s",
            qid,
            version_of(envelope),
            envelope["request_hash"],
            spec.response_type,
        )
        identity = self._answerer(envelope)
        if identity is None:
            log.warning("event=not_in_scope question_id=%s", qid)
            relay._tell(
                f"\nQuestion {line(qid)}: none of {', '.join(relay.identities)} may answer "
                "it; not shown (start the relay with --as one of its approvers)."
            )
            return
        while True:
            stale = self._stale(envelope)
            if stale is not None:
                relay._tell(f"\n{stale}; not asking.")
                return
            value = await self._value(envelope, spec, identity)
            if value is OMIT:
                return
            message = self._answer(envelope, identity, value)
            result = await relay.deliver(envelope, identity, message)
            if result is None:
                return
            status, answer = result
            fields = answer if isinstance(answer, dict) else {}
            log.info(
                "event=answer_sent question_id=%s approver=%s answer=%s reason=%s",
                qid,
                identity,
                status,
                fields.get("reason"),
            )
            if status == 422 and relay.auto is None:
                relay.terminal.say(f"The gate refused that answer: {gate_refusal(answer)}.")
                relay.terminal.say("Please answer again.")
                continue
            relay._tell(self._verdict(envelope, status, fields))
            return

    def _verdict(self, envelope: dict[str, Any], status: int, fields: dict[str, Any]) -> str:
        """Remember what the gate's answer says and put it in one line for the terminal."""
        qid, known, reason = envelope["question_id"], self.relay.known, fields.get("reason")
        if status == 200 or reason == "duplicate":
            known.closed[qid] = "was answered"
            return f"Recorded: question {line(qid)} is answered."
        if reason == "superseded":
            known.newer(qid, version_of(envelope) + 1)
            return (
                f"Question {line(qid)} version {version_of(envelope)} was superseded by a "
                "newer version; your answer was not recorded (the new version is asked "
                "when it arrives)."
            )
        if reason in ("already_resolved", "expired", "unknown_question"):
            outcome = line(fields.get("outcome") or reason)
            known.closed[qid] = f"was resolved ({outcome})"
            return f"Question {line(qid)} is already resolved ({outcome}); dropped."
        return (
            f"The gate did not record your answer to question {line(qid)}: "
            f"{gate_refusal(fields)} (HTTP {status})."
        )

    def _answer(self, envelope: dict[str, Any], identity: str, value: Any) -> dict[str, Any]:
        """``identity``'s answer ``value`` to the question (``build_answer``)."""
        return build_answer(
            question_id=envelope["question_id"],
            nonce=envelope["callback"]["nonce"],
            request_hash=envelope["request_hash"],
            value=value,
            approver_id=identity,
            decided_at_ms=int(time.time() * 1000),
            channel="auto" if self.relay.auto is not None else "terminal",
        )

    async def _value(self, envelope: dict[str, Any], spec: QuestionSpec, identity: str) -> Any:
        """A value that passed ``check_value``, or ``OMIT`` when none will come (the auto
        answer does not fit, input ended, the prompt was withdrawn)."""
        relay = self.relay
        if relay.auto is not None:
            assert self.auto_answer is not None
            try:
                return auto_value(spec, self.auto_answer)
            except GateError:  # checked before the ack (``_unable``): cannot happen
                log.error(
                    "event=auto_answer_refused question_id=%s reason=auto_answer_does_not_fit",
                    envelope["question_id"],
                )
                return OMIT
        if relay.stdin_closed:
            return OMIT
        try:
            return await prompt_value(relay, envelope, spec, identity)
        except Withdrawn as exc:
            log.info(
                "event=prompt_withdrawn question_id=%s reason=%r", envelope["question_id"], str(exc)
            )
        except EOFError:
            relay.stdin_closed = True
            log.warning("event=stdin_closed reason=%r", "no human can answer on this terminal")
            relay.terminal.say("Input ended: nobody can answer here any more. Ctrl-C stops.")
        return OMIT
