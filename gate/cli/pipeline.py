"""``hitl-gate request``, the pipeline side's command over the API: ask for approval of a
draft, with ``--wait`` block until resolved (``list``, ``show`` and ``cancel``: ``requests``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from gate.cli import API_URL_OPTION, CONFIG_OPTION, fail, input_name, main, read_config, run
from gate.cli.asking import (
    APPROVAL,
    left_behind,
    print_unresolved,
    read_text,
    wait_options,
    where_options,
)
from gate.cli.common import (
    api_target,
    check_request_options,
    reporter,
    spend_type,
)

if TYPE_CHECKING:
    from gate.client.request import RequestOptions, RequestResult


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
    # where the draft came from: --draft, --draft-file: PATH or --draft-file: standard input
    source = (
        "--draft: the draft" if draft_file is None else f"--draft-file: {input_name(draft_file)}"
    )
    fail(
        f"{source} is {what}: nothing to approve (allow_empty_draft: true on the step allows it)",
        2,
    )


@main.command()
@CONFIG_OPTION
@API_URL_OPTION
@where_options(APPROVAL)
@click.option("--draft", default=None, help="The draft text to approve.")
@click.option("--draft-file", default=None, help="Read the draft from a file, or - for stdin.")
@click.option("--content-type", default="text/plain", show_default=True)
@click.option(
    "--spend",
    type=spend_type(),
    default=None,
    help="Cost of the action, in budget.unit (a number >= 0).",
)
@wait_options(
    APPROVAL,
    click.option(
        "--permit-out",
        type=click.Path(dir_okay=False),
        default=None,
        help="With --wait: save the execution permit (JWS) here when approved/adjusted; "
        "any other outcome removes FILE.",
    ),
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
    from gate.client.request import Progress, RequestOptions, request_key, run_request
    from gate.sdk.client import approval_body

    check_request_options(wait, permit_out, idempotency_key, spend)
    text = read_text("--draft", draft, draft_file)
    config = read_config(config_path)
    _check_not_blank(config, pipeline, step, text, draft_file)
    body = approval_body(pipeline, step, text, content_type, run_id, spend, requested_by)
    key = request_key(idempotency_key, wait)
    out = None if permit_out is None else Path(permit_out)
    opts = RequestOptions(*api_target(config, api_url), body, key, wait, timeout, out)
    progress = Progress()
    result = run(
        run_request(opts, reporter(quiet), progress),
        lambda: left_behind(APPROVAL, opts, progress.item_id, config_path, api_url),
    )
    _print_request_result(result, opts, as_json, config_path, api_url)


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

    shown = result.approval is not None and as_json
    text = json.dumps(result.approval, ensure_ascii=False, indent=2) if shown else None
    approval = print_unresolved(APPROVAL, result.approval, opts, text, config_path, api_url)
    if approval is None:
        return
    if result.permit_error is not None:
        fail(result.permit_error)
    for line in skip_reason_lines(approval):  # the answer, not a hop: even with --quiet
        click.echo(line, err=True)
    if approval["final_body"] is not None and not as_json:
        sys.stdout.write(approval["final_body"])
        sys.stdout.flush()
    sys.exit(EXIT_CODES[approval["outcome"]])
