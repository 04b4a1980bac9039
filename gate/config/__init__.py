"""YAML config (SPEC §5) -> frozen, typed models; every error is reported with its YAML path."""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gate.config.messages import (
    _path,
    _prune,
    _under,
    _unknown_key,
    pydantic_error,
)
from gate.config.model import BudgetConfig, Config, PipelineConfig, ReceiptsConfig, StepConfig
from gate.config.secrets import (
    Secrets,
    _read_secrets,
    load_secrets,
    read_api_token,
    read_receipt_key,
    read_storage_password,
)
from gate.config.validate import _cross_check
from gate.config.values import TcpListen, UnixListen, parse_duration, parse_listen
from gate.config.yamlfile import read_mapping
from gate.errors import ConfigError

# Neutral stand-ins for required values whose own error is already listed: with them the
# cross-field and secret checks still run, so one run lists every error (SPEC §5).
_STAND_INS = {
    ("relay", "url"): "http://invalid.invalid/",
    # a bad question_url is its own error, not also "a question step needs a relay"
    ("relay", "question_url"): "http://invalid.invalid/",
    ("relay", "callback_addr"): "127.0.0.1:0",
    ("storage", "path"): "invalid.db",
    ("storage", "url"): "postgresql://invalid.invalid/invalid",
}

__all__ = [
    "BudgetConfig",
    "Config",
    "PipelineConfig",
    "ReceiptsConfig",
    "Secrets",
    "config_from_mapping",
    "load",
    "load_config",
    "load_secrets",
    "raw_mapping",
    "read_api_token",
    "read_storage_password",
    "read_receipt_key",
    "parse_duration",
    "parse_listen",
    "TcpListen",
    "UnixListen",
]


def raw_mapping(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The config file's YAML as plain data (before any validation), or None when it cannot
    be read or is not a mapping. For comparing two versions of a file (SIGHUP reload)."""
    return read_mapping(Path(path), "")[0]


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read, parse and validate the YAML config file at ``path`` (SPEC §5, CLI check-config).

    Relative paths inside resolve against the file's directory; steps without ``approvers``
    get ``relay.security.allowed_users``. Raises ``ConfigError`` whose ``errors`` lists every
    problem as ``"<yaml.path>: <message>"`` (file and YAML syntax errors included).
    """
    config, errors = _load(path)
    if errors or config is None:
        raise ConfigError(errors)
    return config


def load(path: str | os.PathLike[str], environ: Mapping[str, str]) -> tuple[Config, Secrets]:
    """Load the config (``load_config``) and its secrets (``load_secrets``) from ``environ``.

    Raises one ``ConfigError`` listing config and secret errors together; only the config
    errors when the config is too broken to know which variables to read (SPEC §5).
    """
    config, errors = _load(path)
    if config is None:
        raise ConfigError(errors)
    secrets, secret_errors = _read_secrets(config, environ)
    errors += secret_errors
    if errors or secrets is None:
        raise ConfigError(errors)
    return config, secrets


def _load(path: str | os.PathLike[str]) -> tuple[Config | None, list[str]]:
    """Return (config, errors). errors lists everything found; config is None when the file,
    YAML or schema is too broken for the cross-field and secret checks to run on it."""
    source = Path(os.path.abspath(os.fspath(path)))
    if source.is_dir():
        return None, [f"config file is a directory: {source}"]
    data, errors = read_mapping(source, "sections relay, api, storage, receipts and pipelines")
    if data is None:
        return None, errors
    return _validate(data, source.parent, source)


def config_from_mapping(data: Mapping[str, Any], base_dir: Path) -> Config:
    """Validate ``data`` (a config file's content as plain data) exactly as ``load_config``
    validates a file, without a file: relative paths resolve against ``base_dir``, and the
    config's ``source`` is None (nothing to reload). Raises ``ConfigError`` listing every
    problem as ``"<yaml.path>: <message>"``."""
    config, errors = _validate(dict(data), base_dir, None)
    if errors or config is None:
        raise ConfigError(errors)
    return config


def _validate(
    data: dict[str, Any], base_dir: Path, source: Path | None
) -> tuple[Config | None, list[str]]:
    """Return (config, errors) for a parsed mapping; see ``_load``."""
    errors: list[str] = []
    if "source" in data:
        data = {k: v for k, v in data.items() if k != "source"}
        errors.append(_unknown_key(("source",), Config))
    context = {"base_dir": base_dir}
    try:
        config = Config.model_validate(data, context=context)
    except ValidationError as exc:
        details = exc.errors(include_url=False)
        errors += [pydantic_error(e, Config) for e in details]
        # Still run the cross-field checks when dropping the bad keys (falling back to their
        # defaults) gives a valid config, so one run reports every error (SPEC §5).
        pruned_data = copy.deepcopy(data)
        pruned = [_prune(pruned_data, e) for e in details]
        if None in pruned:
            return None, errors
        for loc, value in _STAND_INS.items():
            if _path(loc) in pruned:
                pruned_data[loc[0]][loc[1]] = value
        try:
            config = Config.model_validate(pruned_data, context=context)
        except ValidationError:
            return None, errors
        errors += [e for e in _cross_check(config) if not _under(e, pruned)]
    else:
        errors += _cross_check(config)
    return _with_defaults(config, source), errors


def _with_defaults(config: Config, source: Path | None) -> Config:
    """Fill in step approvers (default: allowed_users) and record the source file."""
    allowed = config.relay.security.allowed_users
    pipelines = tuple(
        pipe.model_copy(update={"steps": tuple(_filled(step, allowed) for step in pipe.steps)})
        for pipe in config.pipelines
    )
    return config.model_copy(update={"pipelines": pipelines, "source": source})


def _filled(step: StepConfig, allowed: tuple[int, ...]) -> StepConfig:
    """``step`` with ``allowed`` as its approvers when the file left them out."""
    if "approvers" in step.model_fields_set:
        return step
    return step.model_copy(update={"approvers": allowed})
