"""Policy: which rule of a step decides a new approval, if any (issue 18 §3). Pure: no I/O,
no clock read; the creation transaction (``gate.core.policy_tx``) applies the verdict.

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
    PolicyRule,
    PolicyWhen,
    argument_path,
    body_pattern,
)
from gate.core.policy_values import UNKNOWN, UNREADABLE, is_json, judge, media_type, read_json
from gate.core.policy_values import strings as json_strings
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
        """The body read as strict JSON (``gate.core.policy_values.read_json``), whatever
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
    """The hard limit (issue 18 §3): may a rule approve a step of ``risk`` needing
    ``quorum`` people? Never on high/critical; on quorum > 1 only with ``allow_quorum``."""
    return risk not in HIGH_RISKS and (quorum <= 1 or allow_quorum)


def may_remember(risk: str, quorum: int) -> bool:
    """May a remembered approval decide (never on high/critical nor on quorum > 1)?"""
    return risk not in HIGH_RISKS and quorum <= 1


def evaluate(rules: Sequence[PolicyRule], facts: Facts, risk: str, quorum: int) -> Verdict | None:
    """The verdict of ``rules`` (a step's ``policy``, in order) on ``facts``, or None when no
    rule decides: any matching deny wins (the first such), else the first matching approve
    that the hard limits allow (``may_approve``), else None. A policy fails closed
    (``matches``)."""
    document = _UNSET
    if any(rule.when.arguments or rule.when.body_matches is not None for rule in rules):
        document = facts.document()
    approve: PolicyRule | None = None
    for rule in rules:
        if not matches(rule.when, facts, document, rule.decide):
            continue
        if rule.decide == "deny":
            return Verdict(rule.id, "deny", rule.reason)
        if approve is None and may_approve(risk, quorum, rule.allow_quorum):
            approve = rule
    return None if approve is None else Verdict(approve.id, "approve")


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
    if document is _UNSET:
        document = facts.document() if when.arguments or when.body_matches else UNREADABLE
    answers = conditions(when, facts, document, deny=decide == "deny")
    if decide == "deny":
        return all(answer is not False for answer in answers)
    return all(answer is True for answer in answers)


def conditions(when: PolicyWhen, facts: Facts, document: Any, *, deny: bool) -> list[bool | None]:
    """Each condition of ``when`` judged on ``facts``: True (holds), False, or None (cannot
    be evaluated). ``deny``: ``body_matches`` is tried on the raw text and, for a body that
    is JSON, on every decoded string (a JSON content type whose body is no strict JSON:
    None); an approve's on the raw text only (issue 18 review C2)."""
    out: list[bool | None] = []
    if when.max_spend is not None:
        out.append(UNKNOWN if facts.spend is None else facts.spend <= when.max_spend)
    if when.max_draft_bytes is not None:
        size = facts.draft_bytes()
        out.append(UNKNOWN if size is None else size <= when.max_draft_bytes)
    if when.content_type is not None:
        media = media_type(facts.content_type)
        out.append(any(media == media_type(wanted) for wanted in when.content_type))
    if when.body_matches is not None:
        out.append(_body_matches(when.body_matches, facts, document, deny))
    for key, constraint in (when.arguments or {}).items():
        if document is UNREADABLE or not is_json(facts.content_type):
            out.append(UNKNOWN)
            continue
        value = _lookup(document, argument_path(key))
        out.append(UNKNOWN if value is _ABSENT else judge(constraint, value))
    return out


def _body_matches(source: str, facts: Facts, document: Any, deny: bool) -> bool | None:
    pattern = body_pattern(source)
    try:
        if pattern.search(facts.body) is not None:
            return True
        if not deny:
            return False
        if document is UNREADABLE:
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
