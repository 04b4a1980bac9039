"""YAML config (SPEC §5) -> frozen, typed models; every error is reported with its YAML path."""

from __future__ import annotations

import copy
import hmac
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from gate.errors import ConfigError

__all__ = [
    "ApiConfig",
    "BudgetConfig",
    "Config",
    "Operator",
    "PipelineConfig",
    "ReceiptsConfig",
    "RelayConfig",
    "Secrets",
    "Security",
    "StepConfig",
    "StorageConfig",
    "load",
    "load_config",
    "load_secrets",
    "parse_duration",
    "parse_listen",
]

# --------------------------------------------------------------------------- durations, addresses

_DURATION_HINT = "(use e.g. 90s, 30m, 4h)"
_DURATION_FULL = re.compile(r"(?:[0-9]+(?:ms|h|m|s))+")
_DURATION_PART = re.compile(r"([0-9]+)(ms|h|m|s)")
_PLAIN_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PORT = re.compile(r"[0-9]{1,5}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_duration(text: str | int | float) -> float:
    """Return a duration in seconds (float, > 0) (SPEC §5 per-step ``timeout``).

    Accepts a string of one or more ``<int><unit>`` parts with unit ``h``, ``m``, ``s`` or
    ``ms`` (``4h``, ``1h30m``, ``500ms``), a plain number string (``"90"``), or an int/float,
    both meaning seconds. Raises ``ValueError`` (one line, e.g. ``invalid duration '4 hours'
    (use e.g. 90s, 30m, 4h)``) for anything else, for booleans, and for values <= 0, infinite
    or too large to represent.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"invalid duration {text!r} {_DURATION_HINT}")
    try:
        if isinstance(text, str):
            spec = text.strip()
            if _PLAIN_NUMBER.fullmatch(spec):
                seconds = float(spec)
            elif _DURATION_FULL.fullmatch(spec):
                seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(spec))
            else:
                raise ValueError(f"invalid duration {text!r} {_DURATION_HINT}")
        else:
            seconds = float(text)
    except OverflowError:
        raise ValueError(f"duration {text!r} is too large") from None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"duration must be a finite number, got {text!r}")
    if seconds <= 0:
        raise ValueError(f"duration must be > 0, got {text!r}")
    return seconds


def parse_listen(addr: str) -> tuple[str, str, int] | tuple[str, str]:
    """Split a listen address into ``("tcp", host, port)`` or ``("unix", path)`` (SPEC §3).

    ``host:port`` (port 0-65535, 0 = ephemeral; IPv6 hosts in brackets, ``[::1]:8090``,
    returned without brackets) or ``unix:/path.sock``. Raises ``ValueError`` with a one-line
    message for anything else.
    """
    if not isinstance(addr, str) or not addr.strip():
        raise ValueError("expected 'host:port' or 'unix:/path.sock'")
    if addr.startswith("unix:"):
        path = addr[len("unix:") :]
        if not path.strip():
            raise ValueError("unix socket path is empty (use e.g. unix:/run/hitl-gate.sock)")
        return ("unix", path)
    host, sep, port_text = addr.rpartition(":")
    if not sep or not host:
        raise ValueError(f"invalid address {addr!r} (use host:port, e.g. 127.0.0.1:8090)")
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            raise ValueError(f"invalid address {addr!r} (IPv6 form is [::1]:8090)")
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid address {addr!r} (put IPv6 hosts in brackets: [::1]:8090)")
    if any(ch.isspace() for ch in host):
        raise ValueError(f"invalid address {addr!r} (host contains whitespace)")
    if not _PORT.fullmatch(port_text) or int(port_text) > 65535:
        raise ValueError(f"invalid port in {addr!r} (use 0-65535)")
    return ("tcp", host, int(port_text))


# --------------------------------------------------------------------------- field validators


def _check_env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not an environment variable name (letters, digits and _)"
        )
    return value


def _check_name(value: str) -> str:
    if value != value.strip():
        raise ValueError("has leading or trailing whitespace")
    return value


def _check_http_url(value: str) -> str:
    # Never echo the URL: relay URLs (e.g. Power Automate) may carry a signature in the query.
    if any(ch.isspace() for ch in value):
        raise ValueError("URL must not contain whitespace")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError("not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    return value


def _check_listen(value: str) -> str:
    parse_listen(value)
    return value


def _check_tcp_addr(value: str) -> str:
    if parse_listen(value)[0] != "tcp":
        raise ValueError("must be host:port (a unix socket is not allowed here)")
    return value


def _check_path_text(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    return value


def _non_empty(value: tuple[Any, ...]) -> tuple[Any, ...]:
    # An AfterValidator (not min_length) so a list whose items failed is not also called empty.
    if not value:
        raise ValueError("must not be empty")
    return value


def _none_as_empty(value: Any) -> Any:
    return {} if value is None else value


def _resolve(path: Path, info: ValidationInfo) -> Path:
    """Make ``path`` absolute against ``context["base_dir"]`` (the config file's directory)."""
    base = (info.context or {}).get("base_dir") or Path.cwd()
    path = path.expanduser()
    if not path.is_absolute():
        path = Path(base) / path
    return Path(os.path.normpath(path))


_Int = Annotated[int, Field(strict=True)]
_PositiveInt = Annotated[int, Field(strict=True, ge=1)]
_Amount = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
_Text = Annotated[str, Field(strict=True, min_length=1)]
_Name = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_check_name)]
_EnvName = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_check_env_name)]
_HttpUrl = Annotated[str, Field(strict=True, min_length=1), AfterValidator(_check_http_url)]
_Duration = Annotated[float, BeforeValidator(parse_duration)]
_PathText = Annotated[Path, BeforeValidator(_check_path_text)]
_FROZEN = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- models


