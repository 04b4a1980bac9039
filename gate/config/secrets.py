"""Secret values named by the config, read from the environment or systemd credentials (SPEC §5).

Each ``*_env`` key names a variable. When that variable is set, its value is the secret.
When it is unset and ``$CREDENTIALS_DIRECTORY`` is set (systemd's ``LoadCredential=``), the
secret is the content of the file ``$CREDENTIALS_DIRECTORY/<VARIABLE NAME>``, with a single
trailing newline (``\n``) removed, as most editors and ``echo`` leave one. Any other leading
or trailing whitespace, in a variable or a file, is refused, never trimmed silently. A secret
shorter than 16 bytes (UTF-8) is refused, one shorter than 32 bytes is a warning; the database
password (``storage.password_env``) excepted.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gate.config.model import Config
from gate.errors import ConfigError
from gate.protocol.envelope import is_unicode

CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
MAX_CREDENTIAL_BYTES = 64 * 1024
# Shortest secret accepted, and shortest not warned about (bytes of UTF-8). 16 bytes of random
# hex is 64 bits; 32 (openssl rand -hex 32 gives 64 characters) leaves guessing out of reach.
MIN_SECRET_BYTES = 16
GOOD_SECRET_BYTES = 32
MAKE_SECRET = "openssl rand -hex 32"
# secrets no length is asked of: the database password is the database's to judge, not an
# HMAC key or a bearer token of ours (the inbox asks none of it either)
UNMEASURED = frozenset({"storage.password_env"})


@dataclass(frozen=True, slots=True)
class Secrets:
    """Secret values read from the environment (SPEC §5); never shown by ``repr``.

    ``relay_secrets``: current relay HMAC secret first, then the previous one if configured;
    ``api_token``: pipeline bearer token; ``receipt_key``: receipt HMAC key as UTF-8 bytes;
    ``previous_receipt_key``: the one before a rotation (``receipts.previous_key_env``) or None;
    ``admin_token``: the admin bearer token (``api.admin_token_env``) or None;
    ``storage_password``: the PostgreSQL password (``storage.password_env``) or None.
    """

    relay_secrets: tuple[str, ...] = field(repr=False)
    api_token: str = field(repr=False)
    receipt_key: bytes = field(repr=False)
    previous_receipt_key: bytes | None = field(default=None, repr=False)
    admin_token: str | None = field(default=None, repr=False)
    storage_password: str | None = field(default=None, repr=False)
    # "<yaml.path>: <VARIABLE> is N bytes; ..." for each secret shorter than
    # GOOD_SECRET_BYTES (never a value); not part of equality
    warnings: tuple[str, ...] = field(default=(), compare=False)


def load_secrets(config: Config, environ: Mapping[str, str]) -> Secrets:
    """Read the secrets named by ``config`` from ``environ`` (e.g. ``os.environ``), or, for a
    variable that is unset, from ``$CREDENTIALS_DIRECTORY/<name>`` when ``environ`` has it.

    Raises ``ConfigError`` listing every unset, empty or whitespace-padded variable at once,
    every secret shorter than ``MIN_SECRET_BYTES`` (16) bytes as UTF-8, and every secret that
    reuses another's value; messages never contain a value. A secret shorter than
    ``GOOD_SECRET_BYTES`` (32) is a line in the result's ``warnings``. No length is asked
    of the database password (``UNMEASURED``).
    """
    secrets, errors = _read_secrets(config, environ)
    if errors or secrets is None:
        raise ConfigError(errors)
    return secrets


def read_receipt_key(
    config: Config, environ: Mapping[str, str], *, previous: bool = False
) -> bytes | None:
    """The HMAC receipt key alone (``receipts.key_env``, or its credential file; with
    ``previous`` the one of ``receipts.previous_key_env``), or None when it is not
    configured, unset or unusable: for tools that check receipts without the other secrets
    (``doctor``)."""
    where = "receipts.previous_key_env" if previous else "receipts.key_env"
    name = config.receipts.previous_key_env if previous else config.receipts.key_env
    if name is None:
        return None
    value, _ = read_secret(where, name, environ, environ.get(CREDENTIALS_DIRECTORY) or None)
    return None if value is None else value.encode("utf-8")


def read_storage_password(config: Config, environ: Mapping[str, str]) -> str | None:
    """The PostgreSQL password alone (``storage.password_env``, or its credential file), or
    None when it is not configured, unset or unusable: for tools that reach the database
    without the other secrets (``doctor``: a missing token is not a database problem)."""
    name = config.storage.password_env
    if name is None:
        return None
    credentials = environ.get(CREDENTIALS_DIRECTORY) or None
    value, _ = read_secret("storage.password_env", name, environ, credentials)
    return value


def read_api_token(
    config: Config, environ: Mapping[str, str], *, admin: bool = False
) -> tuple[str | None, str | None]:
    """A token of the pipeline API alone, for the CLI's commands: the pipeline token
    (``api.token_env``), or with ``admin`` the admin token (``api.admin_token_env``, for
    ``hitl-gate approvers``), from its variable or its file in ``$CREDENTIALS_DIRECTORY``:
    ``(token, None)`` or ``(None, error naming that key)``; the error says to set
    ``api.admin_token_env`` when the config names none."""
    where = "api.admin_token_env" if admin else "api.token_env"
    name = config.api.admin_token_env if admin else config.api.token_env
    if name is None:
        return None, "set api.admin_token_env in the config (the admin token) to manage approvers"
    return read_secret(where, name, environ, environ.get(CREDENTIALS_DIRECTORY) or None)


def read_secret(
    where: str, name: str, environ: Mapping[str, str], credentials: str | None
) -> tuple[str | None, str | None]:
    """``(value, None)`` for a usable secret, ``(None, error)`` otherwise (the gate's
    config and the inbox's): the environment variable ``name``, else the credential file
    ``name`` in the directory ``credentials`` ($CREDENTIALS_DIRECTORY; None: none); not
    empty, no leading or trailing whitespace (a file may end in one newline), UTF-8. The
    error starts with ``where`` (the YAML path naming the variable) and never says a value."""
    value = environ.get(name)
    if value is None and credentials is not None:
        file_value, error = _read_credential(credentials, name)
        file = Path(credentials, name)
        if error is not None:
            return None, f"{where}: {error}"
        if file_value is not None:
            what = f"credential file {file}"
            problem = _unclean(file_value, what, what, "beyond one trailing newline")
            return (None, f"{where}: {problem}") if problem else (file_value, None)
    if value is None:
        return None, (
            f"{where}: environment variable {name} is not set"
            + (
                f" (nor is there a credential file {Path(credentials, name)})"
                if credentials is not None
                else ""
            )
        )
    problem = _unclean(value, f"environment variable {name}", name, "often a trailing newline")
    if problem is not None:
        return None, f"{where}: {problem}"
    if not is_unicode(value):  # e.g. undecodable bytes surrogate-escaped by os.environ
        return None, f"{where}: {name} is not valid UTF-8"
    return value, None


def _read_secrets(config: Config, environ: Mapping[str, str]) -> tuple[Secrets | None, list[str]]:
    errors: list[str] = []
    wanted = _secret_vars(config)
    values: dict[str, str] = {}
    credentials = environ.get(CREDENTIALS_DIRECTORY) or None
    warnings: list[str] = []
    for where, name in wanted:
        value, error = read_secret(where, name, environ, credentials)
        if error is not None:
            errors.append(error)
        elif value is not None:
            values[where] = value
            size = len(value.encode("utf-8"))
            if where in UNMEASURED:
                continue
            if size < MIN_SECRET_BYTES:
                errors.append(
                    f"{where}: {name} is {size} byte{'' if size == 1 else 's'}; use at least "
                    f"{MIN_SECRET_BYTES} ({GOOD_SECRET_BYTES} recommended): {MAKE_SECRET}"
                )
            elif size < GOOD_SECRET_BYTES:
                warnings.append(
                    f"{where}: {name} is {size} bytes; {GOOD_SECRET_BYTES} or more "
                    f"are recommended: {MAKE_SECRET}"
                )
    # Each secret must differ from every one before it in ``wanted`` (the relay secrets
    # from each other aside): a pipeline token or receipt key equal to a relay secret could
    # sign decisions (SPEC §3, §5); an admin token equal to the pipeline token would let a
    # pipeline enrol keys; auditors hold the receipt key: as the admin token it would too.
    names = dict(wanted)
    for j, (where, name) in enumerate(wanted):
        for other, other_name in wanted[:j]:
            if (
                not where.startswith("relay.")
                and where in values
                and other in values
                and name != other_name  # same variable: a config error already
                and hmac.compare_digest(values[where].encode(), values[other].encode())
            ):
                errors.append(
                    f"{where}: {name} has the same value as {other_name}"
                    f" ({other}); each secret must be distinct"
                )
    for where in ("api.token_env", "api.admin_token_env"):
        token = values.get(where)
        if token is not None and not all("!" <= c <= "~" for c in token):
            # sent as "Authorization: Bearer <token>": a control character or a space there
            # makes every client request invalid (the value is not shown)
            errors.append(
                f"{where}: {names[where]} holds a space, a control or a "
                "non-ASCII character; an HTTP bearer token is printable ASCII"
            )
    if errors:
        return None, errors
    previous = values.get("receipts.previous_key_env")
    secrets = Secrets(
        # the current relay secret, then the previous one (``wanted``'s order)
        relay_secrets=tuple(value for where, value in values.items() if where.startswith("relay.")),
        api_token=values["api.token_env"],
        receipt_key=values["receipts.key_env"].encode("utf-8"),
        previous_receipt_key=None if previous is None else previous.encode("utf-8"),
        warnings=tuple(warnings),
        admin_token=values.get("api.admin_token_env"),
        storage_password=values.get("storage.password_env"),
    )
    return secrets, []


def _unclean(value: str, what: str, name: str, usual: str) -> str | None:
    """Why a secret's ``value`` is unusable: empty (``what`` is empty), or whitespace around
    it (``name`` has ..., ``usual`` saying where it usually comes from); None when clean."""
    if value == "":
        return f"{what} is empty"
    if value != value.strip():
        return f"{name} has leading or trailing whitespace ({usual}); remove it"
    return None


def _secret_vars(config: Config) -> list[tuple[str, str]]:
    """(YAML path, variable name) of every configured secret, relay secret first: the table
    every per-secret check (set, clean, long enough, distinct) runs over."""
    named = (
        ("relay.secret_env", config.relay.secret_env),
        ("relay.previous_secret_env", config.relay.previous_secret_env),
        ("api.token_env", config.api.token_env),
        ("api.admin_token_env", config.api.admin_token_env),
        ("receipts.key_env", config.receipts.key_env),
        ("receipts.previous_key_env", config.receipts.previous_key_env),
        ("storage.password_env", config.storage.password_env),
    )
    return [(where, name) for where, name in named if name is not None]


def _read_credential(directory: str, name: str) -> tuple[str | None, str | None]:
    """Return ``(value, error)`` for the credential file ``directory/name``.

    ``(None, None)`` when there is no such file. The value is the file's UTF-8 text with one
    trailing ``\n`` removed (not ``\r\n``: the ``\r`` is then refused as whitespace).
    Errors never contain the file's content.
    """
    path = Path(directory, name)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_CREDENTIAL_BYTES + 1)
    except FileNotFoundError:
        return None, None
    except IsADirectoryError:
        return None, f"credential file {path} is a directory"
    except OSError as exc:
        return None, f"cannot read credential file {path}: {exc.strerror or exc}"
    if len(data) > MAX_CREDENTIAL_BYTES:
        return None, f"credential file {path} is larger than {MAX_CREDENTIAL_BYTES} bytes"
    if data.endswith(b"\n"):
        data = data[:-1]
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, f"credential file {path} is not valid UTF-8"
