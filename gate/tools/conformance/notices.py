"""``hitl-gate verify --notices``: the checks of a relay that claims notice support
(docs/protocol.md "Notices"), run after the SPEC §6 checks."""

from __future__ import annotations

import asyncio

from gate.daemon.followups import notice_envelope
from gate.model import Approval
from gate.protocol.canonical import wire_json
from gate.store.approvals import APPROVALS
from gate.tools.conformance.callbacks import Run, callbacks_for
from gate.tools.conformance.checks import ACK_LIMIT_S, CheckResult, Observed, failed, passed

NOTICE_CHECKS = (
    "relay.notice_ack",
    "relay.notice_refuses_bad_signature",
    "relay.notice_not_a_request",
)


def judge_notice_ack(status: int | None, error: str | None, elapsed_s: float) -> CheckResult:
    """The relay acked a signed notice with 2xx within 5 s (docs/protocol.md "Notices")."""
    name = NOTICE_CHECKS[0]
    if error is None and status is not None and elapsed_s <= ACK_LIMIT_S:
        return passed(name, f"HTTP {status} after {elapsed_s:.2f} s")
    return failed(
        name,
        f"{error or f'HTTP {status}'} after {elapsed_s:.2f} s: a signed notice was not acked",
        "verify a notice's signature like a dispatch's and answer any 2xx at once (within "
        f"{ACK_LIMIT_S:g} s), even for an approval you never saw; or do not claim notice "
        "support (relay.notices)",
    )


def judge_notice_refusal(status: int | None, error: str | None) -> CheckResult:
    """The relay refused (non-2xx) a notice signed with another secret."""
    name = NOTICE_CHECKS[1]
    if status is not None and 200 <= status < 300:
        return failed(
            name,
            f"HTTP {status}: a notice with a bad signature was accepted",
            "verify X-Draftcat-Signature of a notice before acting on it (401 otherwise): "
            "a forged notice would close a card that is still waiting for a human",
        )
    if status is None:
        return failed(
            name,
            f"not checked: no HTTP answer ({error})",
            "make the relay reachable at RELAY_URL first",
        )
    return passed(name, f"refused ({error or f'HTTP {status}'})")


def judge_no_decision(decisions: list[Observed], wait_s: float) -> CheckResult:
    """No decision came back for an approval the relay only ever saw as notices."""
    name = NOTICE_CHECKS[2]
    if decisions:
        return failed(
            name,
            f"{len(decisions)} decision(s) came back for an approval only announced by a notice",
            'a body with "type":"notice" is never a request: do not show it to a human '
            "or answer it; close the card of its approval_id, if any",
        )
    return passed(name, f"no decision came back within {wait_s:g} s")


async def check_notices(run: Run, full: Approval, grace_s: float) -> list[CheckResult]:
    """Run ``NOTICE_CHECKS`` against the relay of ``run``; return them in that order.

    ``full`` is a fresh synthetic approval of the ephemeral gate, never dispatched: it is
    cancelled, its notice (the gate's own ``notice_envelope``, outcome ``cancelled``) POSTed
    signed with the shared secret (must be acked 2xx within 5 s), then the same bytes signed
    with another secret (must be refused, non-2xx); after ``grace_s`` seconds no decision may
    have come back for it (what reached the ephemeral gate's decision endpoint about it).
    Raises GateError when the ephemeral gate cannot cancel it.
    """
    await run.service.approvals.cancel(full.approval_id)
    cancelled = await run.service.store.reads.fetch(APPROVALS, full.approval_id)
    assert cancelled is not None
    body = wire_json(notice_envelope(cancelled))  # outcome cancelled, nobody decided, no reason
    ack = await run.send(body, ACK_LIMIT_S)
    bad = await run.send(body, ACK_LIMIT_S, forged=True)
    await asyncio.sleep(grace_s)  # time for a relay that took it for a request to answer
    return [
        judge_notice_ack(ack.status, ack.error, ack.elapsed_s),
        judge_notice_refusal(bad.status, bad.error),
        judge_no_decision(callbacks_for(run.seen, full.approval_id), grace_s),
    ]