class Operator(BaseModel):
    """A human approver (SPEC §5): numeric ``id`` (quorum, scope, audit) and wire ``identity``."""

    model_config = _FROZEN

    id: Annotated[int, Field(strict=True, ge=1)]
    identity: _Text

    @property
    def key(self) -> str:
        """The identity as compared on the wire: ``identity.strip().casefold()`` (SPEC §2 #11)."""
        return self.identity.strip().casefold()


class Security(BaseModel):
    """``relay.security``: who may decide and the decision-listener limits (SPEC §2, §5).

    ``allowed_users`` operator ids (non-empty); ``max_input_length`` adjust_text characters
    (default 500); ``rate_limit`` decisions per approver per minute (default 10);
    ``max_skew`` seconds of signature clock skew accepted (default 300).
    """

    model_config = _FROZEN

    allowed_users: Annotated[tuple[_Int, ...], AfterValidator(_non_empty)]
    max_input_length: _PositiveInt = 500
    rate_limit: _PositiveInt = 10
    max_skew: _Duration = 300.0


class RelayConfig(BaseModel):
    """``relay``: where dispatches go, where decisions come back, who the operators are (SPEC §2).

    ``secret_env``/``previous_secret_env`` name environment variables (values via
    ``load_secrets``); ``callback_addr`` is the decision listener's ``host:port``;
    ``public_url`` (trailing ``/`` removed) is what relays call back, None = derive from the
    bound address; ``dispatch_timeout`` seconds (default 10).
    """

    model_config = _FROZEN

    url: _HttpUrl
    secret_env: _EnvName
    previous_secret_env: _EnvName | None = None
    callback_addr: Annotated[str, Field(strict=True), AfterValidator(_check_tcp_addr)]
    public_url: _HttpUrl | None = None
    dispatch_timeout: _Duration = 10.0
    operators: Annotated[tuple[Operator, ...], AfterValidator(_non_empty)]
    security: Security

    @field_validator("public_url")
    @classmethod
    def _strip_slash(cls, value: str | None) -> str | None:
        return value.rstrip("/") if value is not None else None


class ApiConfig(BaseModel):
    """``api``: the local pipeline API (SPEC §3).

    ``listen`` is ``host:port`` or ``unix:/path.sock`` (default ``127.0.0.1:8090``);
    ``token_env`` names the bearer-token variable; ``max_draft_bytes`` (default 262144).
    """

    model_config = _FROZEN

    listen: Annotated[str, Field(strict=True), AfterValidator(_check_listen)] = "127.0.0.1:8090"
    token_env: _EnvName
    max_draft_bytes: _PositiveInt = 262144


