"""``hitl-gate verify --questions``: the checks of a relay that declares question support
(docs/protocol.md "Questions"), run after the SPEC §6 checks.

The ephemeral gate gets one question step (``add_question_step``); ``check_questions`` asks
the relay one synthetic single-choice question, judges its answer, then probes the gate's
answer checks over real HTTP with re-signed copies of that answer.
"""

from __future__ import annotations

import asyncio
import secrets as pysecrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import aiohttp

from gate.core.service import GateService
from gate.daemon.relay_http import post_signed
from gate.errors import GateError
from gate.model import Question
from gate.protocol import PROTOCOL_HEADER, SIGNATURE_HEADER, signing
from gate.protocol.canonical import wire_json
from gate.protocol.envelope import decode_json
from gate.protocol.question import QuestionSpec, build_question_dispatch
from gate.store.questions import QUESTIONS
from gate.tools.conformance.callbacks import resign, wait_for
from gate.tools.conformance.checks import (
    CheckResult,
    Observed,
    failed,
    judge_ack,
    judge_refusal,
    not_run,
    passed,
    probe,
)
from gate.tools.conformance.question_checks import ANSWER_CHECKS, judge_answer

STEP = "question"
TEXT = (
    "hitl-gate conformance check — not a real question.\n"
    "Grüße, Zoë · 1.240,00 € · ✅\r\nAny option will do.\n"
)
OPTIONS = ("yes", "no", "später")
"""The synthetic question's options; a relay in a demo/test mode answers the first."""
REASON = "hitl-gate verify --questions"
# the gate-side probes, in report order (each a re-signed copy of the relay's answer)
PROBES = (
    "question.replay_refused",
    "question.wrong_type_refused",
    "question.mutated_hash_refused",
    "question.as_approval_refused",
)

Lookup = Callable[[str], list[Observed]]


def add_question_step(config: dict[str, Any]) -> None:
    """Give the ephemeral gate's config mapping (``ephemeral.ephemeral_config``'s, before
    validation) question support: ``relay.questions: true`` (questions go to RELAY_URL) and
    a question step ``question`` in its one pipeline that operator 1 (``--approver``) alone
    may answer."""
    config["relay"]["questions"] = True
    config["pipelines"][0]["steps"].append(
        {"name": STEP, "type": "question", "approvers": [1], "timeout": "1h", "risk": "low"}
    )


def for_question(seen: list[Observed], question_id: str) -> list[Observed]:
    """The callbacks in ``seen`` whose body names ``question_id`` (as ``question_id``)."""
    out = []
    for obs in seen:
        try:
            body = decode_json(obs.raw)
        except GateError:
            continue
        if isinstance(body, dict) and body.get("question_id") == question_id:
            out.append(obs)
    return out


async def _ask(service: GateService, run_id: str) -> Question:
    body = {
        "pipeline": service.config.pipelines[0].name,
        "step": STEP,
        "run_id": run_id,
        "text": TEXT,
        "reason": REASON,
        "response_type": "single_choice",
        "options": list(OPTIONS),
    }
    view, _ = await service.create_question(body, None)
    full = await service.store.reads.fetch(QUESTIONS, view["question_id"])
    assert full is not None
    return full


def dispatch_body(full: Question, callback_url: str) -> bytes:
    """The wire bytes of the dispatch of ``full``'s current version."""
    current = full.current
    return wire_json(
        build_question_dispatch(
            question_id=full.question_id,
            run_id=full.run_id,
            pipeline=full.pipeline,
            step=full.step,
            issued_at_ms=int(time.time() * 1000),
            expires_at_ms=full.expires_at,
            risk=full.risk,
            version=current.version,
            spec=QuestionSpec.from_json(current.question),
            request_hash=current.request_hash,
            approvers=[identity for _, identity in full.scope],
            callback_url=callback_url,
            nonce=current.nonce,
        )
    )


