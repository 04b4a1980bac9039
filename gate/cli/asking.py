"""What ``hitl-gate request`` and ``ask`` share: their common options (help worded by kind),
reading the text from an option or a file, the ``Interrupted`` line of a Ctrl-C, and the
printing of what a run ended with up to the outcome each kind prints its own way."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from gate.cli import Decorator, fail, input_name, options, read_input
from gate.cli.common import NumberType, cancel_command

if TYPE_CHECKING:
    from gate.client.request import RequestOptions


@dataclass(frozen=True, slots=True)
class Noun:
    """How ``request``'s and ``ask``'s words differ by kind: ``name`` (``approval``,
    ``question``), its ``id_key``, the ``cancel`` command, what the gate did not ``take``
    (``request``, ``question``) and ``must_not_fire`` (the warning of a pending approval, ""
    for a question); ``help`` holds the option help that is not ``name`` alone."""

    name: str
    id_key: str
    cancel: tuple[str, ...]
    take: str
    must_not_fire: str
    help: dict[str, str]


APPROVAL = Noun(
    "approval",
    "approval_id",
    ("hitl-gate", "cancel"),
    "request",
    "the action must not fire",
    {
        "--step": "Step name within the pipeline.",
        "--requested-by": "Identity of the operator asking; they may not approve it themselves.",
        "--wait": "Block until resolved; print the final body.",
        "--quiet": "Do not report hops on stderr (a skip's reason is still printed there).",
    },
)
QUESTION = Noun(
    "question",
    "question_id",
    ("hitl-gate", "questions", "cancel"),
    "question",
    "",
    {
        "--step": "Question step within the pipeline.",
        "--requested-by": "Identity of the operator asking.",
        "--wait": "Block until answered; print the answer.",
        "--quiet": "Do not report hops on stderr.",
    },
)


def where_options(noun: Noun) -> Decorator:
    """``--pipeline``, ``--step`` and ``--run-id``: where the request is made."""
    return options(
        click.option("--pipeline", required=True, help="Pipeline name from the config."),
        click.option("--step", required=True, help=noun.help["--step"]),
        click.option(
            "--run-id", default=None, help=f"Correlates the {noun.name} with the pipeline run."
        ),
    )


def wait_options(noun: Noun, *extra: Decorator) -> Decorator:
    """``--idempotency-key``, ``--requested-by``, ``--wait``, ``--timeout``, then ``extra``,
    ``--json`` and ``--quiet``: how the request is made and waited for."""
    return options(
        click.option(
            "--idempotency-key", default=None, help=f"Retry-safe key: same key, same {noun.name}."
        ),
        click.option("--requested-by", default=None, help=noun.help["--requested-by"]),
        click.option("--wait", is_flag=True, help=noun.help["--wait"]),
        click.option(
            "--timeout",
            type=NumberType(low=0),
            default=None,
            help="With --wait: give up waiting after SEC seconds (exit 4).",
        ),
        *extra,
        click.option(
            "--json", "as_json", is_flag=True, help=f"Print the {noun.name} object as JSON."
        ),
        click.option("--quiet", is_flag=True, help=noun.help["--quiet"]),
    )


def read_text(option: str, text: str | None, text_file: str | None) -> str:
    """The text of ``option`` (``--draft``, ``--text``) or of its file option
    (``<option>-file``; ``-``: stdin); exit 2 unless exactly one is given, and on a file
    that cannot be read or is not UTF-8."""
    if (text is None) == (text_file is None):
        fail(f"give exactly one of {option} or {option}-file", 2)
    if text is not None:
        return text
    assert text_file is not None
    raw = read_input(f"{option}-file", text_file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:  # exc.start: the first byte that is not UTF-8
        fail(
            f"{option}-file: {input_name(text_file)} is not valid UTF-8 (byte offset {exc.start})",
            2,
        )


def left_behind(
    noun: Noun, opts: RequestOptions, item_id: str | None, config_path: str, api_url: str | None
) -> str:
    """What an interrupted run (Ctrl-C) leaves on the gate, for the ``Interrupted`` line:
    nothing, maybe an object (found again with the key), or a pending one ``item_id``
    (with the command that cancels it)."""
    if item_id is None:
        if opts.wait:  # an attempt may have landed with its answer unseen
            return (
                f"no {noun.name} was seen created (to find one that landed after all, "
                f"run the same command with --idempotency-key {opts.idempotency_key})"
            )
        return f"no {noun.name} was created"
    warning = f"; {noun.must_not_fire}" if noun.must_not_fire else ""
    command = cancel_command(noun.cancel, config_path, api_url, item_id)
    return (
        f"{noun.name} {item_id} is still pending on the gate{warning} (cancel it with: {command})"
    )


def print_unresolved(
    noun: Noun,
    obj: dict[str, Any] | None,
    opts: RequestOptions,
    json_text: str | None,
    config_path: str,
    api_url: str | None,
) -> dict[str, Any] | None:
    """Print what a run ended with, up to its outcome: exit 4 when the gate did not take the
    create (``obj`` None) or it is still pending after ``--timeout``; ``json_text`` (the
    object as ``--json`` prints it, None without the option), else without ``--wait`` the
    id. Returns the resolved object whose outcome is left to print, or None when done."""
    if obj is None:
        nothing = ": nothing may fire" if noun.must_not_fire else ""
        fail(
            f"the gate did not take the {noun.take} within {opts.timeout_s:g} s{nothing}; run "
            f"the same command again with --idempotency-key {opts.idempotency_key} to find "
            "it if it lands later",
            4,
        )
    if json_text is not None:
        click.echo(json_text)
    if not opts.wait:
        if json_text is None:
            click.echo(obj[noun.id_key])
        return None
    if obj["state"] != "resolved":
        item_id = obj[noun.id_key]
        warning = f"{noun.must_not_fire}; " if noun.must_not_fire else ""
        click.echo(
            f"Error: still pending after {opts.timeout_s:g} s: {noun.name} {item_id} "
            f"({warning}cancel it with: "
            f"{cancel_command(noun.cancel, config_path, api_url, item_id)})",
            err=True,
        )
        sys.exit(4)
    return obj
