"""``hitl-gate`` commands: each parses, calls one function, prints; errors become one line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from gate import __version__
from gate.errors import ConfigError, GateError

T = TypeVar("T")

CONFIG_OPTION = click.option(
    "-c",
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    envvar="HITL_GATE_CONFIG",
    help="Path to the YAML config (env HITL_GATE_CONFIG).",
)
API_URL_OPTION = click.option(
    "--api-url",
    envvar="HITL_GATE_API_URL",
    default=None,
    help="Reach the API here instead of api.listen (http://host:port or unix:/path).",
)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``Error: message`` on stderr and exit with ``code``."""
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Prepare the cyclic garbage collector of a long-running daemon process (``serve``).

    Collects once, then freezes what exists (modules, the loaded config: objects that live
    as long as the process) so no later collection scans them again, and lets the
    youngest generation grow to ``GC_THRESHOLDS[0]`` container allocations before it is
    collected (CPython's default is 700). Reference counting still frees everything
    acyclic at once; only cyclic garbage waits for a collection. Measured under the
    decisions benchmark (docs/performance.md): time in collections 0.18-0.38 s -> 0.02 s per
    run (the one left is the collect above, before serving), and no more full collections
    over the startup objects during the load (each paused the event loop for up to 41 ms).
    Not applied to in-process uses (tests, ``verify``): only to the daemon's own process.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


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


def _config(path: str) -> Any:
    from gate.config import load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        for line in exc.errors:
            click.echo(f"{path}: {line}", err=True)
        sys.exit(2)


def _receipt_keys(config: Any, *, private: bool = True) -> Any:
    """Load the config's Ed25519 keys (``gate.trust.keys.load_receipt_keys``); ConfigError if
    bad."""
    from gate.trust.keys import load_receipt_keys

    return load_receipt_keys(config.receipts, private=private)


def _public_keys(paths: tuple[str, ...], option: str = "--public-key") -> dict[str, Any]:
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


def _relay_secret(var: str) -> str:
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


def _client(config_path: str, api_url: str | None, config: Any = None) -> Any:
    from gate.client.api import ApiClient, api_base
    from gate.config import read_api_token

    if config is None:
        config = _config(config_path)
    # as serve reads it: the variable, else its file in $CREDENTIALS_DIRECTORY
    token, error = read_api_token(config, os.environ)
    if token is None:
        fail(error or f"api.token_env: {config.api.token_env} is not set", 2)
    if not token.isprintable():
        fail(f"api.token_env: {config.api.token_env} has control characters; remove them", 2)
    if api_url is not None and not _valid_api_url(api_url):
        fail(f"--api-url: {api_url!r} is not http://host:port, https://host:port or unix:/path", 2)
    return ApiClient(api_url or api_base(config), token)


def _valid_api_url(url: str) -> bool:
    """True for ``http(s)://host[:port][/prefix]`` or ``unix:/path`` (``--api-url``)."""
    if url.startswith("unix:"):
        return len(url) > len("unix:")
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hitl-gate")
def main() -> None:
    """hitl-gate: a human between an automated pipeline and a real-world action.

    Example: hitl-gate serve -c /etc/hitl-gate/config.yaml
    """


@main.command()
@CONFIG_OPTION
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="text: one key=value line per event, for people; json: one JSON object "
    "per line (ts, level, logger, event, fields), for journald and collectors.",
)
def serve(config_path: str, log_level: str, log_format: str) -> None:
    """Run the daemon: relay callback listener + pipeline API. Logs to stderr.

    Exit 0 on SIGTERM/SIGINT after a clean stop, 2 on a config error, 1 when it cannot
    start (database, bind) or stopped because its database writer process died.

    Example: hitl-gate serve -c config.example.yaml
    """
    from gate import logs
    from gate.config import load
    from gate.daemon.serve import serve as serve_forever

    logs.configure(log_level, log_format)

    def stop(code: int, event: str, lines: list[str]) -> NoReturn:
        # with --log-format json every stderr line is JSON, start failures included
        for line in lines:
            if log_format == "json":
                logging.getLogger("gate.cli").error("event=%s error=%s", event, line)
            else:
                click.echo(line if event == "config_invalid" else f"Error: {line}", err=True)
        sys.exit(code)

    try:
        config, secrets = load(config_path, os.environ)
        _receipt_keys(config)
    except ConfigError as exc:
        stop(2, "config_invalid", [f"{config_path}: {line}" for line in exc.errors])
    for warning in secrets.warnings:
        logging.getLogger("gate.cli").warning("event=weak_secret warning=%s", warning)
    tune_gc()
    try:
        asyncio.run(serve_forever(config, secrets))
    except ConfigError as exc:
        stop(2, "config_invalid", [f"{config_path}: {line}" for line in exc.errors])
    except GateError as exc:
        stop(1, "serve_failed", [exc.message])
    except OSError as exc:
        stop(1, "serve_failed", [f"cannot listen: {exc}"])


