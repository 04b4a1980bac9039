"""Outbox worker: signs and POSTs dispatch envelopes to the relay. The only outbound HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote

import aiohttp
from yarl import URL

from gate.core.approvals.approver_signature_check import step_mode
from gate.core.approvals.delegation import delegates_for
from gate.core.approvals.rules import approvers_of
from gate.core.approvals.rules import skip_reason_required as step_requires_reason
from gate.core.service import GateService
from gate.errors import GateError
from gate.metrics import Metrics
from gate.model import Approval
from gate.protocol import PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.envelope import build_dispatch
from gate.protocol.followup import FollowUp
from gate.protocol.relay_answers import MAX_ANSWER_BYTES, relay_reason

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 60.0
IDLE_S = 3600.0
MAX_ERROR_CHARS = 300


class Outbox(Protocol):
    """An outbox the dispatcher's loop drains (``gate.daemon.delivery.OutboxSender``):
    ``launch_due`` starts what is due at unix ms ``now_ms`` and returns when to look again
    (unix ms; None: at a wake-up); ``stop`` ends what is in flight."""

    async def launch_due(self, session: aiohttp.ClientSession, now_ms: int) -> int | None: ...

    async def stop(self) -> None: ...


def relay_session(ca_file: Path | None = None) -> aiohttp.ClientSession:
    """Return the HTTP client session for dispatches.

    TLS certificates of an https relay are always verified: against ``ca_file`` (a PEM
    bundle, e.g. a private CA; it replaces the system CAs) when given, else against the
    system's CAs. Proxy variables of the environment are ignored (``trust_env=False``).
    Cookies a relay sets are neither kept nor sent back (a dispatch carries no state but
    its signed envelope; and no cookie jar is run per request).
    """
    tls: ssl.SSLContext | bool = True
    if ca_file is not None:
        tls = ssl.create_default_context(cafile=str(ca_file))
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=tls),
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def backoff_s(
    attempts: int,
    rng: random.Random,
    base_s: float = BACKOFF_BASE_S,
    cap_s: float = BACKOFF_CAP_S,
) -> float:
    """Return the delay before retry number ``attempts`` (1-based), in seconds.

    Capped exponential (``base_s`` doubling, capped at ``cap_s``: by default 0.5 s and 60 s)
    with equal jitter: half fixed, half uniform random, so retries of many approvals spread
    out (SPEC §2: "retry with capped exponential backoff and jitter until expiry").
    """
    ceiling = min(cap_s, base_s * float(2 ** max(0, attempts - 1)))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


class Dispatcher:
    """The loop that drains every outbox (``outboxes``: approvals' dispatches, follow-ups,
    questions' dispatches and notices, each a ``gate.daemon.delivery.OutboxSender``), and
    the settings their sends share.

    ``secret`` signs dispatches (the current relay secret); ``timeout_s`` bounds one
    attempt (an ack is any 2xx within it); redirects are never followed. Attempts are
    retried with capped exponential backoff and jitter until the approval resolves; none
    starts at or after the approval's ``expires_at``. Nothing is sent before ``start``
    gives the public callback URL (once the callback listener is bound); ``run`` takes the
    HTTP session (``relay_session``) the POSTs go through.

    The delivery guarantees (in-flight cap, an unrecorded result recorded again without a
    second POST, storage retry, a fault while building one send recorded with backoff) are
    ``gate.daemon.delivery``'s. POSTs are counted in ``metrics`` (the gate's,
    ``gate.daemon.app.build_gate``): attempts, failures by reason, ack latency, last ack.

    ``backoff_base_s`` and ``backoff_cap_s`` shape the retry delays (``backoff_s``); the
    defaults are the daemon's (0.5 s doubling to 60 s), which no config key changes: only
    in-process tests pass smaller ones, not to wait out real backoff. Raises ValueError
    unless ``0 < backoff_base_s <= backoff_cap_s``.
    """

    def __init__(
        self,
        service: GateService,
        metrics: Metrics,
        relay_url: str,
        secret: str,
        timeout_s: float,
        *,
        backoff_base_s: float = BACKOFF_BASE_S,
        backoff_cap_s: float = BACKOFF_CAP_S,
    ) -> None:
        if not 0 < backoff_base_s <= backoff_cap_s:
            raise ValueError(
                f"backoff needs 0 < base <= cap, got base {backoff_base_s} s, cap {backoff_cap_s} s"
            )
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.service = service
        self.metrics = metrics
        self.relay_url = relay_url
        self.secret = secret
        self.timeout_s = timeout_s
        self.callback_url = ""
        self.ready = asyncio.Event()
        self._rng = random.Random()
        # the outboxes this loop drains, in order (``gate.daemon.delivery.OutboxSender``s,
        # one per channel; set by build_gate)
        self.outboxes: tuple[Outbox, ...] = ()

    def backoff_ms(self, attempts: int) -> int:
        """The delay before retry number ``attempts`` (1-based), in whole milliseconds: the
        one retry schedule of dispatches and follow-up sends (reminders, notices)."""
        return int(backoff_s(attempts, self._rng, self.backoff_base_s, self.backoff_cap_s) * 1000)

    def start(self, callback_url: str) -> None:
        """Let ``run`` send: dispatches carry ``callback_url`` (the public URL of the
        callback listener, ``gate.daemon.app.callback_url``)."""
        self.callback_url = callback_url
        self.ready.set()

    def reconfigure(self, relay_url: str, secret: str, timeout_s: float, callback_url: str) -> None:
        """Use these for every attempt not yet sent (SIGHUP reload): the relay's URL, the
        signing secret (the current relay secret), the per-attempt timeout in seconds and
        the public callback URL. No await: an attempt sees all old or all new values."""
        self.relay_url = relay_url
        self.secret = secret
        self.timeout_s = timeout_s
        self.callback_url = callback_url

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Loop until cancelled: launch what is due in every outbox (``outboxes``, in order)
        through ``session``, then sleep until the next due attempt or a wake-up. Sends
        nothing before ``start``."""
        await self.ready.wait()
        wakeup = self.service.dispatch_wakeup
        try:
            while True:
                wakeup.clear()
                delay = IDLE_S
                try:
                    now = self.service.clock.now_ms()
                    for outbox in self.outboxes:
                        at = await outbox.launch_due(session, now)
                        if at is not None:
                            at_s = max(0.0, (at - self.service.clock.now_ms()) / 1000)
                            delay = min(delay, at_s + 0.002)
                except GateError as exc:
                    log.error(
                        "event=dispatch_loop_failed reason=%s message=%s", exc.code, exc.message
                    )
                    delay = 1.0
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
                # lands as the wake-up fires, and the stopping daemon would wait here forever
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(delay, IDLE_S)):
                        await wakeup.wait()
        finally:
            for outbox in self.outboxes:
                await outbox.stop()

    def envelope_for(self, full: Approval, revision: int) -> dict[str, Any]:
        """The dispatch envelope of ``revision`` as the config in force makes it now: the
        step's required skip reason and the delegations in force, for the
        revision's first dispatch and for its reminders and escalations alike."""
        config, now = self.service.config, self.service.clock.now_ms()
        return dispatch_envelope(
            full,
            revision,
            self.callback_url,
            skip_reason_required=step_requires_reason(config, full.pipeline, full.step),
            delegates=delegates_for(full, config, now),
            approver_signature=step_mode(config, full),
        )


