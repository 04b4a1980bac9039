"""A policy fails closed (the outside review): an approve rule matches only when
every condition is evaluated and holds; a deny rule matches when each condition holds or
cannot be evaluated (a draft that is no strict JSON, a value of another type, an argument
that is absent, a glob value no wildcard may judge). Known answers for each finding of the
review over the pure evaluator (``gate.core.approvals.policy``), and properties with hypothesis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.config import config_from_mapping
from gate.config.policy import PolicyRule
from gate.core.approvals import policy_tx
from gate.core.approvals.create import CreateRequest
from gate.core.approvals.policy import Facts, Verdict, evaluate
from gate.core.transactions import Policy
from gate.errors import ConfigError
from gate.store import WriteTx

J = "application/json"
SMALL = {"id": "small", "decide": "approve", "when": {"max_spend": 10}}


def verdict_of(deny_when: dict[str, Any], f: Facts) -> str | None:
    """The rule that decides ``f`` on a step with an approve-everything-small rule and a
    deny rule ``deny_when``."""
    rules = [
        PolicyRule.model_validate(SMALL),
        PolicyRule.model_validate({"id": "no", "decide": "deny", "when": deny_when}),
    ]
    found = evaluate(rules, f, "normal", 1)
    return None if found is None else found.rule_id


def approves(when: dict[str, Any], f: Facts) -> bool:
    r = PolicyRule.model_validate({"id": "ok", "decide": "approve", "when": when})
    return evaluate([r], f, "normal", 1) is not None


AMOUNT = {"arguments": {"amount": {"min": 1000}}}
TO = {"arguments": {"to": {"glob": "*@competitor.com"}}}


@pytest.mark.parametrize(
    ("deny", "ct", "body"),
    [
        (AMOUNT, J, '{"amount": 5000}'),  # the baseline
        (AMOUNT, "text/plain", '{"amount": 5000}'),  # C3: not sent as JSON
        (AMOUNT, J, '{"amount": "5000"}'),  # C3: a string where a number is expected
        (AMOUNT, J, '{"amount": 1e999}'),  # C3: not finite
        (AMOUNT, J, '{"amount": Infinity}'),
        (AMOUNT, J, '{"amount": NaN}'),
        (AMOUNT, J, '{"amount": 5000,}'),  # C3: trailing comma
        (AMOUNT, J, '{"amount": 5000 // cents\n}'),  # C3: a comment
        (AMOUNT, J, '\ufeff{"amount": 5000}'),  # C3: a BOM
        (AMOUNT, J, '{"amount": 5000, "x": ' + "1" * 5000 + "}"),  # C3: Python's int limit
        (AMOUNT, J, '{"amount": 5000, "amount": 5}'),  # M2: duplicate keys
        (AMOUNT, J, '[{"amount": 5000}]'),  # not where the rule looks
        (AMOUNT, J, '{"amount": 5000, "pad": ' + "[" * 50000 + "]" * 50000 + "}"),  # L1
        (AMOUNT, "Application/JSON", '{"amount": 5000}'),
        (TO, J, '{"to": "x@Competitor.COM"}'),  # C3: case
        (TO, J, '{"to": ["x@competitor.com"]}'),  # C3: a list where a string is expected
        (TO, J, '{"to": "x@competitor.com, me@ok.com"}'),  # C1: a list in a string
        (TO, J, '{"to": "x@competitor.com."}'),  # a root dot
        (TO, J, '{"to": "me@ok.com\\nBcc: x@competitor.com"}'),
        ({"content_type": "text/html"}, "text/html; charset=utf-8", "<b>hi</b>"),  # C4
        ({"content_type": "text/html"}, "TEXT/HTML", "<b>hi</b>"),  # C4
        ({"body_matches": r"\bprod\b"}, J, '{"env": "pro\\u0064"}'),  # C2: a JSON escape
        ({"body_matches": r"\bprod\b"}, J, '{"pro\\u0064": 1}'),  # C2: a key
        ({"body_matches": r"\bprod\b"}, J, '{"env": "pro\\u0064",}'),  # C2: unreadable JSON
        ({"body_matches": r"(?i)\bprod\b"}, "text/plain", "to PROD now"),
    ],
)
def test_deny_matches_what_it_cannot_evaluate(deny: dict[str, Any], ct: str, body: str) -> None:
    assert verdict_of(deny, Facts(ct, body, 1)) == "no"


@pytest.mark.parametrize(
    ("deny", "ct", "body"),
    [
        (AMOUNT, J, '{"amount": 5}'),
        (AMOUNT, J, '{"amount": 999.5, "note": "5000"}'),
        (TO, J, '{"to": "x@ok.com"}'),
        ({"content_type": "text/html"}, "text/plain; charset=utf-8", "<b>hi</b>"),
        ({"body_matches": r"\bprod\b"}, J, '{"env": "production"}'),
        ({"body_matches": r"\bprod\b"}, "text/plain", "{not json, but no JSON type either"),
    ],
)
def test_deny_stays_out_of_what_it_judged(deny: dict[str, Any], ct: str, body: str) -> None:
    assert verdict_of(deny, Facts(ct, body, 1)) == "small"


DOMAIN = {"arguments": {"to": {"glob": "*@example.com"}}}
PUBLIC = {"arguments": {"path": {"glob": "/srv/public/*"}}}


@pytest.mark.parametrize(
    ("when", "ct", "body", "expected"),
    [
        (DOMAIN, J, '{"to": "a@example.com"}', True),
        (DOMAIN, J, '{"to": "A.B@Example.COM"}', True),  # casefolded
        (DOMAIN, J, '{"to": "ceo@rival.com, a@example.com"}', False),  # C1
        (DOMAIN, J, '{"to": "ceo@rival.com\\nBcc: a@example.com"}', False),
        (DOMAIN, J, '{"to": "<ceo@rival.com>a@example.com"}', False),
        (DOMAIN, J, '{"to": "ceo@rival.com@example.com"}', False),
        (DOMAIN, J, '{"to": "a@sub.example.com"}', False),
        (DOMAIN, J, '{"to": "a\\u200b@example.com"}', False),  # a format character
        (DOMAIN, J, '{"to": ["a@example.com"]}', False),
        (PUBLIC, J, '{"path": "/srv/public/a.txt"}', True),
        (PUBLIC, J, '{"path": "/srv/public/../../etc/shadow"}', False),  # C1
        (PUBLIC, J, '{"path": "/srv/public/x/../../../root/.ssh/id_rsa"}', False),
        (PUBLIC, J, '{"path": "/srv/public/.."}', False),
        (PUBLIC, J, '{"path": "/srv/public//etc"}', False),
        ({"arguments": {"amount": {"max": 100}}}, J, '{"amount": 50}', True),
        ({"arguments": {"amount": {"max": 100}}}, J, '{"amount": 5000, "amount": 5}', False),
        ({"arguments": {"amount": {"max": 100}}}, J, '{"amount": -1e999}', False),
        ({"arguments": {"amount": {"max": 100}}}, J, '{"amount": NaN}', False),
        ({"arguments": {"amount": {"max": 100}}}, J, '{"amount": -1e308}', False),  # > 2**53
        ({"arguments": {"amount": {"max": 100}}}, J, '{"amount": -9007199254740992}', True),
        ({"arguments": {"amount": {"max": 100}}}, "text/plain", '{"amount": 5}', False),
        ({"content_type": "application/json"}, "Application/JSON; charset=utf-8", "{}", True),
        ({"body_matches": "^hello"}, J, '"hello"', False),  # an approve: raw text only
    ],
)
def test_approve_matches_only_what_holds(
    when: dict[str, Any], ct: str, body: str, expected: bool
) -> None:
    assert approves(when, Facts(ct, body, 1)) is expected


def test_a_catastrophic_pattern_runs_in_linear_time() -> None:
    """H1: RE2 (no backtracking): the review's pattern on a draft that would take Python's
    ``re`` longer than the age of the universe answers at once (no timing assert: a
    backtracking engine simply does not return within the test's timeout)."""
    f = Facts("text/plain", "a" * 100_000 + "!")
    assert not approves({"body_matches": r"^(\w+\s?)+$"}, f)
    assert approves({"body_matches": r"^(\w+\s?)+$"}, Facts("text/plain", "hello world"))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)
