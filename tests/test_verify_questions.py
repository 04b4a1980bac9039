"""Tests for ``hitl-gate verify --questions``: the real CLI against the reference
relay answering questions (``--auto-answer``), an independent honest relay, and relays that
get one thing about questions wrong, proving each FAIL line is real; plus direct tests of the
answer judges.

Like ``tests/test_verify.py``, the module fixture ``fleet`` starts every relay and every
``verify`` subprocess at once; each test then waits for, and judges, its own run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gate.model import Question, QuestionVersion
from gate.protocol import SIGNATURE_HEADER
from gate.protocol.answer import build_answer
from gate.protocol.canonical import wire_json
from gate.protocol.question import QuestionSpec, request_hash
from gate.tools.conformance.checks import Observed
from gate.tools.conformance.question_checks import ANSWER_CHECKS, judge_answer
from gate.tools.conformance.questions import OPTIONS, PROBES
from tests.badrelays import BadRelay, Misbehaviour, hmac_hex
from tests.support import SECRET, CliProcess, gate_env
from tests.test_verify import ALL_CHECKS, APPROVER, Run, failed_names, skipped_names, verify_args

QUESTION_CHECKS = [
    "question.ack",
    "question.answer_received",
    *ANSWER_CHECKS,
    "question.refuses_bad_signature",
    *PROBES,
]
EVERY_CHECK = ALL_CHECKS + QUESTION_CHECKS
WRONG_HASH = "sha256:" + "0" * 64
REFERENCE = "reference"


@dataclass(frozen=True)
class Scenario:
    """One ``verify --questions`` run: the relay (None = the reference relay), the exact set
    of checks that must FAIL and of those that cannot run, and what ``observed`` must say."""

    relay: Misbehaviour | None
    fails: frozenset[str] = frozenset()
    skips: frozenset[str] = frozenset()
    observed: dict[str, str] = field(default_factory=dict)
    timeout: float = 15.0
    text: bool = False


SCENARIOS: dict[str, Scenario] = {
    REFERENCE: Scenario(None),
    "reference-text": Scenario(None, text=True),
    "honest": Scenario(Misbehaviour()),
    "echoes-wrong-request-hash": Scenario(
        Misbehaviour(request_hash=WRONG_HASH),
        frozenset({"question.request_hash_echo", "question.answer_accepted"}),
        frozenset(PROBES),
        {
            "question.request_hash_echo": WRONG_HASH,
            "question.answer_accepted": "request_hash_mismatch",
        },
    ),
    # answers the single choice with a number instead of one of its options
    "untyped-value": Scenario(
        Misbehaviour(value=1),
        frozenset({"question.value_typed", "question.answer_accepted"}),
        frozenset(PROBES),
        {
            "question.value_typed": "value 1: value must be one of the options (a string)",
            "question.answer_accepted": "invalid_value",
        },
    ),
    # an answer from outside the question's scope: it names the out-of-step operator
    "answers-out-of-scope": Scenario(
        Misbehaviour(approver="hitl-conformance-outsider@invalid"),
        frozenset(
            {
                "relay.approver_in_scope",
                "relay.decision_accepted",
                "question.approver_in_scope",
                "question.answer_accepted",
            }
        ),
        frozenset({"gate.replay_refused", "gate.mutated_hash_refused", "gate.out_of_scope_refused"})
        | frozenset(PROBES),
        {"question.answer_accepted": "approver_not_allowed"},
    ),
    "verifies-no-signature": Scenario(
        Misbehaviour(verify_hmac=False, verify_window=False),
        frozenset(
            {
                "relay.refuses_bad_signature",
                "relay.refuses_stale_timestamp",
                "question.refuses_bad_signature",
            }
        ),
        observed={"question.refuses_bad_signature": "a decision came back"},
    ),
    # an approval relay that acks questions but never answers them
    "never-answers-questions": Scenario(
        Misbehaviour(answer_questions=False),
        frozenset({"question.answer_received"}),
        frozenset(ANSWER_CHECKS) | frozenset(PROBES),
        {"question.answer_received": "no answer arrived within 3 s"},
        timeout=3.0,
    ),
}


@dataclass
class Fleet:
    """The reference relay, the other relays, and one verify run per scenario."""

    reference: CliProcess
    relays: dict[str, BadRelay]
    runs: dict[str, Run]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    """Start every relay and every scenario's ``verify --questions`` run at once."""
    reference = CliProcess(
        "relay",
        "--listen",
        "127.0.0.1:0",
        "--secret-env",
        "HITL_RELAY_SECRET",
        "--auto",
        "approve",
        "--auto-answer",
        OPTIONS[0],
        "--as",
        APPROVER,
        env=gate_env(),
    )
    relays: dict[str, BadRelay] = {}
    runs: dict[str, Run] = {}
    try:
        url = reference.wait_for_line(r"event=relay_listening url=(\S+)").group(1)
        for name, scenario in SCENARIOS.items():
            target = url
            if scenario.relay is not None:
                relays[name] = BadRelay(scenario.relay).start()
                target = relays[name].url + "relay"
            args = verify_args(
                target, scenario.timeout, as_json=not scenario.text, extra=("--questions",)
            )
            runs[name] = Run(*args)
        yield Fleet(reference, relays, runs)
    finally:
        for run in runs.values():
            run.kill()
        for relay in relays.values():
            relay.stop()
        reference.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("name", [REFERENCE, "honest"])