def dispatch_envelope(
    full: Approval,
    revision: int,
    callback_url: str,
    skip_reason_required: bool = False,
    delegates: tuple[tuple[str, str], ...] = (),
    approver_signature: str = "off",
) -> dict[str, Any]:
    """Return the SPEC §2 dispatch envelope for ``revision`` of a loaded approval.

    With ``skip_reason_required`` (the step's ``skip_reason: required``) its skip
    action says so; ``delegates`` are the (delegate identity, principal identity) pairs in
    force (``gate.core.approvals.delegation.delegates_for``): the delegates join ``approvers``
    and the pairs go out as ``delegates``. With neither the envelope is byte-for-byte
    as before (``gate.protocol.followup.FollowUp``). ``approver_signature`` (the step's)
    other than ``off`` goes out as the additive ``"approver_signature"`` (optional
    | required), so a relay knows to have the approver sign; ``off`` adds nothing.
    """
    rev = next(r for r in full.revisions if r.revision == revision)
    envelope = build_dispatch(
        approval_id=full.approval_id,
        run_id=full.run_id,
        pipeline=full.pipeline,
        step=full.step,
        issued_at_ms=full.created_at,
        expires_at_ms=full.expires_at,
        risk=full.risk,
        quorum_required=full.quorum_required,
        quorum_collected=len(approvers_of(full, revision)),
        approvers=[identity for _, identity in full.scope],
        payload_hash=rev.payload_hash,
        content_type=full.content_type,
        body=rev.body,
        callback_url=callback_url,
        nonce=rev.nonce,
        revision=revision,
        budget=full.budget,
        followup=FollowUp(delegates=delegates, skip_reason_required=skip_reason_required),
        requested_by=full.requested_by,
    )
    if approver_signature != "off":
        envelope["approver_signature"] = approver_signature
    return envelope


