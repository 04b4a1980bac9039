"""A policy fails closed (issue 18 §3, the outside review): an approve rule matches only when
every condition is evaluated and holds; a deny rule matches when each condition holds or
cannot be evaluated (a draft that is no strict JSON, a value of another type, an argument
that is absent, a glob value no wildcard may judge). Known answers for each finding of the
review over the pure evaluator (``gate.core.policy``), and properties with hypothesis."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gate.config.policy import PolicyRule
from gate.core.policy import Facts, evaluate

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
