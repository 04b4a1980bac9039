"""What ``hitl-gate request`` does on the pipeline's side: create, then wait and report each hop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ulid import ULID

from gate.client.api import ApiClient, ClientError
from gate.client.hops import hops
from gate.client.question_hops import question_hops
from gate.protocol.envelope import rfc3339_ms
from gate.trust import permit

Report = Callable[[str], None]

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


async def create_with_retry(
    api: ApiClient,
    body: dict[str, Any],
    idempotency_key: str,
    timeout_s: float | None,
    report: Callable[[str], None],
    create: Callable[[dict[str, Any], str], Awaitable[tuple[Any, bool]]] | None = None,
) -> tuple[Any, bool] | None:
    """POST the create until the gate takes it; return ``(approval, created)`` as
    ``ApiClient.create``, or None when ``timeout_s`` seconds passed first. Each attempt is
    cut at the deadline (a stuck gate cannot hold it longer), but the last one gets at least
    ``LAST_ATTEMPT_S``: there is always one attempt, and one after a pause that reached the
    deadline.

    While the gate cannot be reached or answers 502/503/504, says so once and tries again
    with backoff (``RETRY_BASE_S`` doubling to ``RETRY_CAP_S``), always with
    ``idempotency_key``: an attempt that landed although its answer was lost is found again
    (200), never created twice (SPEC §3). Other errors are raised (ClientError). ``create``
    is the call that creates (default ``api.create``, an approval; ``api.create_question``
    for ``ask``).
    """
    send = create or api.create
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    outage = 0
    while True:
        limit = None if deadline is None else max(deadline - time.monotonic(), LAST_ATTEMPT_S)
        try:
            return await asyncio.wait_for(send(body, idempotency_key), limit)
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
    api: ApiClient,
    approval: dict[str, Any],
    timeout_s: float | None,
    report: Callable[[str], None],
    *,
    kind: str = "approval",
) -> dict[str, Any]:
    """Long-poll until the approval resolves or ``timeout_s`` passes; report each hop.

    Polls every 0.5 s until the dispatch is acked, every ``PARTIAL_POLL_S`` while a quorum
    above 1 collects decisions, else in ``POLL_CHUNK_S`` long-polls (woken by the resolution).

    While the gate cannot be reached (a restart, a network fault) or answers 502/503/504, says
    so once and polls again with backoff (``RETRY_BASE_S`` doubling to ``RETRY_CAP_S``): the
    approval is durable on the gate (SPEC §8), so waiting goes on. Other errors are raised.

    Returns the last approval object seen (``state`` may still be ``pending`` if the
    client-side timeout elapsed first). With ``kind="question"`` the same loop waits for a
    question (``api.get_question``, ``question_hops``).
    """
    key, get = ("question_id", api.get_question) if kind == "question" else ("approval_id", api.get)
    diff = question_hops if kind == "question" else hops
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    current = approval
    outage = 0  # failed polls in a row while the gate cannot be reached
    for line in diff(None, current):
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
            nxt = await get(current[key], wait=chunk)
        except ClientError as exc:
            if not _transient(exc):
                raise
            if outage == 0:
                report(
                    f"the gate is unreachable ({exc.message}); {kind} "
                    f"{current[key]} stays pending there: retrying every "
                    f"{RETRY_CAP_S:g} s at most (Ctrl-C stops waiting)"
                )
            outage += 1
            await asyncio.sleep(_pause(outage, deadline))
            continue
        if outage:
            report("the gate is reachable again")
            outage = 0
        for line in diff(current, nxt):
            report(line)
        current = nxt
    return current


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """One ``hitl-gate request``: where the gate is, what to ask for, how long to wait.

    ``api_base`` is ``http(s)://host:port`` or ``unix:/path``; ``spend`` is in
    ``budget.unit``; ``timeout_s`` (seconds, None: no limit) is one deadline for the create
    (retried) and the wait after it; ``permit_out`` needs ``wait``. With ``wait`` the
    ``idempotency_key`` must be set (``request_key`` makes one).
    """

    api_base: str
    token: str
    pipeline: str
    step: str
    text: str
    content_type: str = "text/plain"
    run_id: str | None = None
    spend: float | None = None
    requested_by: str | None = None
    idempotency_key: str | None = None
    wait: bool = False
    timeout_s: float | None = None
    permit_out: Path | None = None

    def create_body(self) -> dict[str, Any]:
        """The JSON body of ``POST /v1/approvals`` (SPEC §3); an empty ``run_id`` is left out."""
        body: dict[str, Any] = {
            "pipeline": self.pipeline,
            "step": self.step,
            "draft": {"content_type": self.content_type, "body": self.text},
        }
        if self.run_id:
            body["run_id"] = self.run_id
        if self.spend is not None:
            body["spend"] = self.spend
        if self.requested_by is not None:
            body["requested_by"] = self.requested_by
        return body


@dataclass(slots=True)
class RequestProgress:
    """How far a request got, for a caller interrupted mid-way (Ctrl-C): the id of the
    approval the gate created (or found again), None until then."""

    approval_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What a request ended with. ``approval`` is the last approval object seen (still
    ``pending`` when ``timeout_s`` passed first), or None when the gate did not take the
    create within ``timeout_s``; ``permit_error`` is the one line saying why
    ``permit_out`` was not written (the action must not fire), else None."""

    approval: dict[str, Any] | None
    permit_error: str | None = None