@dataclass(frozen=True, slots=True)
class SendResult:
    """One POST's result: HTTP ``status`` (None if none came), ``error`` (None = acked, 2xx),
    ``elapsed_s`` until the answer or the failure, in seconds, and ``failure``: why it was
    not acked (``http_status``, ``timeout``, ``connection``), None when acked."""

    status: int | None
    error: str | None
    elapsed_s: float
    failure: str | None = None


async def post_signed(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    secret: str,
    t: int,
    timeout_s: float,
    *,
    signature: str | None = None,
) -> SendResult:
    """POST ``body`` signed at unix second ``t`` (or with ``signature`` as given, for tests of
    relays); redirects are never followed; an ack is any 2xx within ``timeout_s`` seconds."""
    headers = {
        "Content-Type": "application/json; charset=utf-8",
        PROTOCOL_HEADER: PROTOCOL,
        SIGNATURE_HEADER: signature or signing.sign(secret, t, body),
    }
    started = time.monotonic()
    try:
        async with session.post(
            url,
            data=body,
            headers=headers,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            status = resp.status
            if 200 <= status < 300:
                return SendResult(status, None, time.monotonic() - started)
            reason = relay_reason(await _answer_head(resp))  # the relay's words: redacted
            error = f"relay answered HTTP {status}" + (f": {redact(reason, url)}" if reason else "")
            return SendResult(status, error, time.monotonic() - started, "http_status")
    except TimeoutError:
        return SendResult(
            None, f"no answer within {timeout_s:g} s", time.monotonic() - started, "timeout"
        )
    except aiohttp.ClientError as exc:
        return SendResult(
            None,
            redact(f"{type(exc).__name__}: {exc}", url)[:MAX_ERROR_CHARS],
            time.monotonic() - started,
            "connection",
        )


async def _answer_head(resp: aiohttp.ClientResponse) -> bytes:
    """Up to MAX_ANSWER_BYTES of a refusal's body; b"" when reading it fails or times out
    (the status is the answer: the body only explains it)."""
    data = b""
    try:
        while len(data) < MAX_ANSWER_BYTES:
            chunk = await resp.content.read(MAX_ANSWER_BYTES - len(data))
            if not chunk:
                break
            data += chunk
    except (TimeoutError, aiohttp.ClientError):
        return b""
    return data


def redact(text: str, url: str) -> str:
    """Return ``text`` (an error message about ``url``) with the URL's secrets removed.

    A Power Automate or webhook URL carries its access signature in the query, and a URL may
    carry a password: every form of them is replaced by ``<redacted>``: the query as written
    and as decoded (yarl prints ``%2F`` as ``/``), each query value of four or more
    characters in both forms, the password and the fragment; error texts that drop the
    userinfo are covered because values are matched, not whole URLs (security review).
    """
    try:
        parsed = URL(url)
    except (TypeError, ValueError):
        return text
    secrets: set[str] = {
        parsed.raw_query_string,
        parsed.query_string,
        unquote(parsed.raw_query_string),
        parsed.raw_fragment,
        parsed.fragment,
    }
    for value in (parsed.raw_password, parsed.password):
        if value:
            secrets.add(value)
            secrets.add(quote(value, safe=""))
    for _, value in parsed.query.items():
        if len(value) >= 4:
            secrets.update({value, quote(value, safe=""), quote(value)})
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "<redacted>")
    return text
