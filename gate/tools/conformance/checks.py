"""Judging what a relay did: one CheckResult per SPEC §6 check, each with what to fix."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from gate.errors import GateError
from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.envelope import decode_json
from gate.protocol.relay_answers import refusal_reason
from gate.protocol.whitespace import identity_key
from gate.relay.delivery import post

ACK_LIMIT_S = 5.0
ACK_FIX = (
    "answer the dispatch POST with any 2xx at once (within 5 s) and show the draft to the "
    "human afterwards; never hold the connection open for the human"
)
SIGNATURE_FORMAT = (
    "X-Draftcat-Signature: t=<unix s>,v1=<hex HMAC-SHA256(secret, t + '.' + the exact body "
    "bytes you send)>"
)


# the checks of the relay's decision, in report order (SPEC §6 relay side); reported as not
# run when no decision arrived
DECISION_CHECKS = (
    "relay.decision_signed",
    "relay.decision_in_window",
    "relay.nonce",
    "relay.payload_hash_echo",
    "relay.approver_in_scope",
    "relay.decision_accepted",
)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: ``name`` (stable id), ``ok``, what was observed, and how to fix a failure.

    ``skipped``: the check could not run because an earlier one failed (``ok`` is False: a
    report with a skipped check is not conformant); ``observed`` says why, ``fix`` points at
    the check to fix first.
    """

    name: str
    ok: bool
    observed: str
    fix: str = ""
    skipped: bool = False

    def as_json(self) -> dict[str, Any]:
        """Return the check as a JSON-ready dict."""
        return asdict(self)


def passed(name: str, observed: str) -> CheckResult:
    """Return a passing check."""
    return CheckResult(name, True, observed)


def failed(name: str, observed: str, fix: str) -> CheckResult:
    """Return a failing check with what the relay did and what it should do."""
    return CheckResult(name, False, observed, fix)


def not_run(name: str, why: str, fix: str) -> CheckResult:
    """Return a check that could not run (``observed`` = ``not run: <why>``)."""
    return CheckResult(name, False, f"not run: {why}", fix, skipped=True)


def _answer_text(answer: Any) -> str:
    """An answer body as the relay author would see it on the wire (JSON, not Python)."""
    if isinstance(answer, (dict, list)):
        return json.dumps(answer, ensure_ascii=False)
    return str(answer)


@dataclass(frozen=True, slots=True)
class Observed:
    """A request that reached the ephemeral gate's decision endpoint, and its answer."""

    raw: bytes
    headers: dict[str, str]
    received_at: float  # unix seconds, gate clock
    status: int
    answer: Any

    def body(self) -> dict[str, Any] | None:
        """The request's body as a JSON object; None when it is not one (undecodable, or
        another JSON value)."""
        try:
            body = decode_json(self.raw)
        except GateError:
            return None
        return body if isinstance(body, dict) else None


def judge_ack(status: int | None, error: str | None, elapsed_s: float) -> CheckResult:
    """Relay acked the real dispatch with 2xx within 5 s (SPEC §6)."""
    name = "relay.ack"
    if error is None and status is not None and elapsed_s <= ACK_LIMIT_S:
        return passed(name, f"HTTP {status} after {elapsed_s:.2f} s")
    what = error or f"HTTP {status}"
    if status is None and "within" not in what:  # no HTTP answer at all
        return failed(
            name,
            f"{what} after {elapsed_s:.2f} s",
            "make the relay reachable at RELAY_URL from this host: is it running, "
            "on this port and path, and does it accept POST?",
        )
    if status is None:
        return failed(name, f"{what} (an ack must come within {ACK_LIMIT_S:g} s)", ACK_FIX)
    reason = (refusal_reason(error) or (status, None))[1]
    if status in (400, 401, 403) and reason == "timestamp_out_of_window":
        return failed(
            name,
            f"{what} after {elapsed_s:.2f} s: a dispatch signed just now was "
            "refused as out of the relay's time window",
            "set the relay's clock "
            "and this host's by NTP: they differ by more than the relay accepts "
            "(300 s in hitl/v0); the secret is not the cause",
        )
    if status in (400, 401, 403):
        return failed(
            name,
            f"{what} after {elapsed_s:.2f} s: a correctly signed dispatch was refused",
            "check that the relay holds the same secret as --secret-env "
            "(the most common cause), then that it verifies the signature over the "
            "exact raw body bytes received (never re-encoded JSON: 20.0 becomes 20), "
            "with the shared secret as UTF-8",
        )
    return failed(name, f"{what} after {elapsed_s:.2f} s", ACK_FIX)


