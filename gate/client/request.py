"""What ``hitl-gate request`` and ``ask`` do on the pipeline's side: create the request and
report it, then with ``--wait`` wait for its outcome reporting each hop (``create_and_wait``,
for both kinds: one retry policy, one deadline rule), save an approval's permit and give a
question's answer as ``ask`` prints it. The retries and long-polls are the SDK's loop
(``gate.sdk.waiting``); ``Reporter`` is the CLI's way through it (its pacing, the outage
lines, the hops)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ulid import ULID

from gate.client.api import client_error
from gate.client.hops import hops, question_hops
from gate.protocol.question import QuestionSpec, answer_text
from gate.protocol.times import rfc3339_ms
from gate.sdk.errors import GateRequestError, GateUnavailable
from gate.sdk.transport import APPROVALS, QUESTIONS, Kind, Transport
from gate.sdk.waiting import RETRY_CAP_S, Failure, Watch, create, deadline_after, settle, transient
from gate.trust import permit

T = TypeVar("T")
Obj = dict[str, Any]
Report = Callable[[str], None]
Hops = Callable[[Obj | None, Obj], list[str]]

EXIT_CODES = {"approved": 0, "adjusted": 0, "skipped": 3, "timeout": 4, "cancelled": 5}

POLL_CHUNK_S = 60.0
# the gate's long-poll wakes on the resolution only (SPEC §3): with a quorum above 1 the
# decisions before it (and an adjust's new revision) are seen by polling this often
PARTIAL_POLL_S = 1.0
# polls this often until the dispatch is acked, so that hop is reported promptly
UNDISPATCHED_POLL_S = 0.5
# a create's last attempt (and the only one of --timeout 0) may take this long past the deadline
LAST_ATTEMPT_S = 1.0


class Reporter(Watch):
    """The CLI's way through the SDK's loop: a create attempt is cut at the deadline (but
    the last one gets ``LAST_ATTEMPT_S``; the cut raises TimeoutError), polls are short
    until the dispatch is acked and while a quorum above 1 collects decisions, an outage is
    said once (and its end), and every change between two views is ``report``-ed as the
    lines ``hops`` makes of it."""

    def __init__(self, report: Report, hops: Hops) -> None:
        self.report = report
        self.hops = hops

    async def attempt(
        self, post: Callable[[float | None], Awaitable[T]], deadline: float | None
    ) -> T:
        limit = None if deadline is None else max(deadline - time.monotonic(), LAST_ATTEMPT_S)
        return await asyncio.wait_for(post(None), limit)

    def hop_s(self, obj: Obj, remaining: float | None) -> float:
        chunk = POLL_CHUNK_S if remaining is None else min(POLL_CHUNK_S, remaining)
        if not (obj.get("dispatch") or {}).get("delivered_at"):
            return min(chunk, UNDISPATCHED_POLL_S)
        if (obj.get("quorum") or {}).get("required", 1) > 1:
            return min(chunk, PARTIAL_POLL_S)
        return chunk

    def create_failed(self, exc: Failure, key: str, outage: int, giving_up: bool) -> None:
        if outage == 1:
            self.report(
                f"the gate cannot take the request now ({_message(exc)}); retrying with "
                f"Idempotency-Key {key} every {RETRY_CAP_S:g} s at most (Ctrl-C stops)"
            )

    def wait_failed(self, exc: Failure, kind: Kind, item_id: str, outage: int) -> None:
        if outage == 1:
            self.report(
                f"the gate is unreachable ({_message(exc)}); {kind.name} {item_id} stays "
                f"pending there: retrying every {RETRY_CAP_S:g} s at most (Ctrl-C stops waiting)"
            )

    def seen(self, before: Obj | None, after: Obj, outage: int) -> None:
        if outage:
            self.report("the gate is reachable again")
        for line in self.hops(before, after):
            self.report(line)


def _message(exc: Failure) -> str:
    """What the CLI's error for a transient failure says (``client_error``)."""
    return client_error(exc).message


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """One ``hitl-gate request`` or ``ask``: where the gate is, what to create, how long to
    wait.

    ``api_base`` is ``http(s)://host:port`` or ``unix:/path``; ``body`` the create's JSON
    body (``gate.sdk.client.approval_body`` or ``question_body``); ``timeout_s`` (seconds,
    None: no limit) is one deadline for the create (retried) and the wait after it;
    ``permit_out`` (an approval's) needs ``wait``. With ``wait`` the ``idempotency_key``
    must be set (``request_key`` makes one).
    """

    api_base: str
    token: str
    body: Obj
    idempotency_key: str | None = None
    wait: bool = False
    timeout_s: float | None = None
    permit_out: Path | None = None


