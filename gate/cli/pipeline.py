"""``hitl-gate`` commands of the pipeline side, over the API: ``request``, ``list``, ``show``,
``cancel``."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import click

from gate.cli import (
    API_URL_OPTION,
    CONFIG_OPTION,
    fail,
    input_name,
    main,
    read_config,
    read_input,
    run,
)


def _client(config_path: str, api_url: str | None, config: Any = None) -> Any:
    from gate.client.api import ApiClient, api_base
    from gate.config import read_api_token

    if config is None:
        config = read_config(config_path)
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


def _draft_source(draft_file: str | None) -> str:
    """How an error names where the draft came from: ``--draft``, ``--draft-file: PATH`` or
    ``--draft-file: standard input``."""
    if draft_file is None:
        return "--draft: the draft"
    return f"--draft-file: {input_name(draft_file)}"


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
    raw = read_input("--draft-file", draft_file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # exc.start: the first byte that is not UTF-8
        fail(
            f"--draft-file: {input_name(draft_file)} is not valid UTF-8 (byte offset {exc.start})",
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
    config = read_config(config_path)
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
