"""``hitl-gate approvers add-key|list|revoke|invite`` (issue 16): approvers' Ed25519 keys and
passkey invites, through the daemon's admin API (``/v1/admin/approvers``) with the admin
token (``api.admin_token_env``), never the pipeline token."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

import click

from gate.cli import API_URL_OPTION, CONFIG_OPTION, fail, main, read_config, read_input, run
from gate.cli.common import safe_json, valid_api_url


def _admin_client(config_path: str, api_url: str | None) -> Any:
    """An ``ApiClient`` holding the admin token; exits 2 with one line when the config names
    no ``api.admin_token_env`` or the variable is not usable."""
    from gate.client.api import ApiClient, api_base
    from gate.config import read_admin_token

    config = read_config(config_path)
    token, error = read_admin_token(config, os.environ)
    if token is None:
        fail(error or "set api.admin_token_env", 2)
    if api_url is not None and not valid_api_url(api_url):
        fail(f"--api-url: {api_url!r} is not http://host:port, https://host:port or unix:/path", 2)
    return ApiClient(api_url or api_base(config), token)


@main.group()
def approvers() -> None:
    """Approvers' own keys (issue 16): enrol, list, revoke.

    Example: hitl-gate approvers list -c /etc/hitl-gate/config.yaml
    """


@approvers.command("add-key")
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("operator_id", type=int)
@click.option(
    "--public-key",
    "public_key",
    required=True,
    help="The approver's Ed25519 public key, PEM (hitl-gate keygen writes one; - = stdin).",
)
@click.option("--label", default=None, help="A name for the key, e.g. 'alice laptop'.")
def add_key(
    config_path: str, api_url: str | None, operator_id: int, public_key: str, label: str | None
) -> None:
    """Enrol an approver's Ed25519 key for OPERATOR_ID; print its credential id.

    A step with approver_signature: optional or required then accepts decisions signed with
    it (docs/protocol.md). Needs api.admin_token_env.

    Example: hitl-gate approvers add-key -c config.yaml 101 --public-key alice.pub --label laptop
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    pem = read_input("--public-key", public_key)
    try:
        loaded = load_pem_public_key(pem)
    except (ValueError, TypeError):
        loaded = None
    if not isinstance(loaded, Ed25519PublicKey):
        fail(f"--public-key: {public_key} is not an Ed25519 public key in PEM", 2)
    body: dict[str, Any] = {
        "operator_id": operator_id,
        "type": "ed25519",
        # the key as PEM again: comments or other text around it in the file stay here
        "public_key": loaded.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode(),
    }
    if label is not None:
        body["label"] = label

    async def go() -> Any:
        async with _admin_client(config_path, api_url) as api:
            return await api.admin("POST", "/v1/admin/approvers", body)

    answer = run(go())
    click.echo(answer["credential_id"])


@approvers.command("list")
@CONFIG_OPTION
@API_URL_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the credentials as JSON.")
def list_(config_path: str, api_url: str | None, as_json: bool) -> None:
    """List approvers' credentials, revoked ones included.

    One line each: credential id, operator id, identity, type, state, label.

    Example: hitl-gate approvers list -c config.yaml --json
    """

    async def go() -> Any:
        async with _admin_client(config_path, api_url) as api:
            return await api.admin("GET", "/v1/admin/approvers")

    items = run(go())["items"]
    if as_json:
        click.echo(safe_json(items))
        return
    for item in items:
        state = "active" if item["revoked_at"] is None else f"revoked {item['revoked_at']}"
        label = json.dumps(item["label"], ensure_ascii=True) if item["label"] else "-"
        click.echo(
            f"{item['credential_id']}  {item['operator_id']}  {item['identity'] or '-'}"
            f"  {item['type']}  {state}  {label}"
        )


@approvers.command("revoke")
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("credential_id")
def revoke(config_path: str, api_url: str | None, credential_id: str) -> None:
    """Revoke an approver credential: it signs nothing from now on (an audit entry says so).

    Example: hitl-gate approvers revoke -c config.yaml If4x36FUomFia_hUBG_SJw
    """

    async def go() -> Any:
        async with _admin_client(config_path, api_url) as api:
            return await api.admin(
                "POST", f"/v1/admin/approvers/{quote(credential_id, safe='')}/revoke"
            )

    answer = run(go())
    click.echo(f"revoked {answer['credential_id']}", err=True)


@approvers.command("invite")
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("operator_id", type=int)
@click.option(
    "--ttl",
    default="15m",
    show_default=True,
    help="How long the invite can be used: 60s..24h (e.g. 90s, 15m, 2h).",
)
@click.option("--label", default=None, help="A name for the passkey, e.g. 'alice phone'.")
def invite(
    config_path: str, api_url: str | None, operator_id: int, ttl: str, label: str | None
) -> None:
    """Print a one-time URL where OPERATOR_ID enrols a passkey (issue 16).

    The URL is on the relay listener (relay.public_url) and is a secret until used: send it
    to the approver only. Its expiry goes to stderr. Needs api.admin_token_env.

    Example: hitl-gate approvers invite -c config.yaml 101 --ttl 15m --label phone
    """
    from gate.config.values import parse_duration

    try:
        seconds = parse_duration(ttl)
    except (ValueError, TypeError):
        fail(f"--ttl: {ttl!r} is not a duration (e.g. 15m)", 2)
    if seconds != int(seconds) or not 60 <= seconds <= 86_400:
        fail(f"--ttl: {ttl!r} must be a whole number of seconds from 60s to 24h", 2)
    body: dict[str, Any] = {"operator_id": operator_id, "ttl_s": int(seconds)}
    if label is not None:
        body["label"] = label

    async def go() -> Any:
        async with _admin_client(config_path, api_url) as api:
            return await api.admin("POST", "/v1/admin/approvers/invites", body)

    answer = run(go())
    click.echo(answer["url"])
    click.echo(f"expires at {answer['expires_at']}", err=True)
