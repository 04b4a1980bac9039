"""``hitl-gate verify --questions``: the checks of a relay that declares question support
(docs/protocol.md "Questions"), run after the SPEC §6 checks.

The ephemeral gate gets one question step (``ephemeral.ephemeral_config``);
``check_questions`` asks the relay one synthetic single-choice question, judges its answer,
then probes the gate's answer checks over real HTTP with re-signed copies of that answer.
"""

from __future__ import annotations

import time
from typing import Any

from gate.core.service import GateService
from gate.daemon.question_sender import question_envelope
from gate.model import Question
from gate.protocol.canonical import wire_json
from gate.store.questions import QUESTIONS
from gate.tools.conformance.callbacks import Probe, Run, mutated, probe_gate
from gate.tools.conformance.checks import CheckResult, Observed
from gate.tools.conformance.ephemeral import ACK_TIMEOUT_S, QUESTION_STEP
from gate.tools.conformance.question_checks import ANSWER, judge_answer

TEXT = (
    "hitl-gate conformance check — not a real question.\n"
    "Grüße, Zoë · 1.240,00 € · ✅\r\nAny option will do.\n"
)
OPTIONS = ("yes", "no", "später")
"""The synthetic question's options; a relay in a demo/test mode answers the first."""
REASON = "hitl-gate verify --questions"
HASH_MISMATCH = ("request_hash_mismatch",)
AS_APPROVAL_DROPS = ("question_id", "kind", "value", "request_hash")
# the gate-side probes, in report order (each a re-signed copy of the relay's answer)
PROBES = (
    "question.replay_refused",
    "question.wrong_type_refused",
    "question.mutated_hash_refused",
    "question.as_approval_refused",
)


async def _ask(service: GateService, run_id: str) -> Question:
    body = {
        "pipeline": service.config.pipelines[0].name,
        "step": QUESTION_STEP,
        "run_id": run_id,
        "text": TEXT,
        "reason": REASON,
        "response_type": "single_choice",
        "options": list(OPTIONS),
    }
    view, _ = await service.questions.create(body, None)
    full = await service.store.reads.fetch(QUESTIONS, view["question_id"])
    assert full is not None
    return full


def dispatch_body(full: Question, callback_url: str) -> bytes:
    """The wire bytes of the dispatch of ``full``'s current version (``question_envelope``;
    a conformance question has no ``requested_by``), issued now."""
    return wire_json(question_envelope(full, int(time.time() * 1000), callback_url))


async def _probes(run: Run, answer: Observed | None) -> list[CheckResult]:
    """The gate-side ``PROBES``: the relay's accepted answer replayed as received, then
    re-signed copies aimed at a second, pending question with a value of the wrong type, a
    mutated request_hash, and turned into an approve of an approval_id that is a question's
    id. Each must be refused with its reason."""

    async def aim(template: dict[str, Any]) -> list[Probe]:
        target = await _ask(run.service, "conformance-question-probe")
        current = target.current
        aimed: dict[str, Any] = {"question_id": target.question_id, "nonce": current.nonce}
        digest = current.request_hash
        as_approval = {
            "approval_id": target.question_id,
            "nonce": current.nonce,
            "decision": "approve",
            "payload_hash": digest,
        }
        wrong_type = {**aimed, "request_hash": digest, "value": len(OPTIONS)}  # a number
        # the hash and the kind probes first: if the gate wrongly took the wrong-typed value,
        # the probe question would be answered and the later probes would say so as well
        return [
            (PROBES[2], {**aimed, "request_hash": mutated(digest)}, (), 403, HASH_MISMATCH),
            (PROBES[3], as_approval, AS_APPROVAL_DROPS, 409, ("wrong_kind",)),
            (PROBES[1], wrong_type, (), 422, ("invalid_value",)),
        ]

    in_run_order = (PROBES[0], PROBES[2], PROBES[3], PROBES[1])
    replayed = ("duplicate", "already_resolved")
    replay, hash_probe, kind_probe, type_probe = await probe_gate(
        run, answer, ANSWER, in_run_order, replayed, aim
    )
    return [replay, type_probe, hash_probe, kind_probe]


async def check_questions(run: Run, max_skew_s: float, grace_s: float) -> list[CheckResult]:
    """Run the question checks against the relay of ``run``; return them in report
    order: ``question.ack``, ``question.answer_received``, ``ANSWER_CHECKS``,
    ``question.refuses_bad_signature``, ``PROBES``.

    Dispatches a synthetic single-choice question (``TEXT``, ``OPTIONS``) signed with the
    shared secret and the same kind of question signed with another secret (must be refused,
    never answered), waits up to ``run.timeout_s`` seconds for the answer among what reached
    the ephemeral gate's decision endpoint, then ``grace_s`` for a stray answer to the
    forged one, then probes the gate at ``run.local_url``; the answer's signature may be
    ``max_skew_s`` seconds off. Raises GateError when the ephemeral gate cannot create a
    question.
    """
    forged_q = await _ask(run.service, "conformance-question-bad-signature")
    real = await _ask(run.service, "conformance-question")
    bad = await run.send(dispatch_body(forged_q, run.callback), ACK_TIMEOUT_S, forged=True)
    refused = ("question.refuses_bad_signature", bad, "a bad signature", forged_q.question_id)
    checks, answer = await run.exchange(
        ANSWER,
        real.question_id,
        dispatch_body(real, run.callback),
        [refused],
        lambda found: judge_answer(found, run.secret, max_skew_s, real, run.approver),
        grace_s,
    )
    return checks + await _probes(run, answer)
