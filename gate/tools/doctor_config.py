"""Doctor checks of the config file, its secret variables and its Ed25519 key files; the line
of what it plans for follow-ups (reminders, escalation levels, delegations, notices); whether
it asks questions, and where they go."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gate.config import Config, load_config, load_secrets
from gate.config.followups import ended_delegations
from gate.config.policy import policy_notes
from gate.config.secrets import _secret_vars
from gate.errors import ConfigError
from gate.tools.doctor_check import Check, counted, shown_errors, warn
from gate.trust.keys import ReceiptKeys, load_receipt_keys


def check_config(path: str) -> tuple[Check, Config | None]:
    """Load and validate the config file (as ``check-config``, without its secrets)."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        hint = f" (hitl-gate check-config -c {path} lists all)"
        return Check("config", False, shown_errors(exc.errors, hint)), None
    steps = sum(len(p.steps) for p in config.pipelines)
    detail = (
        f"{config.source}: {len(config.pipelines)} pipelines, "
        f"{steps} steps, {len(config.relay.operators)} operators"
    )
    notes = policy_notes(config)  # approve rules standing in for a quorum
    if notes:
        detail += "; " + "; ".join(notes)
    ended = ended_delegations(config.delegations, int(time.time() * 1000))
    if ended:  # ignored by the gate; check-config refuses the file until they are removed
        return warn("config", f"{detail}; but {'; '.join(ended)}"), config
    return Check("config", True, detail), config


def check_secrets(config: Config, environ: Mapping[str, str]) -> Check:
    """Every secret the config names is set, clean, at least 16 bytes and distinct
    (``load_secrets``); WARN when one is shorter than 32 bytes or others may read the
    credentials directory."""
    try:
        secrets = load_secrets(config, environ)
    except ConfigError as exc:
        return Check("secrets", False, shown_errors(exc.errors))
    detail = ", ".join(name for _, name in _secret_vars(config)) + " set and distinct"
    exposed = _exposed_credentials(environ.get("CREDENTIALS_DIRECTORY"))
    concerns = [*secrets.warnings, *([exposed] if exposed else [])]
    if concerns:
        return warn("secrets", f"{detail}; but {'; '.join(concerns)}")
    return Check("secrets", True, detail)


def _exposed_credentials(directory: str | None) -> str:
    """What in a credentials directory others may read (docs/operating.md: mode 0700 and
    0600 or stricter, as systemd's ``LoadCredential=`` makes them), or ""."""
    if not directory or not os.path.isdir(directory):
        return ""
    loose = []
    for path in [Path(directory), *sorted(Path(directory).iterdir())]:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            continue
        if mode & 0o077:
            loose.append(f"{path} is mode {mode:04o}")
    if not loose:
        return ""
    return (
        ", ".join(loose[:3])
        + (" and more" if len(loose) > 3 else "")
        + (": readable by other users (chmod go-rwx)")
    )


def check_keys(config: Config) -> tuple[Check, ReceiptKeys | None]:
    """The Ed25519 signing key and trusted public keys load (``receipts.*``)."""
    try:
        keys = load_receipt_keys(config.receipts)
    except ConfigError as exc:
        return Check("keys", False, shown_errors(exc.errors)), None
    if keys.signer is None:
        detail = "no signing key (receipts.signing_key_file): HMAC receipts only"
    else:
        detail = f"signing key {keys.signer.key_id}"
    if config.receipts.trusted_public_keys:
        detail += f", {len(config.receipts.trusted_public_keys)} trusted public keys"
    return Check("keys", True, detail), keys


def followups_summary(config: Config, now_ms: int, safe_url: Callable[[str], str]) -> str:
    """One line of what the config plans: steps that remind, steps that escalate (and their
    levels), delegations in force at ``now_ms`` (unix ms; ended ones are the config check's
    warning), and where notices go (``safe_url`` redacts the URL)."""
    steps = [step for pipeline in config.pipelines for step in pipeline.steps]
    remind = sum(step.first_reminder_s is not None for step in steps)
    escalating = [step for step in steps if step.escalate]
    levels = sum(len(step.escalate) for step in escalating)
    in_force = sum(item.until_ms > now_ms for item in config.delegations)
    target = config.relay.notice_target
    parts = [
        counted(remind, "step reminds", "steps remind"),
        counted(len(escalating), "step escalates", "steps escalate")
        + (f" ({counted(levels, 'level', 'levels')})" if levels else ""),
        counted(in_force, "delegation in force", "delegations in force"),
        f"notices to {safe_url(target)}" if target is not None else "no notices",
    ]
    return ", ".join(parts)


def asks_questions(config: Config) -> bool:
    """The config has a question step or names a relay for questions: only then does the
    doctor check the question relay and the questions' dispatches (a deployment without
    questions gets the report it always got)."""
    return config.relay.question_target is not None or any(
        step.type == "question" for pipeline in config.pipelines for step in pipeline.steps
    )


def separate_question_url(config: Config) -> str | None:
    """``relay.question_url`` when it is set and not ``relay.url`` (else None: the relay
    check probed the one URL questions go to)."""
    url = config.relay.question_url
    return None if url is None or url == config.relay.url else str(url)