@dataclass(slots=True)
class Progress:
    """How far a run got, for a caller interrupted mid-way (Ctrl-C): the id of the approval
    or question the gate created (or found again), None until then."""

    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What a request ended with. ``approval`` is the last approval object seen (still
    ``pending`` when ``timeout_s`` passed first), or None when the gate did not take the
    create within ``timeout_s``; ``permit_error`` is the one line saying why
    ``permit_out`` was not written (the action must not fire), else None."""

    approval: Obj | None
    permit_error: str | None = None


def request_key(given: str | None, wait: bool, prefix: str = "hitl-request") -> str | None:
    """The Idempotency-Key to send: ``given``, else with ``wait`` one of our own
    (``<prefix>-<ULID>``: ``hitl-request-…``, ``hitl-ask-…`` for a question), because a
    create the gate cannot take now is sent again and a key makes that safe (SPEC §3);
    else None."""
    return given or (f"{prefix}-{ULID()}" if wait else None)


async def create_and_wait(
    kind: Kind,
    opts: RequestOptions,
    report: Report,
    progress: Progress,
    created_line: Callable[[RequestOptions, Obj, bool], str],
    hops: Hops,
) -> Obj | None:
    """Create the request of ``kind`` (with ``wait``: retried with its Idempotency-Key,
    ``gate.sdk.waiting.create``), report ``created_line(opts, object, created)``, then with
    ``wait`` wait for the outcome reporting each hop. One deadline, ``opts.timeout_s`` from
    now, covers both.

    Returns the last object seen (still ``pending`` when ``timeout_s`` passed first), or
    None when the gate did not take the create within ``timeout_s``. Records the id in
    ``progress``. Raises ClientError for what the gate refuses (400 naming the field, 404
    unknown pipeline/step, 409 ``idempotency_key_reused``, ...) or a failure that is not
    transient.
    """
    deadline = deadline_after(opts.timeout_s)
    watch = Reporter(report, hops)
    async with Transport(opts.api_base, opts.token) as transport:
        try:
            if opts.wait:
                assert opts.idempotency_key is not None
                try:
                    obj, new = await create(
                        transport, kind, opts.body, opts.idempotency_key, deadline, watch
                    )
                except TimeoutError:
                    return None  # the attempt was cut at the deadline
                except (GateUnavailable, GateRequestError) as exc:
                    if transient(exc):
                        return None  # the deadline passed while the gate could not take it
                    raise
            else:
                obj, new = await transport.create_in(kind, opts.body, opts.idempotency_key)
            progress.item_id = obj[kind.id_key]
            report(created_line(opts, obj, new))
            if not opts.wait:
                return dict(obj)
            return await settle(transport, kind, obj, deadline, watch)
        except (GateUnavailable, GateRequestError) as exc:
            raise client_error(exc) from exc


async def run_request(opts: RequestOptions, report: Report, progress: Progress) -> RequestResult:
    """Create the approval (with ``wait``: retried), report it as new or found again, then
    with ``wait`` wait for the outcome and apply the permit-file policy (``save_permit``).
    One deadline, ``opts.timeout_s`` from now, covers the create and the wait
    (``create_and_wait``). Records the approval id in ``progress``.
    Raises ClientError for what the gate refuses (or a failure that is not transient)."""
    final = await create_and_wait(APPROVALS, opts, report, progress, _created_line, hops)
    if final is None or not opts.wait or final["state"] != "resolved" or opts.permit_out is None:
        return RequestResult(final)
    return RequestResult(final, save_permit(opts.permit_out, final, report))


def _created_line(opts: RequestOptions, approval: Obj, new: bool) -> str:
    """The line reporting a create: a new approval, or one the same key made before."""
    where = f"{opts.body['pipeline']}/{opts.body['step']}"
    if new:
        return (
            f"requested approval {approval['approval_id']} for {where} "
            f"(quorum {approval['quorum']['required']}, {approval['payload_hash']})"
        )
    return (
        f"already requested: approval {approval['approval_id']} for {where} (the same "
        f"request with Idempotency-Key {opts.idempotency_key} was made before; state "
        f"{state_text(approval)})"
    )


def state_text(obj: Obj) -> str:
    """An object's state for a line: ``pending``, or ``resolved, outcome <outcome>``."""
    return str(obj["state"]) + (f", outcome {obj['outcome']}" if obj["state"] == "resolved" else "")


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


# ---- questions (``hitl-gate ask``) ------------------------------------------------------

# a question ends answered, timeout or cancelled (no 3: nobody "skips" a question)
QUESTION_EXIT_CODES = {"answered": 0, "timeout": 4, "cancelled": 5}


def _asked_line(opts: RequestOptions, question: dict[str, Any], new: bool) -> str:
    """The line reporting a create: a new question, or one the same key made before."""
    body = opts.body
    if new:
        return (
            f"asked question {question['question_id']} ({body['response_type']}) on "
            f"{body['pipeline']}/{body['step']} ({question.get('request_hash')})"
        )
    return (
        f"already asked: question {question['question_id']} on {body['pipeline']}/"
        f"{body['step']} (the same question with Idempotency-Key {opts.idempotency_key} was "
        f"asked before; state {state_text(question)})"
    )


# create the question (``opts.body``: ``gate.sdk.client.question_body``), report it, and with
# ``wait`` wait for its answer reporting each hop: ``create_and_wait`` for questions
run_ask = functools.partial(
    create_and_wait, QUESTIONS, created_line=_asked_line, hops=question_hops
)


def answer_output(question: dict[str, Any]) -> str:
    """What ``ask`` prints on stdout for an answered question
    (``gate.protocol.question.answer_text``): the text of a free text or single choice answer,
    compact JSON of a multi choice or form answer; "" when there is no answer."""
    answer = question.get("answer")
    if not isinstance(answer, dict):
        return ""
    return answer_text(QuestionSpec.from_json(question["question"]), answer.get("value"))