@dataclass(frozen=True, slots=True)
class Awaited:
    """The words for a callback awaited after a dispatch: the check ``name``, what arrives
    (``noun``: decision, answer), the note when the dispatch was not acked (``unacked``),
    what a relay must POST (``how``) and fix first without an ack (``fix_ack``), the note
    when one came although not acked (``late``), the checks of what arrived (``judged``:
    reported not run when nothing did), the check of the dispatch's ack (``ack``) and the
    body field naming the request's id (``key``: approval_id, question_id)."""

    name: str
    noun: str
    unacked: str
    how: str
    fix_ack: str
    late: str
    judged: tuple[str, ...]
    ack: str
    key: str


DECISION = Awaited(
    "relay.decision_received",
    "decision",
    " (the dispatch was not acked)",
    "POST one signed decision per approver",
    "fix relay.ack first: the gate retries a dispatch that is not acked",
    " (although the dispatch was not acked)",
    DECISION_CHECKS,
    "relay.ack",
    "approval_id",
)


def judge_arrival(
    awaited: Awaited,
    found: Observed | None,
    acked: bool,
    sent_at: float,
    timeout_s: float,
    callback_url: str,
) -> list[CheckResult]:
    """The callback ``found`` (None: none came) arrived after its dispatch, sent at unix
    second ``sent_at`` and ``acked`` or not; without it, ``awaited.judged`` are not run."""
    if found is not None:
        late = "" if acked else awaited.late
        return [
            passed(awaited.name, f"{found.received_at - sent_at:.1f} s after the dispatch{late}")
        ]
    why = f"no {awaited.noun} arrived"
    result = failed(
        awaited.name,
        why + (f" within {timeout_s:g} s" if acked else awaited.unacked),
        f"{awaited.how} to callback.url ({callback_url}); raise --timeout if a human needs longer"
        if acked
        else awaited.fix_ack,
    )
    return [result, *(not_run(n, why, f"fix {awaited.name} first") for n in awaited.judged)]


def judge_refusal(
    name: str,
    status: int | None,
    error: str | None,
    what: str,
    decisions: list[Observed],
    relay_answered: bool = True,
) -> CheckResult:
    """Relay refused a bad dispatch (non-2xx) and never produced a decision for it."""
    if decisions:
        return failed(
            name,
            f"a decision came back for the dispatch with {what}",
            "verify X-Draftcat-Signature and its timestamp before showing anything to "
            "a human; a relay that forwards unverified requests lets anyone put fake "
            "approvals in front of people",
        )
    if status is not None and 200 <= status < 300:
        return failed(
            name,
            f"HTTP {status}: the dispatch with {what} was accepted",
            "refuse (401) a dispatch whose HMAC does not match or whose t is more "
            "than 300 s from your clock",
        )
    if status is None and not relay_answered:
        return failed(
            name,
            f"not checked: the relay answered no dispatch ({error})",
            "make the relay reachable at RELAY_URL first",
        )
    return passed(name, f"refused ({error or f'HTTP {status}'}), no decision came back")


def judge_signature(
    decision: Observed,
    secret: str,
    now_s: float,
    max_skew_s: float,
    signed: str = "relay.decision_signed",
    in_window: str = "relay.decision_in_window",
) -> list[CheckResult]:
    """Check the signature header of a relay's callback (a decision, or an
    answer): the HMAC over the received bytes (check ``signed``) and its ``t`` within
    ``max_skew_s`` seconds of ``now_s`` (unix s, the gate's clock at receipt; check
    ``in_window``). SPEC §2 checks 1-3.
    """
    header = decision.headers.get(SIGNATURE_HEADER.lower())
    try:
        parsed = signing.parse(header)
    except GateError as exc:
        return [
            failed(signed, f"{exc.code}: {exc.message}", f"send {SIGNATURE_FORMAT}"),
            not_run(in_window, "the signature header is unusable", f"fix {signed} first"),
        ]
    try:
        signing.check_hmac(parsed, decision.raw, [secret])
        results = [passed(signed, "HMAC over the received bytes matches")]
    except GateError as exc:
        fix = (
            "either the secret differs from the gate's, or the bytes signed are not the bytes "
            "sent (serialize the body once, then sign and send those same bytes): "
            f"{SIGNATURE_FORMAT}"
        )
        results = [failed(signed, f"{exc.code}: {exc.message}", fix)]
    # judged even when the HMAC does not match: the gate checks the window first (SPEC §2 #3)
    off = parsed.t - decision.received_at
    relation = (
        f"{abs(off):.0f} s {'ahead of' if off > 0 else 'behind'} the gate's clock"
        if round(off)
        else "on time with the gate's clock"
    )
    try:
        signing.check_window(parsed.t, now_s, max_skew_s)
        results.append(passed(in_window, f"t is {relation}"))
    except GateError:
        results.append(
            failed(
                in_window,
                f"t={parsed.t} is {relation} (more than {max_skew_s:g} s away)",
                "sign with the current unix time in seconds (not ms), and keep "
                "the relay's clock in sync",
            )
        )
    return results


