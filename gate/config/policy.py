"""Per-step policy rules and remembered approvals in the config.

The models (``PolicyRule`` with its ``when`` conditions and argument constraints) and the
checks across fields that need the step (unique ids, the hard limits on ``risk: high`` /
``critical`` and quorum > 1). Every error is a ``"<yaml.path>: <message>"`` line like the
rest of ``gate.config``; the evaluation itself is ``gate.core.approvals.policy`` (pure).
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

import re2
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from gate.config.values import check_bounded_number, duplicate
from gate.protocol.numbers import looks_like_index

if TYPE_CHECKING:
    from gate.config.model import Config, StepConfig

HIGH_RISKS = ("high", "critical")
# the rule id a remembered approval is decided by (``policy:remembered``): no rule may take it
REMEMBERED = "remembered"
MAX_RULE_ID_CHARS = 64
MAX_RULE_REASON_CHARS = 500

_FROZEN = ConfigDict(extra="forbid", frozen=True)
_RULE_ID = re.compile(r"[a-z0-9_-]+")
_Reason = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_RULE_REASON_CHARS)]
_Number = Annotated[
    float, BeforeValidator(check_bounded_number), Field(strict=True, allow_inf_nan=False)
]


def _one_or_list(value: object) -> object:
    """``content_type: application/json`` is the list of one."""
    return (value,) if isinstance(value, str) else value


# what ``*`` and ``?`` never match in a glob (one segment of an address or a path): the
# separators of paths, addresses and lists, whitespace, control and format characters
_SEGMENT = r"[^/@,;<>\\\s\p{Z}\p{Cc}\p{Cf}]"
# a value (or a glob) holding one of these cannot be judged by a glob: list separators,
# angle brackets, a backslash, whitespace, control or format characters; an empty, ``.`` or
# ``..`` path segment (``//``, ``/./``, ``/../``); a final dot (``example.com.``)
_UNJUDGEABLE = re2.compile(r"[,;<>\\\s\p{Z}\p{Cc}\p{Cf}]|//|(?:^|/)\.\.?(?:/|$)|\.$", re2.Options())


def _re2_options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a pattern RE2 refuses is a config error, not a stderr line
    return options


@functools.lru_cache(maxsize=1024)
def body_pattern(source: str) -> Any:
    """``source`` compiled by RE2 (linear time, no backtracking), cached.
    Raises ValueError naming why RE2 refuses it (backreferences, lookaround, too large)."""
    try:
        return re2.compile(source, _re2_options())
    except re2.error as exc:
        why = exc.args[0].decode("utf-8", "replace") if exc.args else str(exc)
        raise ValueError(
            f"RE2 cannot take this regular expression ({why}); RE2 has no backreferences"
            " nor lookaround"
        ) from None


def unjudgeable(text: str) -> bool:
    """True when a glob cannot judge ``text`` (``_UNJUDGEABLE``): an approve's glob never
    matches it, a deny's always does (a policy fails closed, docs/design.md "Policy")."""
    try:
        return _UNJUDGEABLE.search(text) is not None
    except UnicodeEncodeError:  # a lone surrogate (a JSON \ud800 escape)
        return True


@functools.lru_cache(maxsize=1024)
def glob_pattern(glob: str) -> Any:
    """``glob`` as an RE2 pattern matched against a whole casefolded value: ``*`` any run of
    characters of one segment (``_SEGMENT``: never ``/ @ , ; < > \\``, whitespace, control or
    format characters), ``?`` one such character, everything else itself (casefolded).
    Raises ValueError for a glob that could never match (``unjudgeable``)."""
    if unjudgeable(glob):
        raise ValueError(
            "this glob can never match: values holding , ; < > \\, whitespace, control"
            " characters, an empty, . or .. path segment or a final dot are never judged"
        )
    out = []
    for char in glob.casefold():
        out.append(_SEGMENT + "*" if char == "*" else _SEGMENT if char == "?" else re.escape(char))
    return re2.compile("".join(out), _re2_options())


