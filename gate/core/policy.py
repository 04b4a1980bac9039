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

import fnmatch
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gate.config.policy import (
    HIGH_RISKS,
    REMEMBERED,
    ArgumentConstraint,
    PolicyRule,
    PolicyWhen,
    argument_path,
)

_MISSING = object()


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rules look at: the draft's ``content_type`` and ``body`` and the request's
    ``spend`` (in ``budget.unit``, None when not given)."""

    content_type: str
    body: str
    spend: float | None = None

    def draft_bytes(self) -> int:
        """The body's size in bytes (UTF-8)."""
        return len(self.body.encode("utf-8"))

    def document(self) -> Any:
        """The body as JSON when the content type is JSON (``application/json``, ``*+json``,
        parameters ignored) and it parses; else ``_MISSING`` (argument constraints fail)."""
        media = self.content_type.split(";", 1)[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            return _MISSING
        try:
            return json.loads(self.body)
        except ValueError:
            return _MISSING


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
    that the hard limits allow (``may_approve``), else None."""
    document = _MISSING
    if any(rule.when.arguments for rule in rules):
        document = facts.document()
    approve: PolicyRule | None = None
    for rule in rules:
        if not matches(rule.when, facts, document):
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


def matches(when: PolicyWhen, facts: Facts, document: Any = _MISSING) -> bool:
    """True when every condition of ``when`` holds for ``facts`` (``document``: the body as
    JSON, ``Facts.document``, for ``arguments``)."""
    if when.max_spend is not None and (facts.spend is None or facts.spend > when.max_spend):
        return False
    if when.max_draft_bytes is not None and facts.draft_bytes() > when.max_draft_bytes:
        return False
    if when.content_type is not None and facts.content_type not in when.content_type:
        return False
    if when.body_matches is not None and re.search(when.body_matches, facts.body) is None:
        return False
    for key, constraint in (when.arguments or {}).items():
        if not holds(constraint, _lookup(document, argument_path(key))):
            return False
    return True


def holds(constraint: ArgumentConstraint, value: Any) -> bool:
    """True when ``value`` (a JSON value; ``_MISSING`` when absent) meets every part of
    ``constraint``."""
    if value is _MISSING:
        return False
    given = constraint.model_fields_set
    if "equals" in given and not json_equal(value, constraint.equals):
        return False
    if constraint.one_of is not None and not any(json_equal(value, v) for v in constraint.one_of):
        return False
    if constraint.glob is not None and not (
        isinstance(value, str) and fnmatch.fnmatchcase(value, constraint.glob)
    ):
        return False
    if constraint.min is not None and not (_number(value) and value >= constraint.min):
        return False
    return constraint.max is None or (_number(value) and value <= constraint.max)


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``, ``1`` is ``1.0``; arrays and objects compared
    member by member."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _number(a) and _number(b):
        return bool(a == b)
    if isinstance(a, list) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def _number(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and (isinstance(value, int) or math.isfinite(value))
    )


def _lookup(document: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``document`` (object keys; array indexes as decimal text),
    or ``_MISSING``."""
    value = document
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
    return value
