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

from gate.cli import API_URL_OPTION, CONFIG_OPTION, fail, main, run
from gate.cli.common import api_client, echo_page, list_options, safe_json


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
class Kind:
    """One kind of request as these commands handle it: ``noun`` (its id is ``<noun>_id``),
    ``a_noun`` how a sentence names one, ``group`` the click group its commands sit in and
    ``command`` how that group is called, the help texts of list, show and cancel, its
    ``ApiClient`` calls, the line a list prints of one and the printer of its JSON."""

    noun: str
    a_noun: str
    group: click.Group
    command: str
    helps: tuple[str, str, str]
    list: Callable[[Any, str, str | None, int, str | None], Awaitable[Any]]
    get: Callable[[Any, str], Awaitable[Any]]
    cancel: Callable[[Any, str], Awaitable[Any]]
    line: Callable[[dict[str, Any]], str]
    dump: Callable[[Any], str]


KINDS = (
    Kind(
        "approval",
        "an approval",
        main,
        "hitl-gate",
        (
            "List approvals, one line each (or JSON).\n\n"
            "Example: hitl-gate list -c config.example.yaml --state pending",
            "Print one approval as JSON.\n\n"
            "Example: hitl-gate show -c config.example.yaml 01JABCDEF...",
            "Withdraw a pending approval (resolves it as cancelled).\n\n"
            "Example: hitl-gate cancel -c config.example.yaml 01JABCDEF...",
        ),
        list=lambda api, *query: api.list(*query),
        get=lambda api, item_id: api.get(item_id),
        cancel=lambda api, item_id: api.cancel(item_id),
        line=approval_line,
        dump=plain_json,
    ),
    Kind(
        "question",
        "a question",
        questions,
        "hitl-gate questions",
        (
            "List questions, one line each (or JSON); never their text nor their answer.\n\n"
            "Example: hitl-gate questions list -c config.example.yaml --state all",
            "Print one question as JSON (with its answer, once answered).\n\n"
            "Example: hitl-gate questions show -c config.example.yaml 01JABCDEF...",
            "Withdraw a pending question (resolves it as cancelled; a waiting ask exits 5).\n\n"
            "Example: hitl-gate questions cancel -c config.example.yaml 01JABCDEF...",
        ),
        list=lambda api, *query: api.list_questions(*query),
        get=lambda api, item_id: api.get_question(item_id),
        cancel=lambda api, item_id: api.cancel_question(item_id),
        line=question_line,
        dump=safe_json,
    ),
)


def _add_list(kind: Kind) -> None:
    """Register ``list`` of ``kind``: one page, a line each (``kind.line``) or JSON."""

    @kind.group.command("list", help=kind.helps[0])
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
        async def go() -> Any:
            async with api_client(config_path, api_url) as api:
                return await kind.list(api, state, pipeline, limit, cursor)

        page = run(go())
        if as_json:
            click.echo(kind.dump(page))
            return
        echo_page(page, f"{kind.noun}s", state, pipeline, cursor, kind.line)


def _add_show(kind: Kind) -> None:
    """Register ``show`` of ``kind``: the object as JSON; an id of another kind exits 1
    saying which command shows it."""

    @kind.group.command("show", help=kind.helps[1])
    @CONFIG_OPTION
    @API_URL_OPTION
    @click.argument("item_id", metavar=f"{kind.noun.upper()}_ID")
    def show(config_path: str, api_url: str | None, item_id: str) -> None:
        from gate.client.api import ClientError

        async def go() -> Any:
            async with api_client(config_path, api_url) as api:
                try:
                    return await kind.get(api, item_id)
                except ClientError as exc:
                    for other in KINDS if exc.status == 404 else ():
                        if other is not kind:
                            await _hint_other_kind(other, api, item_id)
                    raise

        click.echo(kind.dump(run(go())))


async def _hint_other_kind(other: Kind, api: Any, item_id: str) -> None:
    """Exit 1 saying ``item_id`` is ``other``'s and the command that shows it, when
    ``other``'s get answers; return otherwise."""
    from gate.client.api import ClientError

    try:
        await other.get(api, item_id)
    except ClientError:
        return
    fail(f"{item_id} is {other.a_noun}: use {other.command} show {item_id}")


def _add_cancel(kind: Kind) -> None:
    """Register ``cancel`` of ``kind``: resolve it ``cancelled``; one already resolved exits 1
    saying its outcome."""

    @kind.group.command("cancel", help=kind.helps[2])
    @CONFIG_OPTION
    @API_URL_OPTION
    @click.argument("item_id", metavar=f"{kind.noun.upper()}_ID")
    def cancel(config_path: str, api_url: str | None, item_id: str) -> None:
        from gate.client.api import ClientError

        async def go() -> Any:
            async with api_client(config_path, api_url) as api:
                try:
                    return await kind.cancel(api, item_id)
                except ClientError as exc:
                    if exc.code == "already_resolved" and "outcome" in exc.extra:
                        # whether the action may have fired depends on the outcome: say it
                        fail(
                            f"{kind.noun} {item_id} is already resolved (outcome "
                            f"{exc.extra['outcome']}); nothing changed (HTTP 409 already_resolved)"
                        )
                    raise

        result = run(go())
        click.echo(f"{result[kind.noun + '_id']} cancelled")


for _kind in KINDS:
    _add_list(_kind)
    _add_show(_kind)
    _add_cancel(_kind)
