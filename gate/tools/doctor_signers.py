"""``hitl-gate doctor``'s warnings about who else may have to decide a signing step
(``approver_signature: required``): the operators its escalation levels add and the delegates
in force of whoever may decide it, when they hold no approver credential (they could never
decide it: the gate wants their own passkey's signature)."""

from __future__ import annotations

from pathlib import Path

from gate.config import Config
from gate.config.model import Operator
from gate.errors import GateError
from gate.store.invites import credential_facts
from gate.tools.doctor_passkeys import operators_named

REQUIRED = "(approver_signature: required)"


def signers_findings(config: Config, path: Path, now_ms: int) -> list[str]:
    """One line per escalation level of a signing step adding operators without a
    credential in force, then one per delegation in force at ``now_ms`` (unix ms) whose
    delegate has none while its principal may decide a signing step (in scope or escalated
    to). Nothing without a readable database (the passkeys line reports it)."""
    if not path.exists():
        return []
    try:
        _, holders = credential_facts(path)
    except GateError:
        return []
    by_id = {op.id: op for op in config.relay.operators}
    out: list[str] = []
    deciders: list[tuple[str, set[int]]] = []  # (a signing step's YAML path, who may decide)
    for i, pipe in enumerate(config.pipelines):
        for j, step in enumerate(pipe.steps):
            if getattr(step, "approver_signature", "off") != "required":
                continue
            where = f"pipelines[{i}].steps[{j}]"
            widened = {op.id for op in config.scope(step)}
            for k, level in enumerate(step.escalate):
                added = [by_id[o] for o in level.to if o not in widened and o in by_id]
                widened |= {op.id for op in added}
                missing = [op for op in added if op.id not in holders]
                if missing:
                    out.append(
                        f"{where}.escalate[{k}].to: {_who(missing)} no approver credential:"
                        f" escalated to, they could never decide this step {REQUIRED}"
                    )
            deciders.append((where, widened))
    for n, delegation in enumerate(config.delegations):
        delegate, principal = by_id.get(delegation.to), by_id.get(delegation.from_)
        if delegation.until_ms <= now_ms or delegate is None or principal is None:
            continue
        steps = [where for where, ids in deciders if principal.id in ids]
        if steps and delegate.id not in holders:
            more = f" and {len(steps) - 5} more" if len(steps) > 5 else ""
            out.append(
                f"delegations[{n}].to: {_who([delegate])} no approver credential: as delegate"
                f" of {operators_named([principal])} they could never decide"
                f" {', '.join(steps[:5])}{more} {REQUIRED}"
            )
    return out


def _who(operators: list[Operator]) -> str:
    """``operator 103 (carol@…) has`` or ``operators 102 (…), 103 (…) have``."""
    if len(operators) == 1:
        return f"operator {operators_named(operators)} has"
    return f"operators {operators_named(operators)} have"