whens = st.sampled_from(
    [
        AMOUNT,
        TO,
        DOMAIN,
        PUBLIC,
        {"arguments": {"amount": {"equals": 5}}},
        {"arguments": {"amount": {"one_of": ["a", 5]}}},
        {"body_matches": r"\bprod\b"},
        {"content_type": "application/json"},
        {"max_spend": 3},
    ]
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps({"amount": v, "to": v, "path": v})),
    json_values.map(json.dumps),
    st.text(max_size=30),
)


@settings(max_examples=400, deadline=None)
@given(whens, st.sampled_from([J, "text/plain", "TEXT/Plain; x=1"]), bodies)
def test_a_rule_either_approves_or_denies_never_both_ways_open(
    when: dict[str, Any], ct: str, body: str
) -> None:
    """Whatever the draft, the same conditions as an approve and as a deny never leave a
    draft neither denied nor left to a person when the approve would not hold: if the
    approve matches, every condition held, so the deny matches too."""
    f = Facts(ct, body, 1)
    if approves(when, f):
        assert verdict_of(when, f) == "no"


# ---- the config refuses what a policy cannot do (review H3, L3, L4, H1) ---------------------

ROOT = Path(__file__).resolve().parent.parent
WHERE = "pipelines[0].steps[0]"


def config_errors(step: dict[str, Any], operators: list[dict[str, Any]] | None = None) -> str:
    data = yaml.safe_load((ROOT / "config.example.yaml").read_text(encoding="utf-8"))
    data["pipelines"][0]["steps"] = [{"name": "s", "approvers": [111, 222, 333], **step}]
    if operators is not None:
        data["relay"]["operators"] = operators
    try:
        config_from_mapping(data, ROOT)
    except ConfigError as exc:
        return "\n".join(exc.errors)
    return ""


