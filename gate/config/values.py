"""Plain config values: durations, listen addresses, and the per-field checks the models use."""

from __future__ import annotations

import math
import os
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo

from gate.protocol.numbers import RANGE_WORDS, brief_number, in_range, is_json_number
from gate.protocol.whitespace import is_trimmed

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


@dataclass(frozen=True, slots=True)
class TcpListen:
    """A ``host:port`` listen address; ``port`` 0 asks for an ephemeral port."""

    host: str
    port: int


@dataclass(frozen=True, slots=True)
class UnixListen:
    """A ``unix:/path.sock`` listen address."""

    path: str


def parse_listen(addr: str) -> TcpListen | UnixListen:
    """Parse a listen address into a ``TcpListen`` or a ``UnixListen`` (SPEC §3).

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
        return UnixListen(path)
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
    return TcpListen(host, int(port_text))


# --------------------------------------------------------------------------- field validators


def _looks_like_a_secret(value: str) -> bool:
    """True for text shaped like a key or token (16+ characters, no spaces, digits and
    lower-case letters, no ``_`` or characters a name cannot hold): printed nowhere."""
    return (
        len(value) >= 16
        and not any(c.isspace() for c in value)
        and any(c.isdigit() for c in value)
        and any(c.islower() for c in value)
        and ("_" not in value or not _ENV_NAME.fullmatch(value))
    )


def check_bounded_number(value: Any) -> Any:
    """A bound, limit or amount must be within ±2**53 (docs/design.md "Numbers"); checked
    before pydantic makes it a float (an int of 309+ digits fits none). Other values pass
    on to the type's own check."""
    if is_json_number(value) and not in_range(value):
        raise ValueError(f"must be a number {RANGE_WORDS}, got {brief_number(value)}")
    return value


def duplicate(
    seen: dict[Any, int], key: Any, index: int, field: str, what: str, listed: str
) -> list[str]:
    """The error of ``key`` (a name or an id at ``index`` of the YAML list ``listed``) when
    it was first seen before ``index``: ``<field>: duplicate <what> (also <listed>[first])``;
    else [], and ``index`` is recorded as its first place in ``seen``."""
    first = seen.setdefault(key, index)
    return [] if first == index else [f"{field}: duplicate {what} (also {listed}[{first}])"]


def check_ids(
    where: str, ids: Sequence[int], defined: set[int], allowed: set[int] | None
) -> list[str]:
    """Errors of the operator ids ``ids`` listed at ``where`` (a YAML path): one line per id
    listed twice, not defined (``defined``: the ids of ``relay.operators``) or, with
    ``allowed``, not in ``relay.security.allowed_users``; [] when all are fine."""
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


def check_env_name(value: str, example: str = "HITL_API_TOKEN") -> str:
    """A pydantic validator (the gate's config and the inbox's): ``value`` is the name of an
    environment variable, never a secret pasted in its place (the refusal suggests the name
    ``example``); raises ValueError."""
    if _looks_like_a_secret(value):  # a secret pasted where its variable's NAME belongs
        raise ValueError(
            "looks like a secret value, not the name of an environment variable "
            f"(not shown; put the secret in a variable, e.g. {example}, and "
            "its name here)"
        )
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits and _)")
    return value


def _check_name(value: str) -> str:
    if not is_trimmed(value):
        raise ValueError("has leading or trailing whitespace")
    return value


# Unicode categories of characters that show as nothing (or as something else) in an identity:
# format (zero-width, bidi controls, tags), line/paragraph separators, private use, surrogates,
# unassigned. Two identities differing only by one look like one person (relay review, item D).
_INVISIBLE = {
    "Cf": "format",
    "Zl": "line-separator",
    "Zp": "paragraph-separator",
    "Co": "private-use",
    "Cs": "surrogate",
    "Cn": "unassigned",
}


def identity_problem(identity: str) -> str | None:
    """What is wrong with an operator identity, or None: White_Space around it (the gate
    trims what relays send, so it could never match as written), a control character
    (category Cc: U+0000..U+001F, U+007F..U+009F: no relay sends one for a person), or an
    invisible one (categories Cf, Zl, Zp, Co, Cs, Cn: ``alice@example.com\u200b`` would be a
    second operator that looks exactly like alice), or a name starting ``policy:`` (a
    policy decides by that name). The message names the code point."""
    if not is_trimmed(identity):
        return "has leading or trailing whitespace"
    if identity.casefold().startswith("policy:"):  # the name a policy decides by
        return "starts with 'policy:', the name a policy's decision is recorded by"
    for char in identity:
        category = unicodedata.category(char)
        if category == "Cc":
            what = "a control character"
        elif category in _INVISIBLE:
            what = f"an invisible {_INVISIBLE[category]} character"
        else:
            continue
        return f"has {what} (U+{ord(char):04X}); an identity is what the relay sends as approver.id"
    return None


def check_http_url(value: str) -> str:
    """A pydantic validator: an http(s) URL with a host and no whitespace; raises
    ValueError without echoing the URL."""
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


def check_tcp_addr(value: str) -> str:
    """A pydantic validator: a ``host:port`` listen address (no unix socket); raises
    ValueError."""
    if not isinstance(parse_listen(value), TcpListen):
        raise ValueError("must be host:port (a unix socket is not allowed here)")
    return value


def check_path_text(value: Any) -> Any:
    """A pydantic validator (before a path is parsed): not an empty or blank string;
    raises ValueError."""
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


def resolve_path(path: Path, info: ValidationInfo) -> Path:
    """Make ``path`` absolute against ``context["base_dir"]`` (the config file's directory)."""
    base = (info.context or {}).get("base_dir") or Path.cwd()
    path = path.expanduser()
    if not path.is_absolute():
        path = Path(base) / path
    return Path(os.path.normpath(path))


EnvName = Annotated[str, Field(strict=True, min_length=1), AfterValidator(check_env_name)]
"""A config field naming an environment variable (``*_env``; the gate's config and the
inbox's)."""
HttpUrl = Annotated[str, Field(strict=True, min_length=1), AfterValidator(check_http_url)]
"""A config field holding an http(s) URL (``check_http_url``)."""
Duration = Annotated[float, BeforeValidator(parse_duration)]
"""A config field holding a duration (``90s``, ``30m``, ``4h`` or seconds), as seconds."""
AbsolutePath = Annotated[Path, BeforeValidator(check_path_text), AfterValidator(resolve_path)]
"""A config field holding a path, made absolute against the config file's folder
(``resolve_path``; the gate's config and the inbox's)."""