def argument_path(key: str) -> tuple[str, ...]:
    """The path of an ``arguments`` key into a JSON draft: a JSON pointer (RFC 6901, starts
    with ``/``: ``/items/0/sku``, ``~1`` for ``/``, ``~0`` for ``~``) or a dotted key
    (``customer.country``). A list index is ASCII digits without a leading zero (RFC 6901).
    Raises ValueError for an empty key, an empty dotted segment, or a segment of only
    numeric characters that is no such index (``²``, ``٣``, ``01``: ``looks_like_index``)."""
    if key.startswith("/"):
        parts = tuple(p.replace("~1", "/").replace("~0", "~") for p in key[1:].split("/"))
    else:
        parts = tuple(key.split("."))
        if not key or any(not p for p in parts):
            raise ValueError(f"{key!r} is neither a JSON pointer (/a/b) nor a dotted key (a.b)")
    for part in parts:
        if looks_like_index(part):
            raise ValueError(
                f"{key!r}: segment {part!r} looks like a list index but is none: a list index"
                " is ASCII digits 0-9 without a leading zero (0, 1, 12)"
            )
    return parts


class ArgumentConstraint(BaseModel):
    """What one argument of a JSON draft must be for the rule to match (all given must hold):
    ``equals`` (JSON equality, true is not 1), ``one_of`` (a list of such values, not empty),
    ``glob`` (a string, ``glob_pattern``), ``min`` / ``max`` (a number, bounds inclusive,
    ``min`` <= ``max``). At least one is required."""

    model_config = _FROZEN

    equals: Any = None
    one_of: tuple[Any, ...] | None = None
    glob: Annotated[str, Field(strict=True)] | None = None
    min: _Number | None = None
    max: _Number | None = None

    @model_validator(mode="after")
    def _some(self) -> ArgumentConstraint:
        if not self.model_fields_set:
            raise ValueError("give at least one of equals, one_of, glob, min, max")
        if self.one_of is not None and not self.one_of:
            raise ValueError("one_of: [] can never match: give at least one value")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min:g} > max {self.max:g} can never match")
        if self.glob is not None:
            glob_pattern(self.glob)
        return self


