"""The reference relay's approvals: ask each decider in scope about a dispatch on the terminal
(or decide by ``--auto``), sign the decision, deliver it and say what the gate answered; a
prompt that goes stale on screen (a newer revision, expiry) is withdrawn."""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from gate.protocol.canonical import payload_hash
from gate.protocol.display import display_time
from gate.protocol.envelope import build_decision
from gate.tools.reference_relay.state import Fields, revision_of
from gate.tools.reference_relay.terminal import Withdrawn
from gate.tools.reference_relay.view import shown, verdict

if TYPE_CHECKING:
    from gate.tools.reference_relay.relay import Relay

# the relay's log lines keep the logger name they had before this module was split out
log = logging.getLogger("gate.tools.reference_relay.relay")

CHANNEL = "terminal"


class ApprovalDesk:
    """The approvals side of a ``Relay`` (its state: who it decides as, ``known``, the
    prompt on screen): checks, asks, decides; ``Relay.exchange`` delivers. A reply is
    ``(verb, text)``."""

    # SPEC §2 "Dispatch": the fields this relay uses
    FIELDS: Fields = (
        ("approval_id", str),
        ("payload_hash", str),
        ("draft.body", str),
        ("callback.url", str),
        ("callback.nonce", str),
        ("approvers", list),
    )
    # the field a digest of the dispatch must equal (else 400 payload_hash_mismatch)
    HASHED = ("payload_hash", lambda envelope: payload_hash(envelope["draft"]["body"]))
    # when input ends: the stdin_closed log line's reason, and the line said on the terminal
    ENDED = (
        "no human can answer on this terminal; new dispatches are refused "
        "(503 no_human_at_terminal, the gate retries them), those already "
        "acked stay undecided until they expire or are cancelled",
        "Input ended: nobody can answer here any more; new dispatches are "
        "refused (the gate retries them), this one waits for its timeout. "
        "Ctrl-C stops.",
    )

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.log = log

    def unable(self, envelope: dict[str, Any]) -> str | None:
        """``no_human_at_terminal`` when nobody here can decide (``Relay.nobody_here``)."""
        return "no_human_at_terminal" if self.relay.nobody_here() else None

    def message(
        self, envelope: dict[str, Any], identity: str, reply: tuple[str, str | None]
    ) -> dict[str, Any]:
        """``identity``'s decision ``(verb, text)`` (``text``: an adjust's new text or a
        skip's reason, else ignored; with the relay's ``--approver-key`` it carries its
        ``approver_assertion``)."""
        verb, text = reply
        adjust_text = text if verb == "adjust" else None
        reason = text if verb == "skip" else None
        decision = build_decision(
            approval_id=envelope["approval_id"],
            nonce=envelope["callback"]["nonce"],
            decision=verb,
            payload_hash=envelope["payload_hash"],
            approver_id=identity,
            decided_at_ms=int(time.time() * 1000),
            channel="auto" if self.relay.auto is not None else CHANNEL,
            adjust_text=adjust_text,
            reason=reason,
        )
        key = self.relay.approver_key
        if key is not None:  # signed by the approver's own key
            decision["approver_assertion"] = key.assertion(envelope, verb, adjust_text, reason)
        return decision

    async def handle(self, envelope: dict[str, Any]) -> None:
        """Ask each decider in scope in turn (or auto-decide), skipping who is recorded and
        stopping once the dispatch is stale."""
        approval_id, revision = envelope["approval_id"], revision_of(envelope)
        log.info(
            "event=dispatch_received approval_id=%s revision=%d payload_hash=%s quorum=%s",
            approval_id,
            revision,
            envelope["payload_hash"],
            _quorum_field(envelope),
        )
        self._warn_unsigned(envelope)
        asked = False
        for identity in self.relay.deciders(envelope):
            stale = self.relay.known.stale(envelope, time.time())
            if stale is not None:
                log.info(
                    "event=dispatch_stale approval_id=%s revision=%d reason=%r",
                    approval_id,
                    revision,
                    stale,
                )
                self.relay._tell(
                    f"{stale}; not asking {identity}."
                    if asked
                    else f"\n{stale} before its turn; not shown."
                )
                return
            if self.relay.known.recorded(envelope, identity):
                log.info(
                    "event=already_recorded approval_id=%s revision=%d approver=%s",
                    approval_id,
                    revision,
                    identity,
                )
                self.relay._tell(
                    f"Approval {shown(approval_id)} revision {revision}: not asking "
                    f"{identity}, whose decision on it is recorded (an edit counts as "
                    "its editor's approval)."
                )
                continue
            asked = True
            result = await self.relay.exchange(self, envelope, identity)
            if result is None:
                return
            reply, status, answer = result
            self.relay.known.learn(envelope, identity, reply, status, answer)
            quorum = envelope.get("quorum")
            if (
                status == 200
                and isinstance(quorum, dict)
                and isinstance(quorum.get("collected"), int)
            ):
                # recorded, not resolved: the next approver's prompt shows the new count
                envelope = {**envelope, "quorum": {**quorum, "collected": quorum["collected"] + 1}}

    def _warn_unsigned(self, envelope: dict[str, Any]) -> None:
        """Once per dispatch: a WARNING when its step asks for the approver's own signature
        (``"approver_signature": "required"|"optional"``) and this relay has no
        ``--approver-key``: a required step refuses what it posts (403
        ``approver_signature_required``), an optional one records it unsigned."""
        mode = envelope.get("approver_signature")
        if self.relay.approver_key is not None or mode not in ("required", "optional"):
            return
        effect = (
            "the gate refuses its unsigned decisions"
            if mode == "required"
            else "its decisions are recorded unsigned"
        )
        log.warning(
            "event=approver_signature_unsigned approval_id=%s approver_signature=%s hint=%r",
            envelope["approval_id"],
            mode,
            f"this relay has no approver key, so {effect}: start it with --approver-key KEY "
            "(enrolled with hitl-gate approvers add-key)",
        )

    def answered(
        self, envelope: dict[str, Any], identity: str, reply: Any, status: int, answer: Any
    ) -> str | None:
        """Log the decision ``reply`` sent and the gate's answer; return its verdict's line
        (``view.verdict``), or None when a human is to answer again (a 422: said why)."""
        log.info(
            "event=decision_sent approval_id=%s approver=%s decision=%s answer=%s %s",
            envelope.get("approval_id"),
            identity,
            reply[0],
            status,
            json.dumps(answer, ensure_ascii=False),
        )
        if status == 422 and self.relay.auto is None:
            reason = answer.get("reason") if isinstance(answer, dict) else None
            self.relay.terminal.say(
                f"The gate refused that answer ({reason}); please answer again."
            )
            return None
        return verdict(reply[0], status, answer)

    async def reply(self, envelope: dict[str, Any], identity: str) -> tuple[str, str | None]:
        """What ``--auto`` decides, else one prompt on the terminal, withdrawn (Withdrawn)
        when it goes stale while shown: a newer revision arrives (``Relay._newer``) or the
        dispatch's ``expires_at`` passes."""
        if self.relay.auto is not None:
            return self.relay.auto.verb, self.relay.auto.text
        approval_id = envelope["approval_id"]
        now_stale = self.relay.known.stale(envelope, time.time())
        if now_stale is not None:  # asked again (after a 422) about what went stale meanwhile
            self.relay.terminal.say(f"{now_stale}; not asking again.")
            raise Withdrawn(now_stale)
        expired = (
            f"Approval {shown(approval_id)} expired at "
            f"{shown(display_time(envelope.get('expires_at')))} "
            "while waiting for an answer; not asking any more."
        )
        with self.relay.asking_about(envelope, expired) as stale:
            return await self.relay.terminal.ask(envelope, identity, stale)


def _quorum_field(envelope: dict[str, Any]) -> str:
    """``collected/required`` for a log line (``0/2``)."""
    quorum = envelope.get("quorum")
    quorum = quorum if isinstance(quorum, dict) else {}
    return f"{quorum.get('collected')}/{quorum.get('required')}"
