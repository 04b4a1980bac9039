"""Policy's hard limits as properties, over the pure evaluator
(``gate.core.approvals.policy``) and the config loader (``gate.config``): no rule and no remembered
approval ever approves a step of risk high/critical; a matching deny always wins; an approve
stands in for a quorum > 1 only with ``allow_quorum``; and the known answers of each
condition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.config import config_from_mapping
from gate.config.policy import HIGH_RISKS, PolicyRule, argument_path
from gate.core.approvals import policy_tx
from gate.core.approvals.create import CreateRequest
from gate.core.approvals.policy import (
    Facts,
    Verdict,
    evaluate,
    first_failure,
    judge_rules,
    matches,
    remembered,
    verdict,
)
from gate.core.transactions import Policy
from gate.errors import ConfigError
from gate.store import WriteTx

ROOT = Path(__file__).resolve().parent.parent
RISKS = ("low", "normal", "high", "critical")

content_types = st.sampled_from(["text/plain", "application/json", "application/vnd.x+json"])
bodies = st.one_of(
    st.sampled_from(["deploy to prod", "hello", "", "prod", "{}"]),
    st.builds(
        lambda amount, to: json.dumps({"arguments": {"amount": amount, "to": to}}),
        st.one_of(st.integers(-5, 500), st.floats(allow_nan=False, allow_infinity=False)),
        st.sampled_from(["a@example.com", "b@evil.test", "prod"]),
    ),
    st.text(max_size=40),
)
facts = st.builds(
    Facts, content_types, bodies, st.one_of(st.none(), st.floats(0, 1000, allow_nan=False))
)
whens = st.fixed_dictionaries(
    {},
    optional={
        "max_spend": st.integers(0, 1000),
        "max_draft_bytes": st.integers(0, 80),
        "content_type": st.one_of(content_types, st.lists(content_types, min_size=1, max_size=2)),
        "body_matches": st.sampled_from([r"\bprod\b", "^h", ".", "x{2,}", ""]),
        "arguments": st.dictionaries(
            st.sampled_from(["/arguments/amount", "arguments.to", "missing.key"]),
            st.sampled_from(
                [
                    {"max": 100},
                    {"min": 10},
                    {"glob": "*@example.com"},
                    {"equals": 40},
                    {"one_of": ["prod", 1]},
                ]
            ),  # fmt: skip
            max_size=2,
        ),
    },
)
rule_dicts = st.builds(
    lambda i, decide, when, allow: {
        "id": f"r{i}",
        "decide": decide,
        "when": when,
        **({"allow_quorum": True} if allow and decide == "approve" else {}),
    },
    st.integers(0, 5),
    st.sampled_from(["approve", "deny"]),
    whens,
    st.booleans(),
)
rule_lists = st.lists(rule_dicts, max_size=5, unique_by=lambda r: r["id"]).map(
    lambda rules: [PolicyRule.model_validate(r) for r in rules]
)


@settings(max_examples=300, deadline=None)
@given(rule_lists, facts, st.sampled_from(HIGH_RISKS), st.integers(1, 4))
def test_nothing_approves_a_high_or_critical_step(
    rules: list[PolicyRule], f: Facts, risk: str, quorum: int
) -> None:
    verdict = evaluate(rules, f, risk, quorum)
    assert verdict is None or verdict.decide == "deny"
    assert remembered("01JEARLIER", risk, quorum) is None


@settings(max_examples=300, deadline=None)
@given(rule_lists, facts, st.sampled_from(RISKS), st.integers(1, 4))
def test_a_matching_deny_always_wins(
    rules: list[PolicyRule], f: Facts, risk: str, quorum: int
) -> None:
    doc = f.document()
    denies = [r for r in rules if r.decide == "deny" and matches(r.when, f, doc, "deny")]
    verdict = evaluate(rules, f, risk, quorum)
    if denies:
        assert verdict is not None and (verdict.decide, verdict.rule_id) == ("deny", denies[0].id)
    else:
        assert verdict is None or verdict.decide == "approve"


@settings(max_examples=300, deadline=None)
@given(rule_lists, facts, st.sampled_from(RISKS), st.integers(2, 4))
def test_approve_on_a_quorum_only_with_allow_quorum(
    rules: list[PolicyRule], f: Facts, risk: str, quorum: int
) -> None:
    verdict = evaluate(rules, f, risk, quorum)
    if verdict is not None and verdict.decide == "approve":
        rule = next(r for r in rules if r.id == verdict.rule_id)
        assert rule.allow_quorum and risk not in HIGH_RISKS
    assert remembered("01JEARLIER", risk, quorum) is None


@settings(max_examples=300, deadline=None)
@given(rule_lists, facts, st.sampled_from(["low", "normal"]))
def test_first_matching_approve_decides_when_no_deny(
    rules: list[PolicyRule], f: Facts, risk: str
) -> None:
    doc = f.document()
    matching = [r for r in rules if matches(r.when, f, doc, r.decide)]
    verdict = evaluate(rules, f, risk, 1)
    if not matching:
        assert verdict is None
    elif all(r.decide == "approve" for r in matching):
        assert verdict is not None and verdict.rule_id == matching[0].id


def example_with_step(step: dict[str, Any]) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "config.example.yaml").read_text(encoding="utf-8"))
    data["pipelines"][0]["steps"] = [{"name": "s", "approvers": [111, 222, 333], **step}]
    return dict(data)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(rule_dicts, max_size=4, unique_by=lambda r: r["id"]),
    st.sampled_from(RISKS),
    st.integers(1, 3),
    st.booleans(),
)
def test_config_refuses_every_approve_the_hard_limits_forbid(
    rules: list[dict[str, Any]], risk: str, quorum: int, remember: bool
) -> None:
    step = {"risk": risk, "quorum": quorum, "policy": rules}
    if remember:
        step["remember_approval"] = "1h"
    forbidden = [
        i
        for i, r in enumerate(rules)
        if r["decide"] == "approve"
        and (risk in HIGH_RISKS or (quorum > 1 and not r.get("allow_quorum")))
    ]
    remember_refused = remember and (risk in HIGH_RISKS or quorum > 1)
    try:
        config = config_from_mapping(example_with_step(step), ROOT)
    except ConfigError as exc:
        assert forbidden or remember_refused, exc.errors
        for i in forbidden:
            assert any(
                e.startswith(f"pipelines[0].steps[0].policy[{i}].decide:") for e in exc.errors
            )
        if remember_refused:
            assert any(e.startswith("pipelines[0].steps[0].remember_approval:") for e in exc.errors)
        return
    assert not forbidden and not remember_refused
    found = config.find_step("invoice-due-diligence", "s")
    assert found is not None and len(found[1].policy) == len(rules)


# ---- known answers --------------------------------------------------------------------------


def rule(when: dict[str, Any], decide: str = "approve") -> PolicyRule:
    return PolicyRule.model_validate({"id": "r", "decide": decide, "when": when})


INVOICE = json.dumps({"function": "pay", "arguments": {"amount": 40, "to": "a@example.com",
                                                       "tags": ["x"], "urgent": True}})  # fmt: skip
JSON = Facts("application/json", INVOICE)


@pytest.mark.parametrize(
    ("when", "f", "expected"),
    [
        ({}, Facts("text/plain", "x"), True),
        ({"max_spend": 10}, Facts("text/plain", "x", 10), True),
        ({"max_spend": 10}, Facts("text/plain", "x", 10.5), False),
        ({"max_spend": 10}, Facts("text/plain", "x", None), False),  # no spend: not shown small
        ({"max_draft_bytes": 2}, Facts("text/plain", "é"), True),
        ({"max_draft_bytes": 2}, Facts("text/plain", "éa"), False),  # 3 bytes in UTF-8
        ({"content_type": "text/plain"}, Facts("text/plain", "x"), True),
        ({"content_type": ["a/b", "text/plain"]}, Facts("text/plain", "x"), True),
        ({"content_type": "text/html"}, Facts("text/plain", "x"), False),
        ({"body_matches": r"\bprod\b"}, Facts("text/plain", "to prod now"), True),
        ({"body_matches": r"\bprod\b"}, Facts("text/plain", "production"), False),
        ({"arguments": {"/arguments/amount": {"max": 40}}}, JSON, True),
        ({"arguments": {"arguments.amount": {"min": 41}}}, JSON, False),
        ({"arguments": {"arguments.to": {"glob": "*@example.com"}}}, JSON, True),
        ({"arguments": {"arguments.to": {"glob": "*@EXAMPLE.com"}}}, JSON, True),  # casefolded
        ({"arguments": {"arguments.amount": {"one_of": [40, 50]}}}, JSON, True),
        ({"arguments": {"arguments.amount": {"equals": 40.0}}}, JSON, True),
        ({"arguments": {"arguments.urgent": {"equals": 1}}}, JSON, False),
        ({"arguments": {"arguments.urgent": {"equals": True}}}, JSON, True),
        ({"arguments": {"/arguments/tags/0": {"equals": "x"}}}, JSON, True),
        ({"arguments": {"arguments.tags": {"equals": ["x"]}}}, JSON, True),
        ({"arguments": {"arguments.to": {"max": 5}}}, JSON, False),
        ({"arguments": {"arguments.nope": {"equals": None}}}, JSON, False),
        # not a JSON draft: an approve's argument constraints never match
        ({"arguments": {"arguments.amount": {"max": 100}}}, Facts("text/plain", INVOICE), False),
        ({"arguments": {"arguments.amount": {"max": 100}}}, Facts("application/json", "{"), False),
    ],
)  # fmt: skip
def test_conditions(when: dict[str, Any], f: Facts, expected: bool) -> None:
    r = rule(when)
    assert matches(r.when, f, f.document()) is expected
    assert (evaluate([r], f, "normal", 1) is not None) is expected


@pytest.mark.parametrize(
    ("when", "f", "decide", "why"),
    [
        ({"max_spend": 10}, Facts("text/plain", "x", 10.5), "approve",
         "spend 10.5 > max_spend 10"),
        ({"max_spend": 10}, Facts("text/plain", "x", None), "approve",
         "no spend given for max_spend 10"),
        ({"max_draft_bytes": 2}, Facts("text/plain", "éa"), "approve",
         "draft 3 bytes > max_draft_bytes 2"),
        ({"content_type": ["a/b", "text/html"]}, Facts("TEXT/Plain; charset=utf-8", "x"),
         "approve", "content_type text/plain is not a/b or text/html"),
        ({"body_matches": r"\bprod\b"}, Facts("text/plain", "production"), "deny",
         r"body does not match body_matches '\bprod\b'"),
        ({"arguments": {"arguments.amount": {"min": 41}}}, JSON, "approve",
         "argument arguments.amount 40 < min 41"),
        ({"arguments": {"arguments.to": {"glob": "*@evil.test"}}}, JSON, "approve",
         'argument arguments.to "a@example.com" does not match glob "*@evil.test"'),
        ({"arguments": {"arguments.amount": {"one_of": [1, 2]}}}, JSON, "approve",
         "argument arguments.amount 40 is not in [1,2]"),
        ({"arguments": {"arguments.urgent": {"equals": 1}}}, JSON, "approve",
         "argument arguments.urgent true is no number for equals 1"),
        ({"arguments": {"arguments.to": {"max": 5}}}, JSON, "approve",
         'argument arguments.to "a@example.com" is no number for max 5'),
        ({"arguments": {"arguments.nope": {"equals": None}}}, JSON, "approve",
         "argument arguments.nope is absent"),
        ({"arguments": {"a": {"max": 1}}}, Facts("text/plain", "{}"), "approve",
         "argument a: content_type text/plain is not JSON"),
        ({"arguments": {"a": {"max": 1}}}, Facts("application/json", "{"), "approve",
         "argument a: the draft is not strict JSON (Expecting property name"
         " enclosed in double quotes"
         " at line 1 column 2)"),
        # a deny matches what it cannot evaluate: only a condition that does not hold fails
        ({"max_spend": 10, "content_type": "a/b"}, Facts("text/plain", "x"), "deny",
         "content_type text/plain is not a/b"),
    ],
)  # fmt: skip
def test_first_failure_names_the_values_compared(
    when: dict[str, Any], f: Facts, decide: str, why: str
) -> None:
    r = rule(when, decide)
    assert first_failure(r.when, f, f.document(), decide) == why
    assert judge_rules([r], f, "normal", 1)[0].explain() == f"r: no match: {why}"


@pytest.mark.parametrize(
    ("risk", "quorum", "why"),
    [
        ("high", 1, "r: matches, but no rule approves a step of risk high"),
        ("normal", 2, "r: matches, but it stands in for quorum 2 only with allow_quorum: true"),
        ("normal", 1, "r: matches"),
    ],
)
def test_judge_rules_names_the_hard_limit_that_keeps_a_match_from_deciding(
    risk: str, quorum: int, why: str
) -> None:
    results = judge_rules([rule({})], Facts("text/plain", "x"), risk, quorum)
    assert [result.explain() for result in results] == [why]
    assert (verdict(results) is not None) is (why == "r: matches")


def test_config_errors_name_the_yaml_path() -> None:
    step = {
        "risk": "high",
        "quorum": 2,
        "remember_approval": "10m",
        "policy": [
            {"id": "ok", "decide": "deny", "when": {"body_matches": "("}},
            {"id": "ok", "decide": "approve"},
            {"id": "Bad Id", "decide": "deny"},
            {"id": "remembered", "decide": "deny"},
            {"id": "x", "decide": "deny", "when": {"arguments": {"a..b": {"equals": 1}}}},
            {"id": "y", "decide": "deny", "when": {"arguments": {"a": {}}}},
            {"id": "z", "decide": "approve", "reason": "no", "allow_quorum": True},
        ],
    }
    with pytest.raises(ConfigError) as info:
        config_from_mapping(example_with_step(step), ROOT)
    where = "pipelines[0].steps[0]"
    text = "\n".join(info.value.errors)
    for expected in [
        f"{where}.policy[0].when.body_matches: ",
        f"{where}.policy[2].id: ",
        f"{where}.policy[3].id: ",
        f"{where}.policy[4].when.arguments: ",
        f"{where}.policy[5].when.arguments.a: ",
    ]:
        assert expected in text, text
    # the schema errors are listed; with them pruned the cross checks run too
    step["policy"] = step["policy"][1:2] + step["policy"][6:]
    step["policy"].insert(0, {"id": "ok", "decide": "deny"})
    with pytest.raises(ConfigError) as info:
        config_from_mapping(example_with_step(step), ROOT)
    assert sorted(info.value.errors) == sorted(
        [
            f"{where}.policy[1].id: duplicate rule id 'ok' (also {where}.policy[0])",
            f"{where}.policy[1].decide: a step with risk: high may have deny rules only"
            " (nothing approves it but a person)",
            f"{where}.policy[2].decide: a step with risk: high may have deny rules only"
            " (nothing approves it but a person)",
            f"{where}.policy[2].reason: only for decide: deny (the skip's reason)",
            f"{where}.remember_approval: refused on a step with risk: high"
            " (every draft there is approved by a person)",
        ]
    )


@pytest.mark.parametrize("risk", HIGH_RISKS)
def test_the_creation_transaction_refuses_an_approve_on_high_risk_again(risk: str) -> None:
    """Whatever verdict reaches the creation transaction (a config changed under it), an
    approve on a step of risk high/critical is dropped there: a person decides. A deny
    stands. (No remember window: the transaction is not read, so none is given.)"""
    req = CreateRequest("p", "s", None, "text/plain", "x", None)
    tx = cast(WriteTx, None)
    approve = Policy(1, (), 60.0, risk, verdict=Verdict("r", "approve"))
    assert policy_tx.verdict(tx, req, approve, "sha256:00", 0) is None
    deny = Policy(1, (), 60.0, risk, verdict=Verdict("r", "deny", "no"))
    assert policy_tx.verdict(tx, req, deny, "sha256:00", 0) == Verdict("r", "deny", "no")


@pytest.mark.parametrize(
    ("budget", "over"),
    [
        (None, False),
        ({"this_request": None, "spent_today": 99, "cap_today": 1, "spent_pipeline": 0,
          "cap_pipeline": None}, False),
        ({"this_request": 10, "spent_today": 40, "cap_today": 50, "spent_pipeline": 0,
          "cap_pipeline": None}, False),
        ({"this_request": 10.5, "spent_today": 40, "cap_today": 50, "spent_pipeline": 0,
          "cap_pipeline": None}, True),
        ({"this_request": 10, "spent_today": 0, "cap_today": None, "spent_pipeline": 41,
          "cap_pipeline": 50}, True),
    ],
)  # fmt: skip
def test_the_creation_transaction_leaves_a_request_over_a_cap_to_a_person(
    budget: dict[str, Any] | None, over: bool
) -> None:
    assert policy_tx.over_cap(budget) is over
    req = CreateRequest("p", "s", None, "text/plain", "x", 10)
    tx = cast(WriteTx, None)
    approve = Policy(1, (), 60.0, "normal", verdict=Verdict("r", "approve"))
    expected = None if over else Verdict("r", "approve")
    assert policy_tx.verdict(tx, req, approve, "sha256:00", 0, budget) == expected
    deny = Policy(1, (), 60.0, "normal", verdict=Verdict("r", "deny"))
    assert policy_tx.verdict(tx, req, deny, "sha256:00", 0, budget) == Verdict("r", "deny")


def test_a_deny_rule_gives_its_reason_where_skips_need_one() -> None:
    step = {"skip_reason": "required", "policy": [{"id": "d", "decide": "deny"}]}
    with pytest.raises(ConfigError) as info:
        config_from_mapping(example_with_step(step), ROOT)
    assert info.value.errors == [
        "pipelines[0].steps[0].policy[0].reason: the step has skip_reason: required, so a deny"
        " rule gives its reason too (what the pipeline should change)"
    ]
    step["policy"][0]["reason"] = "use the other account"
    config_from_mapping(example_with_step(step), ROOT)


segments = st.one_of(
    st.sampled_from(["0", "1", "2", "01", "00", "-1", "²", "٣", "１", "items", "qty", "", "~1"]),
    st.text(alphabet=st.characters(categories=["Nd", "No", "Nl", "Ll"]), max_size=3),
)
argument_keys = st.one_of(
    st.lists(segments, min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts)),
    st.lists(segments, min_size=1, max_size=4).map(".".join),
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=5),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(segments, st.text(max_size=3)), inner, max_size=4),
    ),
    max_leaves=12,
)


def _along(parts: list[str], data: st.DataObject) -> Any:
    """A JSON value that follows ``parts`` where it likes: at each level a list (any
    segment may be read as its index), an object holding the segment, or any value."""
    if not parts:
        return data.draw(json_values)
    inner = _along(parts[1:], data)
    shape = data.draw(st.sampled_from(["list", "object", "any"]))
    if shape == "list":
        return [inner] * data.draw(st.integers(1, 12))
    return {parts[0]: inner} if shape == "object" else data.draw(json_values)


@settings(max_examples=400, deadline=None)
@given(argument_keys, st.sampled_from(["approve", "deny"]), st.data())
def test_any_path_check_config_accepts_evaluates_on_any_json_draft(
    key: str, decide: str, data: st.DataObject
) -> None:
    """A path the config takes never makes the evaluation raise, whatever the draft (``²``
    passed ``str.isdigit`` and ``int("²")`` raised on every create with a list there)."""
    rule = {"id": "r", "decide": decide, "when": {"arguments": {key: {"max": 5}}}}
    try:
        rules = [PolicyRule.model_validate(rule)]
    except ValueError:  # pydantic's ValidationError: the config refuses the path
        return
    parts = list(argument_path(key))
    facts = Facts("application/json", json.dumps(_along(parts, data)))
    found = evaluate(rules, facts, "normal", 1)
    assert found is None or found.decide == decide
