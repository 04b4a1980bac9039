"""Run a conformance check of a live relay: crafted dispatches, the relay's decision judged,
probes of the gate (SPEC §6); the ephemeral gate is ``ephemeral``, the report ``report``."""

from __future__ import annotations

import asyncio
import secrets as pysecrets
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from gate.clock import SystemClock
from gate.config import Config, Secrets, TcpListen, parse_listen
from gate.daemon.app import build_gate, callback_url
from gate.daemon.approval_dispatch import dispatch_envelope
from gate.model import Approval
from gate.protocol import DECISIONS_PATH
from gate.protocol.canonical import wire_json
from gate.tools.conformance.callbacks import Refused, Run, observer
from gate.tools.conformance.checks import DECISION, CheckResult, Observed, judge_decision
from gate.tools.conformance.ephemeral import ACK_TIMEOUT_S, GRACE_S, MAX_SKEW_S, ephemeral_config
from gate.tools.conformance.notices import check_notices
from gate.tools.conformance.probes import create_approval, gate_side
from gate.tools.conformance.questions import check_questions
from gate.tools.conformance.report import Report
from gate.tools.conformance.signatures import check_signatures, enrol_key

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
                host, port = await _listen(runner, config)
                async with aiohttp.ClientSession(trust_env=False) as session:
                    run = Run(
                        gate.service,
                        session,
                        relay_url,
                        secret,
                        approver,
                        f"http://{host}:{port}{DECISIONS_PATH}",
                        callback_url(config, f"{host}:{port}"),
                        seen,
                        changed,
                        timeout_s,
                    )
                    return await _report(run, credential_id, notices, questions)
            finally:
                await runner.cleanup()


async def _listen(runner: web.AppRunner, config: Config) -> tuple[str, int]:
    """Start the ephemeral gate's callback listener on ``relay.callback_addr``; return the
    address it is bound to. Raises OSError when it cannot be bound."""
    parsed = parse_listen(config.relay.callback_addr)
    if not isinstance(parsed, TcpListen):  # config validation allows host:port only
        raise OSError("relay.callback_addr must be host:port")
    site = web.TCPSite(runner, parsed.host, parsed.port)
    await site.start()
    host, port = runner.addresses[0][:2]
    return str(host), int(port)


async def _report(run: Run, credential_id: str | None, notices: bool, questions: bool) -> Report:
    """The report of ``run``: the SPEC §6 checks, then the approver-signature checks (with
    an enrolled ``credential_id``), the notice checks and the question checks as asked."""
    report = Report(run.callback)
    decision = await check_decisions(run, report.checks)
    if credential_id is not None:
        report.checks.extend(await check_signatures(run, decision, credential_id))
    if notices:
        target = await create_approval(run.service, "conformance-notice")
        report.checks.extend(await check_notices(run, target, GRACE_S))
    if questions:
        report.checks.extend(await check_questions(run, MAX_SKEW_S, GRACE_S))
    return report


async def check_decisions(run: Run, checks: list[CheckResult]) -> Observed | None:
    """Append to ``checks`` the SPEC §6 checks of the relay's decision and the gate probes;
    returns the relay's decision (None when none arrived)."""
    bad_sig = await create_approval(run.service, "conformance-bad-signature")
    stale = await create_approval(run.service, "conformance-stale-timestamp")
    real = await create_approval(run.service, "conformance")
    now_s = int(time.time())
    bad_result = await run.send(_dispatch(run, bad_sig), ACK_TIMEOUT_S, now_s, forged=True)
    stale_result = await run.send(_dispatch(run, stale), ACK_TIMEOUT_S, now_s - STALE_BY_S)
    stale_by = f"a timestamp {STALE_BY_S} s old"
    bad: list[Refused] = [
        ("relay.refuses_bad_signature", bad_result, "a bad signature", bad_sig.approval_id),
        ("relay.refuses_stale_timestamp", stale_result, stale_by, stale.approval_id),
    ]
    expected = (real.revisions[0].nonce, real.revisions[0].payload_hash, run.approver)
    judged, decision = await run.exchange(
        DECISION,
        real.approval_id,
        _dispatch(run, real),
        bad,
        lambda found: judge_decision(found, run.secret, found.received_at, MAX_SKEW_S, *expected),
        GRACE_S,
    )
    checks.extend(judged)
    checks.extend(await gate_side(run, decision))
    return decision


def _dispatch(run: Run, approval: Approval) -> bytes:
    """The wire bytes of ``approval``'s dispatch to the relay (``dispatch_envelope``), its
    ``approver_signature`` as frozen on the approval (``off`` adds nothing, so that dispatch
    is byte-for-byte as before)."""
    signing = approval.approver_signature or "off"
    return wire_json(dispatch_envelope(approval, 1, run.callback, approver_signature=signing))