def test_config_refuses_a_policy_approve_where_a_signature_is_required() -> None:
    """H3: a policy cannot sign: no approve rule and no remember_approval on a step with
    ``approver_signature: required``; deny rules stay."""
    step = {
        "approver_signature": "required",
        "remember_approval": "1h",
        "policy": [{"id": "d", "decide": "deny"}, {"id": "a", "decide": "approve"}],
    }
    text = config_errors(step)
    assert f"{WHERE}.policy[1].decide: the step has approver_signature: required" in text
    assert f"{WHERE}.remember_approval: refused on a step with approver_signature" in text
    assert f"{WHERE}.policy[0]" not in text
    assert config_errors({"approver_signature": "required", "policy": step["policy"][:1]}) == ""


def test_config_refuses_an_operator_named_like_a_policy() -> None:
    """L3: ``policy:…`` is the name a policy decides by; no person may take it."""
    data = yaml.safe_load((ROOT / "config.example.yaml").read_text(encoding="utf-8"))
    operators = data["relay"]["operators"]
    operators[1]["identity"] = "Policy:remembered"
    assert "relay.operators[1].identity: starts with 'policy:'" in config_errors({}, operators)


@pytest.mark.parametrize(
    ("when", "path", "why"),
    [
        ({"body_matches": r"(a)\1"}, "when.body_matches", "RE2 cannot take"),
        ({"body_matches": r"(?=a)b"}, "when.body_matches", "RE2 cannot take"),
        ({"arguments": {"a": {"min": 5, "max": 1}}}, "when.arguments.a", "can never match"),
        ({"arguments": {"a": {"one_of": []}}}, "when.arguments.a", "can never match"),
        ({"arguments": {"a": {"glob": "/srv/../*"}}}, "when.arguments.a", "can never match"),
        ({"arguments": {"a": {"glob": "* @x.com"}}}, "when.arguments.a", "can never match"),
        ({"content_type": []}, "when.content_type", "can never match"),
    ],
)
def test_config_refuses_rules_that_can_never_match(
    when: dict[str, Any], path: str, why: str
) -> None:
    text = config_errors({"policy": [{"id": "r", "decide": "deny", "when": when}]})
    assert f"{WHERE}.policy[0].{path}: " in text and why in text, text


def test_the_creation_transaction_refuses_an_approve_where_a_signature_is_required() -> None:
    """H3 again at decision time (a config changed under it): an approve verdict on a step
    requiring approver signatures is dropped, a person decides; a deny stands."""
    req = CreateRequest("p", "s", None, "text/plain", "x", None)
    tx = cast(WriteTx, None)
    approve = Policy(
        1, (), 60.0, "normal", approver_signature="required", verdict=Verdict("r", "approve")
    )
    assert policy_tx.verdict(tx, req, approve, "sha256:00", 0) is None
    deny = Policy(
        1, (), 60.0, "normal", approver_signature="required", verdict=Verdict("r", "deny")
    )
    assert policy_tx.verdict(tx, req, deny, "sha256:00", 0) == Verdict("r", "deny")


@pytest.mark.parametrize(
    ("approvers", "expected"),
    [((101,), True), ((101, 102), True), ((101, 104), False), ((104,), False), ((), False)],
)
def test_a_remembered_approval_stands_only_for_approvers_in_scope(
    approvers: tuple[int, ...], expected: bool
) -> None:
    scope = ((101, "alice@example.com"), (102, "bob@example.com"))
    assert policy_tx.in_scope(approvers, scope) is expected
