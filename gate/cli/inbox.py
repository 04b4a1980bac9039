"""``hitl-gate inbox`` commands: ``check-config`` and ``serve`` of the inbox, a
separate program and hitl/v0 relay with its own config file."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import click

from gate.cli import LOG_LEVEL_OPTION, config_option, fail, main, missing_extra, require_extra

if TYPE_CHECKING:
    from gate.inbox.config import InboxConfig, InboxSecrets

INBOX_CONFIG_OPTION = config_option("HITL_INBOX_CONFIG", "the inbox's YAML config")


def load(config_path: str) -> tuple[InboxConfig, InboxSecrets]:
    """The inbox's config and secrets, once its extra is there (``require_extra``); exit 2
    with every error, one line each naming the file, otherwise."""
    require_extra("inbox")
    from gate.inbox.config import load_inbox

    config, secrets, errors = load_inbox(config_path, os.environ)
    if errors or config is None or secrets is None:
        for line in errors:
            click.echo(f"{config_path}: {line}", err=True)
        sys.exit(2)
    if config.storage is not None and config.storage.url is not None:
        missing = missing_extra("postgres", "storage.url (PostgreSQL)")
        if missing is not None:
            fail(missing, 2)
    return config, secrets


@main.group("inbox")
def inbox() -> None:
    """The inbox: a web relay where approvers see what waits for them.

    Example: hitl-gate inbox serve -c inbox.yaml
    """


@inbox.command("check-config")
@INBOX_CONFIG_OPTION
def check_config(config_path: str) -> None:
    """Validate the inbox config and its secret variables; every error with its YAML path.

    Exit 0 when valid, 2 otherwise.

    Example: hitl-gate inbox check-config -c inbox.yaml
    """
    config, _ = load(config_path)
    click.echo(f"{config_path}: ok (listen {config.listen}, database {config.describe_database})")


@inbox.command("serve")
@INBOX_CONFIG_OPTION
@LOG_LEVEL_OPTION
def serve(config_path: str, log_level: str) -> None:
    """Run the inbox: its one listener (relay endpoint /hitl/v0/relay) and its database.

    Logs to stderr (event=inbox_ready url=… once listening). Exit 0 on SIGTERM/SIGINT,
    1 when it cannot start (listen, database), 2 on a config error or without the
    inbox extra.

    Example: hitl-gate inbox serve -c inbox.yaml
    """
    config, secrets = load(config_path)
    import asyncio

    from gate import logs
    from gate.inbox.serve import serve_inbox

    logs.configure(log_level.upper(), "text")
    try:
        asyncio.run(serve_inbox(config, secrets))
    except OSError as exc:
        click.echo(f"Error: cannot start the inbox: {exc.strerror or exc}", err=True)
        sys.exit(1)
