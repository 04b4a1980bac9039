"""``hitl-gate`` commands that check what the gate wrote and signed: ``audit verify``,
``audit export``, ``permit verify``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from gate.cli import (
    fail,
    main,
    public_keys,
    read_config,
    read_input,
)
from gate.cli.databases import configured, database_options, given
from gate.errors import ConfigError, GateError

if TYPE_CHECKING:
    from gate.audit.verify import AuditReport
    from gate.store.readonly import Database

F = TypeVar("F", bound=Callable[..., Any])


@main.group()
def audit() -> None:
    """Audit trail: verify the hash chain and receipts, export JSON Lines.

    Example: hitl-gate audit verify -c config.example.yaml
    """


def config_source(verb: str) -> Callable[[F], F]:
    """The optional ``-c/--config`` of an ``audit`` command (also ``HITL_GATE_CONFIG``): the
    database it names; its help starts with ``verb`` (``Verify``)."""
    return click.option(
        "-c",
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        envvar="HITL_GATE_CONFIG",
        help=f"{verb} the database named by this config.",
    )


def log_source(verb: str) -> Callable[[F], F]:
    """``-c/--config`` and ``--file``: the database or the export an ``audit`` command reads
    (with ``--db``, exactly one: ``one_database``); their help starts with ``verb``."""
    config = config_source(verb)
    export = click.option(
        "--file",
        "export_file",
        type=click.Path(dir_okay=False),
        default=None,
        help=f"{verb} an export (JSON Lines) instead of the database.",
    )
    return lambda command: config(export(command))


def one_database(
    config_path: str | None, db: str | None, password_env: str | None, *others: str | None
) -> None:
    """Exit 2 unless exactly one of ``-c``, ``--db`` and ``others`` (``--file``, when the
    command takes one) was given, or when ``--password-env`` comes without ``--db``."""
    if sum(x is not None for x in (config_path, db, *others)) != 1:
        listed = "-c/--config, --db or --file" if others else "-c/--config or --db"
        fail(f"give exactly one of {listed}", 2)
    if password_env is not None and db is None:
        fail("--password-env: only with --db (a config names its storage.password_env)", 2)


def database(config: Any, db: str | None, password_env: str | None) -> Database | None:
    """The database an ``audit`` command reads: ``--db``'s, else the config's; None for
    an export (neither)."""
    if db is not None:
        return given(db, password_env)
    return None if config is None else configured(config)


def _files(flag: str, name: str, text: str, required: bool = False) -> Callable[[F], F]:
    """A repeatable option naming a file (``--public-key``, ``--expect``)."""
    return click.option(
        flag, name, multiple=True, required=required, type=click.Path(dir_okay=False), help=text
    )


@audit.command("verify")
@log_source("Verify")
@click.option(
    "--key-env",
    "key_envs",
    multiple=True,
    help="Env var with a receipt key (default: the config's receipts.key_env and "
    "receipts.previous_key_env); repeat for a log whose key was rotated: each "
    "entry is checked with the key of its span.",
)
@_files(
    "--public-key",
    "public_key_files",
    "Ed25519 public key (PEM) trusted for entry signatures; repeat for rotated "
    "keys. No secret needed.",
)
@_files(
    "--expect",
    "expect_files",
    "A receipt (JSON, or an approval object holding one) the log must hold; "
    "catches a deleted tail. Repeatable.",
)
@click.option(
    "--records/--no-records",
    default=True,
    show_default=True,
    help="With -c: also check the approvals, revisions and decisions tables against "
    "the verified log (names the first approval that disagrees).",
)
@click.option(
    "--expect-head",
    "expect_heads",
    multiple=True,
    metavar="SEQ:HASH",
    callback=lambda _ctx, _param, values: _expect_heads(values),
    help="A chain head the gate logged (event=audit_head seq=SEQ hash=HASH) that "
    "the log must hold; catches a deleted or rewritten tail. Repeatable.",
)
@database_options("Verify")
def audit_verify(
    config_path: str | None,
    export_file: str | None,
    key_envs: tuple[str, ...],
    public_key_files: tuple[str, ...],
    expect_files: tuple[str, ...],
    records: bool,
    expect_heads: list[tuple[int, str]],
    db: str | None,
    password_env: str | None,
) -> None:
    """Recompute the audit chain, every receipt and every signature; name the first bad entry.

    With --public-key (or a config with receipts.signing_key_file/trusted_public_keys)
    every entry must be signed by a trusted key, except entries written before signing
    was enabled. With -c, also compare every approval's rows (state, outcome, receipt,
    revisions and their bodies, decisions) with what the verified log says of it
    (--no-records skips this). Across a rotation of the receipt key give every key the log
    used (any order); a key that fits no entry 1 (or no rotation) is named as such, exit 1.
    Exit 0 intact, 1 tampered, 2 usage.

    --expect FILE and --expect-head SEQ:HASH anchor the log to what is held outside the
    database (a receipt a pipeline kept, a head the gate logged): a tail deleted after an
    anchor is named, one deleted after the newest anchor given is not.

    Example: hitl-gate audit verify --file audit.jsonl --public-key hitl-gate-ed25519.pub
    --expect receipt.json
    """
    from gate.audit.report import KeysUsed, verdict

    one_database(config_path, db, password_env, export_file)
    config = read_config(config_path) if config_path else None
    public = _trusted_keys(config, public_key_files)
    expected = _expected(expect_files)
    where, names, key = _verify_keys(config, key_envs)
    anchors = [(f"receipt {path}", held) for path, held in expected]
    source = database(config, db, password_env)
    report = _report(source, export_file, key, public, anchors, expect_heads, records)
    keys = KeysUsed(
        where,
        tuple(names),
        bool(key),
        bool(public),
        config.receipts.key_env if config is not None and not key_envs else None,
    )
    said = verdict(
        report,
        keys,
        held_seqs=[held["seq"] for _, held in expected],
        head_seqs=[s for s, _ in expect_heads],
    )
    for line in said.out:
        click.echo(line)
    for line in said.err:
        click.echo(line, err=True)
    sys.exit(said.exit_code)


def _trusted_keys(config: Any, files: tuple[str, ...]) -> dict[str, Any]:
    """The public keys given with --public-key and, with -c, those of the config (its
    signing key's public half, its trusted keys). Exits 2 naming a config error."""
    from gate.trust.keys import load_receipt_keys

    public = public_keys(files)
    if config is not None:
        try:  # with --public-key the private signing key is not needed (nor read)
            public.update(load_receipt_keys(config.receipts, private=not public).public)
        except ConfigError as exc:
            hint = (
                "; to verify without the private key, give its public key with --public-key"
                if any(e.startswith("receipts.signing_key_file") for e in exc.errors)
                else ""
            )
            fail("; ".join(exc.errors) + hint, 2)
    return public


def _expected(files: tuple[str, ...]) -> list[tuple[Path, dict[str, Any]]]:
    """The receipts of --expect, ``(path, receipt)``; exits 2 naming one it cannot read."""
    from gate.audit.inputs import read_expected

    try:
        return [read_expected(Path(f)) for f in files]
    except GateError as exc:
        fail(f"--expect: {exc.message}", 2)


def _report(
    source: Database | None,
    export_file: str | None,
    key: tuple[bytes, ...],
    public: dict[str, Any],
    anchors: list[tuple[str, dict[str, Any]]],
    heads: list[tuple[int, str]],
    records: bool,
) -> AuditReport:
    """The report on the database ``source`` (with its records, when ``records``), else
    on the export ``export_file``. An export that is not intact, or holds no entry, is
    TAMPERED (exit 1); one that cannot be read, or no database, exits 2."""
    from gate.audit.inputs import read_export
    from gate.audit.verify import verify_database, verify_rows

    trusted = public or None
    try:
        if source is not None:
            return verify_database(
                source,
                key,
                public_keys=trusted,
                expect=anchors,
                expect_heads=heads,
                records=records,
            )
        rows = read_export(Path(str(export_file)))
        if not rows:
            click.echo("TAMPERED: the export holds no entries (nothing to verify)")
            sys.exit(1)
        return verify_rows(rows, key, public_keys=trusted, expect=anchors, expect_heads=heads)
    except GateError as exc:
        if exc.code == "bad_export_line":  # a readable export that is not intact
            click.echo(f"TAMPERED: {exc.message}")
            sys.exit(1)
        fail(exc.message, 2 if exc.code in ("no_database", "unreadable_export") else 1)


def _expect_heads(values: tuple[str, ...]) -> list[tuple[int, str]]:
    """``--expect-head`` values as ``(seq, entry_hash)``; a bad one exits 2 naming it."""
    from gate.audit.inputs import parse_head

    try:
        return [parse_head(value) for value in values]
    except GateError as exc:
        fail(f"--expect-head: {exc.message}", 2)


def _verify_keys(
    config: Any, key_envs: tuple[str, ...]
) -> tuple[str, list[str], tuple[bytes, ...]]:
    """``audit verify``'s receipt keys: ``(where they were named, variable names, keys)``.
    ``--key-env`` given: those variables; else, with ``-c``, ``receipts.key_env`` and
    ``receipts.previous_key_env``. A variable holding the same key as an earlier one is
    dropped. Exits 2 when a variable is not set."""
    if key_envs:
        where, wanted = "--key-env", list(key_envs)
    elif config is not None:
        wanted = [config.receipts.key_env] + [config.receipts.previous_key_env] * bool(
            config.receipts.previous_key_env
        )
        where = "receipts.key_env" + (" and receipts.previous_key_env" if len(wanted) > 1 else "")
    else:
        return "", [], ()
    names: list[str] = []
    keys: list[bytes] = []
    for var in dict.fromkeys(wanted):
        value = os.environ.get(var)
        if not value:
            fail(f"environment variable {var} (receipt key) is not set", 2)
        if value.encode("utf-8") not in keys:
            names.append(var)
            keys.append(value.encode("utf-8"))
    return where, names, tuple(keys)


@audit.command("export")
@config_source("Export")
@database_options("Export")
@click.option("-o", "--output", default="-", help="Output file (default stdout).")
def audit_export(
    config_path: str | None, db: str | None, password_env: str | None, output: str
) -> None:
    """Write the audit log as JSON Lines, one entry per line, streamed (constant memory).

    Example: hitl-gate audit export -c config.example.yaml -o audit.jsonl
    """
    from gate.audit.export import export_line
    from gate.audit.verify import read_database

    one_database(config_path, db, password_env)
    source = database(read_config(config_path) if config_path else None, db, password_env)
    assert source is not None  # one of -c and --db
    try:
        rows = read_database(source)
    except GateError as exc:
        fail(exc.message)
    try:
        if output == "-":
            sys.stdout.writelines(export_line(r) + "\n" for r in rows)
        else:
            with open(output, "w", encoding="utf-8") as out:
                out.writelines(export_line(r) + "\n" for r in rows)
    except GateError as exc:  # a read error half-way: no partial export left behind
        _discard(output)
        fail(exc.message)
    except OSError as exc:
        _discard(output)
        fail(f"-o: cannot write {output}: {exc.strerror}")


def _discard(output: str) -> None:
    """Remove what an export that failed half-way wrote to ``output`` (not stdout)."""
    if output != "-":
        with contextlib.suppress(OSError):
            Path(output).unlink()


@main.group()
def permit() -> None:
    """Execution permits: verify one offline before executing the approved body.

    Example: hitl-gate permit verify permit.jws --public-key hitl-gate-ed25519.pub
    --body-file mail.txt --pipeline invoices --step send-followup
    """


@permit.command("verify")
@click.argument("permit_file", type=click.Path(dir_okay=False))
@_files(
    "--public-key",
    "public_key_files",
    "The gate's Ed25519 public key (PEM); repeat to trust rotated keys.",
    required=True,
)
@click.option(
    "--body-file", required=True, help="The exact body about to be executed (file, or - for stdin)."
)
@click.option("--pipeline", default=None, help="Also require the permit to be for this pipeline.")
@click.option("--step", default=None, help="Also require the permit to be for this step.")
@click.option("--json", "as_json", is_flag=True, help="Print the verified claims as JSON.")
def permit_verify(
    permit_file: str,
    public_key_files: tuple[str, ...],
    body_file: str,
    pipeline: str | None,
    step: str | None,
    as_json: bool,
) -> None:
    """Check a permit's signature, expiry, and that the body hashes to its payload_hash.

    Exit 0 valid (execute), 1 invalid (do not execute; the reason is printed), 2 usage.
    Give --pipeline and --step of the action about to run: without them a permit of any
    step passes (stderr then says so and names the permit's pipeline/step).

    Example: hitl-gate permit verify permit.jws --public-key hitl-gate-ed25519.pub
    --body-file mail.txt --pipeline invoices --step send-followup
    """
    from gate.protocol.times import rfc3339_ms
    from gate.trust import permit as permit_mod

    public = public_keys(public_key_files)
    try:
        token = permit_mod.read(Path(permit_file))
    except OSError as exc:
        fail(f"cannot read {permit_file}: {exc.strerror or exc}", 2)
    body = read_input("--body-file", body_file)
    try:
        verified = permit_mod.verify(token, public, body, time.time(), pipeline=pipeline, step=step)
    except permit_mod.PermitError as exc:
        click.echo(f"INVALID: {exc.code}: {exc.message}")
        sys.exit(1)
    claims = verified.claims
    unchecked = [name for name, given in (("pipeline", pipeline), ("step", step)) if given is None]
    if unchecked:
        what = " or ".join(unchecked)
        flags = " and ".join(f"--{name}" for name in unchecked)
        click.echo(
            f"warning: the permit is for {claims['pipeline']}/{claims['step']}; {flags} "
            f"{'were' if len(unchecked) > 1 else 'was'} not given, so a permit for "
            f"another {what} would pass too",
            err=True,
        )
    if as_json:
        click.echo(json.dumps(claims, ensure_ascii=False, indent=2))
        return
    approvers = ", ".join(
        str(a.get("identity") or a.get("operator_id")) for a in claims["approved_by"]
    )
    click.echo(
        f"ok: permit for approval {claims['approval_id']} ({claims['pipeline']}/"
        f"{claims['step']}, {claims['outcome']} by {approvers}), body "
        f"{claims['payload_hash']}, valid until {rfc3339_ms(claims['exp'] * 1000)}"
    )
