"""The channel of ``followup_outbox``: resolution notices, reminders and escalation
dispatches, drained by ``gate.daemon.delivery.OutboxSender`` with the dispatch's signing,
timeout, backoff and redirect rules, and the envelopes they carry."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from gate.daemon.delivery import Channel, Outcome, Send, resolution
from gate.model import Approval
from gate.protocol.canonical import wire_json
from gate.protocol.followup import FollowUp, build_notice
from gate.store.approvals import APPROVALS
from gate.store.outbox import FOLLOWUPS, DueFollowUp

log = logging.getLogger(__name__)

DECIDING_OUTCOMES = ("approved", "adjusted", "skipped")


class FollowUps(Channel[DueFollowUp]):
    """The channel of ``followup_outbox`` for ``dispatcher`` (its relay URL, callback URL and
    metrics, as reconfigured by SIGHUP); drained by ``gate.daemon.delivery.OutboxSender``.

    A notice goes to ``relay.notice_target`` of the config in force (dropped as failed when
    notices were turned off meanwhile); a reminder or an escalation goes to the relay's URL
    as the approval's current dispatch plus its follow-up fields, and is dropped (failed,
    ``last_error`` ``resolved``) once the approval resolved or expired. A row is retried with
    the dispatch backoff until its ``give_up_at``, then failed (logged and counted). Rows are
    read again after a restart.
    """

    table = FOLLOWUPS
    event = "followup"
    log = log

    async def build(self, row: DueFollowUp) -> Send | Outcome:
        """The POST of ``row``, or a drop (an ``Outcome`` without a retry time)."""
        d = self.dispatcher
        full = await d.service.store.reads.fetch(APPROVALS, row.approval_id)
        now = d.service.clock.now_ms()
        if full is None:
            return Outcome(False, "unknown approval", None)
        if row.kind != "notice" and (full.state != "pending" or now >= full.expires_at):
            return Outcome(False, "resolved", None)  # a reminder of nothing pending: dropped
        if now >= row.give_up_at:
            return Outcome(False, "not delivered before it was given up", None)
        if row.kind == "notice":
            url = d.service.config.relay.notice_target
            if url is None:
                return Outcome(False, "notices are turned off", None)
            envelope = notice_envelope(full, d.service.config.relay.operators)
        else:
            url = d.relay_url
            envelope = followup_envelope(d.envelope_for(full, full.revision), full, row.kind, row.n)
        return Send(url, wire_json(envelope), full.pipeline, full.step)

    async def record(self, row: DueFollowUp, outcome: Outcome) -> str | None:
        return await self.dispatcher.service.approvals.followup_result(
            row.key, acked=outcome.acked, error=outcome.error, retry_at_ms=outcome.retry_at_ms
        )

    def ended(self, row: DueFollowUp, state: str | None, outcome: Outcome) -> None:
        """Log and count a row that ended (delivered or failed)."""
        if state == "failed" and outcome.error == "resolved":
            log.info("event=followup_dropped %s reason=resolved", self.log_id(row))
            return
        if state == "failed":
            log.warning("event=followup_given_up %s error=%r", self.log_id(row), outcome.error)
        if state in ("delivered", "failed"):
            metrics = self.dispatcher.metrics
            metrics.followup_ended(row.kind, state, outcome.pipeline, outcome.step, row.n)

    def what(self, row: DueFollowUp) -> str:
        return row.kind


def followup_envelope(
    envelope: dict[str, Any],
    full: Approval,
    kind: str,
    n: int,
) -> dict[str, Any]:
    """``envelope``, the current revision's dispatch (``Dispatcher.envelope_for``: same nonce,
    same revision, ``approvers`` the approval's scope as widened), plus the
    ``reminder``/``awaiting`` (kind ``reminder``, n-th) or ``escalation`` (kind
    ``escalation``, level n)."""
    if kind == "reminder":
        FollowUp(reminder=n, awaiting=awaiting(full)).apply(envelope)
    else:
        FollowUp(escalation=n).apply(envelope)
    return envelope


def awaiting(full: Approval) -> tuple[str, ...]:
    """Identities in the approval's scope that have not decided its current revision: no
    decision of theirs or on their behalf on it, and not the adjust that made it."""
    revision = full.revision_row(full.revision)
    decided = {revision.created_by} if revision is not None else set()
    for row in full.decisions:
        if row.revision == full.revision:
            decided.add(row.operator_id)
            decided.add(row.on_behalf_of)
    return tuple(identity for op_id, identity in full.scope if op_id not in decided)


def notice_envelope(full: Approval, operators: Sequence[Any] = ()) -> dict[str, Any]:
    """The resolution notice of a resolved approval (``build_notice``, docs/protocol.md
    "Notices"): ``decided_by`` the decisions that count on the final revision (the adjust
    that made it, then the decisions on it), each with the principal's identity when made
    on someone's behalf (looked up in the scope, then in ``operators``); ``reason`` the
    resolving decision's (the last one), None for a timeout or a cancel. Raises ValueError
    when the approval is not resolved."""
    fields = resolution(full)
    final = full.revision
    rev = full.revision_row(final)
    assert rev is not None
    rows = full.decisions  # in the order recorded
    counted = [row for row in rows if row.revision == final]
    if rev.created_by is not None:
        made = [
            row
            for row in rows
            if row.revision == final - 1
            and row.operator_id == rev.created_by
            and row.decision == "adjust"
        ]
        counted = made[-1:] + counted
    identities = {int(op.id): str(op.identity) for op in operators} | dict(full.scope)
    return build_notice(
        **fields,
        revision=final,
        payload_hash=rev.payload_hash,
        decided_by=[
            {
                "identity": row.identity,
                "decision": row.decision,
                "on_behalf_of": (
                    None if row.on_behalf_of is None else identities.get(int(row.on_behalf_of))
                ),
            }
            for row in counted
        ],
        reason=rows[-1].reason if rows and full.outcome in DECIDING_OUTCOMES else None,
    )
