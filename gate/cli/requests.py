"""``hitl-gate list|show|cancel`` (approvals) and ``hitl-gate questions list|show|cancel``,
over the API: one list, show and cancel for both kinds of request. What differs between the
kinds (words, help texts, client calls, the line a list prints, the JSON printer) is one row
each of ``KINDS``."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import click

from gate.cli import API_URL_OPTION, CONFIG_OPTION, fail, main, read_config, run
from gate.cli.common import api_target, echo_page, list_options, safe_json


@main.group()
def questions() -> None:
    """Operate on questions: list, show, cancel.

    Example: hitl-gate questions list -c config.example.yaml --state pending
    """


def approval_line(a: dict[str, Any]) -> str:
    """One approval object of a page as ``hitl-gate list`` prints it."""
    from gate.client.hops import reason_summary
    from gate.protocol.display import display_time

    return (
        f"{a['approval_id']}  {a['state']:8}  {a['outcome'] or '-':9}  "
        f"{a['pipeline']}/{a['step']}  {a['quorum']['collected']}/"
        f"{a['quorum']['required']}  expires {display_time(a['expires_at'])}"
        f"{_followup_text(a)}" + reason_summary(a)
    )


def _followup_text(approval: dict[str, Any]) -> str:
    """``  reminded N  escalated level L`` for an approval with reminders or escalation
    (nothing otherwise, so those lines read as before)."""
    text = ""
    if approval.get("reminders_sent"):
        text += f"  reminded {approval['reminders_sent']}"
    escalation = approval.get("escalation")
    if isinstance(escalation, dict) and escalation.get("level"):
        text += f"  escalated level {escalation['level']}"
    return text


def question_line(q: dict[str, Any]) -> str:
    """One question object of a page as ``hitl-gate questions list`` prints it (never its
    text nor its answer)."""
    from gate.protocol.display import display_time

    return (
        f"{q['question_id']}  {q['state']:8}  {q['outcome'] or '-':9}  "
        f"{q['pipeline']}/{q['step']}  {(q.get('question') or {}).get('response_type')}  "
        f"version {q.get('version')}  expires {display_time(q['expires_at'])}"
    )


def plain_json(value: Any) -> str:
    """``value`` as indented JSON text, non-ASCII letters kept as they are."""
    return json.dumps(value, ensure_ascii=False, indent=2)


@dataclass(frozen=True, slots=True)
class Notes:
    """What a kind's help texts add to the words all kinds share (``Kind.helps``)."""

    listed: str = ""  # after "List <noun>s, one line each (or JSON)"
    example_state: str = "pending"  # the --state of the list example
    shown: str = ""  # after "Print one <noun> as JSON"
    cancelled: str = ""  # after "resolves it as cancelled"


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of request as these commands handle it: ``noun`` (its id is ``<noun>_id``;
    the API's kind of that name), the click ``group`` its commands sit in, the ``line`` a
    list prints of one, the printer of its JSON (``dump``) and what its help texts add
    (``notes``)."""

    noun: str
    group: click.Group
    line: Callable[[dict[str, Any]], str]
    dump: Callable[[Any], str] = plain_json
    notes: Notes = Notes()

    @property
    def command(self) -> str:
        """How its group is called: ``hitl-gate`` or ``hitl-gate questions``."""
        return "hitl-gate" if self.group is main else f"hitl-gate {self.group.name}"

    @property
    def a_noun(self) -> str:
        """How a sentence names one: ``an approval``, ``a question``."""
        return ("an " if self.noun[0] in "aeiou" else "a ") + self.noun

    def helps(self) -> tuple[str, str, str]:
        """The help texts of its list, show and cancel, each with an example."""
        n, example = self.notes, f"Example: {self.command}"
        return (
            f"List {self.noun}s, one line each (or JSON){n.listed}.\n\n"
            f"{example} list -c config.example.yaml --state {n.example_state}",
            f"Print one {self.noun} as JSON{n.shown}.\n\n"
            f"{example} show -c config.example.yaml 01JABCDEF...",
            f"Withdraw a pending {self.noun} (resolves it as cancelled{n.cancelled}).\n\n"
            f"{example} cancel -c config.example.yaml 01JABCDEF...",
        )

    async def call(self, api: Any, verb: str, *args: Any) -> Any:
        """The ``ApiClient`` call ``<verb>_in`` (list, get, cancel) of its kind on ``api``
        with ``args``."""
        from gate.sdk.transport import APPROVALS, QUESTIONS

        kind = next(k for k in (APPROVALS, QUESTIONS) if k.name == self.noun)
        return await getattr(api, f"{verb}_in")(kind, *args)


KINDS = (
    Kind("approval", main, approval_line),
    Kind(
        "question",
        questions,
        question_line,
        safe_json,
        Notes(
            "; never their text nor their answer",
            "all",
            " (with its answer, once answered)",
            "; a waiting ask exits 5",
        ),
    ),
)


def _api_call(config_path: str, api_url: str | None, call: Callable[[Any], Awaitable[Any]]) -> Any:
    """``call(api)`` on the API client of the config (or ``--api-url``), run to its end: a
    gate error is one ``Error:`` line and exit 1 (``gate.cli.run``); exits 2 as
    ``api_target`` does."""
    from gate.client.api import ApiClient

    async def go() -> Any:
        async with ApiClient(*api_target(read_config(config_path), api_url)) as api:
            return await call(api)

    return run(go())


async def _get(kind: Kind, api: Any, item_id: str) -> Any:
    """``kind``'s object ``item_id``; a 404 for the id of another kind exits 1 naming the
    command that shows it."""
    from gate.client.api import ClientError

    try:
        return await kind.call(api, "get", item_id)
    except ClientError as exc:
        for other in [k for k in KINDS if k is not kind] if exc.status == 404 else []:
            try:
                await other.call(api, "get", item_id)
            except ClientError:
                continue
            fail(f"{item_id} is {other.a_noun}: use {other.command} show {item_id}")
        raise


async def _cancel(kind: Kind, api: Any, item_id: str) -> Any:
    """Cancel ``kind``'s ``item_id``; one already resolved exits 1 saying its outcome
    (whether the action may have fired depends on it)."""
    from gate.client.api import ClientError

    try:
        return await kind.call(api, "cancel", item_id)
    except ClientError as exc:
        if exc.code == "already_resolved" and "outcome" in exc.extra:
            fail(
                f"{kind.noun} {item_id} is already resolved (outcome "
                f"{exc.extra['outcome']}); nothing changed (HTTP 409 already_resolved)"
            )
        raise


def _add_commands(kind: Kind) -> None:
    """Register ``list``, ``show`` and ``cancel`` of ``kind`` on its group."""
    list_help, show_help, cancel_help = kind.helps()

    @kind.group.command("list", help=list_help)
    @CONFIG_OPTION
    @API_URL_OPTION
    @list_options
    def list_cmd(
        config_path: str,
        api_url: str | None,
        state: str,
        pipeline: str | None,
        limit: int,
        cursor: str | None,
        as_json: bool,
    ) -> None:
        query = (state, pipeline, limit, cursor)
        page = _api_call(config_path, api_url, lambda api: kind.call(api, "list", *query))
        if as_json:
            click.echo(kind.dump(page))
        else:
            echo_page(page, f"{kind.noun}s", state, pipeline, cursor, kind.line)

    _add_item_command(kind, "show", show_help, _get, kind.dump)
    cancelled = kind.noun + "_id"
    _add_item_command(kind, "cancel", cancel_help, _cancel, lambda r: f"{r[cancelled]} cancelled")


def _add_item_command(
    kind: Kind,
    name: str,
    help_text: str,
    call: Callable[[Kind, Any, str], Awaitable[Any]],
    output: Callable[[Any], str],
) -> None:
    """Register ``kind``'s command ``name`` on one item (``<NOUN>_ID``): ``call(kind, api,
    item_id)`` on the API, then ``output`` of its result on stdout."""

    @kind.group.command(name, help=help_text)
    @CONFIG_OPTION
    @API_URL_OPTION
    @click.argument("item_id", metavar=f"{kind.noun.upper()}_ID")
    def command(config_path: str, api_url: str | None, item_id: str) -> None:
        click.echo(output(_api_call(config_path, api_url, lambda api: call(kind, api, item_id))))


for _kind in KINDS:
    _add_commands(_kind)
