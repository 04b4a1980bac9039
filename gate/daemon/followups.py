"""The channel of ``followup_outbox``: resolution notices, reminders and escalation
dispatches, drained by ``gate.daemon.delivery.OutboxSender`` with the dispatch's signing,
timeout, backoff and redirect rules, and the envelopes they carry."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gate.daemon.delivery import ChannelBase, Outcome, Send, typed
from gate.daemon.dispatch import SendResult
from gate.model import Approval
from gate.protocol.canonical import wire_json
from gate.protocol.followup import FollowUp, build_notice

log = logging.getLogger(__name__)

Key = tuple[str, str, int]  # (approval_id, kind, n): the row's primary key
DECIDING_OUTCOMES = ("approved", "adjusted", "skipped")


@dataclass(frozen=True, slots=True)
class FollowUpRow:
    """A due ``followup_outbox`` row: the ``kind`` (``notice``, ``reminder``,
    ``escalation``) and ``n`` of ``approval_id``, ``attempts`` so far, ``give_up_at`` (unix
    ms: not delivered by then, failed)."""

    approval_id: str
    kind: str
    n: int
    attempts: int
    give_up_at: int

    @property
    def key(self) -> Key:
        return (self.approval_id, self.kind, self.n)

    @property
    def log_id(self) -> str:
        return f"approval_id={self.approval_id} kind={self.kind} n={self.n}"


class FollowUps(ChannelBase):
    """The channel of ``followup_outbox`` for ``dispatcher`` (its relay URL, callback URL and
    metrics, as reconfigured by SIGHUP); drained by ``gate.daemon.delivery.OutboxSender``.

    A notice goes to ``relay.notice_target`` of the config in force (dropped as failed when
    notices were turned off meanwhile); a reminder or an escalation goes to the relay's URL
    as the approval's current dispatch plus its follow-up fields, and is dropped (failed,
    ``last_error`` ``resolved``) once the approval resolved or expired. A row is retried with
    the dispatch backoff until its ``give_up_at``, then failed (logged and counted). Rows are
    read again after a restart.
    """

    failed_event = "followup_failed"
    log = log

    async def due(self, now_ms: int, limit: int) -> tuple[list[FollowUpRow], int | None]:
        rows, next_at = await self.dispatcher.service.store.reads.followup_plan(now_ms, limit)
        return typed(FollowUpRow, rows), next_at

    async def build(self, row: FollowUpRow) -> Send | Outcome:
        """The POST of ``row``, or a drop (an ``Outcome`` without a retry time)."""
        d = self.dispatcher
        full = await d.service.store.reads.fetch_approval(row.approval_id)
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

    def sent(
        self, row: FollowUpRow, send: Send, result: SendResult, attempt: int, retry_at_ms: int
    ) -> None:
        if result.error is None:
            log.info(
                "event=followup_sent approval_id=%s kind=%s n=%d attempt=%d status=%s",
                row.approval_id,
                row.kind,
                row.n,
                attempt,
                result.status,
            )
        else:
            log.warning(
                "event=followup_attempt_failed approval_id=%s kind=%s n=%d attempt=%d error=%r",
                row.approval_id,
                row.kind,
                row.n,
                attempt,
                result.error,
            )

    async def record(self, row: FollowUpRow, outcome: Outcome) -> str | None:
        return await self.dispatcher.service.approvals.followup_result(
            row.key, acked=outcome.acked, error=outcome.error, retry_at_ms=outcome.retry_at_ms
        )

    def ended(self, row: FollowUpRow, state: str | None, outcome: Outcome) -> None:
        """Log and count a row that ended (delivered or failed)."""
        metrics = self.dispatcher.metrics.followups
        if state == "delivered":
            if row.kind == "notice":
                metrics.notice("delivered")
            else:
                metrics.delivered(row.kind, outcome.pipeline, outcome.step, row.n)
        elif state == "failed":
            if outcome.error == "resolved":
                log.info("event=followup_dropped %s reason=resolved", row.log_id)
                return
            log.warning("event=followup_given_up %s error=%r", row.log_id, outcome.error)
            if row.kind == "notice":
                metrics.notice("failed")
            else:
                metrics.failed(row.kind)

    def what(self, row: FollowUpRow) -> str:
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
    if full.outcome is None or full.resolved_at is None:
        raise ValueError(f"approval {full.approval_id} is not resolved")
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
    identity_of = _identities(full, operators)
    return build_notice(
        approval_id=full.approval_id,
        run_id=full.run_id,
        pipeline=full.pipeline,
        step=full.step,
        outcome=full.outcome,
        resolved_at_ms=full.resolved_at,
        revision=final,
        payload_hash=rev.payload_hash,
        decided_by=[
            {
                "identity": row.identity,
                "decision": row.decision,
                "on_behalf_of": identity_of(row.on_behalf_of),
            }
            for row in counted
        ],
        reason=rows[-1].reason if rows and full.outcome in DECIDING_OUTCOMES else None,
    )


def _identities(full: Approval, operators: Sequence[Any]) -> Callable[[int | None], str | None]:
    """Operator id -> configured identity: the approval's scope first, then ``operators``."""
    known = {int(op.id): str(op.identity) for op in operators}
    known.update(dict(full.scope))

    def identity_of(op_id: int | None) -> str | None:
        return None if op_id is None else known.get(int(op_id))

    return identity_of
