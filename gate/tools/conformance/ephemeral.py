"""The ephemeral gate ``hitl-gate verify`` runs (SPEC §6): its config and the constants the
run uses (who is out of scope, how long to wait for an ack, the skew allowed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gate.config import Config, config_from_mapping

PIPELINE = "hitl-conformance"
OUTSIDER = "hitl-conformance-outsider@invalid"
MAX_SKEW_S = 300.0
ACK_TIMEOUT_S = 10.0
GRACE_S = 3.0
QUESTION_STEP = "question"


def ephemeral_config(
    directory: Path,
    relay_url: str,
    listen: str,
    public_url: str | None,
    approver: str,
    questions: bool = False,
    signatures: bool = False,
) -> Config:
    """The ephemeral gate's config, validated as a config file would be (its database in
    ``directory``): one pipeline, one step the ``approver`` (operator 1) alone may decide,
    and an outsider (operator 2) allowed on the relay but out of the step's scope. With
    ``questions``, question support: ``relay.questions: true`` (questions go to RELAY_URL)
    and a question step ``question`` that operator 1 (``--approver``) alone may answer. With
    ``signatures``, the step is ``approver_signature: required``."""
    # both steps: the approver (operator 1) alone may decide, within the hour, at low risk
    alone = {"approvers": [1], "timeout": "1h", "risk": "low"}
    steps: list[dict[str, Any]] = [{"name": "verify", "quorum": 1, **alone}]
    if signatures:
        steps[0]["approver_signature"] = "required"
    config: dict[str, Any] = {
        "relay": {
            "url": relay_url,
            "secret_env": "HITL_VERIFY_SECRET",
            "callback_addr": listen,
            "public_url": public_url,
            "dispatch_timeout": f"{ACK_TIMEOUT_S:g}s",
            "operators": [{"id": 1, "identity": approver}, {"id": 2, "identity": OUTSIDER}],
            "security": {
                "allowed_users": [1, 2],
                "max_input_length": 2000,
                "rate_limit": 1000,
                "max_skew": f"{MAX_SKEW_S:g}s",
            },
        },
        "api": {"listen": "127.0.0.1:0", "token_env": "HITL_VERIFY_TOKEN"},
        "storage": {"path": "verify.db"},
        "receipts": {"key_env": "HITL_VERIFY_RECEIPTS"},
        # a budget puts floats (20.0, 0.0) in the dispatch: a relay that verifies re-encoded
        # JSON (20.0 -> 20) instead of the raw bytes fails here, as it would in production
        "budget": {"unit": "EUR", "cap_today": 20.0},
        "pipelines": [{"name": PIPELINE, "budget_cap": 2.0, "steps": steps}],
    }
    if questions:
        config["relay"]["questions"] = True
        steps.append({"name": QUESTION_STEP, "type": "question", **alone})
    return config_from_mapping(config, directory)
