"""``hitl-gate questions list|show|cancel``, over the API: the approval commands'
list, show and cancel for questions, kept apart from them as questions are on the gate."""

from __future__ import annotations

from typing import Any

import click

from gate.cli import API_URL_OPTION, CONFIG_OPTION, fail, main, run
from gate.cli.common import api_client, echo_page, list_options, safe_json


@main.group()
def questions() -> None:
    """Operate on questions: list, show, cancel.

    Example: hitl-gate questions list -c config.example.yaml --state pending
    """


@questions.command("list")
@CONFIG_OPTION
@API_URL_OPTION
@list_options
def list_questions(
    config_path: str,
    api_url: str | None,
    state: str,
    pipeline: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
) -> None:
    """List questions, one line each (or JSON); never their text nor their answer.

    Example: hitl-gate questions list -c config.example.yaml --state all
    """

    async def go() -> Any:
        async with api_client(config_path, api_url) as api:
            return await api.list_questions(state, pipeline, limit, cursor)

    page = run(go())
    if as_json:
        click.echo(safe_json(page))
        return
    echo_page(page, "questions", state, pipeline, cursor, question_line)


def question_line(q: dict[str, Any]) -> str:
    """One question object of a page as ``hitl-gate questions list`` prints it (never its
    text nor its answer)."""
    from gate.protocol.display import display_time

    return (
        f"{q['question_id']}  {q['state']:8}  {q['outcome'] or '-':9}  "
        f"{q['pipeline']}/{q['step']}  {(q.get('question') or {}).get('response_type')}  "
        f"version {q.get('version')}  expires {display_time(q['expires_at'])}"
    )


@questions.command("show")
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("question_id")
def show_question(config_path: str, api_url: str | None, question_id: str) -> None:
    """Print one question as JSON (with its answer, once answered).

    Example: hitl-gate questions show -c config.example.yaml 01JABCDEF...
    """

    from gate.client.api import ClientError

    async def go() -> Any:
        async with api_client(config_path, api_url) as api:
            try:
                return await api.get_question(question_id)
            except ClientError as exc:
                if exc.status == 404 and await other_kind_exists(api.get, question_id):
                    fail(f"{question_id} is an approval: use hitl-gate show {question_id}")
                raise

    click.echo(safe_json(run(go())))


async def other_kind_exists(get: Any, item_id: str) -> bool:
    """True when ``get(item_id)`` answers (the id is of the other kind: A4's hint)."""
    from gate.client.api import ClientError

    try:
        await get(item_id)
    except ClientError:
        return False
    return True


@questions.command("cancel")
@CONFIG_OPTION
@API_URL_OPTION
@click.argument("question_id")
def cancel_question(config_path: str, api_url: str | None, question_id: str) -> None:
    """Withdraw a pending question (resolves it as cancelled; a waiting ask exits 5).

    Example: hitl-gate questions cancel -c config.example.yaml 01JABCDEF...
    """
    from gate.client.api import ClientError

    async def go() -> Any:
        async with api_client(config_path, api_url) as api:
            try:
                return await api.cancel_question(question_id)
            except ClientError as exc:
                if exc.code == "already_resolved" and "outcome" in exc.extra:
                    fail(
                        f"question {question_id} is already resolved (outcome "
                        f"{exc.extra['outcome']}); nothing changed (HTTP 409 already_resolved)"
                    )
                raise

    result = run(go())
    click.echo(f"{result['question_id']} cancelled")
