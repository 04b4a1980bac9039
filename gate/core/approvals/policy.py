"""Policy: which rule of a step decides a new approval, if any. Pure: no I/O,
no clock read; the creation transaction (``gate.core.approvals.policy_tx``) applies the verdict.

Every rule that matches is found; any matching ``deny`` wins over any ``approve``; else the
first matching ``approve``; else none (a person decides). Then, with none, a remembered
approval (``remembered``: the transaction found the same payload hash approved by a person
on the step within ``remember_approval``). The hard limits hold here too, whatever the
config says (it may have changed since it was checked): nothing approves a step of risk
high or critical, an approve rule stands in for a quorum > 1 only with ``allow_quorum``, and
a remembered approval never does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gate.config.policy import (
    HIGH_RISKS,
    REMEMBERED,
    ArgumentConstraint,
    PolicyRule,
    PolicyWhen,
    argument_path,
    body_pattern,
)
from gate.core.approvals.policy_values import (
    UNKNOWN,
    UNREADABLE,
    Check,
    is_json,
    judge_parts,
    media_type,
    read_json,
    shown,
    unreadable,
)
from gate.core.approvals.policy_values import strings as json_strings
from gate.protocol.numbers import list_index

_UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rules look at: the draft's ``content_type`` and ``body`` and the request's
    ``spend`` (in ``budget.unit``, None when not given)."""

    content_type: str
    body: str
    spend: float | None = None

    def draft_bytes(self) -> int | None:
        """The body's size in bytes (UTF-8); None for a body that is no Unicode text."""
        try:
            return len(self.body.encode("utf-8"))
        except UnicodeEncodeError:
            return None

    def document(self) -> Any:
        """The body read as strict JSON (``gate.core.approvals.policy_values.read_json``), whatever
        the content type, or ``UNREADABLE``."""
        return read_json(self.body)


@dataclass(frozen=True, slots=True)
class Verdict:
    """A policy decision: ``rule_id`` (``remembered`` for a remembered approval), ``decide``
    approve|deny, a deny's ``reason`` (or None) and, when remembered, the approval id it
    remembers (``remembered_from``)."""

    rule_id: str
    decide: str
    reason: str | None = None
    remembered_from: str | None = None

    @property
    def by(self) -> str:
        """The decider's name: ``policy:<rule id>``."""
        return f"policy:{self.rule_id}"

    @property
    def decision(self) -> str:
        """The decision it records (SPEC §2 vocabulary): ``approve`` or ``skip``."""
        return "approve" if self.decide == "approve" else "skip"

    @property
    def outcome(self) -> str:
        """The outcome it resolves the approval with: ``approved`` or ``skipped``."""
        return "approved" if self.decide == "approve" else "skipped"


def may_approve(risk: str, quorum: int, allow_quorum: bool) -> bool:
    """The hard limit: may a rule approve a step of ``risk`` needing
    ``quorum`` people? Never on high/critical; on quorum > 1 only with ``allow_quorum``."""
    return risk not in HIGH_RISKS and (quorum <= 1 or allow_quorum)


def may_remember(risk: str, quorum: int) -> bool:
    """May a remembered approval decide (never on high/critical nor on quorum > 1)?"""
    return risk not in HIGH_RISKS and quorum <= 1


@dataclass(frozen=True, slots=True)
class RuleResult:
    """One rule judged on a draft: ``matched`` (``matches``), and ``why`` it does not count:
    the first condition that kept it from matching (``no match: spend 400 > max_spend
    100``), or the hard limit that keeps a matching approve from deciding; None when it
    counts."""

    rule: PolicyRule
    matched: bool
    why: str | None
    unchecked: str | None = None

    @property
    def counts(self) -> bool:
        """True when this rule takes part in the verdict (matched, within the hard limits)."""
        return self.why is None

    def explain(self) -> str:
        """One line: ``<rule id>: matches`` or ``<rule id>: <why>``; a deny that matched
        only because a condition could not be evaluated (``unchecked``) says which."""
        if self.why is not None:
            return f"{self.rule.id}: {self.why}"
        if self.unchecked is not None:
            return (
                f"{self.rule.id}: matches: {self.unchecked}, and a deny rule holds where it"
                " cannot check"
            )
        return f"{self.rule.id}: matches"


