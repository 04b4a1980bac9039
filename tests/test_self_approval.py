"""No self-approval: a create request names ``requested_by``; that operator cannot decide it.

Through the real daemon (pipeline API, decision endpoint over HTTP, audit export, permit),
the CLI (``request --requested-by``, ``check-config``), and the rules over a real Store.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gate.core.approvals.create import CreateRequest, parse_create
from gate.protocol.canonical import canonical_json
from gate.trust import keys, permit
from tests.support import (
    ROOT,
    CliProcess,
    GateProcess,
    decision_body,
    post_decision,
    run_cli,
    wait_until,
    write_config,
)
from tests.test_signed_audit import export_of, sign_config

ALICE, BOB, CAROL = "alice@example.com", "bob@example.com", "carol@example.com"
STEPS = [
    {"name": "q2", "quorum": 2, "approvers": [101, 102, 103], "timeout": "1h"},
    {"name": "pair", "quorum": 2, "approvers": [101, 102], "timeout": "1h"},
    {"name": "ask", "type": "question", "approvers": [101, 102, 103], "timeout": "1h"},
    {
        "name": "selfok",
        "quorum": 1,
        "approvers": [101, 102],
        "timeout": "1h",
        "allow_self_approval": True,
    },
]
SELF = {"status": "forbidden", "reason": "self_approval"}
NOT_AN_OPERATOR = {"status": "invalid", "reason": "invalid_requested_by", "field": "requested_by"}


def not_one(given: str) -> str:
    """The start of the refusal of a ``requested_by`` that names no operator."""
    return f'requested_by "{given}" is not the identity of an operator in relay.operators'


def request_args(gate: Any, requested_by: str, draft: str) -> tuple[str, ...]:
    """``hitl-gate request`` of ``draft`` at step q2 of ``gate``, asked by ``requested_by``."""
    where = ("-c", str(gate.config), "--api-url", gate.api_url, "--pipeline", "p")
    return ("request", *where, "--step", "q2", "--draft", draft, "--requested-by", requested_by)


@pytest.fixture
def gate(tmp_path: Path, relay: Any) -> Any:
    config = write_config(tmp_path, relay.url, steps=STEPS, relay={"questions": True})
    public, _ = sign_config(config)
    proc = GateProcess(config).start()
    proc.public = public  # type: ignore[attr-defined]
    yield proc
    if proc.proc and proc.proc.poll() is None:
        proc.stop()


@pytest.mark.e2e
def test_self_approval_refused_and_quorum_2_counts_only_others(gate: Any, relay: Any) -> None:
    api = gate.api()
    created = api.create("q2", "pay 1.250,00 €", requested_by=ALICE)
    approval_id = created["approval_id"]
    assert created["requested_by"] == ALICE
    assert created["approvers"] == [BOB, CAROL]  # the requester left the scope
    dispatch = relay.wait_dispatch(approval_id)
    assert dispatch["approvers"] == [BOB, CAROL]
    assert dispatch["quorum"] == {"required": 2, "collected": 0}

    # the snapshot after the gate recorded the relay's ack (it raced delivered_at/attempts)
    wait_until(
        lambda: api.get(approval_id)["dispatch"]["delivered_at"] is not None,
        what="the gate to record the relay's ack",
    )
    before = api.get(approval_id)
    for verb, extra in (("approve", {}), ("skip", {}), ("adjust", {"adjust_text": "mine"})):
        status, answer, _ = post_decision(
            gate.callback_url, decision_body(dispatch, " Alice@Example.com ", verb, **extra)
        )
        assert (status, answer) == (403, SELF), verb
    assert api.get(approval_id) == before  # a refused decision changes nothing

    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, BOB))
    assert (status, answer) == (200, {"status": "recorded", "resolved": False})
    assert api.get(approval_id)["quorum"] == {"required": 2, "collected": 1}
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, ALICE))
    assert (status, answer) == (403, SELF)  # still refused with one approval in
    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, CAROL))
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )

    final = api.get(approval_id)
    assert final["quorum"] == {"required": 2, "collected": 2}
    assert [d["identity"] for d in final["decisions"]] == [BOB, CAROL]
    claims = permit.verify(
        final["permit"], [keys.load_public_key(gate.public)], "pay 1.250,00 €", 0
    ).claims
    assert claims["approved_by"] == [
        {"operator_id": 102, "identity": BOB},
        {"operator_id": 103, "identity": CAROL},
    ]
    assert claims["requested_by"] == ALICE

    assert gate.stop() == 0
    rows = [json.loads(line) for line in export_of(gate.config, gate.config.parent / "a.jsonl")]
    entries = [json.loads(r["entry"]) for r in rows if r["approval_id"] == approval_id]
    created_entry = next(e for e in entries if e["kind"] == "created")
    assert created_entry["data"]["requested_by"] == 101
    assert created_entry["data"]["allow_self_approval"] is False
    assert created_entry["data"]["approvers"] == [102, 103]
    resolved = next(e for e in entries if e["kind"] == "resolved")
    assert resolved["data"]["approved_by"] == [102, 103]
    assert [e["data"]["operator_id"] for e in entries if e["kind"] == "decision"] == [102, 103]


@pytest.mark.e2e
def test_self_approval_allowed_by_step(gate: Any, relay: Any) -> None:
    api = gate.api()
    created = api.create("selfok", "my own change", requested_by=ALICE)
    assert created["approvers"] == [ALICE, BOB]
    dispatch = relay.wait_dispatch(created["approval_id"])

    status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, ALICE))
    assert (status, answer) == (
        200,
        {"status": "recorded", "resolved": True, "outcome": "approved"},
    )


@pytest.mark.e2e
def test_self_approval_requester_outside_scope_decides_nothing_else(gate: Any, relay: Any) -> None:
    # carol is an operator but not an approver of "pair": alice and bob decide as usual
    api = gate.api()
    created = api.create("pair", "needs both", requested_by=CAROL)
    dispatch = relay.wait_dispatch(created["approval_id"])
    assert created["approvers"] == [ALICE, BOB]
    assert post_decision(gate.callback_url, decision_body(dispatch, CAROL))[:2] == (403, SELF)
    for who, resolved in ((ALICE, False), (BOB, True)):
        status, answer, _ = post_decision(gate.callback_url, decision_body(dispatch, who))
        assert (status, answer["resolved"]) == (200, resolved)


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("body", "status", "answer"),
    [
        (
            {"step": "pair", "requested_by": ALICE},
            422,
            {
                "status": "invalid",
                "reason": "quorum_unreachable",
                "field": "requested_by",
                "requested_by": ALICE,
                "approvers_left": 1,
                "quorum_required": 2,
            },
        ),
        (
            {"step": "q2", "requested_by": "mallory@example.com"},
            400,
            {**NOT_AN_OPERATOR, "message": f"{not_one('mallory@example.com')}, e.g. {ALICE}"},
        ),
        (
            {"step": "q2", "requested_by": "alice@exmaple.com"},
            400,
            {
                **NOT_AN_OPERATOR,
                "message": f"{not_one('alice@exmaple.com')}; did you mean {ALICE}?",
            },
        ),
        (
            {"step": "q2", "requested_by": "Carol"},
            400,
            {**NOT_AN_OPERATOR, "message": f"{not_one('Carol')}; did you mean {CAROL}?"},
        ),
        (
            {"step": "q2", "requested_by": "  "},
            400,
            {**NOT_AN_OPERATOR, "message": "requested_by must be a non-empty string"},
        ),
        (
            {"step": "q2", "requested_by": 101},
            400,
            {**NOT_AN_OPERATOR, "message": "requested_by must be a non-empty string"},
        ),
    ],
    ids=["quorum_unreachable", "unknown_identity", "typo", "local_part", "blank", "not_a_string"],
)
def test_self_approval_create_refusals(
    gate: Any, body: dict[str, Any], status: int, answer: dict[str, Any]
) -> None:
    payload = {"pipeline": "p", "draft": {"body": "x"}, **body}

    assert gate.api().call("POST", "/v1/approvals", payload) == (status, answer)
    assert gate.api().call("GET", "/v1/approvals?state=all")[1]["items"] == []


@pytest.mark.e2e
def test_self_approval_cli_requested_by(gate: Any, relay: Any) -> None:
    cli = CliProcess(*request_args(gate, BOB, "via the CLI"), "--wait")
    approval_id = cli.wait_for_line(r"requested approval (\S+)").group(1)
    dispatch = relay.wait_dispatch(approval_id)
    assert post_decision(gate.callback_url, decision_body(dispatch, BOB))[:2] == (403, SELF)
    for who in (ALICE, CAROL):
        assert post_decision(gate.callback_url, decision_body(dispatch, who))[0] == 200
    code, stdout, stderr = cli.finish()

    assert (code, stdout) == (0, b"via the CLI"), stderr
    assert gate.api().get(approval_id)["requested_by"] == BOB


@pytest.mark.e2e
def test_self_approval_question_refuses_an_unknown_requester_in_words(gate: Any) -> None:
    body = {"pipeline": "p", "step": "ask", "text": "Which PO?", "response_type": "free_text"}

    answer = gate.api().call("POST", "/v1/questions", {**body, "requested_by": "agent-7"})

    assert answer == (400, {**NOT_AN_OPERATOR, "message": f"{not_one('agent-7')}, e.g. {ALICE}"})


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("who", "said"),
    [
        ("agent-7", f"{not_one('agent-7')}, e.g. {ALICE}"),
        ("bob@exmaple.com", f"{not_one('bob@exmaple.com')}; did you mean {BOB}?"),
        # look-alike and hidden characters are shown by their code point
        ("alice@example.c\u043em", f"{not_one('alice@example.c<U+043E>m')}; did you mean {ALICE}?"),
        ("bob\u200b@example.com", f"{not_one('bob<U+200B>@example.com')}; did you mean {BOB}?"),
        (
            "carol@example.com\u202e",
            f"{not_one('carol@example.com<U+202E>')}; did you mean {CAROL}?",
        ),
        # an operator's numeric id: the identity it stands for
        ("101", f"101 is an operator id; requested_by takes the operator's identity: {ALICE}"),
        (" 102 ", f"102 is an operator id; requested_by takes the operator's identity: {BOB}"),
    ],
    ids=[
        "unknown",
        "typo",
        "look_alike",
        "zero_width",
        "bidi",
        "operator_id",
        "operator_id_spaced",
    ],
)
def test_self_approval_cli_says_what_requested_by_must_be(gate: Any, who: str, said: str) -> None:
    proc = run_cli(*request_args(gate, who, "x"))

    assert (proc.returncode, proc.stdout, proc.stderr.decode()) == (1, b"", f"Error: {said}\n")
    assert not (who[1:] in gate.log() and "@" in who)  # an identity given is not logged


@pytest.mark.e2e
def test_self_approval_dispatch_names_the_requester(gate: Any, relay: Any) -> None:
    api = gate.api()
    asked = api.create("q2", "asked by carol", requested_by=" Carol@Example.com")["approval_id"]
    anonymous = api.create("q2", "asked by nobody")["approval_id"]

    assert relay.wait_dispatch(asked)["requested_by"] == CAROL  # the configured spelling
    assert "requested_by" not in relay.wait_dispatch(anonymous)  # absent, as before


@pytest.mark.e2e
def test_self_approval_question_dispatch_names_the_requester(gate: Any, relay: Any) -> None:
    body = {"pipeline": "p", "step": "ask", "text": "Which PO?", "response_type": "free_text"}
    api = gate.api()
    asked = api.call("POST", "/v1/questions", {**body, "requested_by": BOB})[1]["question_id"]
    anonymous = api.call("POST", "/v1/questions", body)[1]["question_id"]

    def dispatch_of(question_id: str) -> dict[str, Any]:
        return wait_until(
            lambda: next(
                (d for d in relay.dispatches() if d.get("question_id") == question_id), None
            ),
            what=f"the dispatch of question {question_id}",
        )

    assert dispatch_of(asked)["requested_by"] == BOB
    assert "requested_by" not in dispatch_of(anonymous)


@pytest.mark.e2e
def test_self_approval_idempotency_key_includes_requested_by(gate: Any) -> None:
    api = gate.api()
    body = {"pipeline": "p", "step": "q2", "draft": {"body": "same"}}
    key = {"Idempotency-Key": "k-self-1"}
    assert api.call("POST", "/v1/approvals", {**body, "requested_by": ALICE}, key)[0] == 201
    assert api.call("POST", "/v1/approvals", {**body, "requested_by": ALICE}, key)[0] == 200
    assert api.call("POST", "/v1/approvals", {**body, "requested_by": BOB}, key) == (
        409,
        {"status": "conflict", "reason": "idempotency_key_reused"},
    )


def test_self_approval_request_hash_unchanged_without_requested_by() -> None:
    old_style = CreateRequest("p", "s", None, "text/plain", "x", None)
    assert parse_create({"pipeline": "p", "step": "s", "draft": {"body": "x"}}) == old_style
    # Idempotency-Keys stored before requested_by existed still match after an upgrade
    assert (
        old_style.request_hash()
        == hashlib.sha256(
            canonical_json(
                {
                    "pipeline": "p",
                    "step": "s",
                    "run_id": None,
                    "content_type": "text/plain",
                    "body": "x",
                    "spend": None,
                }
            )
        ).hexdigest()
    )
    assert (
        CreateRequest("p", "s", None, "text/plain", "x", None, ALICE).request_hash()
        != old_style.request_hash()
    )


# ---- config validation ------------------------------------------------------------------------


def _config_with(tmp_path: Path, steps: list[dict[str, Any]]) -> Path:
    return write_config(tmp_path, "http://127.0.0.1:9/relay", steps=steps)


@pytest.mark.e2e
def test_self_approval_check_config_rejects_unreachable_quorum(tmp_path: Path) -> None:
    config = _config_with(
        tmp_path,
        [
            {"name": "a", "quorum": 2, "approvers": [101, 102], "allow_self_approval": False},
            {"name": "b", "quorum": 1, "approvers": [101], "allow_self_approval": False},
            {"name": "c", "quorum": 2, "approvers": [101, 102, 103], "allow_self_approval": False},
            {"name": "d", "quorum": 2, "approvers": [101, 102], "allow_self_approval": True},
            {"name": "e", "quorum": 2, "approvers": [101, 102]},
            {"name": "f", "allow_self_approval": "yes"},
        ],
    )
    proc = run_cli("check-config", "-c", str(config))

    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        f"{config}: pipelines[0].steps[5].allow_self_approval: expected true or false, got "
        "string 'yes'",
        f"{config}: pipelines[0].steps[0].quorum: quorum 2 cannot be met without the requester"
        " (2 in scope, and with allow_self_approval: false a requester's own decisions do not"
        " count)",
        f"{config}: pipelines[0].steps[1].quorum: quorum 1 cannot be met without the requester"
        " (1 in scope, and with allow_self_approval: false a requester's own decisions do not"
        " count)",
    ]


def test_self_approval_config_keys_documented_in_example() -> None:
    text = (ROOT / "config.example.yaml").read_text(encoding="utf-8")
    for key in (
        "allow_self_approval:",
        "trusted_public_keys:",
        "permit_lifetime:",
        "signing_key_file:",
    ):
        assert key in text
    data = yaml.safe_load(text)
    assert data["receipts"]["permit_lifetime"] == "15m"
