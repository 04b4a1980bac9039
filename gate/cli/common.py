"""What the API-side commands (``request``, ``list``, ``show``, ``cancel``, ``ask``,
``questions list|show|cancel``) share: where the API is and its token, the checks of
``--idempotency-key`` and ``--permit-out``, the hop reporter, the runnable cancel command
line and the one-line-per-item page printer."""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from gate.cli import fail, options
from gate.protocol.display import is_hidden


def safe_json(value: Any) -> str:
    """``value`` as indented JSON text (non-ASCII letters kept as they are) with every
    character a terminal would not show as itself (controls, bidi and other format
    characters, line/paragraph separators, unassigned) written as a ``\\uXXXX`` escape (a
    surrogate pair above U+FFFF): the same value for a JSON parser, nothing hidden or
    reordered on a screen (new-user finding 2: ``ask --json`` is the machine-safe form)."""
    text = json.dumps(value, ensure_ascii=False, indent=2)
    # a newline here is the indent's own (json.dumps escapes those, and every other control
    # below U+0020, inside strings); what a terminal does not show as itself is one rule:
    # gate.protocol.display. json.dumps of one such character (ASCII output) is its
    # ``\\uXXXX`` escape, a surrogate pair above U+FFFF.
    return "".join(json.dumps(c)[1:-1] if c != "\n" and is_hidden(c) else c for c in text)


def api_target(config: Any, api_url: str | None) -> tuple[str, str]:
    """``(API base URL, bearer token)``: ``--api-url`` or ``api.listen`` (a wildcard bind
    reached on loopback: ``listen_url``), and the token as ``serve`` reads it. Exits 2 on a
    token that is not set or has control characters, and on an ``--api-url`` that is no
    http(s) or unix: URL."""
    from gate.config import read_api_token
    from gate.sdk.client import listen_url

    # as serve reads it: the variable, else its file in $CREDENTIALS_DIRECTORY
    token, error = read_api_token(config, os.environ)
    if token is None:
        fail(error or f"api.token_env: {config.api.token_env} is not set", 2)
    if not token.isprintable():
        fail(f"api.token_env: {config.api.token_env} has control characters; remove them", 2)
    check_api_url(api_url)
    return api_url or listen_url(config.api.listen), token


