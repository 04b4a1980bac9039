"""The reference relay's questions: check a signed question dispatch (its signature
and window were checked by ``Relay.receive``, as for approvals), ack it at once, ask the one
answerer in scope on the terminal (or answer with ``--auto-answer``), check the answer with
``gate.protocol.question.check_value`` before sending it, post it signed (``build_answer``)
and ask again when the gate refuses the value (422; ``Relay.exchange``). Nothing here ever
decides an approval.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from gate.errors import GateError
from gate.protocol.answer import build_answer
from gate.protocol.question import QuestionSpec
from gate.protocol.relay_inbound import question_request_hash
from gate.tools.reference_relay.question_prompt import auto_value, prompt_value
from gate.tools.reference_relay.question_view import OMIT, gate_refusal, line
from gate.tools.reference_relay.state import Fields, revision_of

if TYPE_CHECKING:
    from gate.tools.reference_relay.relay import Relay

log = logging.getLogger(__name__)


def _is_question(value: object) -> bool:
    """True for a dispatch's ``question``: an object ``QuestionSpec.from_json`` reads."""
    if not isinstance(value, dict):
        return False
    try:
        QuestionSpec.from_json(value)
    except (KeyError, TypeError, ValueError):
        return False
    return True


class QuestionDesk:
    """The questions side of a ``Relay``: checks, asks, answers; ``Relay.exchange``
    delivers. A reply is the answer's value. ``auto_answer`` is the ``--auto-answer`` VALUE
    (None: ask on the terminal, or refuse with ``--auto`` alone)."""

    # docs/protocol.md "Questions": the fields this relay uses
    FIELDS: Fields = (
        ("question_id", str),
        ("request_hash", str),
        ("question", _is_question),
        ("callback.url", str),
        ("callback.nonce", str),
        ("approvers", list),
    )
    # the field a digest of the dispatch must equal (else 400 request_hash_mismatch)
    HASHED = ("request_hash", question_request_hash)
    # when input ends: the stdin_closed log line's reason, and the line said on the terminal
    ENDED = (
        "no human can answer on this terminal",
        "Input ended: nobody can answer here any more. Ctrl-C stops.",
    )

    def __init__(self, relay: Relay, auto_answer: str | None) -> None:
        self.relay = relay
        self.auto_answer = auto_answer
        self.log = log

    def unable(self, envelope: dict[str, Any]) -> str | None:
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

    async def handle(self, envelope: dict[str, Any]) -> None:
        """Ask (or auto-answer) until the gate records an answer or says nobody needs one."""
        relay, qid = self.relay, envelope["question_id"]
        log.info(
            "event=question_received question_id=%s version=%d request_hash=%s type=%s",
            qid,
            revision_of(envelope),
            envelope["request_hash"],
            QuestionSpec.from_json(envelope["question"]).response_type,
        )
        identity = next(iter(relay.in_scope(envelope)), None)  # one answer: the first
        if identity is None:
            log.warning("event=not_in_scope question_id=%s", qid)
            relay._tell(
                f"\nQuestion {line(qid)}: none of {', '.join(relay.identities)} may answer "
                "it; not shown (start the relay with --as one of its approvers)."
            )
        elif not self._stale(envelope):
            await relay.exchange(self, envelope, identity)

    def _stale(self, envelope: dict[str, Any]) -> bool:
        """True, said on the terminal, when nobody should answer this dispatch any more
        (``Knowledge.stale``)."""
        stale = self.relay.known.stale(envelope, time.time())
        if stale is not None:
            self.relay._tell(f"\n{stale}; not asking.")
        return stale is not None

    async def reply(self, envelope: dict[str, Any], identity: str) -> Any:
        """The ``--auto-answer`` value for the question (``auto_value``; ``OMIT`` when it
        does not fit, which ``unable`` checked before the ack), else a value typed on the
        terminal that passed ``check_value`` (``prompt_value``; ``OMIT`` when the question
        went stale before it was asked again)."""
        spec = QuestionSpec.from_json(envelope["question"])
        if self.relay.auto is None:
            return (
                OMIT
                if self._stale(envelope)
                else await prompt_value(self.relay, envelope, spec, identity)
            )
        assert self.auto_answer is not None
        try:
            return auto_value(spec, self.auto_answer)
        except GateError:
            log.error(
                "event=auto_answer_refused question_id=%s reason=auto_answer_does_not_fit",
                envelope["question_id"],
            )
            return OMIT

    def message(self, envelope: dict[str, Any], identity: str, reply: Any) -> dict[str, Any]:
        """``identity``'s answer ``reply`` (its value) to the question (``build_answer``)."""
        return build_answer(
            question_id=envelope["question_id"],
            nonce=envelope["callback"]["nonce"],
            request_hash=envelope["request_hash"],
            value=reply,
            approver_id=identity,
            decided_at_ms=int(time.time() * 1000),
            channel="auto" if self.relay.auto is not None else "terminal",
        )

    def answered(
        self, envelope: dict[str, Any], identity: str, reply: Any, status: int, answer: Any
    ) -> str | None:
        """Log the answer sent (never its value) and the gate's answer; remember what it says
        and return it in one line, or None when a human is to answer again (a 422: said
        why)."""
        qid, known = envelope["question_id"], self.relay.known
        fields = answer if isinstance(answer, dict) else {}
        reason = fields.get("reason")
        log.info(
            "event=answer_sent question_id=%s approver=%s answer=%s reason=%s",
            qid,
            identity,
            status,
            reason,
        )
        if status == 422 and self.relay.auto is None:
            self.relay.terminal.say(f"The gate refused that answer: {gate_refusal(answer)}.")
            self.relay.terminal.say("Please answer again.")
            return None
        if status == 200 or reason == "duplicate":
            known.closed[qid] = "was answered"
            return f"Recorded: question {line(qid)} is answered."
        if reason == "superseded":
            known.newer(qid, revision_of(envelope) + 1)
            return (
                f"Question {line(qid)} version {revision_of(envelope)} was superseded by a "
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
