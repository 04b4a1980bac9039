"""The inbox's YAML config -> a frozen, typed ``InboxConfig`` and its secrets.

Every error is one line starting with its YAML path, as the gate's ``check-config`` says
them; secrets come only from the environment (or ``$CREDENTIALS_DIRECTORY``), never the YAML.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from gate.config.messages import pydantic_error
from gate.config.secrets import CREDENTIALS_DIRECTORY, MIN_SECRET_BYTES, read_secret
from gate.config.storage import StorageConfig
from gate.config.values import (
    AbsolutePath,
    Duration,
    EnvName,
    HttpUrl,
    check_tcp_addr,
)
from gate.config.webauthn import is_domain, is_ip, origin_of
from gate.config.yamlfile import read_mapping


class GateSection(BaseModel):
    """``gate``: the relay secret shared with the gate (by variable name), the one before a
    rotation, the gate's relay listener base URL (credentials channel, decisions) and the
    signature window (SPEC §2 check 3)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret_env: EnvName
    previous_secret_env: EnvName | None = None
    callback_url: HttpUrl
    max_skew: Duration = 300.0


class WebAuthnSection(BaseModel):
    """``webauthn``: the relying party; must match the gate's (defaults from public_url)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rp_id: Annotated[str, Field(strict=True, min_length=1, max_length=253)] | None = None
    origins: tuple[Annotated[str, Field(strict=True, min_length=1)], ...] | None = None


MAIL_ADDRESS = re.compile(r"[^@\s<>()\[\],;:\"\\]+@[^@\s<>()\[\],;:\"\\]+\.[^@\s<>()\[\],;:\"\\]+")
"""A plain ``local@domain.tld`` address: no display name, no spaces or line breaks (a mail
header never carries anything the config did not say)."""


def _check_address(value: str) -> str:
    if not MAIL_ADDRESS.fullmatch(value):
        raise ValueError(f"{value!r} is not a plain e-mail address (local@domain)")
    return value


MailAddress = Annotated[str, Field(strict=True, min_length=3), AfterValidator(_check_address)]


def _check_mail_on(value: tuple[str, ...]) -> tuple[str, ...]:
    if not value:
        raise ValueError("an empty list mails nobody (leave out the mail section to send no mail)")
    return value


MailOn = Annotated[
    tuple[Literal["new", "escalation", "reminder"], ...], AfterValidator(_check_mail_on)
]


class MailSection(BaseModel):
    """``mail`` (optional, off when absent): the SMTP server new items are
    announced through — ``host``, ``port`` (587), ``security`` (``starttls``, ``tls`` or
    ``none``), the login by variable names (``username_env`` and ``password_env``, both or
    neither), the ``from`` address, ``addresses`` (identity -> address; an identity that
    is itself an address is used as is) and ``on``: what is mailed (``new`` items, the
    approvers an ``escalation`` adds, each ``reminder`` to whom it awaits; default new and
    escalation)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    host: Annotated[str, Field(strict=True, min_length=1, max_length=253)]
    port: Annotated[int, Field(strict=True, ge=1, le=65535)] = 587
    security: Literal["starttls", "tls", "none"] = "starttls"
    username_env: EnvName | None = None
    password_env: EnvName | None = None
    sender: MailAddress = Field(alias="from")
    addresses: dict[Annotated[str, Field(strict=True, min_length=1)], MailAddress] = {}
    on: MailOn = ("new", "escalation")

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: object) -> object:
        """YAML 1.1 reads an unquoted ``on:`` key as the boolean true: take it as ``on``."""
        if isinstance(data, dict) and True in data and "on" not in data:
            return {("on" if key is True else key): value for key, value in data.items()}
        return data