def test_conformant_relay_passes_every_question_check(fleet: Fleet, name: str) -> None:
    result = fleet.runs[name].result()
    assert result.code == 0, result
    report = result.report()
    assert [c["name"] for c in report["checks"]] == EVERY_CHECK
    assert failed_names(report) == set() and skipped_names(report) == set(), report
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["question.value_typed"]["observed"] == 'value "yes" fits single_choice'
    assert by_name["question.replay_refused"]["observed"] == "refused 409 duplicate"
    assert by_name["question.wrong_type_refused"]["observed"] == "refused 422 invalid_value"
    assert (
        by_name["question.mutated_hash_refused"]["observed"] == "refused 403 request_hash_mismatch"
    )
    assert by_name["question.as_approval_refused"]["observed"] == "refused 409 wrong_kind"
    assert "Traceback" not in result.stderr


@pytest.mark.e2e
def test_reference_relay_showed_the_question_apart_and_refused_the_forged_one(
    fleet: Fleet,
) -> None:
    fleet.runs[REFERENCE].result()
    fleet.reference.wait_for_line(r"event=dispatch_refused reason=signature_mismatch")


@pytest.mark.e2e
def test_honest_relay_answered_exactly_one_question_as_asked(fleet: Fleet) -> None:
    fleet.runs["honest"].result()
    relay = fleet.relays["honest"]
    questions = [d for d in relay.dispatches if d["envelope"].get("kind") == "question"]
    # the forged dispatch refused, the real one acked; the probe question is never dispatched
    assert [d["status"] for d in questions] == [401, 202]
    question = questions[1]["envelope"]["question"]
    assert question["response_type"] == "single_choice" and question["options"] == list(OPTIONS)
    answers = [d for d in relay.decided() if d["body"]["decision"] == "answer"]
    assert [(a["status"], a["body"]["value"]) for a in answers] == [(200, "yes")]


@pytest.mark.e2e
def test_text_report_lists_the_question_checks(fleet: Fleet) -> None:
    result = fleet.runs["reference-text"].result()
    assert result.code == 0, result
    lines = result.stdout.splitlines()
    for name in QUESTION_CHECKS:
        assert any(line.split()[:2] == ["PASS", name] for line in lines), name
    assert lines[-1] == f"{len(EVERY_CHECK)}/{len(EVERY_CHECK)} checks passed: CONFORMANT"


