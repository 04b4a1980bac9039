"""``hitl-gate verify``: the conformance test of a live relay (SPEC §6), run against an
ephemeral gate (``gate.tools.conformance``)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from gate.cli import ed25519_pem, fail, main
from gate.cli.common import NumberType
from gate.cli.tools import relay_secret
from gate.errors import ConfigError


def _approver_public_key(path: str) -> str:
    """The PEM text of ``verify --approver-public-key``; exit 2 with one line unless it is
    a readable Ed25519 public key."""
    try:
        pem = Path(path).read_bytes()[: 64 * 1024]
    except OSError as exc:
        fail(f"--approver-public-key: cannot read {path}: {exc.strerror or exc}", 2)
    ed25519_pem(pem, "--approver-public-key", path)
    return pem.decode("ascii")


# where ``verify``'s ephemeral config takes each setting from
_VERIFY_OPTIONS = (
    ("relay.operators", "--approver"),
    ("relay.public_url", "--public-url"),
    ("relay.url", "RELAY_URL"),
    ("relay.callback_addr", "--listen"),
)


def _verify_option(error: str) -> str:
    """A config error of ``verify``'s ephemeral gate, named by the argument it came from
    (``relay.operators[0].identity: must not be empty`` -> ``--approver: must not be
    empty``)."""
    path, _, message = error.partition(": ")
    for prefix, option in _VERIFY_OPTIONS:
        if path.startswith(prefix):
            return f"{option}: {message}"
    return error


@main.command()
@click.argument("relay_url")
@click.option("--secret-env", required=True, help="Env var holding the shared relay secret.")
@click.option(
    "--approver",
    required=True,
    help="Identity the relay will report as approver (the human, or the auto account).",
)
@click.option(
    "--listen",
    default="127.0.0.1:0",
    show_default=True,
    help="host:port for the ephemeral gate's decision endpoint (port 0: any free port).",
)
@click.option(
    "--public-url",
    default=None,
    help="Base URL the relay calls back (default http://<listen>). A relay in the "
    "cloud (Power Automate, n8n cloud) needs a public URL that reaches --listen, "
    "e.g. through a tunnel or reverse proxy.",
)
@click.option(
    "--timeout",
    type=NumberType(low=1),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the relay's decision (a human may be answering).",
)
@click.option(
    "--notices",
    is_flag=True,
    help="The relay claims notice support (relay.notices): also check that it acks a "
    "signed resolution notice, refuses a badly signed one and never answers one.",
)
@click.option(
    "--questions",
    is_flag=True,
    help="The relay declares question support (relay.questions): also ask it a "
    "single-choice question, judge its answer and probe the gate's answer checks.",
)
@click.option(
    "--approver-public-key",
    "approver_public_key",
    default=None,
    help="The relay signs each decision as the approver: this Ed25519 public key, "
    "PEM, is enrolled for --approver on a step that requires approver signatures.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(
    relay_url: str,
    secret_env: str,
    approver: str,
    listen: str,
    public_url: str | None,
    timeout: float,
    notices: bool,
    questions: bool,
    approver_public_key: str | None,
    as_json: bool,
) -> None:
    """Conformance test of a live relay (SPEC §6): PASS/FAIL per check.

    Starts an ephemeral gate (the real decision handler over HTTP), dispatches a synthetic
    approval (pipeline hitl-conformance) plus a badly signed and a stale one, waits for the
    relay's decision, then checks replay, mutated-hash and out-of-scope refusals. With
    --notices, then sends the relay a signed resolution notice (must be acked 2xx within
    5 s), the same notice badly signed (must be refused) and waits that no decision comes
    back for it. With --questions, then asks the relay a single-choice question
    (options yes, no, später), judges its answer and checks that the gate refuses that
    answer replayed, with a wrong-typed value, with a mutated request_hash and turned into
    an approve. With --approver-public-key, the step requires approver
    signatures: the relay's decision must carry an Ed25519 approver_assertion by
    that key and be recorded with it, and the gate must refuse that assertion moved to
    another approval, with a batch that does not list the decision, and a decision without
    one.
    Exit 0 when every check passes, 1 when one fails, 2 for usage errors.

    Example: hitl-gate verify http://127.0.0.1:8091/ --secret-env HITL_RELAY_SECRET
    --approver alice@example.com
    """
    from gate.config import TcpListen, parse_listen
    from gate.tools.conformance.runner import run_verify

    secret = relay_secret(secret_env)
    public_pem = None
    if approver_public_key is not None:
        public_pem = _approver_public_key(approver_public_key)
    if not relay_url.startswith(("http://", "https://")):
        fail("RELAY_URL must be an http:// or https:// URL", 2)
    try:
        if not isinstance(parse_listen(listen), TcpListen):
            raise ValueError("unix sockets cannot be reached by a relay")
    except ValueError as exc:
        fail(f"--listen: {exc}", 2)
    try:
        report = asyncio.run(
            run_verify(
                relay_url,
                secret,
                approver,
                listen,
                public_url,
                timeout,
                notices,
                questions,
                public_pem,
            )
        )
    except OSError as exc:
        fail(f"--listen: cannot listen on {listen}: {exc}", 2)
    except ConfigError as exc:  # the ephemeral gate's config is built from the arguments
        fail("; ".join(_verify_option(error) for error in exc.errors), 2)
    click.echo(
        json.dumps(report.as_json(), ensure_ascii=False, indent=2) if as_json else report.as_text()
    )
    sys.exit(0 if report.ok else 1)
