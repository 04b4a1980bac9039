"""``hitl-gate doctor``'s passkeys checks: the line saying the relying party passkeys are
made for (RP ID, origins) and how many passkeys are enrolled, a warning when no relying party
can be resolved while a step asks for approvers' signatures, and warnings about who else may
have to decide a signing step (``approver_signature: required``): the operators its
escalation levels add and the delegates in force of whoever may decide it, when they hold no
approver credential (they could never decide it: the gate wants their own passkey's
signature)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gate.config import Config
from gate.config.model import Operator, StepConfig
from gate.config.webauthn import resolve_webauthn, unavailable_reason
from gate.errors import GateError
from gate.store.invites import count_passkeys, credential_facts
from gate.tools.doctor_check import Check, warn

if TYPE_CHECKING:
    from gate.store.readonly import Database


def check_passkeys(config: Config, path: Database, now_ms: int) -> list[Check]:
    """The passkeys line (``passkeys_summary``), then a WARN per finding: the passkeys'
    (``passkeys_findings``), then who else may have to sign (``signers_findings``, at
    ``now_ms``, unix ms)."""
    level, detail = passkeys_summary(config, path)
    line = Check("passkeys", level != "FAIL", detail, "" if level == "FAIL" else level)
    found: list[str] = []
    if _exists(path):  # nothing without a readable database (the passkeys line reports it)
        try:
            by_rp, holders = credential_facts(path)
        except GateError:
            pass
        else:
            found = [
                *passkeys_findings(config, by_rp, holders),
                *signers_findings(config, holders, now_ms),
            ]
    return [line, *(warn("passkeys", finding) for finding in found)]


def _exists(path: Database) -> bool:
    """Whether there is a database to read: a SQLite file that exists, or any PostgreSQL
    one (``PgTarget``: a read error says what is wrong)."""
    return not isinstance(path, Path) or path.exists()


def _signing_steps(config: Config, *levels: str) -> Iterator[tuple[str, str, StepConfig]]:
    """``(pipeline/step, YAML path, step)`` of every step whose ``approver_signature`` is
    one of ``levels`` (optional, required)."""
    for i, pipe in enumerate(config.pipelines):
        for j, step in enumerate(pipe.steps):
            if step.approver_signature in levels:
                yield f"{pipe.name}/{step.name}", f"pipelines[{i}].steps[{j}]", step


def operators_named(operators: Sequence[Operator], limit: int = 10) -> str:
    """``101 (alice@…), 102 (bob@…) and 3 more``: the first ``limit`` by id and identity."""
    names = ", ".join(f"{op.id} ({op.identity})" for op in operators[:limit])
    return names + (f" and {len(operators) - limit} more" if len(operators) > limit else "")


def passkeys_summary(config: Config, path: Database) -> tuple[str, str]:
    """``(level, detail)`` of the passkeys line: level "" (PASS), "WARN" or "FAIL".

    Without ``relay.public_url`` the configured ``relay.callback_addr`` stands for the bound
    address (a port 0 listener is resolved at start: reported as such)."""
    settings = resolve_webauthn(config, config.relay.callback_addr)
    count = 0
    if _exists(path):
        try:
            count = count_passkeys(path)
        except GateError as exc:
            return "FAIL", exc.message
    enrolled = f"{count} passkey{'' if count == 1 else 's'} enrolled"
    if settings is None:
        steps = [name for name, _, _ in _signing_steps(config, "optional", "required")]
        if steps:
            return "WARN", (
                f"passkeys unavailable ({unavailable_reason(config)}); steps asking for "
                f"signatures: {', '.join(steps[:5])}; {enrolled}"
            )
        public = config.relay.public_url
        if public is not None and public.startswith("http://"):  # meant for passkeys? say why
            return "WARN", f"passkeys unavailable ({unavailable_reason(config)}); {enrolled}"
        return "", f"passkeys unavailable (no relay.public_url on a domain); {enrolled}"
    origins = ", ".join(settings.origins)
    if origins.endswith(":0"):
        origins += " (the bound port at start)"
    return "", f"rp_id {settings.rp_id}, origins {origins}; {enrolled}"


def passkeys_findings(config: Config, by_rp: dict[str, int], holders: set[int]) -> list[str]:
    """doctor's passkey warnings, one line each: passkeys in force enrolled for
    an RP ID other than the one in force (they cannot sign; ``by_rp``: passkeys in force by
    RP ID), and, per step with ``approver_signature: required``, the operators in its scope
    holding no credential in force (not in ``holders``: they cannot approve it)."""
    settings = resolve_webauthn(config, config.relay.callback_addr)
    out = [
        f"{n} passkeys were enrolled for rp_id {rp_id} and cannot sign for {settings.rp_id}"
        for rp_id, n in sorted(by_rp.items())
        if settings is not None and rp_id != settings.rp_id
    ]
    for _, where, step in _signing_steps(config, "required"):
        missing = [op for op in config.scope(step) if op.id not in holders]
        if missing:
            out.append(
                f"{where}: operators {operators_named(missing)} have no"
                " approver credential: they cannot approve"
            )
    return out


REQUIRED = "(approver_signature: required)"


def signers_findings(config: Config, holders: set[int], now_ms: int) -> list[str]:
    """One line per escalation level of a signing step adding operators without a
    credential in force (not in ``holders``), then one per delegation in force at ``now_ms``
    (unix ms) whose delegate has none while its principal may decide a signing step (in
    scope or escalated to)."""
    by_id = {op.id: op for op in config.relay.operators}
    out: list[str] = []
    deciders: list[tuple[str, set[int]]] = []  # (a signing step's YAML path, who may decide)
    for _, where, step in _signing_steps(config, "required"):
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
