"""When nobody answers: reminders, escalation levels and delegations in the config.

The models (``EscalationLevel``, ``Delegation``) and the checks across fields that need the
whole config (operator ids, scopes, the step's timeout, delegation cycles). Every error is a
``"<yaml.path>: <message>"`` line like the rest of ``gate.config``.
"""

from __future__ import annotations

import graphlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gate.config.values import Duration, _non_empty, check_ids

if TYPE_CHECKING:
    from gate.config.model import Config, StepConfig

# the shortest reminder interval accepted (s): anything shorter floods the relay
MIN_REMIND_EVERY_S = 1.0
MAX_REASON_CHARS = 500

_FROZEN = ConfigDict(extra="forbid", frozen=True)
_Ids = Annotated[tuple[Annotated[int, Field(strict=True)], ...], AfterValidator(_non_empty)]
_Reason = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_REASON_CHARS)]


def format_duration(seconds: float) -> str:
    """``seconds`` the way the config writes durations: ``4h``, ``1h30m``, ``90s``, ``500ms``."""
    ms = round(seconds * 1000)
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            parts.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(parts) or "0s"


def _utc_instant(value: Any) -> datetime:
    """An RFC 3339 UTC instant (``2026-12-24T18:00:00Z``) as an aware datetime; YAML's own
    timestamps (unquoted) are taken when they carry a zero offset. Raises ValueError."""
    if isinstance(value, datetime):
        instant = value
    elif isinstance(value, str):
        text = value.strip()
        if not text.endswith(("Z", "z", "+00:00")):
            raise ValueError(f"expected an RFC 3339 UTC time ending in Z, got {value!r}")
        try:
            instant = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1] in "Zz" else text)
        except ValueError:
            raise ValueError(f"expected an RFC 3339 UTC time, got {value!r}") from None
    else:
        raise ValueError(f"expected an RFC 3339 UTC time, got {type(value).__name__}")
    offset = instant.utcoffset()
    if offset is None or offset.total_seconds() != 0:
        raise ValueError(f"expected an RFC 3339 UTC time ending in Z, got {value!s}")
    return instant.astimezone(UTC)


class EscalationLevel(BaseModel):
    """One level of a step's ``escalate`` list: ``after`` seconds from creation, the operator
    ids in ``to`` join the approver scope (it widens, never narrows; the quorum stays)."""

    model_config = _FROZEN

    after: Duration
    to: _Ids


class Delegation(BaseModel):
    """``delegations[]``: until ``until`` (UTC), operator ``to`` may decide wherever operator
    ``from`` is in scope, recorded as on behalf of ``from``. Not transitive."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: Annotated[int, Field(strict=True, alias="from")]
    to: Annotated[int, Field(strict=True)]
    until: Annotated[datetime, BeforeValidator(_utc_instant)]
    reason: _Reason | None = None

    @property
    def until_ms(self) -> int:
        """``until`` as unix milliseconds (UTC)."""
        return int(self.until.timestamp() * 1000)


def check_step_followups(
    where: str, step: StepConfig, scope: set[int], config: Config
) -> list[str]:
    """Errors of a step's ``remind_after``/``remind_every``/``escalate`` (``where`` is the
    step's YAML path, ``scope`` its operator ids in scope before any escalation)."""
    errors: list[str] = []
    if step.remind_every is not None and step.remind_every < MIN_REMIND_EVERY_S:
        errors.append(
            f"{where}.remind_every: must be at least {format_duration(MIN_REMIND_EVERY_S)}"
        )
    first = step.first_reminder_s
    if first is not None and first >= step.timeout:
        key = "remind_after" if step.remind_after is not None else "remind_every"
        errors.append(
            f"{where}.{key}: {format_duration(first)} is not before the step's timeout"
            f" ({format_duration(step.timeout)}): no reminder would ever be sent"
        )
    defined = {op.id for op in config.relay.operators}
    allowed = set(config.relay.security.allowed_users)
    widened = set(scope)
    previous = 0.0
    for i, level in enumerate(step.escalate):
        at = f"{where}.escalate[{i}]"
        if level.after <= previous:
            errors.append(f"{at}.after: must be later than the level before it")
        elif level.after >= step.timeout:
            errors.append(
                f"{at}.after: {format_duration(level.after)} is not before the step's timeout"
                f" ({format_duration(step.timeout)}): this level would never be reached"
            )
        previous = max(previous, level.after)
        listed = check_ids(f"{at}.to", level.to, defined, allowed)
        errors += listed
        if not listed and set(level.to) <= widened:  # each one fine, and each in scope already
            errors.append(f"{at}.to: adds nobody (every operator is already in scope)")
        widened |= set(level.to) & allowed & defined
    return errors


def check_delegations(delegations: Sequence[Delegation], config: Config) -> list[str]:
    """Errors of the ``delegations`` list: unknown ids, a delegate outside allowed_users, a
    delegation to oneself or listed twice, and cycles (A to B and B to A, or longer). An
    ended delegation is not among them: see ``ended_delegations``."""
    errors: list[str] = []
    defined = {op.id for op in config.relay.operators}
    allowed = set(config.relay.security.allowed_users)
    seen: dict[tuple[int, int], int] = {}
    edges: dict[int, set[int]] = {}
    for i, item in enumerate(delegations):
        at = f"delegations[{i}]"
        bad = False
        for key, op_id in (("from", item.from_), ("to", item.to)):
            if op_id not in defined:
                errors.append(f"{at}.{key}: operator {op_id} is not defined in relay.operators")
                bad = True
        if not bad and item.to not in allowed:
            errors.append(
                f"{at}.to: operator {item.to} is not in relay.security.allowed_users"
                " (a delegate decides only if allowed to decide at all)"
            )
        if item.from_ == item.to:
            errors.append(f"{at}.to: operator {item.to} cannot delegate to themselves")
            bad = True
        pair = (item.from_, item.to)
        if pair in seen:
            errors.append(f"{at}: the same delegation as delegations[{seen[pair]}]")
        else:
            seen[pair] = i
        if not bad:
            edges.setdefault(item.from_, set()).add(item.to)
    cycle = _find_cycle(edges)
    if cycle is not None:
        path = " -> ".join(str(op_id) for op_id in cycle)
        errors.append(f"delegations: cycle {path} (each would decide on behalf of the other)")
    return errors


def _find_cycle(edges: dict[int, set[int]]) -> list[int] | None:
    """One cycle of the directed graph ``edges`` as [a, b, ..., a], or None: the first one
    ``graphlib`` meets walking nodes and edges in sorted order."""
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for node in sorted({*edges, *(target for targets in edges.values() for target in targets)}):
        sorter.add(node)
    for node in sorted(edges):
        for target in sorted(edges[node]):
            sorter.add(target, node)  # ``node`` comes before ``target``: the edge's direction
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def ended_delegations(delegations: Sequence[Delegation], now_ms: int) -> list[str]:
    """``delegations[i].until: ... is in the past`` for each delegation whose ``until`` is not
    after ``now_ms`` (unix ms). ``check-config`` reports them as errors (exit 2: the file
    says something no longer true); ``serve``, a SIGHUP reload and ``doctor`` as warnings,
    and the gate ignores them: a file that was valid must not stop a restart because time
    passed (docs/design.md)."""
    out: list[str] = []
    for i, item in enumerate(delegations):
        if item.until_ms <= now_ms:
            when = item.until.strftime("%Y-%m-%dT%H:%M:%SZ")
            out.append(f"delegations[{i}].until: {when} is in the past (the delegation has ended)")
    return out