class PolicyWhen(BaseModel):
    """The conditions of a rule; all given must hold (none given: the rule always matches).
    ``max_spend`` (the request's ``spend`` <= it, in ``budget.unit``; a request without
    ``spend`` does not match), ``max_draft_bytes`` (UTF-8 size of the draft), ``content_type``
    (one or a list: the media type, parameters ignored, case-insensitive), ``body_matches``
    (an RE2 regular expression searched in the body, compiled at load: ``body_pattern``) and
    ``arguments`` (a JSON draft's values, ``argument_path``)."""

    model_config = _FROZEN

    max_spend: _Number | None = Field(default=None, ge=0)
    max_draft_bytes: Annotated[int, Field(strict=True, ge=0)] | None = None
    content_type: Annotated[tuple[str, ...], BeforeValidator(_one_or_list)] | None = None
    body_matches: Annotated[str, Field(strict=True)] | None = None
    arguments: dict[str, ArgumentConstraint] | None = None

    @field_validator("body_matches")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            body_pattern(value)
        return value

    @field_validator("content_type")
    @classmethod
    def _media(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is not None and not value:
            raise ValueError("content_type: [] can never match: give at least one")
        return value

    @field_validator("arguments")
    @classmethod
    def _paths(cls, value: dict[str, ArgumentConstraint] | None) -> Any:
        for key in value or {}:
            argument_path(key)
        return value


class PolicyRule(BaseModel):
    """One rule of a step's ``policy`` list: ``id`` ([a-z0-9_-]+, unique in the step; the
    decider is ``policy:<id>``), ``decide`` approve|deny, ``when`` its conditions,
    ``allow_quorum`` (an approve rule on a step with quorum > 1 must say so) and ``reason``
    (a deny's reason, what should change: the pipeline gets it as a skip's reason)."""

    model_config = _FROZEN

    id: Annotated[str, Field(strict=True, min_length=1, max_length=MAX_RULE_ID_CHARS)]
    decide: Literal["approve", "deny"]
    when: PolicyWhen = Field(default_factory=PolicyWhen)
    allow_quorum: Annotated[bool, Field(strict=True)] = False
    reason: _Reason | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not _RULE_ID.fullmatch(value):
            raise ValueError("must match [a-z0-9_-]+")
        if value == REMEMBERED:
            raise ValueError(f"{REMEMBERED!r} is reserved (remember_approval decides by it)")
        return value


def check_step_policy(where: str, step: StepConfig) -> list[str]:
    """Errors of one step's ``policy`` and ``remember_approval`` (``where`` its YAML path,
    ``pipelines[i].steps[j]``), hard limits: rule ids unique in the step; a step
    of ``risk: high``/``critical`` or ``approver_signature: required`` (a policy cannot sign,
    review H3) may have deny rules only and no ``remember_approval``; on
    a step with quorum > 1 an approve rule needs ``allow_quorum: true`` and
    ``remember_approval`` is refused; ``reason`` only on a deny rule, and required on one
    where the step has ``skip_reason: required``."""
    errors: list[str] = []
    seen: dict[str, int] = {}
    for k, rule in enumerate(step.policy):
        at = f"{where}.policy[{k}]"
        errors += duplicate(seen, rule.id, k, f"{at}.id", f"rule id {rule.id!r}", f"{where}.policy")
        if rule.decide == "approve" and step.risk in HIGH_RISKS:
            errors.append(
                f"{at}.decide: a step with risk: {step.risk} may have deny rules only"
                " (nothing approves it but a person)"
            )
        elif rule.decide == "approve" and step.approver_signature == "required":
            errors.append(
                f"{at}.decide: the step has approver_signature: required and a policy cannot"
                " sign: deny rules only there"
            )
        elif rule.decide == "approve" and step.quorum > 1 and not rule.allow_quorum:
            errors.append(
                f"{at}.decide: the step needs quorum {step.quorum}; an approve rule would"
                " stand in for every person: say allow_quorum: true to mean it"
            )
        if rule.allow_quorum and rule.decide != "approve":
            errors.append(f"{at}.allow_quorum: only for decide: approve")
        if rule.reason is not None and rule.decide != "deny":
            errors.append(f"{at}.reason: only for decide: deny (the skip's reason)")
        elif rule.decide == "deny" and rule.reason is None and step.skip_reason == "required":
            errors.append(
                f"{at}.reason: the step has skip_reason: required, so a deny rule gives its"
                " reason too (what the pipeline should change)"
            )
    if step.remember_approval is not None:
        if step.risk in HIGH_RISKS:
            errors.append(
                f"{where}.remember_approval: refused on a step with risk: {step.risk}"
                " (every draft there is approved by a person)"
            )
        elif step.approver_signature == "required":
            errors.append(
                f"{where}.remember_approval: refused on a step with approver_signature:"
                " required (a policy cannot sign)"
            )
        elif step.quorum > 1:
            errors.append(
                f"{where}.remember_approval: refused on a step with quorum {step.quorum}"
                " (a remembered approval would stand in for every person)"
            )
    return errors


def policy_notes(config: Config) -> list[str]:
    """One line per approve rule that stands in for a quorum > 1 (``allow_quorum: true``),
    its YAML path first: ``check-config`` and ``doctor`` show them."""
    return [
        f"pipelines[{i}].steps[{j}].policy[{k}]: rule {rule.id!r} approves on its own a step"
        f" that needs quorum {step.quorum} (allow_quorum: true)"
        for i, pipeline in enumerate(config.pipelines)
        for j, step in enumerate(pipeline.steps)
        for k, rule in enumerate(step.policy)
        if rule.decide == "approve" and rule.allow_quorum and step.quorum > 1
    ]
