"""The ``webauthn`` config section (passkeys) and the one function that resolves
the relying party the gate uses: RP ID, RP name, allowed origins. Pure: no I/O."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from gate.config.model import Config

DEFAULT_RP_NAME = "hitl-gate"
_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")


class WebAuthnConfig(BaseModel):
    """``webauthn`` (optional): ``rp_id`` (default: the host of ``relay.public_url``),
    ``rp_name`` (default "hitl-gate"), ``origins`` (default: ``relay.public_url``'s origin).
    Checked across fields by ``check_webauthn``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rp_id: Annotated[str, Field(strict=True, min_length=1, max_length=253)] | None = None
    rp_name: Annotated[str, Field(strict=True, min_length=1, max_length=64)] = DEFAULT_RP_NAME
    origins: tuple[Annotated[str, Field(strict=True, min_length=1)], ...] | None = None


@dataclass(frozen=True, slots=True)
class WebAuthnSettings:
    """The relying party in force: ``rp_id`` (a domain), ``rp_name``, and ``origins`` (the
    exact origins, ``scheme://host[:port]``, whose registrations and assertions count)."""

    rp_id: str
    rp_name: str
    origins: tuple[str, ...]


def is_ip(host: str) -> bool:
    """True when ``host`` is an IPv4 or IPv6 literal (never an RP ID: WebAuthn §5.1.3)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def is_domain(host: str) -> bool:
    """True when ``host`` is a lowercase DNS name (``localhost`` included), not an IP."""
    if is_ip(host) or not 0 < len(host) <= 253:
        return False
    return all(_LABEL.fullmatch(label) for label in host.split("."))


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url`` (the port only when the URL names one)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1].lower()}"


def resolve_webauthn(config: Config, callback_bound: str | None) -> WebAuthnSettings | None:
    """The passkey relying party of ``config``, or None when passkeys are
    unavailable (no domain to use: ``relay.public_url`` is unset or an IP address and no
    ``webauthn.rp_id`` is configured; or the origin derived from ``relay.public_url`` is
    http on a host other than localhost, which browsers refuse for WebAuthn).

    ``callback_bound`` is the relay listener's bound ``host:port`` (None before it is
    bound). Defaults: ``rp_id`` = the host of ``relay.public_url``, ``origins`` = its
    origin; without ``public_url`` and with a loopback listener, ``rp_id`` "localhost" and
    the origin ``http://localhost:<bound port>`` (tests and demos).
    """
    section = config.webauthn
    public = config.relay.public_url
    rp_id = section.rp_id
    origins = section.origins
    if public is not None:
        host = (urlsplit(public).hostname or "").lower()
        if rp_id is None and is_domain(host):
            rp_id = host
        if origins is None:
            if _insecure(public):
                return None  # browsers refuse WebAuthn on an http origin but localhost
            origins = (origin_of(public),)
    elif callback_bound is not None:
        host, _, port = callback_bound.rpartition(":")
        if host.strip("[]") in _LOOPBACK_HOSTS and (rp_id is None or rp_id == "localhost"):
            rp_id = "localhost"
            if origins is None:
                origins = (f"http://localhost:{port}",)
    if rp_id is None or not origins:
        return None
    return WebAuthnSettings(rp_id, section.rp_name, tuple(origins))


def _insecure(url: str) -> bool:
    """True when ``url`` is http on a host other than ``localhost`` (not a secure context)."""
    parts = urlsplit(url)
    return parts.scheme == "http" and (parts.hostname or "").lower() != "localhost"


def unavailable_reason(config: Config) -> str:
    """Why ``resolve_webauthn`` found no relying party, naming the setting to change (one
    line, for doctor and the 409 ``webauthn_unavailable`` message)."""
    public = config.relay.public_url
    if public is not None and config.webauthn.origins is None and _insecure(public):
        host = urlsplit(public).hostname or ""
        return (
            f"relay.public_url is http on {host!r}: browsers allow passkeys only over https"
            " (or http://localhost); set relay.public_url to an https URL"
        )
    return (
        "set relay.public_url to an https URL on a domain (or webauthn.rp_id and webauthn.origins)"
    )


def check_webauthn(config: Config) -> list[str]:
    """check-config's errors for ``webauthn`` (one line each, YAML path first): ``rp_id``
    an IP or not a domain; ``origins[i]`` not an http(s) origin, http on a host other than
    localhost, or a host that is neither ``rp_id`` nor a subdomain of it; an empty
    ``origins`` list (it would allow no origin)."""
    section = config.webauthn
    errors: list[str] = []
    rp_id = section.rp_id
    if rp_id is not None and not is_domain(rp_id):
        what = "an IP address" if is_ip(rp_id) else "not a lowercase domain name"
        errors.append(f"webauthn.rp_id: {rp_id!r} is {what} (a passkey's RP ID is a domain)")
        rp_id = None
    if rp_id is None and config.relay.public_url is not None:
        host = (urlsplit(config.relay.public_url).hostname or "").lower()
        rp_id = host if is_domain(host) else None
    if section.origins is not None and not section.origins:
        errors.append(
            "webauthn.origins: an empty list allows no origin"
            " (omit it to use relay.public_url's origin)"
        )
    for i, origin in enumerate(section.origins or ()):
        where = f"webauthn.origins[{i}]"
        parts = urlsplit(origin)
        host = (parts.hostname or "").lower()
        try:
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError:
            host = ""
        if (
            parts.scheme not in ("http", "https")
            or not host
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username is not None
        ):
            errors.append(f"{where}: {origin!r} is not an http(s) origin (scheme://host[:port])")
        elif parts.scheme == "http" and host != "localhost":
            errors.append(f"{where}: {origin!r} uses http on a host other than localhost")
        elif rp_id is not None and host != rp_id and not host.endswith("." + rp_id):
            errors.append(f"{where}: host {host!r} is neither {rp_id!r} nor a subdomain of it")
    return errors