@main.command("check-config")
@CONFIG_OPTION
def check_config(config_path: str) -> None:
    """Validate the config and its secret variables; list every error with its YAML path.

    Exit 0 when valid (a secret shorter than 32 bytes is a warning on stderr), 2 otherwise
    (a secret shorter than 16 bytes is an error).

    Example: hitl-gate check-config -c config.example.yaml
    """
    from gate.config import load

    try:
        config, secrets = load(config_path, os.environ)
        _receipt_keys(config)
    except ConfigError as exc:
        for line in exc.errors:
            click.echo(f"{config_path}: {line}", err=True)
        sys.exit(2)
    for warning in secrets.warnings:
        click.echo(f"{config_path}: warning: {warning}", err=True)
    steps = sum(len(p.steps) for p in config.pipelines)
    click.echo(
        f"{config_path}: ok ({len(config.pipelines)} pipelines, {steps} steps, "
        f"{len(config.relay.operators)} operators)"
    )


@main.command()
@CONFIG_OPTION
def doctor(config_path: str) -> None:
    """Check a deployment: config, secrets, keys, database integrity, audit chain, relay
    reachable, clock. One PASS/WARN/FAIL/SKIP line per check; writes nothing.

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


def _input_name(path: str) -> str:
    """How a message names a file argument: the path, or "standard input" for ``-``."""
    return "standard input" if path == "-" else path


def _read_input(option: str, path: str) -> bytes:
    """The bytes of ``path`` (``-``: all of standard input); exit 2 with one line naming
    ``option`` and the file (or standard input) when it cannot be read."""
    try:
        if path != "-":
            return Path(path).read_bytes()
        if sys.stdin is None:  # started with standard input closed (`<&-`)
            fail(f"{option}: cannot read standard input: it is closed", 2)
        return sys.stdin.buffer.read()
    except OSError as exc:
        fail(f"{option}: cannot read {_input_name(path)}: {exc.strerror or exc}", 2)


def _draft_source(draft_file: str | None) -> str:
    """How an error names where the draft came from: ``--draft``, ``--draft-file: PATH`` or
    ``--draft-file: standard input``."""
    if draft_file is None:
        return "--draft: the draft"
    return f"--draft-file: {_input_name(draft_file)}"


def _check_not_blank(
    config: Any, pipeline: str, step: str, text: str, draft_file: str | None
) -> None:
    """Exit 2 on a draft that is empty or only White_Space unless the step (in this config)
    allows it; a step this config does not know is left to the gate (404 or its own rule)."""
    from gate.protocol.whitespace import is_blank

    found = config.find_step(pipeline, step)
    if found is None or found[1].allow_empty_draft or not is_blank(text):
        return
    what = "empty" if text == "" else "only white space"
    fail(
        f"{_draft_source(draft_file)} is {what}: nothing to approve (allow_empty_draft: true "
        "on the step allows it)",
        2,
    )


def _read_draft(draft: str | None, draft_file: str | None) -> str:
    if (draft is None) == (draft_file is None):
        fail("give exactly one of --draft or --draft-file", 2)
    if draft is not None:
        return draft
    assert draft_file is not None
    raw = _read_input("--draft-file", draft_file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # exc.start: the first byte that is not UTF-8
        fail(
            f"--draft-file: {_input_name(draft_file)} is not valid UTF-8 (byte offset {exc.start})",
            2,
        )


@main.command()
@CONFIG_OPTION
@API_URL_OPTION
@click.option("--pipeline", required=True, help="Pipeline name from the config.")
@click.option("--step", required=True, help="Step name within the pipeline.")
@click.option("--run-id", default=None, help="Correlates the approval with the pipeline run.")
@click.option("--draft", default=None, help="The draft text to approve.")
@click.option("--draft-file", default=None, help="Read the draft from a file, or - for stdin.")
@click.option("--content-type", default="text/plain", show_default=True)
@click.option(
    "--spend", type=float, default=None, help="Cost of the action, in budget.unit (a number >= 0)."
)
@click.option("--idempotency-key", default=None, help="Retry-safe key: same key, same approval.")
@click.option(
    "--requested-by",
    default=None,
    help="Identity of the operator asking; they may not approve it themselves.",
)
@click.option("--wait", is_flag=True, help="Block until resolved; print the final body.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="With --wait: give up waiting after SEC seconds (exit 4).",
)
@click.option(
    "--permit-out",
    type=click.Path(dir_okay=False),
    default=None,
    help="With --wait: save the execution permit (JWS) here when approved/adjusted; "
    "any other outcome removes FILE.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the approval object as JSON.")
@click.option("--quiet", is_flag=True, help="Do not report hops on stderr.")
def request(
    config_path: str,
    api_url: str | None,
    pipeline: str,
    step: str,
    run_id: str | None,
    draft: str | None,
    draft_file: str | None,
    content_type: str,
    spend: float | None,
    idempotency_key: str | None,
    requested_by: str | None,
    wait: bool,
    timeout: float | None,
    permit_out: str | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Ask for approval of a draft; with --wait, block and print the final body.

    Exit 0 approved/adjusted, 3 skipped, 4 timeout, 5 cancelled, 1 gate error, 2 usage.
    A --timeout that elapses while the approval is still pending exits 4 too (the
    approval stays pending on the gate; the action must not fire). With --permit-out,
    an approved/adjusted approval without a permit (no signing key) exits 1.

    Example: hitl-gate request -c config.example.yaml --pipeline invoice-due-diligence
    --step send-followup --draft-file mail.txt --wait
    """
    from ulid import ULID

    from gate.client.request import EXIT_CODES, create_with_retry, wait_for_outcome
    from gate.core.requests import (
        MAX_SPEND,
        has_control_characters,
        idempotency_key_fits,
        spend_problem,
    )

    if permit_out is not None and not wait:
        fail("--permit-out needs --wait", 2)
    if permit_out is not None:  # before a human is asked, not after
        folder = Path(permit_out).absolute().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            fail(f"--permit-out: {folder} is not a directory this user can write to", 2)
    if idempotency_key is not None and (
        not idempotency_key_fits(idempotency_key) or has_control_characters(idempotency_key)
    ):
        fail(
            "--idempotency-key: must be 1-200 characters, not blank, without control characters", 2
        )
    text = _read_draft(draft, draft_file)
    config = _config(config_path)
    _check_not_blank(config, pipeline, step, text, draft_file)
    if spend is not None and spend_problem(spend) is not None:
        fail(f"--spend: must be a finite number >= 0 and <= {MAX_SPEND:g}", 2)
    created: dict[str, str] = {}
    body: dict[str, Any] = {
        "pipeline": pipeline,
        "step": step,
        "draft": {"content_type": content_type, "body": text},
    }
    if run_id:
        body["run_id"] = run_id
    if spend is not None:
        body["spend"] = spend
    if requested_by is not None:
        body["requested_by"] = requested_by

    def report(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    # --wait retries a create the gate cannot take now; a key of its own makes that safe
    key = idempotency_key or (f"hitl-request-{ULID()}" if wait else None)
    # one deadline for the create (retried) and the wait after it
    deadline = None if timeout is None else time.monotonic() + timeout

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    async def go() -> dict[str, Any] | None:
        async with _client(config_path, api_url, config) as api:
            if wait:
                assert key is not None
                answered = await create_with_retry(api, body, key, left(), report)
                if answered is None:
                    return None
                approval, new = answered
            else:
                approval, new = await api.create(body, idempotency_key)
            created["id"] = approval["approval_id"]
            if new:
                report(
                    f"requested approval {approval['approval_id']} for {pipeline}/{step} "
                    f"(quorum {approval['quorum']['required']}, {approval['payload_hash']})"
                )
            else:
                state = approval["state"] + (
                    f", outcome {approval['outcome']}" if approval["state"] == "resolved" else ""
                )
                report(
                    f"already requested: approval {approval['approval_id']} for "
                    f"{pipeline}/{step} (the same request with Idempotency-Key "
                    f"{key} was made before; state {state})"
                )
            if not wait:
                return dict(approval)
            return await wait_for_outcome(api, approval, left(), report)

    def left_behind() -> str:
        if "id" not in created:
            if wait:  # an attempt may have landed with its answer unseen
                return (
                    "no approval was seen created (to find one that landed after all, "
                    f"run the same command with --idempotency-key {key})"
                )
            return "no approval was created"
        return (
            f"approval {created['id']} is still pending on the gate; the action must not "
            f"fire (cancel it with: {_cancel_command(config_path, api_url, created['id'])})"
        )

    result = run(go(), left_behind)
    if result is None:
        fail(
            f"the gate did not take the request within {timeout:g} s: nothing may fire; run "
            f"the same command again with --idempotency-key {key} to find it if it lands "
            "later",
            4,
        )
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False, indent=2))
    if not wait:
        if not as_json:
            click.echo(result["approval_id"])
        return
    if result["state"] != "resolved":
        click.echo(
            f"Error: still pending after {timeout:g} s: approval {result['approval_id']}"
            " (the action must not fire; cancel it with: "
            f"{_cancel_command(config_path, api_url, result['approval_id'])})",
            err=True,
        )
        sys.exit(4)
    if permit_out is not None:
        _save_permit(Path(permit_out), result, report)
    if result["final_body"] is not None and not as_json:
        sys.stdout.write(result["final_body"])
        sys.stdout.flush()
    sys.exit(EXIT_CODES[result["outcome"]])


