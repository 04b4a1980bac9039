"""``hitl-gate ask``: ask a person a question over the API and print the typed
answer. Reads the question's text and form schema, picks the response type from the options,
maps the outcome to the exit code."""

from __future__ import annotations

import functools
import json
import sys
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
from gate.cli.asking import (
    QUESTION,
    left_behind,
    print_unresolved,
    read_text,
    wait_options,
    where_options,
)
from gate.cli.common import api_target, check_request_options, reporter, safe_json


def _read_text(text: str | None, text_file: str | None) -> str:
    """The question's text from ``--text`` or ``--text-file`` (``-``: stdin); exit 2 unless
    exactly one is given, on a file that cannot be read or is not UTF-8 (``read_text``),
    and on a text that is empty or only white space (nothing to ask; the gate refuses it
    too)."""
    from gate.protocol.whitespace import is_blank

    text = read_text("--text", text, text_file)
    if is_blank(text):
        source = "--text" if text_file is None else f"--text-file: {input_name(text_file)}"
        fail(f"{source}: the question is {'empty' if not text else 'only white space'}", 2)
    return text


def _read_schema(path: str) -> dict[str, Any]:
    """The ``--schema`` file as a JSON object; exit 2 with one line naming the file and what
    is wrong (cannot be read, not UTF-8, not JSON, a key twice, not an object). Whether it is
    a form schema the gate accepts is the gate's check (400 ``invalid_schema`` naming the
    JSON path)."""
    from gate.protocol.canonical import json_type, no_duplicate_keys, reject_json_constant

    name = input_name(path)
    raw = read_input("--schema", path)
    try:
        schema = json.loads(
            raw.decode("utf-8-sig"),
            object_pairs_hook=functools.partial(no_duplicate_keys, twice=_twice),
            parse_constant=reject_json_constant,
        )
    except UnicodeDecodeError as exc:
        fail(f"--schema: {name} is not valid UTF-8 (byte offset {exc.start})", 2)
    except RecursionError:
        fail(f"--schema: {name} nests too deeply", 2)
    except ValueError as exc:
        fail(f"--schema: {name} is not JSON: {exc}", 2)
    if not isinstance(schema, dict):
        fail(f"--schema: {name} holds a JSON {json_type(schema)}, not an object", 2)
    return schema


def _twice(key: str) -> str:
    """What ``--schema`` says of a key given twice (JSON would keep the last one silently)."""
    return f"the key {key!r} is given twice"


def _response_type(choices: tuple[str, ...], multi: bool, schema: str | None) -> str:
    """The question's ``response_type`` from the options given; exit 2
    naming the option on a combination that means nothing."""
    from gate.protocol.whitespace import is_blank

    if schema is not None and choices:
        fail(
            "--choice and --schema exclude each other (choices ask for one of them, a schema "
            "for a form)",
            2,
        )
    if multi and not choices:
        fail("--multi needs --choice (the options to choose from)", 2)
    seen: set[str] = set()
    for choice in choices:
        if is_blank(choice):
            fail("--choice: an option must not be empty or only white space", 2)
        if choice in seen:
            fail(f"--choice: {choice!r} is given twice", 2)
        seen.add(choice)
    if schema is not None:
        return "form"
    if choices:
        return "multi_choice" if multi else "single_choice"
    return "free_text"


@main.command()
@CONFIG_OPTION
@API_URL_OPTION
@where_options(QUESTION)
@click.option("--text", default=None, help="The question to ask.")
@click.option("--text-file", default=None, help="Read the question from a file, or - for stdin.")
@click.option("--reason", default=None, help="Why the pipeline asks (shown to the person).")
@click.option(
    "--choice",
    "choices",
    multiple=True,
    help="An option to choose from (repeat): a single choice, or with --multi several.",
)
@click.option("--multi", is_flag=True, help="With --choice: any number of options may be chosen.")
@click.option(
    "--schema", default=None, help="A form: JSON file with its schema (flat object of fields)."
)
@wait_options(QUESTION)
def ask(
    config_path: str,
    api_url: str | None,
    pipeline: str,
    step: str,
    run_id: str | None,
    text: str | None,
    text_file: str | None,
    reason: str | None,
    choices: tuple[str, ...],
    multi: bool,
    schema: str | None,
    idempotency_key: str | None,
    requested_by: str | None,
    wait: bool,
    timeout: float | None,
    as_json: bool,
    quiet: bool,
) -> None:
    """Ask a person a question; with --wait, block and print the answer.

    No --choice or --schema: free text. --choice (repeated): a single choice, with --multi
    a multi choice. --schema FILE: a form. The answer goes to stdout: the text of a free
    text or single choice answer, compact JSON of a multi choice or form answer; --json
    prints the whole question object instead. Without --wait, prints the question id.

    Exit 0 answered, 4 timeout (also: still pending after --timeout), 5 cancelled, 1 gate
    error, 2 usage.

    Example: hitl-gate ask -c config.yaml --pipeline supplier-choice --step pick-supplier
    --text "Which supplier?" --choice Acme --choice Globex --wait
    """
    from gate.client.request import (
        QUESTION_EXIT_CODES,
        Progress,
        RequestOptions,
        answer_output,
        request_key,
        run_ask,
    )
    from gate.sdk.client import question_body

    response_type = _response_type(choices, multi, schema)
    check_request_options(wait, None, idempotency_key, None)
    body_text = _read_text(text, text_file)
    form = _read_schema(schema) if schema is not None else None
    config = read_config(config_path)
    body = question_body(
        pipeline, step, body_text, response_type, reason, choices, form, run_id, requested_by
    )
    key = request_key(idempotency_key, wait, "hitl-ask")
    opts = RequestOptions(*api_target(config, api_url), body, key, wait, timeout)
    progress = Progress()
    question = run(
        run_ask(opts, reporter(quiet), progress),
        lambda: left_behind(QUESTION, opts, progress.item_id, config_path, api_url),
    )
    shown = safe_json(question) if as_json and question is not None else None
    resolved = print_unresolved(QUESTION, question, opts, shown, config_path, api_url)
    if resolved is None:
        return
    if resolved["outcome"] == "answered" and not as_json:
        write_exact(answer_output(resolved) + "\n")
    sys.exit(QUESTION_EXIT_CODES[resolved["outcome"]])


def write_exact(text: str) -> None:
    """Write ``text`` to stdout as its UTF-8 bytes, nothing stripped or changed (click.echo
    would strip ANSI sequences when stdout is no terminal but keep a carriage return: the
    pipeline would get neither the answer recorded nor a safe one; new-user finding 2).
    ``--json`` is the machine-safe form."""
    sys.stdout.flush()
    out = sys.stdout.buffer
    out.write(text.encode("utf-8"))
    out.flush()
