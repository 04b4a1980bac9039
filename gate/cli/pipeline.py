"""``hitl-gate request``, the pipeline side's command over the API: ask for approval of a
draft, with ``--wait`` block until resolved (``list``, ``show`` and ``cancel``: ``requests``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from gate.cli.common import (
    NumberType,
    api_target,
    cancel_command,
    check_request_options,
    reporter,
    spend_type,
)

CANCEL = ("hitl-gate", "cancel")  # the command that cancels an approval

if TYPE_CHECKING:
    from gate.client.request import RequestOptions, RequestProgress, RequestResult


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
    "--spend",
    type=spend_type(),
    default=None,
    help="Cost of the action, in budget.unit (a number >= 0).",
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
    type=NumberType(low=0),
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
@click.option(
    "--quiet",
    is_flag=True,
    help="Do not report hops on stderr (a skip's reason is still printed there).",
)
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
    from gate.client.request import RequestOptions, RequestProgress, request_key, run_request

    check_request_options(wait, permit_out, idempotency_key, spend)
    text = _read_draft(draft, draft_file)
    config = read_config(config_path)
    _check_not_blank(config, pipeline, step, text, draft_file)
    opts = RequestOptions(
        *api_target(config, api_url),
        pipeline,
        step,
        text,
        content_type=content_type,
        run_id=run_id,
        spend=spend,
        requested_by=requested_by,
        idempotency_key=request_key(idempotency_key, wait),
        wait=wait,
        timeout_s=timeout,
        permit_out=None if permit_out is None else Path(permit_out),
    )
    progress = RequestProgress()
    result = run(
        run_request(opts, reporter(quiet), progress),
        lambda: _left_behind(opts, progress, config_path, api_url),
    )
    _print_request_result(result, opts, as_json, config_path, api_url)


def _left_behind(
    opts: RequestOptions, progress: RequestProgress, config_path: str, api_url: str | None
) -> str:
    """What an interrupted ``request`` (Ctrl-C) leaves on the gate, for the ``Interrupted``
    line: nothing, maybe an approval (found again with the key), or a pending approval
    (with the command that cancels it)."""
    if progress.approval_id is None:
        if opts.wait:  # an attempt may have landed with its answer unseen
            return (
                "no approval was seen created (to find one that landed after all, "
                f"run the same command with --idempotency-key {opts.idempotency_key})"
            )
        return "no approval was created"
    command = cancel_command(CANCEL, config_path, api_url, progress.approval_id)
    return (
        f"approval {progress.approval_id} is still pending on the gate; the action must not "
        f"fire (cancel it with: {command})"
    )


def _print_request_result(
    result: RequestResult,
    opts: RequestOptions,
    as_json: bool,
    config_path: str,
    api_url: str | None,
) -> None:
    """Print what ``request`` ended with and exit with its code (``EXIT_CODES``; 4 when the
    gate did not take the request, or the approval is still pending, after ``--timeout``;
    1 when ``--permit-out`` could not be honoured)."""
    from gate.client.hops import skip_reason_lines
    from gate.client.request import EXIT_CODES

    approval = result.approval
    if approval is None:
        fail(
            f"the gate did not take the request within {opts.timeout_s:g} s: nothing may fire; "
            f"run the same command again with --idempotency-key {opts.idempotency_key} to find "
            "it if it lands later",
            4,
        )
    if as_json:
        click.echo(json.dumps(approval, ensure_ascii=False, indent=2))
    if not opts.wait:
        if not as_json:
            click.echo(approval["approval_id"])
        return
    if approval["state"] != "resolved":
        click.echo(
            f"Error: still pending after {opts.timeout_s:g} s: approval "
            f"{approval['approval_id']} (the action must not fire; cancel it with: "
            f"{cancel_command(CANCEL, config_path, api_url, approval['approval_id'])})",
            err=True,
        )
        sys.exit(4)
    if result.permit_error is not None:
        fail(result.permit_error)
    for line in skip_reason_lines(approval):  # the answer, not a hop: even with --quiet
        click.echo(line, err=True)
    if approval["final_body"] is not None and not as_json:
        sys.stdout.write(approval["final_body"])
        sys.stdout.flush()
    sys.exit(EXIT_CODES[approval["outcome"]])
