"""``hitl-gate`` commands that start separate programs: ``doctor``, ``keygen``, ``relay``
(``verify`` is in ``gate.cli.verify``)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click

from gate.cli import (
    CONFIG_OPTION,
    fail,
    main,
    run,
)
from gate.cli.common import NumberType
from gate.errors import GateError


def relay_secret(var: str) -> str:
    """Return the relay secret from env ``var``; exit 2 if unset or padded with whitespace
    (a trailing newline would silently break every signature: case H04)."""
    secret = os.environ.get(var)
    if not secret:
        fail(f"--secret-env: environment variable {var} is not set", 2)
    if secret != secret.strip():
        fail(
            f"--secret-env: {var} has leading or trailing whitespace (often a trailing "
            "newline); remove it",
            2,
        )
    return secret


@main.command()
@CONFIG_OPTION
def doctor(config_path: str) -> None:
    """Check a deployment: config, secrets, keys, database integrity, audit chain, relay
    reachable, clock. One PASS/WARN/FAIL/SKIP line per check; writes nothing.

    With storage.url (PostgreSQL) the audit chain is verified on the database, and the gates
    sharing it are checked: live ones, one config (this file's), clocks, the timers' holder.

    The relay counts as reachable when it answers HEAD or OPTIONS with any HTTP status
    (405 too). The clock is compared with the relay's Date header. Exit 0 when no check
    failed (warnings allowed), 1 otherwise.

    Example: hitl-gate doctor -c /etc/hitl-gate/config.yaml
    """
    from gate.tools.doctor import run_checks

    checks = run(run_checks(config_path, os.environ))
    for check in checks:
        click.echo(check.line())
    sys.exit(0 if all(check.ok for check in checks) else 1)


@main.command()
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for the key pair (created 0700 if missing).",
)
def keygen(out_dir: str) -> None:
    """Write a new Ed25519 key pair for signed audit entries and permits, or for an
    approver's own signature; print its key id.

    DIR/hitl-gate-ed25519.key (private, PEM, mode 0600; never overwritten) goes to
    receipts.signing_key_file; DIR/hitl-gate-ed25519.pub (public, PEM) goes to auditors and
    to the tool that executes approved actions. Key id = "ed25519:" + the first 16 hex
    digits of SHA-256 of the raw 32-byte public key.

    The pair also serves as an approver's Ed25519 key (one pair per approver, in
    its own DIR): hitl-gate approvers add-key takes the .pub, hitl-gate relay --approver-key
    the .key.

    Example: hitl-gate keygen --out /etc/hitl-gate/keys
    """
    from gate.trust.keys import generate

    try:
        private_path, public_path, kid = generate(Path(out_dir))
    except GateError as exc:
        fail(exc.message)
    click.echo(
        f"wrote {private_path} (private key, mode 0600: receipts.signing_key_file)", err=True
    )
    click.echo(f"wrote {public_path} (public key: give it to verifiers)", err=True)
    click.echo(kid)


@main.command()
@click.option(
    "--listen",
    default="127.0.0.1:8091",
    show_default=True,
    help="host:port to receive dispatches on (port 0: any free port).",
)
@click.option("--secret-env", required=True, help="Env var holding the shared relay secret.")
@click.option(
    "--as",
    "identities",
    multiple=True,
    help="Decide as this identity (repeat for several approvers). Default: the first "
    "approver in the dispatch.",
)
@click.option(
    "--auto",
    default=None,
    help="Decide without asking: approve, skip, skip:REASON (a skip with its reason) or "
    "adjust:TEXT.",
)
@click.option(
    "--auto-answer",
    default=None,
    help="With --auto: answer every question with VALUE, read as JSON when that fits the "
    "question (a number, a list, a form's object), else as plain text.",
)
@click.option(
    "--max-skew",
    type=NumberType(),
    default=300.0,
    show_default=True,
    help="Refuse dispatches signed more than this many seconds away.",
)
@click.option(
    "--approver-key",
    "approver_key_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Sign every decision with this Ed25519 private key, PEM (hitl-gate keygen "
    "--out DIR writes DIR/hitl-gate-ed25519.key). Prints its credential id at start.",
)
def relay(
    listen: str,
    secret_env: str,
    identities: tuple[str, ...],
    auto: str | None,
    auto_answer: str | None,
    max_skew: float,
    approver_key_path: str | None,
) -> None:
    """Reference relay: verify each dispatch, ask a human on this terminal (or decide
    automatically with --auto), sign the decision and post it back.

    At a terminal, keys typed before a draft and its prompt are on screen are discarded;
    answer a, s or e (or approve, skip, edit), and on a step of risk high or critical the
    whole word. Stdin that is no terminal (a pipe, a file) is a script: one line answers
    each prompt, in order, however early it was written. A prompt whose approval went
    stale (a newer revision, expired) is withdrawn with a line saying why.

    A question is shown apart, under a QUESTION header, and answered by its
    type: a line of text, the number of an option, comma-separated numbers, or one line
    per form field; an answer that does not fit is refused here and asked again, as is one
    the gate refuses (422). With --auto, questions get --auto-answer (without it they are
    refused 503 no_auto_answer).

    Asking (no --auto) with stderr on a terminal, only warnings and errors are logged,
    never inside a draft or prompt (they follow it); redirect stderr (2>relay.log) to keep
    the INFO lines.

    With --approver-key, each decision carries an approver_assertion signed by that key:
    enrol its public half once with hitl-gate approvers add-key; the credential
    id is printed on stderr at start ("approver key: credential <id>").

    Example: HITL_RELAY_SECRET=... hitl-gate relay --secret-env HITL_RELAY_SECRET --auto approve
    """
    from gate import logs
    from gate.config import parse_listen
    from gate.config.values import identity_problem
    from gate.protocol.whitespace import is_blank, is_trimmed
    from gate.tools.reference_relay.approver_key import ApproverKey
    from gate.tools.reference_relay.relay import AutoDecision
    from gate.tools.reference_relay.server import run_relay
    from gate.tools.reference_relay.terminal import NoScreen
    from gate.trust.keys import private_key_mode_problem

    secret = relay_secret(secret_env)
    try:
        parse_listen(listen)
    except ValueError as exc:
        fail(f"--listen: {exc}", 2)
    try:
        auto_decision = AutoDecision.parse(auto) if auto else None
    except ValueError as exc:
        fail(f"--auto: {exc}", 2)
    if auto_answer is not None and auto_decision is None:
        fail("--auto-answer needs --auto (without it, questions are asked on the terminal)", 2)
    for identity in identities:  # a dispatch's scope never names such an identity
        if is_blank(identity) or not is_trimmed(identity):
            fail(f"--as: {identity!r} is not an identity (empty, or spaces around it)", 2)
        problem = identity_problem(identity)
        if problem is not None:
            fail(
                f"--as: {identity!r} {problem.split(';')[0]}; no dispatch names such an identity", 2
            )
    approver_key = None
    if approver_key_path is not None:
        try:
            approver_key = ApproverKey.load(Path(approver_key_path))
            mode = os.stat(approver_key_path).st_mode
        except (ValueError, OSError) as exc:
            fail(f"--approver-key: {exc}", 2)
        problem = private_key_mode_problem(Path(approver_key_path), mode)
        if problem is not None:  # like receipts.signing_key_file (new-user finding L1)
            fail(f"--approver-key: {problem}", 2)
        click.echo(
            f"approver key: credential {approver_key.credential_id} (enrol its public key: "
            "hitl-gate approvers add-key)",
            err=True,
        )
    # asking on a terminal: INFO lines would land in the drafts and prompts
    logs.configure("WARNING" if auto_decision is None and sys.stderr.isatty() else "INFO")
    try:
        asyncio.run(
            run_relay(
                listen, secret, identities, auto_decision, max_skew, auto_answer, approver_key
            )
        )
    except NoScreen as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"cannot listen on {listen}: {exc}")