def judge_decision(
    decision: Observed,
    secret: str,
    now_s: float,
    max_skew_s: float,
    nonce: str,
    payload_hash: str,
    approver: str,
) -> list[CheckResult]:
    """Check the relay's decision for the real dispatch: signed, in window, nonce, hash, approver,
    accepted by the gate (SPEC §6 relay side)."""
    results = judge_signature(decision, secret, now_s, max_skew_s)
    protocol = decision.headers.get(PROTOCOL_HEADER.lower())
    try:
        body = decode_json(decision.raw)
    except GateError as exc:
        body = None
        results.append(
            failed(
                "relay.decision_parses",
                exc.message,
                "send the decision envelope as a UTF-8 JSON object",
            )
        )
    if not isinstance(body, dict):
        body = {}
    if protocol not in (None, PROTOCOL) or body.get("protocol") != PROTOCOL:
        results.append(
            failed(
                "relay.protocol",
                f"protocol {body.get('protocol')!r}",
                f'send "protocol": "{PROTOCOL}"',
            )
        )
    echoes = (
        Echo("relay.nonce", "nonce", nonce, "nonce is the dispatched one", ECHO_NONCE),
        Echo(
            "relay.payload_hash_echo",
            "payload_hash",
            payload_hash,
            "payload_hash matches the dispatch",
            "echo payload_hash from the dispatch byte for byte; never recompute it from a "
            "re-encoded draft",
        ),
    )
    results += judge_echoes(body, echoes, "relay.approver_in_scope", approver, "decided", repr)
    results.append(judge_accepted("relay.decision_accepted", decision, "decision", _answer_text))
    return results


@dataclass(frozen=True, slots=True)
class Echo:
    """A field a callback must carry unchanged from its dispatch: the check ``name``, the
    body's ``field`` and its ``expected`` value, what a pass says (``ok``) and how to fix a
    miss (``fix``)."""

    name: str
    field: str
    expected: Any
    ok: str
    fix: str


ECHO_NONCE = "echo callback.nonce from the dispatch unchanged"


def judge_echoes(
    body: dict[str, Any],
    echoes: Sequence[Echo],
    name: str,
    approver: str,
    who: str,
    show: Callable[[Any], str],
) -> list[CheckResult]:
    """The ``echoes`` of a callback's ``body`` (a decision, an answer), then the approver it
    reports (check ``name``): ``approver``, compared as SPEC §2 check 11 does, the human who
    ``who`` (decided, answered). Values are written in the report by ``show``."""
    results = [
        passed(e.name, e.ok)
        if body.get(e.field) == e.expected
        else failed(e.name, f"{e.field} {show(body.get(e.field))}", e.fix)
        for e in echoes
    ]
    reported = body.get("approver")
    got = reported.get("id") if isinstance(reported, dict) else None
    said = f"approver.id {show(got)}"
    if isinstance(got, str) and identity_key(got) == identity_key(approver):
        return [*results, passed(name, said)]
    fix = (
        f"report the human who {who} as approver.id; expected {approver!r}, one of the "
        "dispatch's approvers"
    )
    return [*results, failed(name, said, fix)]


def judge_accepted(
    name: str, callback: Observed, noun: str, show: Callable[[Any], str]
) -> CheckResult:
    """The gate took the callback (a ``noun``: decision, answer) with 200 (check ``name``);
    its answer is written in the report by ``show``."""
    said = f"gate answered {callback.status} {show(callback.answer)}"
    if callback.status == 200:
        return passed(name, said)
    return failed(name, said, f"the gate refused this {noun}; the reason names the field or check")


async def probe(
    session: aiohttp.ClientSession,
    gate_url: str,
    body: bytes,
    headers: dict[str, str],
    name: str,
    expect_status: int,
    expect_reasons: tuple[str, ...],
) -> CheckResult:
    """POST a crafted decision to a gate over HTTP; pass only on the expected status and reason.

    Used for the gate-side checks (replay, mutated hash, out-of-scope approver); it fails
    for any other answer, so a gate that wrongly accepts is reported.
    """
    try:
        sent = await post(session, gate_url, body, headers)
    except aiohttp.ClientError as exc:
        return failed(name, f"no answer: {exc}", "the ephemeral gate must be reachable")
    status, text = sent.status, sent.raw.decode("utf-8", "replace")
    try:
        answer = decode_json(sent.raw)
    except GateError:
        answer = text[:200]
    reason = answer.get("reason") if isinstance(answer, dict) else None
    if status == expect_status and reason in expect_reasons:
        return passed(name, f"refused {status} {reason}")
    want = f"{expect_status} {' or '.join(expect_reasons)}"
    return failed(
        name, f"answered {status} {_answer_text(answer)}", f"must be refused with {want} (SPEC §2)"
    )
