"""The ``storage`` section: a SQLite file (``path``, the default) or a PostgreSQL database
(``url``, its password in the variable ``password_env``); exactly one of the two."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qsl, urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from gate.config.values import AbsolutePath, check_env_name
from gate.errors import ConfigError

POSTGRES_SCHEMES = ("postgresql", "postgres")
# libpq's query parameters that carry a secret: refused in storage.url like a password in it
# (in any case: ``PASSWORD=`` is a password misspelled, not an unknown parameter)
_SECRET_PARAMS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
# libpq's connection parameters (PostgreSQL 18's; ``ssl``: its URI alias of sslmode=require):
# any other in storage.url is a mistake libpq would refuse at connect, told at load instead
LIBPQ_PARAMS = frozenset(
    """application_name channel_binding client_encoding connect_timeout dbname
    fallback_application_name gssdelegation gssencmode gsslib host hostaddr keepalives
    keepalives_count keepalives_idle keepalives_interval krbsrvname load_balance_hosts
    max_protocol_version min_protocol_version oauth_client_id oauth_issuer oauth_scope options
    passfile port replication require_auth requirepeer service ssl ssl_max_protocol_version
    ssl_min_protocol_version sslcert sslcertmode sslcompression sslcrl sslcrldir sslkey
    sslkeylogfile sslmode sslnegotiation sslrootcert sslsni target_session_attrs
    tcp_user_timeout user""".split()
)
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})|%00")


def check_postgres_url(value: str) -> str:
    """A pydantic validator: a libpq URL (``postgresql://user@host:port/db?sslmode=...``; query
    parameters, each one of libpq's (``LIBPQ_PARAMS``), pass through to libpq) without a
    password, in its user part or as a secret's parameter (``password``, ``sslpassword``, ...,
    in any case): the password comes from ``password_env``. Raises ValueError without
    echoing the URL (it may hold a password)."""
    if any(ch.isspace() for ch in value):
        raise ValueError("URL must not contain whitespace")
    if _BAD_ESCAPE.search(value):  # libpq refuses these at connect
        raise ValueError(
            "not a valid postgresql:// URL: % must start %XX (two hex digits, not %00)"
        )
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
        params = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ValueError("not a valid postgresql:// URL") from None
    if parts.scheme not in POSTGRES_SCHEMES:
        raise ValueError("must be a postgresql:// URL (a SQLite file is storage.path)")
    if parts.password is not None or any(key.lower() in _SECRET_PARAMS for key, _ in params):
        raise ValueError(
            "must not hold a password; name the environment variable that holds it in"
            " storage.password_env"
        )
    if parts.fragment:
        raise ValueError("must not have a #fragment")
    unknown = next((key for key, _ in params if key not in LIBPQ_PARAMS), None)
    if unknown is not None:
        shown = unknown if unknown.isascii() and unknown.isprintable() else ascii(unknown)
        raise ValueError(
            f'invalid URI query parameter "{shown[:40]}" (libpq\'s, such as sslmode,'
            " connect_timeout, application_name)"
        )
    return value


PostgresUrl = Annotated[str, Field(strict=True, min_length=1), AfterValidator(check_postgres_url)]
# a variable's name (``EnvName``) whose refusal of a pasted secret suggests a name that fits
PasswordEnv = Annotated[
    str,
    Field(strict=True, min_length=1),
    AfterValidator(partial(check_env_name, example="HITL_DB_PASSWORD")),
]


class StorageConfig(BaseModel):
    """``storage``: exactly one of ``path``, the SQLite database file, absolute (relative =
    against the config dir), and ``url``, a PostgreSQL database (``check_postgres_url``);
    with ``url``, ``password_env`` (optional) names the variable holding its password."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: AbsolutePath | None = None
    url: PostgresUrl | None = None
    password_env: PasswordEnv | None = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        # what can be told without touching anything: serve creates a missing file and
        # its directories, but cannot open a directory as a database
        if path is None:
            return None
        if path.is_dir():
            raise ValueError(f"{path} is a directory; name the database file in it (e.g. gate.db)")
        parent = next((folder for folder in path.parents if folder.exists()), None)
        if parent is not None and not parent.is_dir():
            raise ValueError(f"{parent} is not a directory")
        return path

    @model_validator(mode="after")
    def _one_backend(self) -> StorageConfig:
        given = {name for name in ("path", "url") if getattr(self, name) is not None}
        if given == {"path", "url"}:
            raise ValueError("give either path (SQLite) or url (PostgreSQL), not both")
        if not given:
            raise ValueError("give path (a SQLite file) or url (a postgresql:// URL)")
        if self.password_env is not None and self.url is None:
            raise ValueError("password_env goes with url (PostgreSQL); SQLite has no password")
        return self

    @property
    def on_postgres(self) -> bool:
        """True when ``url`` selects PostgreSQL."""
        return self.url is not None

    def sqlite_file(self) -> Path:
        """The SQLite database file, for what reads it directly (offline tools); raises
        ConfigError naming ``storage`` when the config selects PostgreSQL."""
        if self.path is None:
            raise ConfigError(
                ["storage: this command reads a SQLite database (storage.path); storage.url"
                 " selects PostgreSQL, where it does not run yet"]
            )  # fmt: skip
        return self.path

    def describe(self) -> str:
        """Where the data is, for a log line: the file, or the URL (never a password: a
        URL holding one is refused)."""
        return str(self.path) if self.path is not None else str(self.url)