def judge_rules(
    rules: Sequence[PolicyRule], facts: Facts, risk: str, quorum: int
) -> list[RuleResult]:
    """Each of ``rules`` (a step's ``policy``, in order) judged on ``facts`` (``RuleResult``):
    the evaluation ``evaluate`` decides by, and ``policy test`` explains."""
    document = _UNSET
    if any(rule.when.arguments or rule.when.body_matches is not None for rule in rules):
        document = facts.document()
    out: list[RuleResult] = []
    for rule in rules:
        failed, unchecked = _first_failure(rule.when, facts, document, rule.decide)
        if failed is not None:
            out.append(RuleResult(rule, False, f"no match: {failed}"))
        elif rule.decide == "approve" and not may_approve(risk, quorum, rule.allow_quorum):
            out.append(RuleResult(rule, True, _hard_limit(risk, quorum)))
        else:
            out.append(RuleResult(rule, True, None, unchecked))
    return out


def _hard_limit(risk: str, quorum: int) -> str:
    if risk in HIGH_RISKS:
        return f"matches, but no rule approves a step of risk {risk}"
    return f"matches, but it stands in for quorum {quorum} only with allow_quorum: true"


def evaluate(rules: Sequence[PolicyRule], facts: Facts, risk: str, quorum: int) -> Verdict | None:
    """The verdict of ``rules`` (a step's ``policy``, in order) on ``facts``, or None when no
    rule decides: any matching deny wins (the first such), else the first matching approve
    that the hard limits allow (``may_approve``), else None. A policy fails closed
    (``matches``)."""
    return verdict(judge_rules(rules, facts, risk, quorum))


def verdict(results: Sequence[RuleResult]) -> Verdict | None:
    """The verdict of rules judged by ``judge_rules``: the first counting deny, else the
    first counting approve, else None."""
    counting = [result.rule for result in results if result.counts]
    deny = next((rule for rule in counting if rule.decide == "deny"), None)
    if deny is not None:
        return Verdict(deny.id, "deny", deny.reason)
    return Verdict(counting[0].id, "approve") if counting else None


def remembered(earlier_id: str, risk: str, quorum: int) -> Verdict | None:
    """The verdict of a remembered approval of ``earlier_id`` (None where ``may_remember``
    refuses it)."""
    if not may_remember(risk, quorum):
        return None
    return Verdict(REMEMBERED, "approve", remembered_from=earlier_id)


def matches(
    when: PolicyWhen, facts: Facts, document: Any = _UNSET, decide: str = "approve"
) -> bool:
    """Does a rule with conditions ``when`` deciding ``decide`` match ``facts``
    (``document``: ``facts.document()``, read once per evaluation)? A policy fails closed:
    an approve matches only when every condition is evaluated and holds; a deny when no
    condition is evaluated and fails (each holds or cannot be evaluated)."""
    return first_failure(when, facts, document, decide) is None


def first_failure(
    when: PolicyWhen, facts: Facts, document: Any = _UNSET, decide: str = "approve"
) -> str | None:
    """Why a rule with conditions ``when`` deciding ``decide`` does not match ``facts``: the
    values its first failing condition compared (an approve's first condition that does not
    hold or cannot be evaluated, a deny's first that does not hold), or None when it
    matches (``matches``)."""
    return _first_failure(when, facts, document, decide)[0]


def _first_failure(
    when: PolicyWhen, facts: Facts, document: Any, decide: str
) -> tuple[str | None, str | None]:
    """``first_failure``, and for a deny that matches, its first condition that could not be
    evaluated (or None)."""
    if document is _UNSET:
        document = facts.document() if when.arguments or when.body_matches else UNREADABLE
    unchecked: str | None = None
    for check in conditions(when, facts, document, deny=decide == "deny"):
        if check.answer is False:
            return check.why, None
        if check.answer is UNKNOWN and decide != "deny":
            return check.why, None
        if check.answer is UNKNOWN and unchecked is None:
            unchecked = check.why
    return None, unchecked