class StorageConfig(BaseModel):
    """``storage``: the SQLite database ``path``, absolute (relative = against the config dir)."""

    model_config = _FROZEN

    path: _PathText

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: Path, info: ValidationInfo) -> Path:
        return _resolve(value, info)


class ReceiptsConfig(BaseModel):
    """``receipts`` (SPEC §7): ``key_env`` names the HMAC receipt key variable (not the relay
    secret); ``signing_key_file`` is an optional Ed25519 key path, resolved like storage.path."""

    model_config = _FROZEN

    key_env: _EnvName
    signing_key_file: _PathText | None = None

    @field_validator("signing_key_file")
    @classmethod
    def _absolute(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return _resolve(value, info) if value is not None else None


class BudgetConfig(BaseModel):
    """``budget`` (optional): currency ``unit`` (default EUR) and ``cap_today`` (>= 0 or None)."""

    model_config = _FROZEN

    unit: _Name = "EUR"
    cap_today: _Amount | None = None


class StepConfig(BaseModel):
    """One gated step (SPEC §5).

    ``quorum`` approvals needed (default 1); ``approvers`` operator ids (defaults to
    ``relay.security.allowed_users`` after ``load_config``); ``timeout`` seconds until the
    approval resolves ``timeout`` (default 4h); ``risk`` low|normal|high|critical.
    """

    model_config = _FROZEN

    name: _Name
    type: Literal["approval"] = "approval"
    channel: Literal["relay"] = "relay"
    quorum: _PositiveInt = 1
    approvers: Annotated[tuple[_Int, ...], AfterValidator(_non_empty)] = ()
    timeout: _Duration = 4 * 3600.0
    risk: Literal["low", "normal", "high", "critical"] = "normal"


class PipelineConfig(BaseModel):
    """A named pipeline with its optional ``budget_cap`` (>= 0) and non-empty ``steps``."""

    model_config = _FROZEN

    name: _Name
    budget_cap: _Amount | None = None
    steps: Annotated[tuple[StepConfig, ...], AfterValidator(_non_empty)]


class Config(BaseModel):
    """The whole validated configuration; ``source`` is the file it was loaded from (or None)."""

    model_config = _FROZEN

    relay: RelayConfig
    api: ApiConfig
    storage: StorageConfig
    receipts: ReceiptsConfig
    budget: Annotated[BudgetConfig, BeforeValidator(_none_as_empty)] = Field(
        default_factory=BudgetConfig
    )
    pipelines: Annotated[tuple[PipelineConfig, ...], AfterValidator(_non_empty)]
    source: Path | None = None

    def find_step(self, pipeline: str, step: str) -> tuple[PipelineConfig, StepConfig] | None:
        """Return the named pipeline and step (exact names), or None if either is unknown."""
        for pipe in self.pipelines:
            if pipe.name == pipeline:
                for candidate in pipe.steps:
                    if candidate.name == step:
                        return pipe, candidate
                return None
        return None

    def scope(self, step: StepConfig) -> tuple[Operator, ...]:
        """Operators allowed to decide ``step``: allowed_users ∩ approvers, in approvers order
        (SPEC §2 check 11)."""
        by_id = {op.id: op for op in self.relay.operators}
        allowed = set(self.relay.security.allowed_users)
        out: list[Operator] = []
        # () only when approvers was omitted and the config did not come from load_config.
        for op_id in dict.fromkeys(step.approvers or self.relay.security.allowed_users):
            if op_id in allowed and op_id in by_id:
                out.append(by_id[op_id])
        return tuple(out)

    def operator_by_identity(self, identity: str) -> Operator | None:
        """The operator whose identity equals ``identity`` after strip()+casefold(), else None."""
        if not isinstance(identity, str):
            return None
        key = identity.strip().casefold()
        for op in self.relay.operators:
            if op.key == key:
                return op
        return None


# --------------------------------------------------------------------------- secrets


@dataclass(frozen=True, slots=True)
class Secrets:
    """Secret values read from the environment (SPEC §5); never shown by ``repr``.

    ``relay_secrets``: current relay HMAC secret first, then the previous one if configured;
    ``api_token``: pipeline bearer token; ``receipt_key``: receipt HMAC key as UTF-8 bytes.
    """

    relay_secrets: tuple[str, ...] = field(repr=False)
    api_token: str = field(repr=False)
    receipt_key: bytes = field(repr=False)


def load_secrets(config: Config, environ: Mapping[str, str]) -> Secrets:
    """Read the secrets named by ``config`` from ``environ`` (e.g. ``os.environ``).

    Raises ``ConfigError`` listing every unset, empty or whitespace-padded variable at once,
    and every secret that reuses another's value; messages never contain a value.
    """
    secrets, errors = _read_secrets(config, environ)
    if errors or secrets is None:
        raise ConfigError(errors)
    return secrets


def _read_secrets(config: Config, environ: Mapping[str, str]) -> tuple[Secrets | None, list[str]]:
    errors: list[str] = []
    wanted = _secret_vars(config)
    values: dict[str, str] = {}
    for where, name in wanted:
        value = environ.get(name)
        if value is None:
            errors.append(f"{where}: environment variable {name} is not set")
        elif value == "":
            errors.append(f"{where}: environment variable {name} is empty")
        elif value != value.strip():
            errors.append(
                f"{where}: {name} has leading or trailing whitespace (often a trailing newline);"
                " remove it"
            )
        elif not _is_utf8(value):
            errors.append(f"{where}: {name} is not valid UTF-8")
        else:
            values[where] = value
    # A pipeline token or receipt key equal to a relay secret could sign decisions (SPEC §3, §5).
    names = dict(wanted)
    relay_keys = [w for w in ("relay.secret_env", "relay.previous_secret_env") if w in values]
    for where, others in (
        ("api.token_env", relay_keys),
        ("receipts.key_env", [*relay_keys, "api.token_env"]),
    ):
        for other in others:
            if (
                where in values
                and other in values
                and names[where] != names[other]  # same variable: a config error already
                and _same(values[where], values[other])
            ):
                errors.append(
                    f"{where}: {names[where]} has the same value as {names[other]}"
                    f" ({other}); each secret must be distinct"
                )
    if errors:
        return None, errors
    relay = [values["relay.secret_env"]]
    if "relay.previous_secret_env" in values:
        relay.append(values["relay.previous_secret_env"])
    secrets = Secrets(
        relay_secrets=tuple(relay),
        api_token=values["api.token_env"],
        receipt_key=values["receipts.key_env"].encode("utf-8"),
    )
    return secrets, []


def _secret_vars(config: Config) -> list[tuple[str, str]]:
    """(YAML path, variable name) of every configured secret, relay secret first."""
    relay = config.relay
    out = [("relay.secret_env", relay.secret_env)]
    if relay.previous_secret_env is not None:
        out.append(("relay.previous_secret_env", relay.previous_secret_env))
    out.append(("api.token_env", config.api.token_env))
    out.append(("receipts.key_env", config.receipts.key_env))
    return out


def _is_utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # e.g. undecodable bytes surrogate-escaped by os.environ
        return False
    return True


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8"), b.encode("utf-8"))


# --------------------------------------------------------------------------- loading


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
    try:
        text = source.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        return None, [f"config file not found: {source}"]
    except IsADirectoryError:
        return None, [f"config file is a directory: {source}"]
    except UnicodeDecodeError as exc:
        return None, [f"config file {source} is not valid UTF-8 (byte offset {exc.start})"]
    except OSError as exc:
        return None, [f"cannot read config file {source}: {exc.strerror or exc}"]
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except yaml.YAMLError as exc:
        return None, [_yaml_error(exc)]
    if not isinstance(data, dict):
        found = "an empty file" if data is None else _describe(data)
        return None, [
            "top level: expected a mapping with sections relay, api, storage, receipts and"
            f" pipelines, got {found}"
        ]
    errors: list[str] = []
    if "source" in data:
        data = {k: v for k, v in data.items() if k != "source"}
        errors.append("source: unknown key")
    context = {"base_dir": source.parent}
    try:
        config = Config.model_validate(data, context=context)
    except ValidationError as exc:
        details = exc.errors(include_url=False)
        errors += [_pydantic_error(e) for e in details]
        # Still run the cross-field checks when dropping the bad keys (falling back to their
        # defaults) gives a valid config, so one run reports every error (SPEC §5).
        pruned_data = copy.deepcopy(data)
        pruned = [_prune(pruned_data, e) for e in details]
        if None in pruned:
            return None, errors
        try:
            config = Config.model_validate(pruned_data, context=context)
        except ValidationError:
            return None, errors
        errors += [e for e in _cross_check(config) if not _under(e, pruned)]
    else:
        errors += _cross_check(config)
    return _with_defaults(config, source), errors


def _prune(data: dict[Any, Any], err: Mapping[str, Any]) -> str | None:
    """Delete from ``data`` the mapping key an error points at (or into); return its YAML path,
    or None when there is no such key (a required value is missing or a list item is bad)."""
    loc = tuple(err["loc"])
    if err["type"] in ("extra_forbidden", "invalid_key"):
        last = len(loc) - 1
    else:
        last = max((i for i, part in enumerate(loc) if isinstance(part, str)), default=-1)
    if last < 0 or err["type"] == "missing":
        return None
    node: Any = data
    for part in loc[:last]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    if not isinstance(node, dict) or loc[last] not in node:
        return None
    del node[loc[last]]
    return _path(loc[: last + 1])


def _under(message: str, paths: Sequence[str | None]) -> bool:
    """True when ``message`` is about one of ``paths`` or something inside it."""
    where = message.split(": ", 1)[0]
    return any(
        p is not None and (where == p or where.startswith((p + ".", p + "["))) for p in paths
    )


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (last-one-wins would hide a mistake)."""


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[dict[Any, Any]]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
            continue
        key = loader.construct_object(key_node, deep=True)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"duplicate key {key!r}",
                key_node.start_mark,
            )
        seen.add(key)
    yield from loader.construct_yaml_map(node)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
# YAML 1.1 reads 1:30 as the base-60 number 90; keep such scalars strings so that
# `timeout: 1:30` is reported as an invalid duration instead of meaning 90 seconds.
_SEXAGESIMAL = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_Loader.yaml_implicit_resolvers = {
    first: [("tag:yaml.org,2002:str", _SEXAGESIMAL)] * (first in "+-0123456789") + list(rules)
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _yaml_error(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "invalid YAML"
        if mark is not None:
            return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
        return problem
    return " ".join(str(exc).split()) or "invalid YAML"


def _with_defaults(config: Config, source: Path) -> Config:
    """Fill in step approvers (default: allowed_users) and record the source file."""
    allowed = config.relay.security.allowed_users
    pipelines = tuple(
        pipe.model_copy(
            update={
                "steps": tuple(
                    step
                    if "approvers" in step.model_fields_set
                    else step.model_copy(update={"approvers": allowed})
                    for step in pipe.steps
                )
            }
        )
        for pipe in config.pipelines
    )
    return config.model_copy(update={"pipelines": pipelines, "source": source})


def _cross_check(config: Config) -> list[str]:
    """Checks across fields (SPEC §5), run after the schema validated; returns every error."""
    errors: list[str] = []
    relay = config.relay
    first_id: dict[int, int] = {}
    first_key: dict[str, int] = {}
    for i, op in enumerate(relay.operators):
        where = f"relay.operators[{i}]"
        if op.id in first_id:
            errors.append(
                f"{where}.id: duplicate operator id {op.id}"
                f" (also relay.operators[{first_id[op.id]}])"
            )
        else:
            first_id[op.id] = i
        if op.identity != op.identity.strip():
            errors.append(f"{where}.identity: has leading or trailing whitespace")
        elif op.key in first_key:
            errors.append(
                f"{where}.identity: duplicate identity {op.identity!r} (same as"
                f" relay.operators[{first_key[op.key]}] after trim and casefold)"
            )
        if op.identity.strip() and op.key not in first_key:
            first_key[op.key] = i
    defined = set(first_id)
    allowed = relay.security.allowed_users
    allowed_set = set(allowed)
    errors += _check_ids("relay.security.allowed_users", allowed, defined, None)

    env_names = _secret_vars(config)
    for j, (where, name) in enumerate(env_names):
        for other, other_name in env_names[:j]:
            if name == other_name:
                errors.append(f"{where}: must differ from {other} ({name} is used for both)")
                break

    first_pipe: dict[str, int] = {}
    for p, pipe in enumerate(config.pipelines):
        if pipe.name in first_pipe:
            errors.append(
                f"pipelines[{p}].name: duplicate pipeline name {pipe.name!r}"
                f" (also pipelines[{first_pipe[pipe.name]}])"
            )
        else:
            first_pipe[pipe.name] = p
        first_step: dict[str, int] = {}
        for s, step in enumerate(pipe.steps):
            where = f"pipelines[{p}].steps[{s}]"
            if step.name in first_step:
                errors.append(
                    f"{where}.name: duplicate step name {step.name!r}"
                    f" (also pipelines[{p}].steps[{first_step[step.name]}])"
                )
            else:
                first_step[step.name] = s
            if "approvers" in step.model_fields_set:
                errors += _check_ids(f"{where}.approvers", step.approvers, defined, allowed_set)
                candidates: Sequence[int] = step.approvers
            else:
                candidates = allowed
            in_scope = {i for i in candidates if i in allowed_set and i in defined}
            if step.quorum > len(in_scope):
                noun = "operator" if len(in_scope) == 1 else "operators"
                errors.append(
                    f"{where}.quorum: quorum {step.quorum} is larger than the {len(in_scope)}"
                    f" {noun} in scope"
                )
    return errors


def _check_ids(
    where: str, ids: Sequence[int], defined: set[int], allowed: set[int] | None
) -> list[str]:
    errors: list[str] = []
    seen: set[int] = set()
    for i, op_id in enumerate(ids):
        if op_id in seen:
            errors.append(f"{where}[{i}]: operator {op_id} is listed twice")
        elif op_id not in defined:
            errors.append(f"{where}[{i}]: operator {op_id} is not defined in relay.operators")
        elif allowed is not None and op_id not in allowed:
            errors.append(f"{where}[{i}]: operator {op_id} is not in relay.security.allowed_users")
        seen.add(op_id)
    return errors


# --------------------------------------------------------------------------- pydantic errors

_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "tuple_type": "a list",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "path_type": "a path string",
}


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "top level"


def _pydantic_error(err: Mapping[str, Any]) -> str:
    kind = err["type"]
    loc = tuple(err["loc"])
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind in ("extra_forbidden", "invalid_key"):
        return f"{_path(loc[:-1]) + '.' if loc[:-1] else ''}{loc[-1]}: unknown key"
    where = _path(loc)
    if kind == "missing":
        message = "required"
    elif kind in _EXPECTED:
        message = f"expected {_EXPECTED[kind]}, got {_describe(value)}"
    elif kind == "value_error":
        message = str(ctx.get("error", err["msg"]))
    elif kind == "literal_error":
        expected = str(ctx.get("expected", "?"))
        one_of = "one of " if " or " in expected else ""
        message = f"must be {one_of}{expected}, got {_describe(value)}"
    elif kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
              "less_than": "<"}[kind]
        bound = next(iter(ctx.values()), "?")
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        message = f"must be {op} {bound}, got {value!r}"
    elif kind in ("too_short", "string_too_short"):
        message = "must not be empty"
    elif kind == "finite_number":
        message = "must be a finite number"
    else:
        message = " ".join(str(err["msg"]).split())
    return f"{where}: {message}"


def _describe(value: Any) -> str:
    """Short one-line description of a YAML value for messages (type, plus short scalars)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__