class InboxConfig(BaseModel):
    """The whole inbox config. ``database`` (the SQLite file) is resolved against the config
    file's folder; ``storage`` (the gate's section: ``url`` and ``password_env``) puts the
    inbox on PostgreSQL instead; ``public_url`` defaults to ``http://<listen>``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    listen: Annotated[str, Field(strict=True), AfterValidator(check_tcp_addr)] = "127.0.0.1:8095"
    public_url: HttpUrl | None = None
    database: Annotated[AbsolutePath, Field(validate_default=True)] = Path("var/inbox.db")
    storage: StorageConfig | None = None
    gate: GateSection
    webauthn: WebAuthnSection = WebAuthnSection()
    session_ttl: Duration = 12 * 3600.0
    mail: MailSection | None = None
    metrics_token_env: EnvName | None = None

    @property
    def describe_database(self) -> str:
        """Where the inbox keeps its state, for a log line: the file, or ``storage.url``
        (never a password: a URL holding one is refused)."""
        return self.storage.describe() if self.storage is not None else str(self.database)

    @property
    def base_url(self) -> str:
        """What approvers open: ``public_url`` without a trailing ``/``; by default
        ``http://<listen>``, with a loopback host said as ``localhost`` (a passkey needs a
        domain, and browsers allow http there)."""
        if self.public_url is not None:
            return self.public_url.rstrip("/")
        host, _, port = self.listen.rpartition(":")
        if host.strip("[]") in ("127.0.0.1", "::1", "localhost"):
            host = "localhost"
        return f"http://{host}:{port}"


@dataclass(frozen=True, slots=True)
class InboxSecrets:
    """The gate relay secrets, current first then the previous one, the SMTP login and the
    bearer token of ``GET /metrics`` (None: metrics off); never shown by repr."""

    relay_secrets: tuple[str, ...] = field(repr=False)
    mail_login: tuple[str, str] | None = field(default=None, repr=False)  # (username, password)
    metrics_token: str | None = field(default=None, repr=False)
    database_password: str | None = field(default=None, repr=False)  # storage.password_env


@dataclass(frozen=True, slots=True)
class RelyingParty:
    """The passkey relying party in force: ``rp_id`` (a domain) and exact ``origins``."""

    rp_id: str
    origins: tuple[str, ...]


def relying_party(config: InboxConfig) -> RelyingParty | None:
    """``webauthn`` with its defaults (``rp_id``: the host of ``public_url``, never an IP;
    ``origins``: its origin), or None when no domain is known (an IP and no ``rp_id``)."""
    host = (urlsplit(config.base_url).hostname or "").lower()
    rp_id = config.webauthn.rp_id or (host if is_domain(host) else None)
    origins = config.webauthn.origins or (origin_of(config.base_url),)
    return None if rp_id is None else RelyingParty(rp_id, tuple(origins))


def load_inbox(
    path: str | os.PathLike[str], environ: Mapping[str, str]
) -> tuple[InboxConfig | None, InboxSecrets | None, list[str]]:
    """Read and validate the inbox config at ``path`` and its secrets from ``environ``.

    Returns ``(config, secrets, errors)``: errors lists every problem as ``"<yaml.path>:
    <message>"`` (file and YAML syntax errors included); config and secrets are None when
    there is any error. Never raises for bad input."""
    source = Path(os.path.abspath(os.fspath(path)))
    data, errors = read_mapping(source, "a gate section")
    if data is None:
        return None, None, errors
    try:
        config = InboxConfig.model_validate(data, context={"base_dir": source.parent})
    except ValidationError as exc:
        return None, None, [pydantic_error(e, InboxConfig) for e in exc.errors(include_url=False)]
    secrets, secret_errors = _read_secrets(config, environ)
    errors = check_inbox(config) + secret_errors
    if errors or secrets is None:
        return None, None, errors
    return config, secrets, []


def check_inbox(config: InboxConfig) -> list[str]:
    """Checks across fields, one line each with its YAML path: ``public_url`` a base URL
    (no query or fragment), ``webauthn.rp_id`` a domain, each ``webauthn.origins[i]`` an
    http(s) origin on ``rp_id`` or a subdomain (http only on localhost), a relying party
    known at all (``public_url`` on a domain or ``webauthn.rp_id``)."""
    errors: list[str] = _check_storage(config)
    if config.public_url is not None:
        parts = urlsplit(config.public_url)
        if parts.query or parts.fragment:
            errors.append("public_url: must not have a query or fragment (it is a base URL)")
    rp_id = config.webauthn.rp_id
    if rp_id is not None and not is_domain(rp_id):
        what = "an IP address" if is_ip(rp_id) else "not a lowercase domain name"
        errors.append(f"webauthn.rp_id: {rp_id!r} is {what} (a passkey's RP ID is a domain)")
        return errors
    party = relying_party(config)
    if party is None:
        errors.append(
            "webauthn.rp_id: public_url's host is an IP address; set public_url to a URL on a"
            " domain (e.g. http://localhost:8095) or set webauthn.rp_id"
        )
        return errors
    if config.webauthn.origins is not None and not config.webauthn.origins:
        errors.append("webauthn.origins: an empty list allows no origin (omit it)")
    for i, origin in enumerate(config.webauthn.origins or ()):
        where, parts = f"webauthn.origins[{i}]", urlsplit(origin)
        host = (parts.hostname or "").lower()
        if parts.scheme not in ("http", "https") or not host or parts.path not in ("", "/"):
            errors.append(f"{where}: {origin!r} is not an http(s) origin (scheme://host[:port])")
        elif parts.scheme == "http" and host != "localhost":
            errors.append(f"{where}: {origin!r} uses http on a host other than localhost")
        elif host != party.rp_id and not host.endswith("." + party.rp_id):
            errors.append(f"{where}: host {host!r} is neither {party.rp_id!r} nor a subdomain")
    return errors


def _check_storage(config: InboxConfig) -> list[str]:
    """``storage`` holds ``url`` (PostgreSQL) only, and not beside ``database``."""
    if config.storage is None:
        return []
    if config.storage.url is None:
        return ["storage.path: the inbox's SQLite file is database; storage takes url"]
    if "database" in config.model_fields_set:
        return ["storage.url: give database (a SQLite file) or storage.url, not both"]
    return []


def _read_secrets(
    config: InboxConfig, environ: Mapping[str, str]
) -> tuple[InboxSecrets | None, list[str]]:
    """The relay secrets named by ``gate.secret_env`` (and ``previous_secret_env``) and the
    metrics token (``metrics_token_env``): set, clean, at least 16 bytes (as the gate
    requires of the same secret and of its API token); then the SMTP login,
    ``mail.username_env`` and ``mail.password_env`` (both or neither; no length asked),
    read the same way. Never says a value."""
    credentials = environ.get(CREDENTIALS_DIRECTORY) or None
    mail = config.mail
    login = (None, None) if mail is None else (mail.username_env, mail.password_env)
    unpaired: list[str] = []
    if (login[0] is None) != (login[1] is None):
        missing = "mail.username_env" if login[0] is None else "mail.password_env"
        unpaired = [f"{missing}: set both mail.username_env and mail.password_env, or neither"]
    wanted = [
        ("gate.secret_env", config.gate.secret_env, MIN_SECRET_BYTES),
        ("gate.previous_secret_env", config.gate.previous_secret_env, MIN_SECRET_BYTES),
        ("metrics_token_env", config.metrics_token_env, MIN_SECRET_BYTES),
        ("storage.password_env", config.storage.password_env if config.storage else None, 0),
    ]
    if not unpaired:  # the SMTP login is read only when both variables are named
        wanted += [("mail.username_env", login[0], 0), ("mail.password_env", login[1], 0)]
    values: dict[str, str] = {}
    errors: list[str] = []
    for where, name, min_bytes in wanted:
        if name is None:
            continue
        value, error = read_secret(where, name, environ, credentials)
        if error is not None:
            errors.append(error)
        elif value is not None and len(value.encode("utf-8")) < min_bytes:
            errors.append(f"{where}: {name} is shorter than {min_bytes} bytes")
        elif value is not None:
            values[where] = value
    errors += unpaired
    if errors:
        return None, errors
    token = values.pop("metrics_token_env", None)
    password = values.pop("storage.password_env", None)
    user, mail_password = (values.pop(w, "") for w in ("mail.username_env", "mail.password_env"))
    mail_login = (user, mail_password) if login[0] is not None else None
    return InboxSecrets(tuple(values.values()), mail_login, token, password), []