def conditions(when: PolicyWhen, facts: Facts, document: Any, *, deny: bool) -> list[Check]:
    """Each condition of ``when`` judged on ``facts`` (a ``Check``: True holds, False, or
    None cannot be evaluated, with the values compared). ``deny``: ``body_matches`` is tried
    on the raw text and, for a body that is JSON, on every decoded string (a JSON content
    type whose body is no strict JSON: None); an approve's on the raw text only."""
    out: list[Check] = []
    if when.max_spend is not None:
        limit = shown(when.max_spend)
        if facts.spend is None:
            out.append(Check(UNKNOWN, f"no spend given for max_spend {limit}"))
        else:
            holds = facts.spend <= when.max_spend
            sign = "<=" if holds else ">"
            out.append(Check(holds, f"spend {shown(facts.spend)} {sign} max_spend {limit}"))
    if when.max_draft_bytes is not None:
        size = facts.draft_bytes()
        limit = shown(when.max_draft_bytes)
        if size is None:
            out.append(Check(UNKNOWN, f"the draft is no Unicode text for max_draft_bytes {limit}"))
        else:
            holds = size <= when.max_draft_bytes
            sign = "<=" if holds else ">"
            out.append(Check(holds, f"draft {size} bytes {sign} max_draft_bytes {limit}"))
    if when.content_type is not None:
        media = media_type(facts.content_type)
        holds = any(media == media_type(wanted) for wanted in when.content_type)
        wanted = " or ".join(when.content_type)
        out.append(Check(holds, f"content_type {media} is {'' if holds else 'not '}{wanted}"))
    if when.body_matches is not None:
        out.append(_body_matches(when.body_matches, facts, document, deny))
    for key, constraint in (when.arguments or {}).items():
        out.append(_argument(key, constraint, facts, document))
    return out


def _argument(key: str, constraint: ArgumentConstraint, facts: Facts, document: Any) -> Check:
    if not is_json(facts.content_type):
        media = media_type(facts.content_type)
        return Check(UNKNOWN, f"argument {key}: content_type {media} is not JSON")
    if unreadable(document):
        return Check(UNKNOWN, f"argument {key}: {document.why}")
    value = _lookup(document, argument_path(key))
    if value is _ABSENT:
        return Check(UNKNOWN, f"argument {key} is absent")
    parts = judge_parts(constraint, value)
    failed = next((part for part in parts if part.answer is False), None)
    failed = failed or next((part for part in parts if part.answer is UNKNOWN), None)
    if failed is None:
        return Check(True, f"argument {key} {shown(value)} meets its constraint")
    return Check(failed.answer, f"argument {key} {failed.why}")


def _body_matches(source: str, facts: Facts, document: Any, deny: bool) -> Check:
    answer = _body_search(source, facts, document, deny)
    if answer is UNKNOWN and unreadable(document) and is_json(facts.content_type):
        return Check(UNKNOWN, document.why)
    if answer is UNKNOWN:
        return Check(UNKNOWN, f"body_matches '{source}' on a body it cannot read")
    verb = "matches" if answer else "does not match"
    return Check(answer, f"body {verb} body_matches '{source}'")


def _body_search(source: str, facts: Facts, document: Any, deny: bool) -> bool | None:
    pattern = body_pattern(source)
    try:
        if pattern.search(facts.body) is not None:
            return True
        if not deny:
            return False
        if unreadable(document):
            return UNKNOWN if is_json(facts.content_type) else False
        return any(pattern.search(text) is not None for text in set(json_strings(document)))
    except UnicodeEncodeError:  # a lone surrogate: no text RE2 can read
        return UNKNOWN


_ABSENT: Any = object()


def _lookup(document: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``document`` (object keys; list indexes as ASCII decimal
    text, ``gate.protocol.numbers.list_index``), or ``_ABSENT``."""
    value = document
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and (index := list_index(part)) is not None:
            if index >= len(value):
                return _ABSENT
            value = value[index]
        else:
            return _ABSENT
    return value
