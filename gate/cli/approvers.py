"""``hitl-gate approvers add-key|list|revoke|invite``: approvers' Ed25519 keys and
passkey invites, through the daemon's admin API (``/v1/admin/approvers``) with the admin
token (``api.admin_token_env``), never the pipeline token."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

import click

from gate.cli import (
    API_URL_OPTION,
    CONFIG_OPTION,
    ed25519_pem,
    fail,
    main,
    read_config,
    read_input,
    run,
)
from gate.cli.common import NumberType, check_api_url, safe_json


def _admin(config_path: str, api_url: str | None, method: str, path: str, body: Any = None) -> Any:
    """The admin API's answer to ``method path`` (with JSON ``body``), asked with the admin
    token; exits 2 with one line when the config names no ``api.admin_token_env`` or the
    variable is not usable, 1 with the API's refusal."""
    from gate.client.api import ApiClient
    from gate.config import read_api_token
    from gate.sdk.client import listen_url

    async def go() -> Any:
        config = read_config(config_path)
        token, error = read_api_token(config, os.environ, admin=True)
        if token is None:
            fail(error or "set api.admin_token_env", 2)
        check_api_url(api_url)
        async with ApiClient(api_url or listen_url(config.api.listen), token) as api:
            return await api.admin(method, path, body)

    return run(go())


def check_label(label: str | None) -> None:
    """Exit 2 with one line when ``--label`` is longer than the admin API takes
    (``gate.core.credentials.MAX_LABEL_CHARS``), before any call is made."""
    from gate.core.credentials import MAX_LABEL_CHARS

    if label is not None and len(label) > MAX_LABEL_CHARS:
        fail(f"--label: {len(label)} characters; a label is at most {MAX_LABEL_CHARS}", 2)


def invite_ttl_s(ttl: str) -> int:
    """``--ttl`` of ``approvers invite`` in whole seconds, read like a config duration
    (``gate.config.values.parse_duration``: ``15m``, ``1h30m``; a plain number is seconds).
    Exits 2 with one line when it is no duration, or when it is outside 60 s..24 h (the admin
    API's ``ttl_s`` range) or not whole seconds: 0 too, which is a duration, just not one an
    invite can last."""
    from gate.config.values import parse_duration

    out_of_range = (
        f"--ttl: {ttl!r} is out of range: an invite lasts 60s..24h (a plain number is seconds)"
    )
    try:
        seconds = parse_duration(ttl)
    except ValueError as exc:
        # parse_duration says "invalid duration ..." for text that is no duration; anything
        # else it refuses ("duration must be > 0", "... too large") is a duration out of range
        fail(f"--ttl: {exc}" if str(exc).startswith("invalid") else out_of_range, 2)
    if seconds != int(seconds) or not 60 <= seconds <= 86_400:
        fail(out_of_range, 2)
    return int(seconds)


@main.group()
def approvers() -> None:
    """Approvers' own keys: enrol, list, revoke.

    Example: hitl-gate approvers list -c /etc/hitl-gate/config.yaml
    """


@approvers.command("add-key")
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("operator_id", type=NumberType(whole=True))
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
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    pem = read_input("--public-key", public_key)
    if b"PRIVATE KEY-----" in pem:  # the .key of a keygen pair given for its .pub
        fail(f"--public-key: {public_key}: this is a private key: give its public half (.pub)", 2)
    check_label(label)
    loaded = ed25519_pem(pem, "--public-key", public_key)
    body: dict[str, Any] = {
        "operator_id": operator_id,
        "type": "ed25519",
        # the key as PEM again: comments or other text around it in the file stay here
        "public_key": loaded.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode(),
    }
    if label is not None:
        body["label"] = label
    answer = _admin(config_path, api_url, "POST", "/v1/admin/approvers", body)
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
    items = _admin(config_path, api_url, "GET", "/v1/admin/approvers")["items"]
    if as_json:
        click.echo(safe_json(items))
        return
    for item in items:
        click.echo(credential_line(item))


def credential_line(item: dict[str, Any]) -> str:
    """One credential of ``GET /v1/admin/approvers`` as ``approvers list`` prints it: id,
    operator, identity, type, ``active`` or ``revoked TIME``, the label as JSON (one line)."""
    from gate.protocol.display import display_time

    state = (
        "active" if item["revoked_at"] is None else f"revoked {display_time(item['revoked_at'])}"
    )
    label = json.dumps(item["label"], ensure_ascii=True) if item["label"] else "-"
    return (
        f"{item['credential_id']}  {item['operator_id']}  {item['identity'] or '-'}"
        f"  {item['type']}  {state}  {label}"
    )


class _IdCommand(click.Command):
    """A command whose argument is a base64url credential id, which may begin with "-"
    (1 key in 64): click reads such an id as options, so its error says to put it after
    "--" instead of "No such option"."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes ``args``
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if any(a.startswith("-") and not a.startswith("--") for a in given[1:]):
                raise click.UsageError(
                    f"{exc.format_message()} (a credential id that begins with '-' goes"
                    " after '--': hitl-gate approvers revoke -c FILE -- ID)",
                    ctx,
                ) from None
            raise


@approvers.command("revoke", cls=_IdCommand)
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("credential_id")
def revoke(config_path: str, api_url: str | None, credential_id: str) -> None:
    """Revoke an approver credential: it signs nothing from now on (an audit entry says so).

    An id that begins with "-" goes after "--": hitl-gate approvers revoke -c FILE -- ID.

    Example: hitl-gate approvers revoke -c config.yaml If4x36FUomFia_hUBG_SJw
    """
    path = f"/v1/admin/approvers/{quote(credential_id, safe='')}/revoke"
    answer = _admin(config_path, api_url, "POST", path)
    click.echo(f"revoked {answer['credential_id']}", err=True)


@approvers.command("invite")
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("operator_id", type=NumberType(whole=True))
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
    """Print a one-time URL where OPERATOR_ID enrols a passkey.

    The URL is on the relay listener (relay.public_url) and is a secret until used: send it
    to the approver only. Its expiry goes to stderr. Needs api.admin_token_env.

    Example: hitl-gate approvers invite -c config.yaml 101 --ttl 15m --label phone
    """
    seconds = invite_ttl_s(ttl)
    check_label(label)
    body: dict[str, Any] = {"operator_id": operator_id, "ttl_s": int(seconds)}
    if label is not None:
        body["label"] = label
    answer = _admin(config_path, api_url, "POST", "/v1/admin/approvers/invites", body)
    click.echo(answer["url"])
    from gate.protocol.display import display_time

    click.echo(f"expires at {display_time(answer['expires_at'])}", err=True)
