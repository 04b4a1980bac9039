"""Run a conformance check of a live relay: ephemeral gate, crafted dispatches, probes (SPEC §6)."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets as pysecrets
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from gate.clock import SystemClock
from gate.config import Config, Secrets, TcpListen, config_from_mapping, parse_listen
from gate.core.model import Approval
from gate.core.requests import CreateRequest
from gate.core.service import GateService
from gate.daemon.app import build_gate, callback_url
from gate.daemon.dispatch import dispatch_envelope, post_signed
from gate.protocol import DECISIONS_PATH, PROTOCOL, PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import decode_json
from gate.tools.conformance.checks import (
    DECISION_CHECKS,
    CheckResult,
    Observed,
    judge_ack,
    judge_decision,
    judge_refusal,
    not_run,
    probe,
)
from gate.tools.conformance.notices import check_notices
from gate.tools.conformance.questions import add_question_step, check_questions
from gate.web.common import Handler

log = logging.getLogger(__name__)

PIPELINE = "hitl-conformance"
OUTSIDER = "hitl-conformance-outsider@invalid"
MAX_SKEW_S = 300.0
ACK_TIMEOUT_S = 10.0
GRACE_S = 3.0
STALE_BY_S = 3600
DRAFT = (
    "hitl-gate conformance check — not a real request.\n"
    "Grüße, Zoë · 1.240,00 € · ✅\r\nPlease approve so the check can finish.\n"
)


@dataclass
class Report:
    """The checks in order, plus the ephemeral gate's callback URL used."""

    callback_url: str
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True only when every check passed."""
        return bool(self.checks) and all(c.ok for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        """Return ``{"ok", "callback_url", "checks": [...]}``."""
        return {
            "ok": self.ok,
            "callback_url": self.callback_url,
            "checks": [c.as_json() for c in self.checks],
        }

    def as_text(self) -> str:
        """Return the human-readable report: one line per check, fixes under failures."""
        lines = [f"hitl/v0 conformance of the relay (callback {self.callback_url})"]
        for c in self.checks:
            label = "PASS" if c.ok else "SKIP" if c.skipped else "FAIL"
            lines.append(f"{label}  {c.name:30} {c.observed}")
            if not c.ok and c.fix and not c.skipped:
                lines.append(f"      fix: {c.fix}")
        passed_n = sum(c.ok for c in self.checks)
        skipped_n = sum(c.skipped for c in self.checks)
        lines.append(
            f"{passed_n}/{len(self.checks)} checks passed"
            + (f", {skipped_n} not run" if skipped_n else "")
            + f": {'CONFORMANT' if self.ok else 'NOT CONFORMANT'}"
        )
        return "\n".join(lines)


def _ephemeral_config(
    directory: Path,
    relay_url: str,
    listen: str,
    public_url: str | None,
    approver: str,
    questions: bool = False,
) -> Config:
    """The ephemeral gate's config, validated as a config file would be (its database in
    ``directory``): one pipeline, one step the ``approver`` (operator 1) alone may decide,
    and an outsider (operator 2) allowed on the relay but out of the step's scope. With
    ``questions``, also a question step (``questions.add_question_step``, issue 15)."""
    config = {
        "relay": {
            "url": relay_url,
            "secret_env": "HITL_VERIFY_SECRET",
            "callback_addr": listen,
            "public_url": public_url,
            "dispatch_timeout": f"{ACK_TIMEOUT_S:g}s",
            "operators": [{"id": 1, "identity": approver}, {"id": 2, "identity": OUTSIDER}],
            "security": {
                "allowed_users": [1, 2],
                "max_input_length": 2000,
                "rate_limit": 1000,
                "max_skew": f"{MAX_SKEW_S:g}s",
            },
        },
        "api": {"listen": "127.0.0.1:0", "token_env": "HITL_VERIFY_TOKEN"},
        "storage": {"path": "verify.db"},
        "receipts": {"key_env": "HITL_VERIFY_RECEIPTS"},
        # a budget puts floats (20.0, 0.0) in the dispatch: a relay that verifies re-encoded
        # JSON (20.0 -> 20) instead of the raw bytes fails here, as it would in production
        "budget": {"unit": "EUR", "cap_today": 20.0},
        "pipelines": [
            {
                "name": PIPELINE,
                "budget_cap": 2.0,
                "steps": [
                    {
                        "name": "verify",
                        "quorum": 1,
                        "approvers": [1],
                        "timeout": "1h",
                        "risk": "low",
                    }
                ],
            }
        ],
    }
    if questions:
        add_question_step(config)
    return config_from_mapping(config, directory)


def _observer(seen: list[Observed], changed: asyncio.Event, now: Callable[[], float]) -> Middleware:
    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPException:
            raw = b""
        received = now()
        response = await handler(request)
        answer: Any = None
        if isinstance(response, web.Response) and response.body is not None:
            try:
                answer = json.loads(bytes(response.body))  # type: ignore[arg-type]
            except (ValueError, TypeError):
                answer = None
        seen.append(
            Observed(
                raw,
                {k.lower(): v for k, v in request.headers.items()},
                received,
                response.status,
                answer,
            )
        )
        changed.set()
        return response

    return observe


def _for(seen: list[Observed], approval_id: str) -> list[Observed]:
    out = []
    for obs in seen:
        try:
            body = decode_json(obs.raw)
        except Exception:  # noqa: BLE001 - any undecodable body simply is not this approval's
            continue
        if isinstance(body, dict) and body.get("approval_id") == approval_id:
            out.append(obs)
    return out


async def _wait_for(
    seen: list[Observed], changed: asyncio.Event, approval_id: str, timeout_s: float
) -> Observed | None:
    deadline = time.monotonic() + timeout_s
    while True:
        found = _for(seen, approval_id)
        if found:
            return found[0]
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        changed.clear()
        try:
            await asyncio.wait_for(changed.wait(), timeout=left)
        except TimeoutError:
            return None


def _resign(template: dict[str, Any], secret: str, **fields: Any) -> tuple[bytes, dict[str, str]]:
    body = dict(template)
    body.update(fields)
    raw = wire_json(body)
    headers = {
        "Content-Type": "application/json",
        PROTOCOL_HEADER: PROTOCOL,
        SIGNATURE_HEADER: signing.sign(secret, int(time.time()), raw),
    }
    return raw, headers


async def run_verify(
    relay_url: str,
    secret: str,
    approver: str,
    listen: str,
    public_url: str | None,
    timeout_s: float,
    notices: bool = False,
    questions: bool = False,
) -> Report:
    """Run every SPEC §6 check against the relay at ``relay_url``; return the report.

    Starts the real decision handler over HTTP on ``listen`` (reachable by the relay at
    ``public_url``, default the bound address), dispatches one real approval plus one with
    a bad signature and one with a stale timestamp, waits up to ``timeout_s`` seconds for
    the human's decision, then probes the gate with a replay, a mutated payload hash and an
    out-of-scope approver. With ``notices`` (a relay that claims notice support, issue 14),
    then checks its resolution notices (``gate.tools.conformance.notices``). With
    ``questions`` (a relay that declares question support, issue 15), then asks it a
    question and probes the gate's answer checks (``gate.tools.conformance.questions``).
    Raises OSError when ``listen`` cannot be bound.
    """
    with tempfile.TemporaryDirectory(prefix="hitl-verify-") as tmp:
        config = _ephemeral_config(Path(tmp), relay_url, listen, public_url, approver, questions)
        secrets_ = Secrets(
            (secret,), pysecrets.token_hex(16), pysecrets.token_hex(16).encode("ascii")
        )
        clock = SystemClock()
        seen: list[Observed] = []
        changed = asyncio.Event()
        gate = build_gate(
            config,
            secrets_,
            writer_process=False,
            clock=clock,
            callback_middlewares=[_observer(seen, changed, lambda: clock.now_ms() / 1000)],
        )
        async with gate.storage():
            runner = web.AppRunner(gate.callback_app, access_log=None)
            await runner.setup()
            try:
                parsed = parse_listen(config.relay.callback_addr)
                if not isinstance(parsed, TcpListen):  # config validation allows host:port only
                    raise OSError("relay.callback_addr must be host:port")
                site = web.TCPSite(runner, parsed.host, parsed.port)
                await site.start()
                host, port = runner.addresses[0][:2]
                local_url = f"http://{host}:{port}{DECISIONS_PATH}"
                callback = callback_url(config, f"{host}:{port}")
                async with aiohttp.ClientSession(trust_env=False) as session:
                    report = Report(callback)
                    await _run(
                        report,
                        gate.service,
                        session,
                        relay_url,
                        secret,
                        approver,
                        local_url,
                        callback,
                        seen,
                        changed,
                        timeout_s,
                    )
                    if notices:
                        target = await _create(gate.service, "conformance-notice")
                        report.checks.extend(
                            await check_notices(
                                gate.service,
                                session,
                                relay_url,
                                secret,
                                target,
                                lambda approval_id: _for(seen, approval_id),
                                GRACE_S,
                            )
                        )
                    if questions:
                        report.checks.extend(
                            await check_questions(
                                gate.service,
                                session,
                                relay_url,
                                secret,
                                approver,
                                local_url,
                                callback,
                                seen,
                                changed,
                                timeout_s,
                                MAX_SKEW_S,
                                GRACE_S,
                            )
                        )
                    return report
            finally:
                await runner.cleanup()


async def _create(service: GateService, run_id: str) -> Approval:
    view, _ = await service.create(
        CreateRequest(PIPELINE, "verify", run_id, "text/plain", DRAFT, None), None
    )
    full = await service.store.reads.fetch_approval(view["approval_id"])
    assert full is not None
    return full


async def _run(
    report: Report,
    service: GateService,
    session: aiohttp.ClientSession,
    relay_url: str,
    secret: str,
    approver: str,
    local_url: str,
    callback_url: str,
    seen: list[Observed],
    changed: asyncio.Event,
    timeout_s: float,
) -> None:
    checks = report.checks
    bad_sig = await _create(service, "conformance-bad-signature")
    stale = await _create(service, "conformance-stale-timestamp")
    real = await _create(service, "conformance")
    now_s = int(time.time())

    body = wire_json(dispatch_envelope(bad_sig, 1, callback_url))
    forged = signing.sign("not-the-shared-secret-" + pysecrets.token_hex(8), now_s, body)
    bad_result = await post_signed(
        session, relay_url, body, secret, now_s, ACK_TIMEOUT_S, signature=forged
    )
    body = wire_json(dispatch_envelope(stale, 1, callback_url))
    stale_result = await post_signed(
        session, relay_url, body, secret, now_s - STALE_BY_S, ACK_TIMEOUT_S
    )
    body = wire_json(dispatch_envelope(real, 1, callback_url))
    sent_at = time.time()
    ack = await post_signed(session, relay_url, body, secret, int(time.time()), ACK_TIMEOUT_S)
    checks.append(judge_ack(ack.status, ack.error, ack.elapsed_s))

    revision = real.revisions[0]
    # a human may need --timeout; a relay that answered the dispatch non-2xx may still have
    # passed it on (GRACE_S); one that gave no HTTP answer at all is not waited for
    wait_s = timeout_s if ack.error is None else GRACE_S if ack.status is not None else 0.0
    decision = await _wait_for(seen, changed, real.approval_id, wait_s) if wait_s else None
    if decision is None:
        checks.append(
            CheckResult(
                "relay.decision_received",
                False,
                "no decision arrived"
                + (
                    f" within {timeout_s:g} s"
                    if ack.error is None
                    else " (the dispatch was not acked)"
                ),
                f"POST one signed decision per approver to callback.url ({callback_url}); "
                "raise --timeout if a human needs longer"
                if ack.error is None
                else "fix relay.ack first: the gate retries a dispatch that is not acked",
            )
        )
        checks.extend(
            not_run(name, "no decision arrived", "fix relay.decision_received first")
            for name in DECISION_CHECKS
        )
    else:
        late = "" if ack.error is None else " (although the dispatch was not acked)"
        checks.append(
            CheckResult(
                "relay.decision_received",
                True,
                f"{decision.received_at - sent_at:.1f} s after the dispatch{late}",
            )
        )
        checks.extend(
            judge_decision(
                decision,
                secret,
                decision.received_at,
                MAX_SKEW_S,
                revision.nonce,
                revision.payload_hash,
                approver,
            )
        )
    # give a relay that wrongly forwarded the bad dispatches time to answer them too
    await asyncio.sleep(GRACE_S)
    answered = any(r.status is not None for r in (ack, bad_result, stale_result))
    checks.append(
        judge_refusal(
            "relay.refuses_bad_signature",
            bad_result.status,
            bad_result.error,
            "a bad signature",
            _for(seen, bad_sig.approval_id),
            answered,
        )
    )
    checks.append(
        judge_refusal(
            "relay.refuses_stale_timestamp",
            stale_result.status,
            stale_result.error,
            f"a timestamp {STALE_BY_S} s old",
            _for(seen, stale.approval_id),
            answered,
        )
    )
    await _gate_side(checks, service, session, secret, local_url, decision)


async def _gate_side(
    checks: list[CheckResult],
    service: GateService,
    session: aiohttp.ClientSession,
    secret: str,
    local_url: str,
    decision: Observed | None,
) -> None:
    names = ("gate.replay_refused", "gate.mutated_hash_refused", "gate.out_of_scope_refused")
    template: Any = None
    if decision is not None and decision.status == 200:
        try:
            template = decode_json(decision.raw)
        except Exception:  # noqa: BLE001 - an accepted decision always decodes
            template = None
    if decision is None or not isinstance(template, dict):
        checks.extend(
            not_run(
                name,
                "no accepted decision to use as a template",
                "make the relay's decision acceptable first (relay.decision_accepted)",
            )
            for name in names
        )
        return
    replay_headers = {
        k: v
        for k, v in decision.headers.items()
        if k in (SIGNATURE_HEADER.lower(), PROTOCOL_HEADER.lower(), "content-type")
    }
    checks.append(
        await probe(
            session,
            local_url,
            decision.raw,
            replay_headers,
            names[0],
            409,
            ("already_resolved", "duplicate"),
        )
    )
    target = await _create(service, "conformance-probe")
    rev = target.revisions[0]
    digest = rev.payload_hash
    mutated = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    raw, headers = _resign(
        template,
        secret,
        approval_id=target.approval_id,
        nonce=rev.nonce,
        payload_hash=mutated,
    )
    checks.append(
        await probe(session, local_url, raw, headers, names[1], 403, ("payload_hash_mismatch",))
    )
    approver_obj = dict(template.get("approver") or {})
    approver_obj["id"] = OUTSIDER
    raw, headers = _resign(
        template,
        secret,
        approval_id=target.approval_id,
        nonce=rev.nonce,
        payload_hash=digest,
        approver=approver_obj,
    )
    checks.append(
        await probe(session, local_url, raw, headers, names[2], 403, ("approver_not_allowed",))
    )