def check_api_url(api_url: str | None) -> None:
    """Exit 2 with one line on an ``--api-url`` that is no ``http(s)://host[:port][/prefix]``
    nor ``unix:/path``."""
    from urllib.parse import urlsplit

    if api_url is None or (api_url.startswith("unix:") and len(api_url) > len("unix:")):
        return
    try:
        parts = urlsplit(api_url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        valid = False
    if not valid:
        fail(f"--api-url: {api_url!r} is not http://host:port, https://host:port or unix:/path", 2)


def check_request_options(
    wait: bool, permit_out: str | None, idempotency_key: str | None, spend: float | None
) -> None:
    """Exit 2 on a ``--permit-out`` without ``--wait`` or in a folder this user cannot
    write to (checked before a human is asked, not after), and on an ``--idempotency-key``
    the API would refuse (``gate.core.requests.fields.check_idempotency_key``: shape and UTF-8; a
    non-UTF-8 argv byte would be dropped on the way, making two keys one) or that holds
    control characters (aiohttp cannot send those in a header). ``spend`` is not checked
    here (``request`` checks it apart)."""
    from gate.core.requests.fields import check_idempotency_key, has_control_characters
    from gate.errors import GateError

    if permit_out is not None and not wait:
        fail("--permit-out needs --wait", 2)
    if permit_out is not None:  # before a human is asked, not after
        folder = Path(permit_out).absolute().parent
        if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            fail(f"--permit-out: {folder} is not a directory this user can write to", 2)
    try:
        check_idempotency_key(idempotency_key)
        refused = idempotency_key is not None and has_control_characters(idempotency_key)
    except GateError:
        refused = True
    if refused:
        fail(
            "--idempotency-key: must be 1-200 UTF-8 characters, not blank, without control"
            " characters",
            2,
        )


def reporter(quiet: bool) -> Callable[[str], None]:
    """Where ``request`` and ``ask`` report what happens (hops): stderr, or nowhere with
    ``--quiet``."""

    def report(line: str) -> None:
        if not quiet:
            click.echo(line, err=True)

    return report


def cancel_command(
    command: Sequence[str], config_path: str | None, api_url: str | None, item_id: str
) -> str:
    """The command line ``command`` (e.g. ``("hitl-gate", "cancel")``) with ``-c`` and
    ``--api-url`` as given and ``item_id``, shell-quoted: runnable as printed."""
    words = list(command)
    if config_path:
        words += ["-c", config_path]
    if api_url:
        words += ["--api-url", api_url]
    return " ".join(shlex.quote(word) for word in [*words, item_id])


def echo_page(
    page: dict[str, Any],
    noun: str,
    state: str,
    pipeline: str | None,
    cursor: str | None,
    line: Callable[[dict[str, Any]], str],
) -> None:
    """Print one page of a list (``{"items", "next_cursor"}``): ``line(item)`` per item on
    stdout, then ``next page: --cursor C``; an empty page is said on stderr ("no pending
    <noun> in pipeline P"), so stdout stays one line per item."""
    if not page["items"]:
        which = "" if state == "all" else f"{state} "
        where = f" in pipeline {pipeline}" if pipeline else ""
        click.echo(f"no {which}{noun}{where}" + (" after that cursor" if cursor else ""), err=True)
    for item in page["items"]:
        click.echo(line(item))
    if page["next_cursor"]:
        click.echo(f"next page: --cursor {page['next_cursor']}")


def list_options(fn: Any) -> Any:
    """The options of a list command, the same for approvals and questions (SPEC §3 list
    parameters): ``--state`` (default pending), ``--pipeline``, ``--limit`` 1..500 (default
    50), ``--cursor``, ``--json`` (as ``as_json``)."""
    return options(
        click.option(
            "--state",
            type=click.Choice(["pending", "resolved", "all"]),
            default="pending",
            show_default=True,
        ),
        click.option("--pipeline", default=None),
        click.option(
            "--limit", type=NumberType(whole=True, low=1, high=500), default=50, show_default=True
        ),
        click.option("--cursor", default=None, help="next_cursor from the previous page."),
        click.option("--json", "as_json", is_flag=True),
    )(fn)


class _OptionError(click.ClickException):
    """A refused option value: one ``Error: --option: ...`` line, exit 2 (no usage text)."""

    exit_code = 2


class NumberType(click.ParamType[float]):
    """A number option or argument in ASCII digits (``gate.protocol.numbers``: click's FLOAT
    and INT also take ``١٢``, ``1_0`` and `` 5 ``): ``whole`` for an int; ``low``/``high``
    bound it, else it is within ±2**53; ``problem`` (e.g. the API's ``spend_problem``) says
    what is wrong with a value instead of those bounds."""

    def __init__(
        self,
        *,
        whole: bool = False,
        low: float = -math.inf,
        high: float = math.inf,
        problem: Callable[[float], str | None] | None = None,
    ) -> None:
        self.name = "integer" if whole else "number"
        self.whole, self.low, self.high, self.problem = whole, low, high, problem

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from gate.protocol.numbers import INTEGER_TEXT, NUMBER_TEXT, in_range

        if not isinstance(value, str):
            return value  # a default
        name = "value"
        if isinstance(param, click.Option):
            name = param.opts[0]
        elif param is not None:
            name = param.human_readable_name
        what = "a whole number" if self.whole else "a number"
        if (INTEGER_TEXT if self.whole else NUMBER_TEXT).fullmatch(value) is None:
            example = "12" if self.whole else "12 or 0.5"
            raise _OptionError(
                f"{name}: must be {what} in ASCII digits, such as {example} (got {value!r})"
            )
        number: float = int(value) if self.whole else float(value)
        if self.problem is not None:
            problem = self.problem(number)
        elif not in_range(number) or not self.low <= number <= self.high:
            problem = f"must be {what} {self._range()}"
        else:
            problem = None
        if problem is not None:
            raise _OptionError(f"{name}: {problem}")
        return number

    def _range(self) -> str:
        from gate.protocol.numbers import MAX_MAGNITUDE, RANGE_WORDS

        if self.high != math.inf:
            return f"from {self.low:g} to {self.high:g}"
        if self.low != -math.inf:
            return f">= {self.low:g} and at most 2**53 ({MAX_MAGNITUDE})"
        return RANGE_WORDS


def spend_type() -> NumberType:
    """``--spend``: a number the API takes (``gate.core.approvals.create.spend_problem``)."""

    def problem(spend: float) -> str | None:
        from gate.core.approvals.create import spend_problem

        return spend_problem(spend)

    return NumberType(problem=problem)
