"""What ``hitl-gate request`` does on the pipeline's side: create, then wait and report each hop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gate.client.api import ApiClient, ClientError

EXIT_CODES = {"approved": 0, "adjusted": 0, "skipped": 3, "timeout": 4, "cancelled": 5}
POLL_CHUNK_S = 60.0
# the gate's long-poll wakes on the resolution only (SPEC §3): with a quorum above 1 the
# decisions before it (and an adjust's new revision) are seen by polling this often
PARTIAL_POLL_S = 1.0
# polls while the gate cannot be reached: 0.5 s doubling to 5 s
RETRY_BASE_S = 0.5
RETRY_CAP_S = 5.0
# a create's last attempt (and the only one of --timeout 0) may take this long past the deadline
LAST_ATTEMPT_S = 1.0


def _pause(outage: int, deadline: float | None) -> float:
    """Seconds to wait after the ``outage``-th failed try in a row: ``RETRY_BASE_S``
    doubling to ``RETRY_CAP_S``, never past ``deadline`` (time.monotonic(), or None)."""
    pause = min(RETRY_CAP_S, RETRY_BASE_S * float(2 ** (outage - 1)))
    return pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))


def _transient(exc: ClientError) -> bool:
    """True for a failure that passes by itself: no connection, or 502/503/504."""
    return exc.code == "gate_unreachable" or exc.status in (502, 503, 504)


def hops(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """Return one human line per change between two approval objects (dispatch, decisions)."""
    lines: list[str] = []
    old_dispatch = (before or {}).get("dispatch") or {}
    new_dispatch = after.get("dispatch") or {}
    if new_dispatch.get("delivered_at") and (
        new_dispatch.get("delivered_at") != old_dispatch.get("delivered_at")
        or new_dispatch.get("revision") != old_dispatch.get("revision")
    ):
        lines.append(
            f"dispatched revision {new_dispatch.get('revision')} to the relay "
            f"(attempt {new_dispatch.get('attempts')}, acked {new_dispatch['delivered_at']})"
        )
    elif new_dispatch.get("last_error") and new_dispatch.get("last_error") != old_dispatch.get(
        "last_error"
    ):
        lines.append(f"dispatch not acked yet: {new_dispatch['last_error']} (retrying)")
    seen = len((before or {}).get("decisions") or [])
    new_decisions = (after.get("decisions") or [])[seen:]
    if (
        new_decisions
        and not lines
        and not new_dispatch.get("delivered_at")
        and not (old_dispatch.get("delivered_at"))
        and not seen
    ):
        # the relay answered before the gate had recorded its ack: the decision proves delivery
        lines.append(
            f"dispatched revision {new_decisions[0]['revision']} to the relay "
            "(decision arrived before the ack was recorded)"
        )
    decided = [
        f"decision {d['decision']} by {d['identity']} (operator {d['operator_id']}, "
        f"revision {d['revision']}, via {d.get('channel') or 'relay'})"
        for d in new_decisions
    ]
    if (old_dispatch.get("revision") or 1) < (new_dispatch.get("revision") or 1):
        lines[:0] = decided  # an adjust made the revision just dispatched: cause first
    else:
        lines.extend(decided)
    if after["state"] == "resolved" and (before or {}).get("state") != "resolved":
        receipt = after.get("receipt") or {}
        lines.append(
            f"resolved: {after['outcome']} (revision {after['revision']}, {after['payload_hash']})"
        )
        if receipt:
            lines.append(
                f"receipt: audit entry {receipt.get('seq')} "
                f"{receipt.get('alg')}={receipt.get('receipt')}"
            )
    return lines


async def create_with_retry(
    api: ApiClient,
    body: dict[str, Any],
    idempotency_key: str,
    timeout_s: float | None,
    report: Callable[[str], None],
) -> tuple[Any, bool] | None:
    """POST the create until the gate takes it; return ``(approval, created)`` as
    ``ApiClient.create``, or None when ``timeout_s`` seconds passed first. Each attempt is
    cut at the deadline (a stuck gate cannot hold it longer), but the last one gets at least
    ``LAST_ATTEMPT_S``: there is always one attempt, and one after a pause that reached the
    deadline.

    While the gate cannot be reached or answers 502/503/504, says so once and tries again
    with backoff (``RETRY_BASE_S`` doubling to ``RETRY_CAP_S``), always with
    ``idempotency_key``: an attempt that landed although its answer was lost is found again
    (200), never created twice (SPEC §3). Other errors are raised (ClientError).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    outage = 0
    while True:
        limit = None if deadline is None else max(deadline - time.monotonic(), LAST_ATTEMPT_S)
        try:
            return await asyncio.wait_for(api.create(body, idempotency_key), limit)
        except TimeoutError:
            return None
        except ClientError as exc:
            if not _transient(exc):
                raise
            if outage == 0:
                report(
                    f"the gate cannot take the request now ({exc.message}); retrying with "
                    f"Idempotency-Key {idempotency_key} every {RETRY_CAP_S:g} s at most "
                    "(Ctrl-C stops)"
                )
            outage += 1
            if deadline is not None and time.monotonic() >= deadline:
                return None
            await asyncio.sleep(_pause(outage, deadline))


async def wait_for_outcome(
    api: ApiClient, approval: dict[str, Any], timeout_s: float | None, report: Callable[[str], None]
) -> dict[str, Any]:
    """Long-poll until the approval resolves or ``timeout_s`` passes; report each hop.

    Polls every 0.5 s until the dispatch is acked, every ``PARTIAL_POLL_S`` while a quorum
    above 1 collects decisions, else in ``POLL_CHUNK_S`` long-polls (woken by the resolution).

    While the gate cannot be reached (a restart, a network fault) or answers 502/503/504, says
    so once and polls again with backoff (``RETRY_BASE_S`` doubling to ``RETRY_CAP_S``): the
    approval is durable on the gate (SPEC §8), so waiting goes on. Other errors are raised.

    Returns the last approval object seen (``state`` may still be ``pending`` if the
    client-side timeout elapsed first).
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    current = approval
    outage = 0  # failed polls in a row while the gate cannot be reached
    for line in hops(None, current):
        report(line)
    while current["state"] != "resolved":
        remaining = POLL_CHUNK_S if deadline is None else deadline - time.monotonic()
        if remaining <= 0:
            break
        # short polls while nothing is dispatched yet, so the hop is reported promptly
        chunk = min(POLL_CHUNK_S, remaining)
        if not (current.get("dispatch") or {}).get("delivered_at"):
            chunk = min(chunk, 0.5)
        elif (current.get("quorum") or {}).get("required", 1) > 1:
            chunk = min(chunk, PARTIAL_POLL_S)
        try:
            nxt = await api.get(current["approval_id"], wait=chunk)
        except ClientError as exc:
            if not _transient(exc):
                raise
            if outage == 0:
                report(
                    f"the gate is unreachable ({exc.message}); approval "
                    f"{current['approval_id']} stays pending there: retrying every "
                    f"{RETRY_CAP_S:g} s at most (Ctrl-C stops waiting)"
                )
            outage += 1
            await asyncio.sleep(_pause(outage, deadline))
            continue
        if outage:
            report("the gate is reachable again")
            outage = 0
        for line in hops(current, nxt):
            report(line)
        current = nxt
    return current
