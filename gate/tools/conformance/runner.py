"""Run a conformance check of a live relay: crafted dispatches, the relay's decision judged,
probes of the gate (SPEC §6); the ephemeral gate is ``ephemeral``, the report ``report``."""

from __future__ import annotations

import asyncio
import logging
import secrets as pysecrets
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from gate.clock import SystemClock
from gate.config import Secrets, TcpListen, parse_listen
from gate.core.service import GateService
from gate.daemon.app import build_gate, callback_url
from gate.daemon.approval_dispatch import dispatch_envelope
from gate.daemon.relay_http import post_signed
from gate.model import Approval
from gate.protocol import DECISIONS_PATH, signing
from gate.protocol.canonical import wire_json
from gate.tools.conformance.callbacks import callbacks_for, observer, wait_for
from gate.tools.conformance.checks import (
    DECISION_CHECKS,
    CheckResult,
    Observed,
    judge_ack,
    judge_decision,
    judge_refusal,
    not_run,
)
from gate.tools.conformance.ephemeral import (
    ACK_TIMEOUT_S,
    GRACE_S,
    MAX_SKEW_S,
    ephemeral_config,
)
from gate.tools.conformance.notices import check_notices
from gate.tools.conformance.probes import create_approval, gate_side
from gate.tools.conformance.questions import check_questions
from gate.tools.conformance.report import Report
from gate.tools.conformance.signatures import check_signatures, enrol_key

log = logging.getLogger(__name__)

STALE_BY_S = 3600


async def run_verify(
    relay_url: str,
    secret: str,
    approver: str,
    listen: str,
    public_url: str | None,
    timeout_s: float,
    notices: bool = False,
    questions: bool = False,
    approver_public_key: str | None = None,
) -> Report:
    """Run every SPEC §6 check against the relay at ``relay_url``; return the report.

    Starts the real decision handler over HTTP on ``listen`` (reachable by the relay at
    ``public_url``, default the bound address), dispatches one real approval plus one with
    a bad signature and one with a stale timestamp, waits up to ``timeout_s`` seconds for
    the human's decision, then probes the gate with a replay, a mutated payload hash and an
    out-of-scope approver. With ``notices`` (a relay that claims notice support),
    then checks its resolution notices (``gate.tools.conformance.notices``). With
    ``questions`` (a relay that declares question support), then asks it a
    question and probes the gate's answer checks (``gate.tools.conformance.questions``).
    With ``approver_public_key`` (an Ed25519 public key PEM: a relay that signs),
    the step requires approver signatures, the key is enrolled for the approver and the
    signature checks run (``gate.tools.conformance.signatures``).
    Raises OSError when ``listen`` cannot be bound.
    """
    with tempfile.TemporaryDirectory(prefix="hitl-verify-") as tmp:
        signing_ = approver_public_key is not None
        config = ephemeral_config(
            Path(tmp), relay_url, listen, public_url, approver, questions, signing_
        )
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
            callback_middlewares=[observer(seen, changed, lambda: clock.now_ms() / 1000)],
        )
        async with gate.storage():
            credential_id = None
            if approver_public_key is not None:
                credential_id = await enrol_key(gate.service, 1, approver_public_key)
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
                    decision = await _run(
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
                    if credential_id is not None:
                        report.checks.extend(
                            await check_signatures(
                                gate.service, session, secret, local_url, decision, credential_id
                            )
                        )
                    if notices:
                        target = await create_approval(gate.service, "conformance-notice")
                        report.checks.extend(
                            await check_notices(
                                gate.service,
                                session,
                                relay_url,
                                secret,
                                target,
                                lambda approval_id: callbacks_for(seen, approval_id),
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
) -> Observed | None:
    """The SPEC §6 checks of the relay's decision and the gate probes; returns the relay's
    decision (None when none arrived)."""
    checks = report.checks
    bad_sig = await create_approval(service, "conformance-bad-signature")
    stale = await create_approval(service, "conformance-stale-timestamp")
    real = await create_approval(service, "conformance")
    now_s = int(time.time())

    body = wire_json(
        dispatch_envelope(bad_sig, 1, callback_url, approver_signature=_signing(bad_sig))
    )
    forged = signing.sign("not-the-shared-secret-" + pysecrets.token_hex(8), now_s, body)
    bad_result = await post_signed(
        session, relay_url, body, secret, now_s, ACK_TIMEOUT_S, signature=forged
    )
    body = wire_json(dispatch_envelope(stale, 1, callback_url, approver_signature=_signing(stale)))
    stale_result = await post_signed(
        session, relay_url, body, secret, now_s - STALE_BY_S, ACK_TIMEOUT_S
    )
    body = wire_json(dispatch_envelope(real, 1, callback_url, approver_signature=_signing(real)))
    sent_at = time.time()
    ack = await post_signed(session, relay_url, body, secret, int(time.time()), ACK_TIMEOUT_S)
    checks.append(judge_ack(ack.status, ack.error, ack.elapsed_s))

    revision = real.revisions[0]
    # a human may need --timeout; a relay that answered the dispatch non-2xx may still have
    # passed it on (GRACE_S); one that gave no HTTP answer at all is not waited for
    wait_s = timeout_s if ack.error is None else GRACE_S if ack.status is not None else 0.0
    lookup = lambda key: callbacks_for(seen, key)  # noqa: E731
    decision = await wait_for(lookup, changed, real.approval_id, wait_s) if wait_s else None
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
            callbacks_for(seen, bad_sig.approval_id),
            answered,
        )
    )
    checks.append(
        judge_refusal(
            "relay.refuses_stale_timestamp",
            stale_result.status,
            stale_result.error,
            f"a timestamp {STALE_BY_S} s old",
            callbacks_for(seen, stale.approval_id),
            answered,
        )
    )
    await gate_side(checks, service, session, secret, local_url, decision)
    return decision


def _signing(approval: Approval) -> str:
    """The dispatch's ``approver_signature``: as frozen on the approval (``off``
    adds nothing, so that dispatch is byte-for-byte as before)."""
    return approval.approver_signature or "off"