def _cancel_command(config_path: str | None, api_url: str | None, approval_id: str) -> str:
    """The ``hitl-gate cancel`` command line for ``approval_id``, runnable as printed."""
    words = ["hitl-gate", "cancel"]
    if config_path:
        words += ["-c", config_path]
    if api_url:
        words += ["--api-url", api_url]
    return " ".join(shlex.quote(word) for word in [*words, approval_id])


def _save_permit(path: Path, approval: dict[str, Any], report: Any) -> None:
    from gate.protocol.envelope import rfc3339
    from gate.trust import permit

    try:
        if approval["final_body"] is None:
            path.unlink(missing_ok=True)  # no earlier permit may pass for this outcome's
            return
        if not approval.get("permit"):
            path.unlink(missing_ok=True)  # an older permit must not pass for this approval
            fail(
                f"approval {approval['approval_id']} is {approval['outcome']} but the gate "
                "issued no permit (receipts.signing_key_file is not configured)"
            )
        exp = permit.unverified_expiry(approval["permit"])
        if exp is not None and exp <= time.time():  # a replay long after the resolution
            path.unlink(missing_ok=True)
            fail(
                f"the permit of approval {approval['approval_id']} expired at "
                f"{rfc3339(exp * 1000)}: the action must not fire on it; request again with "
                "a new Idempotency-Key"
            )
        permit.save(path, approval["permit"])
    except OSError as exc:
        fail(f"--permit-out: cannot write {path}: {exc.strerror or exc}")
    report(f"permit saved to {path}")