async def _probes(
    service: GateService,
    session: aiohttp.ClientSession,
    secret: str,
    local_url: str,
    answer: Observed | None,
) -> list[CheckResult]:
    """The gate-side ``PROBES``: the relay's accepted answer replayed as received, then
    re-signed copies aimed at a second, pending question with a value of the wrong type, a
    mutated request_hash, and turned into an approve of an approval_id that is a question's
    id. Each must be refused with its reason."""
    template: Any = None
    if answer is not None and answer.status == 200:
        try:
            template = decode_json(answer.raw)
        except GateError:
            template = None
    if answer is None or not isinstance(template, dict):
        return [
            not_run(
                name,
                "no accepted answer to use as a template",
                "make the relay's answer acceptable first (question.answer_accepted)",
            )
            for name in PROBES
        ]
    kept = (SIGNATURE_HEADER.lower(), PROTOCOL_HEADER.lower(), "content-type")
    headers = {k: v for k, v in answer.headers.items() if k in kept}
    replay = await probe(
        session, local_url, answer.raw, headers, PROBES[0], 409, ("duplicate", "already_resolved")
    )
    target = await _ask(service, "conformance-question-probe")
    current = target.current
    aimed: dict[str, Any] = {"question_id": target.question_id, "nonce": current.nonce}
    digest = current.request_hash
    mutated = digest[:-1] + ("0" if digest[-1] != "0" else "1")
    # the hash and the kind probes first: if the gate wrongly took the wrong-typed value,
    # the probe question would be answered and the later probes would say so as well
    raw, hdrs = resign(template, secret, {**aimed, "request_hash": mutated})
    hash_probe = await probe(
        session, local_url, raw, hdrs, PROBES[2], 403, ("request_hash_mismatch",)
    )
    as_approval = {
        "approval_id": target.question_id,
        "nonce": current.nonce,
        "decision": "approve",
        "payload_hash": digest,
    }
    raw, hdrs = resign(
        template, secret, as_approval, drop=("question_id", "kind", "value", "request_hash")
    )
    kind_probe = await probe(session, local_url, raw, hdrs, PROBES[3], 409, ("wrong_kind",))
    wrong_type = {**aimed, "request_hash": digest, "value": len(OPTIONS)}  # a number, no option
    raw, hdrs = resign(template, secret, wrong_type)
    type_probe = await probe(session, local_url, raw, hdrs, PROBES[1], 422, ("invalid_value",))
    return [replay, type_probe, hash_probe, kind_probe]


async def check_questions(
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
    max_skew_s: float,
    grace_s: float,
) -> list[CheckResult]:
    """Run the question checks against the relay at ``relay_url``; return them in report
    order: ``question.ack``, ``question.answer_received``, ``ANSWER_CHECKS``,
    ``question.refuses_bad_signature``, ``PROBES``.

    Dispatches a synthetic single-choice question (``TEXT``, ``OPTIONS``) signed with
    ``secret`` and the same kind of question signed with another secret (must be refused,
    never answered), waits up to ``timeout_s`` seconds for the answer among ``seen`` (what
    reached the ephemeral gate's decision endpoint; ``changed`` is set on each arrival),
    then ``grace_s`` for a stray answer to the forged one, then probes the gate at
    ``local_url``. Raises GateError when the ephemeral gate cannot create a question.
    """
    forged_q = await _ask(service, "conformance-question-bad-signature")
    real = await _ask(service, "conformance-question")
    now_s = int(time.time())
    body = dispatch_body(forged_q, callback_url)
    forged = signing.sign("not-the-shared-secret-" + pysecrets.token_hex(8), now_s, body)
    bad = await post_signed(session, relay_url, body, secret, now_s, 10.0, signature=forged)
    body = dispatch_body(real, callback_url)
    sent_at = time.time()
    ack = await post_signed(session, relay_url, body, secret, int(time.time()), 10.0)
    checks = [replace(judge_ack(ack.status, ack.error, ack.elapsed_s), name="question.ack")]
    wait_s = timeout_s if ack.error is None else grace_s if ack.status is not None else 0.0
    lookup: Lookup = lambda key: for_question(seen, key)  # noqa: E731
    answer = await wait_for(lookup, changed, real.question_id, wait_s) if wait_s else None
    if answer is None:
        checks.append(
            failed(
                "question.answer_received",
                "no answer arrived"
                + (f" within {timeout_s:g} s" if ack.error is None else " (not acked)"),
                f'POST one signed decision "answer" to callback.url ({callback_url}); '
                "raise --timeout if a human needs longer"
                if ack.error is None
                else "fix question.ack first",
            )
        )
        checks.extend(
            not_run(name, "no answer arrived", "fix question.answer_received first")
            for name in ANSWER_CHECKS
        )
    else:
        checks.append(
            passed(
                "question.answer_received",
                f"{answer.received_at - sent_at:.1f} s after the dispatch",
            )
        )
        checks.extend(judge_answer(answer, secret, max_skew_s, real, approver))
    await asyncio.sleep(grace_s)  # time for a relay that shows forged questions to answer one
    refusal = judge_refusal(
        "question.refuses_bad_signature",
        bad.status,
        bad.error,
        "a bad signature",
        lookup(forged_q.question_id),
        bad.status is not None or ack.status is not None,
    )
    checks.append(refusal)
    checks.extend(await _probes(service, session, secret, local_url, answer))
    return checks
