"""``hitl-gate`` commands: each parses, calls one function, prints; errors become one line.
The group, ``fail``, ``run`` and shared options live here; the commands in daemon, pipeline,
requests (list, show, cancel of both kinds), ask, audit, tools and verify (what the API-side
ones share: common).

A command's module is imported only when that command runs (or help lists it): ``main`` is a
``LazyGroup`` that knows each command's module by name (``COMMANDS``), and the module registers
its commands on ``main`` when imported. A call then pays only for the imports it uses.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from gate import __version__
from gate.errors import ConfigError, GateError

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def config_option(envvar: str, what: str) -> Callable[[F], F]:
    """The required ``-c/--config`` option (a file path, also from the variable ``envvar``)
    of a program whose YAML config ``what`` names in the help."""
    return click.option(
        "-c",
        "--config",
        "config_path",
        required=True,
        type=click.Path(dir_okay=False),
        envvar=envvar,
        help=f"Path to {what} (env {envvar}).",
    )


Decorator = Callable[[Any], Any]


def options(*decorators: Decorator) -> Decorator:
    """One decorator applying ``decorators`` (click options) so that ``--help`` lists them in
    this order."""

    def apply(fn: Any) -> Any:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


CONFIG_OPTION = config_option("HITL_GATE_CONFIG", "the YAML config")
API_URL_OPTION = click.option(
    "--api-url",
    envvar="HITL_GATE_API_URL",
    default=None,
    help="Reach the API here instead of api.listen (http://host:port or unix:/path).",
)
LOG_LEVEL_OPTION = click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``Error: message`` on stderr and exit with ``code``."""
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def run(coro: Coroutine[Any, Any, T], interrupted: Callable[[], str] = lambda: "") -> T:
    """Run a coroutine; a GateError becomes one ``Error:`` line and exit 1; Ctrl-C exits 130
    with ``interrupted()`` (what is left behind) on stderr."""
    try:
        return asyncio.run(coro)
    except GateError as exc:
        fail(exc.message)
    except KeyboardInterrupt:
        left = interrupted()
        click.echo(f"Interrupted{': ' + left if left else ''}", err=True)
        sys.exit(130)


# an extra of pyproject.toml -> the modules it installs that the base install lacks
EXTRAS: dict[str, tuple[str, ...]] = {
    "inbox": ("jinja2", "markupsafe", "aiohttp_jinja2", "markdown_it", "aiosmtplib"),
    "mcp": ("mcp", "uvicorn", "h11"),
    "postgres": ("psycopg", "psycopg_pool"),  # storage.url: the gate on PostgreSQL
}


# an extra -> the program's module that imports all of it (tried before the command runs)
PROGRAMS: dict[str, str] = {"inbox": "gate.inbox.serve", "mcp": "gate.mcp.server"}


def require_extra(extra: str) -> None:
    """Exit 2 with one line naming the extra to install (``pip install 'hitl-gate[inbox]'``)
    when a module of ``extra`` (``EXTRAS``) is not installed, or is installed but unusable
    (an older major version, a dependency of it removed): the program's module
    (``PROGRAMS``) is imported here, and what it could not import follows in brackets.
    The command ``hitl-gate <extra>`` calls this first, so its ``--help`` needs no extra."""
    line = f"hitl-gate {extra} needs the {extra} extra: pip install 'hitl-gate[{extra}]'"
    if any(importlib.util.find_spec(module) is None for module in EXTRAS[extra]):
        fail(line, 2)
    try:
        importlib.import_module(PROGRAMS[extra])
    except ImportError as exc:
        fail(f"{line} ({exc})", 2)


def missing_extra(extra: str, needed_by: str) -> str | None:
    """The one line saying that ``needed_by`` needs the extra ``extra`` (``pip install
    'hitl-gate[postgres]'``) when a module of it (``EXTRAS``) is not installed; else None."""
    if all(importlib.util.find_spec(module) is not None for module in EXTRAS[extra]):
        return None
    return f"{needed_by} needs the {extra} extra: pip install 'hitl-gate[{extra}]'"


def read_config(path: str) -> Any:
    from gate.config import load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        for line in exc.errors:
            click.echo(f"{path}: {line}", err=True)
        sys.exit(2)


def public_keys(paths: tuple[str, ...], option: str = "--public-key") -> dict[str, Any]:
    """Load ``--public-key`` files into ``{key id: key}``; a bad file is a usage error (2)."""
    from gate.trust.keys import KeyFileError, key_id, load_public_key

    out = {}
    for path in paths:
        try:
            key = load_public_key(Path(path))
        except KeyFileError as exc:
            fail(f"{option}: {exc.message}", 2)
        out[key_id(key)] = key
    return out


def ed25519_pem(pem: bytes, option: str, name: str) -> Any:
    """The Ed25519 public key the PEM text ``pem`` (given with ``option``, as ``name``)
    holds; exit 2 with one line unless it is one."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        loaded = load_pem_public_key(pem)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        loaded = None
    if not isinstance(loaded, Ed25519PublicKey):
        fail(f"{option}: {name} is not an Ed25519 public key in PEM", 2)
    return loaded


# command name -> the modules that register it (a group's subcommands may live in two)
COMMANDS: dict[str, tuple[str, ...]] = {
    "approvers": ("approvers",),
    "ask": ("ask",),
    "audit": ("audit", "audit_signatures"),
    "cancel": ("requests",),
    "check-config": ("daemon",),
    "doctor": ("tools",),
    "inbox": ("inbox",),
    "keygen": ("tools",),
    "list": ("requests",),
    "mcp": ("mcp",),
    "permit": ("audit",),
    "policy": ("policy",),
    "questions": ("requests",),
    "relay": ("tools",),
    "request": ("pipeline",),
    "serve": ("daemon",),
    "show": ("requests",),
    "storage": ("storage",),
    "verify": ("verify",),
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use (``COMMANDS``): ``hitl-gate
    request`` does not import the daemon, the inbox or the MCP server."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, sorted, without importing any."""
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, importing its modules first; None when unknown."""
        for module in COMMANDS.get(cmd_name, ()):
            importlib.import_module(f"gate.cli.{module}")
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hitl-gate")
def main() -> None:
    """hitl-gate: a human between an automated pipeline and a real-world action.

    Example: hitl-gate serve -c /etc/hitl-gate/config.yaml
    """


def input_name(path: str) -> str:
    """How a message names a file argument: the path, or "standard input" for ``-``."""
    return "standard input" if path == "-" else path


def read_input(option: str, path: str) -> bytes:
    """The bytes of ``path`` (``-``: all of standard input); exit 2 with one line naming
    ``option`` and the file (or standard input) when it cannot be read."""
    try:
        if path != "-":
            return Path(path).read_bytes()
        if sys.stdin is None:  # started with standard input closed (`<&-`)
            fail(f"{option}: cannot read standard input: it is closed", 2)
        return sys.stdin.buffer.read()
    except OSError as exc:
        fail(f"{option}: cannot read {input_name(path)}: {exc.strerror or exc}", 2)
