"""``hitl-gate doctor``'s passkeys line: the relying party passkeys are made
for (RP ID, origins) and how many passkeys are enrolled; a warning when no relying party
can be resolved while a step asks for approvers' signatures."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gate.config import Config
from gate.config.model import Operator
from gate.config.webauthn import resolve_webauthn, unavailable_reason
from gate.errors import GateError
from gate.store.invites import count_passkeys, credential_facts


def signing_steps(config: Config) -> list[str]:
    """``pipeline/step`` of every step whose ``approver_signature`` is not ``off``."""
    return [
        f"{pipe.name}/{step.name}"
        for pipe in config.pipelines
        for step in pipe.steps
        if getattr(step, "approver_signature", "off") != "off"
    ]


def operators_named(operators: Sequence[Operator], limit: int = 10) -> str:
    """``101 (alice@…), 102 (bob@…) and 3 more``: the first ``limit`` by id and identity."""
    names = ", ".join(f"{op.id} ({op.identity})" for op in operators[:limit])
    return names + (f" and {len(operators) - limit} more" if len(operators) > limit else "")


def passkeys_summary(config: Config, path: Path) -> tuple[str, str]:
    """``(level, detail)`` of the passkeys line: level "" (PASS), "WARN" or "FAIL".

    Without ``relay.public_url`` the configured ``relay.callback_addr`` stands for the bound
    address (a port 0 listener is resolved at start: reported as such)."""
    settings = resolve_webauthn(config, config.relay.callback_addr)
    count = 0
    if path.exists():
        try:
            count = count_passkeys(path)
        except GateError as exc:
            return "FAIL", exc.message
    enrolled = f"{count} passkey{'' if count == 1 else 's'} enrolled"
    if settings is None:
        steps = signing_steps(config)
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


def passkeys_findings(config: Config, path: Path) -> list[str]:
    """doctor's passkey warnings, one line each: passkeys in force enrolled for
    an RP ID other than the one in force (they cannot sign), and, per step with
    ``approver_signature: required``, the operators in its scope holding no credential in
    force (they cannot approve it). Nothing without a database."""
    if not path.exists():
        return []
    try:
        by_rp, holders = credential_facts(path)
    except GateError:
        return []  # the passkeys line reports it
    settings = resolve_webauthn(config, config.relay.callback_addr)
    out: list[str] = []
    if settings is not None:
        for rp_id, n in sorted(by_rp.items()):
            if rp_id != settings.rp_id:
                out.append(
                    f"{n} passkeys were enrolled for rp_id {rp_id} and cannot sign for "
                    f"{settings.rp_id}"
                )
    for i, pipe in enumerate(config.pipelines):
        for j, step in enumerate(pipe.steps):
            if getattr(step, "approver_signature", "off") != "required":
                continue
            missing = [op for op in config.scope(step) if op.id not in holders]
            if missing:
                out.append(
                    f"pipelines[{i}].steps[{j}]: operators {operators_named(missing)} have no"
                    " approver credential: they cannot approve"
                )
    return out