@main.command("list")
@CONFIG_OPTION
@API_URL_OPTION
@click.option(
    "--state",
    type=click.Choice(["pending", "resolved", "all"]),
    default="pending",
    show_default=True,
)
@click.option("--pipeline", default=None)
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--cursor", default=None, help="next_cursor from the previous page.")
@click.option("--json", "as_json", is_flag=True)
def list_cmd(
    config_path: str,
    api_url: str | None,
    state: str,
    pipeline: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List approvals, one line each (or JSON).

    Example: hitl-gate list -c config.example.yaml --state pending
    """

    async def go() -> Any:
        async with _client(config_path, api_url) as api:
            return await api.list(state, pipeline, limit, cursor)

    page = run(go())
    if as_json:
        click.echo(json.dumps(page, ensure_ascii=False, indent=2))
        return
    if not page["items"]:  # said on stderr: stdout stays one line per approval
        which = "" if state == "all" else f"{state} "
        where = f" in pipeline {pipeline}" if pipeline else ""
        click.echo(
            f"no {which}approvals{where}" + (" after that cursor" if cursor else ""), err=True
        )
    for a in page["items"]:
        click.echo(
            f"{a['approval_id']}  {a['state']:8}  {a['outcome'] or '-':9}  "
            f"{a['pipeline']}/{a['step']}  {a['quorum']['collected']}/"
            f"{a['quorum']['required']}  expires {a['expires_at']}"
        )
    if page["next_cursor"]:
        click.echo(f"next page: --cursor {page['next_cursor']}")


@main.command()
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("approval_id")
def show(config_path: str, api_url: str | None, approval_id: str) -> None:
    """Print one approval as JSON.

    Example: hitl-gate show -c config.example.yaml 01JABCDEF...
    """

    async def go() -> Any:
        async with _client(config_path, api_url) as api:
            return await api.get(approval_id)

    click.echo(json.dumps(run(go()), ensure_ascii=False, indent=2))


@main.command()
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("approval_id")
def cancel(config_path: str, api_url: str | None, approval_id: str) -> None:
    """Withdraw a pending approval (resolves it as cancelled).

    Example: hitl-gate cancel -c config.example.yaml 01JABCDEF...
    """
    from gate.client.api import ClientError

    async def go() -> Any:
        async with _client(config_path, api_url) as api:
            try:
                return await api.cancel(approval_id)
            except ClientError as exc:
                if exc.code == "already_resolved" and "outcome" in exc.extra:
                    # whether the action may have fired depends on the outcome: say it
                    fail(
                        f"approval {approval_id} is already resolved (outcome "
                        f"{exc.extra['outcome']}); nothing changed (HTTP 409 already_resolved)"
                    )
                raise

    result = run(go())
    click.echo(f"{result['approval_id']} cancelled")


@main.group()
def audit() -> None:
    """Audit trail: verify the hash chain and receipts, export JSON Lines.

    Example: hitl-gate audit verify -c config.example.yaml
    """


@audit.command("verify")
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    envvar="HITL_GATE_CONFIG",
    help="Verify the database named by this config.",
)
@click.option(
    "--file",
    "export_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Verify an export (JSON Lines) instead of the database.",
)
@click.option(
    "--key-env",
    "key_envs",
    multiple=True,
    help="Env var with a receipt key (default: the config's receipts.key_env and "
    "receipts.previous_key_env); repeat for a log whose key was rotated: each "
    "entry is checked with the key of its span.",
)
@click.option(
    "--public-key",
    "public_key_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="Ed25519 public key (PEM) trusted for entry signatures; repeat for rotated "
    "keys. No secret needed.",
)
@click.option(
    "--expect",
    "expect_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A receipt (JSON, or an approval object holding one) the log must hold; "
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
def audit_verify(
    config_path: str | None,
    export_file: str | None,
    key_envs: tuple[str, ...],
    public_key_files: tuple[str, ...],
    expect_files: tuple[str, ...],
    records: bool,
    expect_heads: list[tuple[int, str]],
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
    from gate.audit.inputs import read_expected, read_export
    from gate.audit.verify import verify_database, verify_rows

    if (config_path is None) == (export_file is None):
        fail("give exactly one of -c/--config or --file", 2)
    config = _config(config_path) if config_path else None
    public = _public_keys(public_key_files)
    if config is not None:
        try:  # with --public-key the private signing key is not needed (nor read)
            public.update(_receipt_keys(config, private=not public).public)
        except ConfigError as exc:
            hint = (
                "; to verify without the private key, give its public key with --public-key"
                if any(e.startswith("receipts.signing_key_file") for e in exc.errors)
                else ""
            )
            fail("; ".join(exc.errors) + hint, 2)
    try:
        expected = [read_expected(Path(f)) for f in expect_files]
    except GateError as exc:
        fail(f"--expect: {exc.message}", 2)
    where, names, key = _verify_keys(config, key_envs)
    anchors = [(f"receipt {path}", held) for path, held in expected]
    try:
        if config is not None:
            report = verify_database(
                config.storage.path,
                key,
                public_keys=public or None,
                expect=anchors,
                expect_heads=expect_heads,
                records=records,
            )
        else:
            rows = read_export(Path(str(export_file)))
            if not rows:
                click.echo("TAMPERED: the export holds no entries (nothing to verify)")
                sys.exit(1)
            report = verify_rows(
                rows, key, public_keys=public or None, expect=anchors, expect_heads=expect_heads
            )
    except GateError as exc:
        if exc.code == "bad_export_line":  # a readable export that is not intact
            click.echo(f"TAMPERED: {exc.message}")
            sys.exit(1)
        fail(exc.message, 2 if exc.code in ("no_database", "unreadable_export") else 1)
    result = report.chain
    if result.wrong_key:  # not tampering: far likelier a wrong key (b02-04)
        fail(f"{where} ({', '.join(names)}): {result.reason}")
    if not result.ok:
        click.echo(
            f"TAMPERED: entry {result.first_bad_seq}: {result.reason} "
            f"({result.checked} entries before it verified)"
        )
        sys.exit(1)
    if report.anchor is not None:
        anchor = report.anchor
        click.echo(f"TAMPERED: entry {anchor.seq}: {anchor.reason} ({anchor.source})")
        sys.exit(1)
    matched = report.records
    if matched is not None and matched.problem is not None:
        approval_id, reason = matched.problem
        click.echo(
            f"TAMPERED: approval {approval_id}: {reason}; the audit log itself "
            f"verified ({result.checked} entries)"
        )
        sys.exit(1)
    checked = ["chain"] + ["receipts"] * bool(key) + ["signatures"] * bool(public)
    what = ", ".join(checked[:-1]) + f" and {checked[-1]}" if len(checked) > 1 else checked[0]
    held_note = "".join(f"; holds the receipt for entry {held['seq']}" for _, held in expected)
    held_note += _heads_note(expect_heads)
    click.echo(
        f"ok: {result.checked} entries, {what} intact{_spans_note(result, names)}{held_note}"
    )
    if matched is not None:
        newer = f" ({matched.newer} written since, not checked)" if matched.newer else ""
        click.echo(f"ok: {matched.checked} approvals match the audit log{newer}")
    if (
        config is not None
        and not key_envs
        and result.spans
        and (names[result.spans[-1][1]] != config.receipts.key_env)
    ):
        click.echo(
            f"warning: the newest entries are receipted with receipts.previous_key_env's"
            f" key ({names[result.spans[-1][1]]}), not receipts.key_env's: the gate "
            "writes the receipt_key_rotated entry at its next start",
            err=True,
        )
    if not key and not public:
        click.echo(
            "warning: no key was given, so nothing authenticated the entries: anyone "
            "can re-chain an edited log; verify with --public-key (or --key-env)",
            err=True,
        )


def _expect_heads(values: tuple[str, ...]) -> list[tuple[int, str]]:
    """``--expect-head`` values as ``(seq, entry_hash)``; a bad one exits 2 naming it."""
    from gate.audit.inputs import parse_head

    try:
        return [parse_head(value) for value in values]
    except GateError as exc:
        fail(f"--expect-head: {exc.message}", 2)


def _heads_note(heads: list[tuple[int, str]]) -> str:
    """``; holds the logged head(s) at entr(y|ies) ...`` for the ok line ('' for none)."""
    seqs = sorted({seq for seq, _ in heads})
    if not seqs:
        return ""
    if len(seqs) == 1:
        return f"; holds the logged head at entry {seqs[0]}"
    return f"; holds the logged heads at entries {', '.join(map(str, seqs))}"


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


def _spans_note(result: Any, names: list[str]) -> str:
    """`` (receipt keys: A for entries 1-4, B from entry 5)`` for a log whose receipt key
    was rotated, else ""."""
    spans = result.spans
    if len(spans) < 2:
        return ""
    parts = [
        f"{names[index]} for entries {first}-{spans[i + 1][0] - 1}"
        for i, (first, index) in enumerate(spans[:-1])
    ]
    parts.append(f"{names[spans[-1][1]]} from entry {spans[-1][0]}")
    return f" (receipt keys: {', '.join(parts)})"


@audit.command("export")
@CONFIG_OPTION
@click.option("-o", "--output", default="-", help="Output file (default stdout).")
def audit_export(config_path: str, output: str) -> None:
    """Write the audit log as JSON Lines, one entry per line.

    Example: hitl-gate audit export -c config.example.yaml -o audit.jsonl
    """
    from gate.audit import chain as audit_mod
    from gate.audit.verify import read_database

    config = _config(config_path)
    try:
        rows = asyncio.run(read_database(config.storage.path))
    except GateError as exc:
        fail(exc.message)
    lines = "".join(audit_mod.export_line(r) + "\n" for r in rows)
    if output == "-":
        sys.stdout.write(lines)
    else:
        try:
            Path(output).write_text(lines, encoding="utf-8")
        except OSError as exc:
            fail(f"-o: cannot write {output}: {exc.strerror}")


@main.command()
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Directory for the key pair (created 0700 if missing).",
)
def keygen(out_dir: str) -> None:
    """Write a new Ed25519 key pair for signed audit entries and permits; print its key id.

    DIR/hitl-gate-ed25519.key (private, PEM, mode 0600; never overwritten) goes to
    receipts.signing_key_file; DIR/hitl-gate-ed25519.pub (public, PEM) goes to auditors and
    to the tool that executes approved actions. Key id = "ed25519:" + the first 16 hex
    digits of SHA-256 of the raw 32-byte public key.

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


@main.group()
def permit() -> None:
    """Execution permits: verify one offline before executing the approved body.

    Example: hitl-gate permit verify permit.jws --public-key hitl-gate-ed25519.pub
    --body-file mail.txt --pipeline invoices --step send-followup
    """


@permit.command("verify")
@click.argument("permit_file", type=click.Path(dir_okay=False))
@click.option(
    "--public-key",
    "public_key_files",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False),
    help="The gate's Ed25519 public key (PEM); repeat to trust rotated keys.",
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
    from gate.protocol.envelope import rfc3339
    from gate.trust import permit as permit_mod

    public = _public_keys(public_key_files)
    try:
        token = permit_mod.read(Path(permit_file))
    except OSError as exc:
        fail(f"cannot read {permit_file}: {exc.strerror or exc}", 2)
    body = _read_input("--body-file", body_file)
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
        f"{claims['payload_hash']}, valid until {rfc3339(claims['exp'] * 1000)}"
    )


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
@click.option("--auto", default=None, help="Decide without asking: approve, skip or adjust:TEXT.")
@click.option(
    "--max-skew",
    type=float,
    default=300.0,
    show_default=True,
    help="Refuse dispatches signed more than this many seconds away.",
)
def relay(
    listen: str, secret_env: str, identities: tuple[str, ...], auto: str | None, max_skew: float
) -> None:
    """Reference relay: verify each dispatch, ask a human on this terminal (or decide
    automatically with --auto), sign the decision and post it back.

    At a terminal, keys typed before a draft and its prompt are on screen are discarded;
    answer a, s or e (or approve, skip, edit), and on a step of risk high or critical the
    whole word. Stdin that is no terminal (a pipe, a file) is a script: one line answers
    each prompt, in order, however early it was written. A prompt whose approval went
    stale (a newer revision, expired) is withdrawn with a line saying why.

    Asking (no --auto) with stderr on a terminal, only warnings and errors are logged,
    never inside a draft or prompt (they follow it); redirect stderr (2>relay.log) to keep
    the INFO lines.

    Example: HITL_RELAY_SECRET=... hitl-gate relay --secret-env HITL_RELAY_SECRET --auto approve
    """
    from gate import logs
    from gate.config import parse_listen
    from gate.config.values import identity_problem
    from gate.protocol.whitespace import is_blank, is_trimmed
    from gate.tools.reference_relay.relay import AutoDecision, run_relay
    from gate.tools.reference_relay.terminal import NoScreen

    secret = _relay_secret(secret_env)
    try:
        parse_listen(listen)
    except ValueError as exc:
        fail(f"--listen: {exc}", 2)
    try:
        auto_decision = AutoDecision.parse(auto) if auto else None
    except ValueError as exc:
        fail(f"--auto: {exc}", 2)
    for identity in identities:  # a dispatch's scope never names such an identity
        if is_blank(identity) or not is_trimmed(identity):
            fail(f"--as: {identity!r} is not an identity (empty, or spaces around it)", 2)
        problem = identity_problem(identity)
        if problem is not None:
            fail(
                f"--as: {identity!r} {problem.split(';')[0]}; no dispatch names such an identity", 2
            )
    # asking on a terminal: INFO lines would land in the drafts and prompts (issue 12)
    logs.configure("WARNING" if auto_decision is None and sys.stderr.isatty() else "INFO")
    try:
        asyncio.run(run_relay(listen, secret, identities, auto_decision, max_skew))
    except NoScreen as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"cannot listen on {listen}: {exc}")


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
    type=click.FloatRange(min=1),
    default=120.0,
    show_default=True,
    help="Seconds to wait for the relay's decision (a human may be answering).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(
    relay_url: str,
    secret_env: str,
    approver: str,
    listen: str,
    public_url: str | None,
    timeout: float,
    as_json: bool,
) -> None:
    """Conformance test of a live relay (SPEC §6): PASS/FAIL per check.

    Starts an ephemeral gate (the real decision handler over HTTP), dispatches a synthetic
    approval (pipeline hitl-conformance) plus a badly signed and a stale one, waits for the
    relay's decision, then checks replay, mutated-hash and out-of-scope refusals.
    Exit 0 when every check passes, 1 when one fails, 2 for usage errors.

    Example: hitl-gate verify http://127.0.0.1:8091/ --secret-env HITL_RELAY_SECRET
    --approver alice@example.com
    """
    from gate.config import TcpListen, parse_listen
    from gate.tools.conformance.runner import run_verify

    secret = _relay_secret(secret_env)
    if not relay_url.startswith(("http://", "https://")):
        fail("RELAY_URL must be an http:// or https:// URL", 2)
    try:
        if not isinstance(parse_listen(listen), TcpListen):
            raise ValueError("unix sockets cannot be reached by a relay")
    except ValueError as exc:
        fail(f"--listen: {exc}", 2)
    try:
        report = asyncio.run(run_verify(relay_url, secret, approver, listen, public_url, timeout))
    except OSError as exc:
        fail(f"--listen: cannot listen on {listen}: {exc}", 2)
    except ConfigError as exc:  # the ephemeral gate's config is built from the arguments
        fail("; ".join(_verify_option(error) for error in exc.errors), 2)
    click.echo(
        json.dumps(report.as_json(), ensure_ascii=False, indent=2) if as_json else report.as_text()
    )
    sys.exit(0 if report.ok else 1)
