"""The sender of ``followup_outbox``: resolution notices, reminders and escalation
dispatches, drained by the dispatcher's loop with the dispatch's signing, timeout, backoff and
redirect rules (``gate.daemon.dispatch``), and the envelopes they carry."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from gate.core.model import Approval
from gate.daemon.dispatch import Dispatcher, post_signed
from gate.errors import GateError
from gate.protocol.canonical import wire_json
from gate.protocol.followup import FollowUp, build_notice

log = logging.getLogger(__name__)

Key = tuple[str, str, int]  # (approval_id, kind, n): the row's primary key
MAX_IN_FLIGHT = 32
BATCH = 64
STORAGE_RETRY_S = 1.0
DECIDING_OUTCOMES = ("approved", "adjusted", "skipped")


@dataclass(frozen=True, slots=True)
class _Outcome:
    """An attempt's result waiting to be recorded: ``retry_at_ms`` None = drop it unsent
    (``error`` says why); ``pipeline``/``step`` label its metric."""

    acked: bool
    error: str | None
    retry_at_ms: int | None
    pipeline: str = ""
    step: str = ""


class FollowUpSender:
    """Sends the due rows of ``followup_outbox`` for ``dispatcher`` (its session, relay URL,
    secret, per-attempt timeout, callback URL and backoff, all as reconfigured by SIGHUP).

    A notice goes to ``relay.notice_target`` of the config in force (dropped as failed when
    notices were turned off meanwhile); a reminder or an escalation goes to the relay's URL
    as the approval's current dispatch plus its follow-up fields, and is dropped (failed,
    ``last_error`` ``resolved``) once the approval resolved or expired. A row is retried with
    the dispatch backoff until its ``give_up_at``, then failed (logged and counted). An
    attempt whose result cannot be recorded (storage fault) is kept in memory and recorded
    again without a second POST, as dispatches are. Rows are read again after a restart.
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self._in_flight: dict[Key, asyncio.Task[None]] = {}
        self._unrecorded: dict[Key, _Outcome] = {}

    async def launch_due(self, session: aiohttp.ClientSession, now_ms: int) -> int | None:
        """Start an attempt for each row due at ``now_ms`` (unix ms) that is not in flight;
        return when the loop should look again (unix ms), or None to wait for a wake-up (a
        finished attempt sets ``dispatch_wakeup``). Raises GateError when the store cannot
        be read."""
        service = self.dispatcher.service
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            return None
        due, next_at = await service.store.reads.followup_plan(now_ms, BATCH)
        for row in due:
            key: Key = (str(row["approval_id"]), str(row["kind"]), int(row["n"]))
            if key in self._in_flight or len(self._in_flight) >= MAX_IN_FLIGHT:
                continue
            task = asyncio.create_task(self._attempt(session, key, row))
            self._in_flight[key] = task
            task.add_done_callback(functools.partial(self._forget, key))
        if next_at is not None and next_at <= now_ms and self._in_flight:
            return None  # what is due is in flight (or waits for room): a finish wakes us
        return next_at

    async def stop(self) -> None:
        """Cancel the attempts in flight (their rows stay due: sent again after a restart)."""
        tasks = list(self._in_flight.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _forget(self, key: Key, _task: asyncio.Task[None]) -> None:
        self._in_flight.pop(key, None)
        self.dispatcher.service.dispatch_wakeup.set()

    async def _attempt(self, session: aiohttp.ClientSession, key: Key, row: dict[str, Any]) -> None:
        service = self.dispatcher.service
        try:
            outcome = self._unrecorded.pop(key, None)
            if outcome is None:
                outcome = await self._send(session, key, row)
            self._unrecorded[key] = outcome  # until recorded
            state = await service.followup_result(
                key, acked=outcome.acked, error=outcome.error, retry_at_ms=outcome.retry_at_ms
            )
            self._unrecorded.pop(key, None)
            self._count(key, state, outcome)
        except GateError as exc:  # storage trouble: the row stays due and is tried again
            log.error(
                "event=followup_failed approval_id=%s kind=%s n=%d reason=%s message=%s",
                *key,
                exc.code,
                exc.message,
            )
            await asyncio.sleep(STORAGE_RETRY_S)
        except Exception as exc:  # a fault building this one send: a failed attempt
            log.error(
                "event=followup_failed approval_id=%s kind=%s n=%d reason=internal_error",
                *key,
                exc_info=exc,
            )
            retry_at = service.clock.now_ms() + self.dispatcher.backoff_ms(int(row["attempts"]) + 1)
            with contextlib.suppress(Exception):
                await service.followup_result(
                    key,
                    acked=False,
                    error=f"the {key[1]} could not be built ({type(exc).__name__})",
                    retry_at_ms=retry_at,
                )
                return
            await asyncio.sleep(STORAGE_RETRY_S)

    async def _send(
        self, session: aiohttp.ClientSession, key: Key, row: dict[str, Any]
    ) -> _Outcome:
        """POST one attempt (or decide not to: a drop) and return what to record."""
        d = self.dispatcher
        approval_id, kind, n = key
        full = await d.service.store.reads.fetch_approval(approval_id)
        now = d.service.clock.now_ms()
        if full is None:
            return _Outcome(False, "unknown approval", None)
        if kind != "notice" and (full.state != "pending" or now >= full.expires_at):
            return _Outcome(False, "resolved", None)  # a reminder of nothing pending: dropped
        if now >= int(row["give_up_at"]):
            return _Outcome(False, "not delivered before it was given up", None)
        if kind == "notice":
            url = d.service.config.relay.notice_target
            if url is None:
                return _Outcome(False, "notices are turned off", None)
            envelope = notice_envelope(full, d.service.config.relay.operators)
        else:
            url = d.relay_url
            envelope = followup_envelope(d.envelope_for(full, full.revision), full, kind, n)
        result = await post_signed(
            session, url, wire_json(envelope), d.secret, now // 1000, d.timeout_s
        )
        attempt = int(row["attempts"]) + 1
        retry_at = d.service.clock.now_ms() + self.dispatcher.backoff_ms(attempt)
        if result.error is None:
            log.info(
                "event=followup_sent approval_id=%s kind=%s n=%d attempt=%d status=%s",
                approval_id,
                kind,
                n,
                attempt,
                result.status,
            )
        else:
            log.warning(
                "event=followup_attempt_failed approval_id=%s kind=%s n=%d attempt=%d error=%r",
                approval_id,
                kind,
                n,
                attempt,
                result.error,
            )
        return _Outcome(result.error is None, result.error, retry_at, full.pipeline, full.step)

    def _count(self, key: Key, state: str | None, outcome: _Outcome) -> None:
        """Log and count a row that ended (delivered or failed)."""
        approval_id, kind, n = key
        metrics = self.dispatcher.metrics.followups
        if state == "delivered":
            if kind == "notice":
                metrics.notice("delivered")
            else:
                metrics.delivered(kind, outcome.pipeline, outcome.step, n)
        elif state == "failed":
            if outcome.error == "resolved":
                log.info(
                    "event=followup_dropped approval_id=%s kind=%s n=%d reason=resolved",
                    approval_id,
                    kind,
                    n,
                )
                return
            log.warning(
                "event=followup_given_up approval_id=%s kind=%s n=%d error=%r",
                approval_id,
                kind,
                n,
                outcome.error,
            )
            if kind == "notice":
                metrics.notice("failed")
            else:
                metrics.failed(kind)


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