FAILING = [name for name, s in SCENARIOS.items() if s.fails]


@pytest.mark.e2e
@pytest.mark.parametrize("name", FAILING)
def test_misbehaving_relay_fails_exactly_the_right_question_checks(fleet: Fleet, name: str) -> None:
    scenario = SCENARIOS[name]
    result = fleet.runs[name].result()
    assert result.code == 1, result
    assert "Traceback" not in result.stderr, result.stderr
    report = result.report()
    assert [c["name"] for c in report["checks"]] == EVERY_CHECK
    assert failed_names(report) == set(scenario.fails), json.dumps(report, indent=1)
    assert skipped_names(report) == set(scenario.skips), json.dumps(report, indent=1)
    by_name = {c["name"]: c for c in report["checks"]}
    for check in report["checks"]:
        assert check["observed"], check
        assert (check["fix"] == "") == check["ok"], check
    for check_name, text in scenario.observed.items():
        assert text in by_name[check_name]["observed"], by_name[check_name]


# ---- the judges, on crafted answers ---------------------------------------------------------


SPEC = QuestionSpec("Which?", "single_choice", options=("yes", "no"))
QID = "01HZX0CONFORMANCEQUESTION0"
NONCE = "a" * 32


def _question() -> Question:
    version = QuestionVersion(1, SPEC.to_json(), request_hash(QID, 1, SPEC), NONCE, 0)
    return Question(
        QID, "run", "p", "question", "low", ((1, APPROVER),), 1, "pending", None, 0, 1, None,
        None, "x", None, None, None, None, (version,),
    )  # fmt: skip


def _observed(value: Any, status: int = 200, **changes: Any) -> Observed:
    body = build_answer(
        question_id=QID,
        nonce=NONCE,
        request_hash=request_hash(QID, 1, SPEC),
        value=value,
        approver_id=APPROVER,
        decided_at_ms=int(time.time() * 1000),
    )
    body.update(changes)
    raw = wire_json(body)
    t = int(time.time())
    headers = {SIGNATURE_HEADER.lower(): f"t={t},v1={hmac_hex(SECRET, t, raw)}"}
    return Observed(raw, headers, float(t), status, {"status": "recorded"})


def test_judge_answer_passes_an_honest_answer() -> None:
    results = judge_answer(_observed("no"), SECRET, 300.0, _question(), APPROVER)
    assert [r.name for r in results] == list(ANSWER_CHECKS)
    assert all(r.ok for r in results), results


@pytest.mark.parametrize(
    ("value", "changes", "failing"),
    [
        (["yes"], {}, "question.value_typed"),
        ("maybe", {}, "question.value_typed"),
        ("yes", {"request_hash": WRONG_HASH}, "question.request_hash_echo"),
        ("yes", {"nonce": "b" * 32}, "question.nonce"),
        ("yes", {"approver": {"id": "mallory@example.com"}}, "question.approver_in_scope"),
    ],
)
def test_judge_answer_fails_exactly_what_is_wrong(
    value: Any, changes: dict[str, Any], failing: str
) -> None:
    results = judge_answer(_observed(value, **changes), SECRET, 300.0, _question(), APPROVER)
    assert [r.name for r in results if not r.ok] == [failing], results


def test_judge_answer_reports_a_missing_value_and_a_refusal() -> None:
    obs = _observed("yes", status=422)
    body = json.loads(obs.raw)
    del body["value"]
    raw = wire_json(body)
    t = int(time.time())
    headers = {SIGNATURE_HEADER.lower(): f"t={t},v1={hmac_hex(SECRET, t, raw)}"}
    observed = Observed(raw, headers, float(t), 422, None)
    results = judge_answer(observed, SECRET, 300.0, _question(), APPROVER)
    failing = {r.name: r.observed for r in results if not r.ok}
    assert failing == {
        "question.value_typed": "no value",
        "question.answer_accepted": "gate answered 422 null",
    }