def request_key(given: str | None, wait: bool, prefix: str = "hitl-request") -> str | None:
    """The Idempotency-Key to send: ``given``, else with ``wait`` one of our own
    (``<prefix>-<ULID>``: ``hitl-request-…``, ``hitl-ask-…`` for a question), because a
    create the gate cannot take now is sent again and a key makes that safe (SPEC §3);
    else None."""
    return given or (f"{prefix}-{ULID()}" if wait else None)


async def run_request(
    opts: RequestOptions, report: Report, progress: RequestProgress | None = None
) -> RequestResult:
    """Create the approval (with ``wait``: retried, ``create_with_retry``), report it as new
    or found again, then with ``wait`` wait for the outcome (``wait_for_outcome``) and apply
    the permit-file policy (``save_permit``). One deadline, ``opts.timeout_s`` from now,
    covers the create and the wait. Records the approval id in ``progress``. Raises
    ClientError for what the gate refuses (or a failure that is not transient)."""
    progress = progress if progress is not None else RequestProgress()
    deadline = None if opts.timeout_s is None else time.monotonic() + opts.timeout_s

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    async with ApiClient(opts.api_base, opts.token) as api:
        if opts.wait:
            assert opts.idempotency_key is not None
            answered = await create_with_retry(
                api, opts.create_body(), opts.idempotency_key, left(), report
            )
            if answered is None:
                return RequestResult(None)
            approval, new = answered
        else:
            approval, new = await api.create(opts.create_body(), opts.idempotency_key)
        progress.approval_id = approval["approval_id"]
        report(_created_line(opts, approval, new))
        if not opts.wait:
            return RequestResult(dict(approval))
        final = await wait_for_outcome(api, approval, left(), report)
    if final["state"] != "resolved" or opts.permit_out is None:
        return RequestResult(final)
    return RequestResult(final, save_permit(opts.permit_out, final, report))


def _created_line(opts: RequestOptions, approval: dict[str, Any], new: bool) -> str:
    """The line reporting a create: a new approval, or one the same key made before."""
    if new:
        return (
            f"requested approval {approval['approval_id']} for {opts.pipeline}/{opts.step} "
            f"(quorum {approval['quorum']['required']}, {approval['payload_hash']})"
        )
    state = approval["state"] + (
        f", outcome {approval['outcome']}" if approval["state"] == "resolved" else ""
    )
    return (
        f"already requested: approval {approval['approval_id']} for "
        f"{opts.pipeline}/{opts.step} (the same request with Idempotency-Key "
        f"{opts.idempotency_key} was made before; state {state})"
    )


def save_permit(path: Path, approval: dict[str, Any], report: Report) -> str | None:
    """Apply ``--permit-out`` to a resolved approval: write its permit (JWS) to ``path``, or
    remove ``path`` when the outcome carries none, so an older permit cannot pass for it.

    Returns None when done (reports ``permit saved to PATH`` when written), else the one
    line why not: an approved/adjusted approval without a permit (no signing key), a
    permit already expired (a replay long after the resolution), or ``path`` not
    writable.
    """
    try:
        if approval["final_body"] is None:
            path.unlink(missing_ok=True)  # no earlier permit may pass for this outcome's
            return None
        if not approval.get("permit"):
            path.unlink(missing_ok=True)  # an older permit must not pass for this approval
            return (
                f"approval {approval['approval_id']} is {approval['outcome']} but the gate "
                "issued no permit (receipts.signing_key_file is not configured)"
            )
        exp = permit.unverified_expiry(approval["permit"])
        if exp is not None and exp <= time.time():
            path.unlink(missing_ok=True)
            return (
                f"the permit of approval {approval['approval_id']} expired at "
                f"{rfc3339_ms(exp * 1000)}: the action must not fire on it; request again with "
                "a new Idempotency-Key"
            )
        permit.save(path, approval["permit"])
    except OSError as exc:
        return f"--permit-out: cannot write {path}: {exc.strerror or exc}"
    report(f"permit saved to {path}")
    return None
