"""``AsyncGate``: the SDK's asynchronous client of the pipeline API (SPEC §3).

Creates approvals and questions, waits for them in bounded long-polls, and retries what
passes by itself (no connection, 502/503/504): always with an Idempotency-Key, so a retried
create joins the approval it made. The loop is ``gate.sdk.waiting``'s, the one
``hitl-gate request --wait`` and ``ask --wait`` run too.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from gate.sdk.models import Approval, Question
from gate.sdk.transport import APPROVALS, QUESTIONS, Kind, Transport
from gate.sdk.waiting import Watch, create, deadline_after, fetch, settle

URL_ENV = "HITL_GATE_URL"
TOKEN_ENV = "HITL_GATE_TOKEN"

Obj = dict[str, Any]


def listen_url(listen: str) -> str:
    """The API base URL for an ``api.listen`` value: ``http://host:port`` or ``unix:/path``;
    a wildcard bind address (0.0.0.0, ::) is reached on loopback. Raises ValueError for a
    value that is no listen address (gate.config.parse_listen)."""
    from gate.config import UnixListen, parse_listen  # lazily: only from_config needs it

    parsed = parse_listen(listen)
    if isinstance(parsed, UnixListen):
        return f"unix:{parsed.path}"
    host = parsed.host
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{parsed.port}"


MAX_KEY_CHARS = 200  # the gate's MAX_IDEMPOTENCY_KEY_CHARS (gate/core/requests/fields.py)


def check_id(value: str, argument: str) -> str:
    """``value`` once it can be an approval/question id: a non-empty printable string with
    no ``/`` and no ``..`` (one path segment). Raises ValueError starting ``<argument>: ``
    (review 18c finding 11)."""
    if not isinstance(value, str) or not value.strip() or not value.isprintable():
        raise ValueError(f"{argument}: must be a non-empty printable id")
    if "/" in value or ".." in value or "\\" in value:
        raise ValueError(f"{argument}: an id has no '/', '\\' or '..'")
    return value


async def _all_pages(transport: Transport, kind: Kind, pipeline: str | None) -> list[Obj]:
    """Every pending item of ``kind`` (``Transport.list_in``), following ``next_cursor`` to
    the last page."""
    out: list[Obj] = []
    cursor: str | None = None
    while True:
        page = await transport.list_in(kind, "pending", pipeline, 100, cursor)
        out.extend(page.get("items") or [])
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def _key(given: str | None, prefix: str) -> str:
    """``given`` once the gate would take it as an Idempotency-Key: 1-200 characters, not
    blank, printable (no newline or other control character; SPEC §3,
    gate/core/requests/fields.py); raises ValueError starting ``idempotency_key: `` (review
    18c finding 12). None: a fresh ``<prefix>-<uuid4 hex>``, since every create carries a
    key, so a retried one is found again, never made twice (SPEC §3)."""
    if given is None:
        return f"{prefix}-{uuid.uuid4().hex}"
    if not isinstance(given, str) or not given.strip() or len(given) > MAX_KEY_CHARS:
        raise ValueError(f"idempotency_key: must be 1-{MAX_KEY_CHARS} characters, not blank")
    if not given.isprintable():
        raise ValueError("idempotency_key: must not hold a newline or control character")
    return given


class AsyncGate:
    """Asynchronous client: ``async with AsyncGate(url, token) as gate: ...``.

    ``url`` is ``http(s)://host:port`` or ``unix:/path`` (the gate's ``api.listen``),
    ``token`` the pipeline API token (``api.token_env``). Waits are in seconds: ``None``
    until resolved (long-polls of ``HOP_S``, retrying while the gate is unreachable or
    answers 502/503/504), ``0`` answer at once, else at most that long (the object is then
    returned still ``pending``). Raises GateRequestError for what the gate refuses (400
    naming the field, 404 unknown pipeline/step, 409 ``idempotency_key_reused``, ...),
    GateUnavailable when it cannot be reached and no wait allows a retry.
    """

    def __init__(self, url: str, token: str) -> None:
        if not (url.startswith(("http://", "https://")) or len(url) > 5 and url[:5] == "unix:"):
            raise ValueError(f"url must be http(s)://host:port or unix:/path, got {url!r}")
        if not token or not token.isprintable():
            raise ValueError("token must be a non-empty printable string")
        self.url = url
        self._token = token
        self._transport = Transport(url, token)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """A client for ``$HITL_GATE_URL`` with ``$HITL_GATE_TOKEN``; raises ValueError naming
        the variable that is not set and both the SDK needs (the CLI's ``api.token_env``,
        e.g. HITL_API_TOKEN, is not read here: set HITL_GATE_TOKEN to the same token)."""
        env = os.environ if environ is None else environ
        for name in (URL_ENV, TOKEN_ENV):
            if not env.get(name):
                raise ValueError(
                    f"{name} is not set: the SDK needs {URL_ENV} (the gate's API URL) and "
                    f"{TOKEN_ENV} (its pipeline API token)"
                )
        return cls(env[URL_ENV], env[TOKEN_ENV])

    @classmethod
    def from_config(cls, path: str | Path, environ: Mapping[str, str] | None = None) -> Self:
        """A client for a gate config file as the CLI reads it: ``api.listen`` (a wildcard
        bind is reached on loopback) and the token of ``api.token_env`` (or its file in
        ``$CREDENTIALS_DIRECTORY``). Raises gate.errors.ConfigError for an invalid config,
        ValueError when the token is not set."""
        from gate.config import load_config, read_api_token  # lazily: only this needs it

        config = load_config(Path(path))
        token, error = read_api_token(config, os.environ if environ is None else environ)
        if token is None:
            raise ValueError(error or f"api.token_env: {config.api.token_env} is not set")
        return cls(listen_url(config.api.listen), token)

    async def close(self) -> None:
        """Close the HTTP session (idempotent); ``async with`` does it."""
        await self._transport.close()

    async def aclose(self) -> None:
        """``close()`` under the name of aiohttp/httpx clients."""
        await self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ---- approvals --------------------------------------------------------------------

    async def request_approval(
        self,
        pipeline: str,
        step: str,
        draft: str,
        *,
        content_type: str = "text/plain",
        run_id: str | None = None,
        idempotency_key: str | None = None,
        requested_by: str | None = None,
        spend: float | None = None,
        wait: float | None = None,
    ) -> Approval:
        """Ask for approval of ``draft`` on ``pipeline``/``step`` (POST /v1/approvals) and wait
        up to ``wait`` seconds for the outcome. The same ``idempotency_key`` (and the same
        request) joins the approval made before, e.g. by a process that crashed; without
        one, a fresh key is made for this call alone. ``spend`` is in the step's budget
        unit. Returns the Approval (``pending`` if the wait ended first: not a yes)."""
        deadline = deadline_after(wait)
        body = approval_body(pipeline, step, draft, content_type, run_id, spend, requested_by)
        got = await self._request(APPROVALS, body, _key(idempotency_key, "hitl-sdk"), deadline)
        return Approval.from_json(got)

    async def get_approval(self, approval_id: str, wait: float | None = None) -> Approval:
        """The approval ``approval_id``; with ``wait`` (seconds, None: until resolved) wait
        for its outcome first. Raises GateRequestError 404 ``not_found`` for an unknown id."""
        return Approval.from_json(await self._get(APPROVALS, approval_id, wait))

    async def cancel_approval(self, approval_id: str) -> Approval:
        """Cancel a pending approval (outcome ``cancelled``); raises GateRequestError 409 when
        it is already resolved."""
        return Approval.from_json(await self._cancel(APPROVALS, approval_id))

    async def list_pending(self, pipeline: str | None = None) -> list[Approval]:
        """Every pending approval (of ``pipeline`` when given), oldest first, all pages."""
        items = await _all_pages(self._transport, APPROVALS, pipeline)
        return [Approval.from_json(item) for item in items]

    async def list_pending_questions(self, pipeline: str | None = None) -> list[Question]:
        """Every pending question (of ``pipeline`` when given), oldest first, all pages."""
        items = await _all_pages(self._transport, QUESTIONS, pipeline)
        return [Question.from_json(item) for item in items]

    # ---- questions ---------------------------------------------------------

    async def ask(
        self,
        pipeline: str,
        step: str,
        text: str,
        *,
        response_type: str = "free_text",
        options: list[str] | tuple[str, ...] | None = None,
        schema: dict[str, Any] | None = None,
        reason: str | None = None,
        run_id: str | None = None,
        idempotency_key: str | None = None,
        requested_by: str | None = None,
        wait: float | None = None,
    ) -> Question:
        """Ask a person ``text`` (POST /v1/questions): ``response_type`` ``free_text``,
        ``single_choice``/``multi_choice`` (with ``options``) or ``form`` (with ``schema``);
        wait up to ``wait`` seconds for the answer. Keys as ``request_approval``. Returns the
        Question (``pending`` if the wait ended first)."""
        deadline = deadline_after(wait)
        body = question_body(
            pipeline, step, text, response_type, reason, options, schema, run_id, requested_by
        )
        key = _key(idempotency_key, "hitl-sdk-ask")
        return Question.from_json(await self._request(QUESTIONS, body, key, deadline))

    async def get_question(self, question_id: str, wait: float | None = None) -> Question:
        """The question ``question_id``; with ``wait`` wait for its answer first."""
        return Question.from_json(await self._get(QUESTIONS, question_id, wait))

    async def cancel_question(self, question_id: str) -> Question:
        """Cancel a pending question; raises GateRequestError 409 when already resolved."""
        return Question.from_json(await self._cancel(QUESTIONS, question_id))

    # ---- one family of calls for every kind (gate.sdk.waiting runs the loop) -----------

    async def _request(self, kind: Kind, body: Obj, key: str, deadline: float | None) -> Obj:
        """Create (retried with ``key``) and wait until ``deadline`` for the outcome."""
        obj, _ = await create(self._transport, kind, body, key, deadline, Watch())
        return await settle(self._transport, kind, obj, deadline, Watch())

    async def _get(self, kind: Kind, item_id: str, wait: float | None) -> Obj:
        """One object of ``kind``, after waiting up to ``wait`` seconds for its outcome."""
        deadline = deadline_after(wait)
        got = check_id(item_id, kind.id_key)
        obj = await fetch(self._transport, kind, got, deadline, Watch())
        return await settle(self._transport, kind, obj, deadline, Watch())

    async def _cancel(self, kind: Kind, item_id: str) -> Any:
        """Cancel one pending object of ``kind``; returns it resolved."""
        return await self._transport.cancel_in(kind, check_id(item_id, kind.id_key))


def approval_body(
    pipeline: str,
    step: str,
    draft: str,
    content_type: str = "text/plain",
    run_id: str | None = None,
    spend: float | None = None,
    requested_by: str | None = None,
) -> Obj:
    """The JSON body of ``POST /v1/approvals`` (SPEC §3): absent optional fields (and an
    empty ``run_id``) are left out, never null."""
    draft_object = {"content_type": content_type, "body": draft}
    body = {"pipeline": pipeline, "step": step, "draft": draft_object}
    return _with_given(body, run_id, requested_by, spend=spend)


def question_body(
    pipeline: str,
    step: str,
    text: str,
    response_type: str = "free_text",
    reason: str | None = None,
    options: list[str] | tuple[str, ...] | None = None,
    schema: dict[str, Any] | None = None,
    run_id: str | None = None,
    requested_by: str | None = None,
) -> Obj:
    """The JSON body of ``POST /v1/questions``: absent optional fields (an empty ``run_id``
    or ``options`` too) are left out, never null."""
    body = {"pipeline": pipeline, "step": step, "text": text, "response_type": response_type}
    choices = list(options) if options else None
    return _with_given(body, run_id, requested_by, reason=reason, options=choices, schema=schema)


def _with_given(body: Obj, run_id: str | None, requested_by: str | None, **fields: Any) -> Obj:
    """A create's ``body`` with its optional fields that are given: ``run_id`` unless empty,
    then each of ``fields`` and ``requested_by`` unless None (absent ones are left out,
    never null)."""
    optional = {"run_id": run_id or None, **fields, "requested_by": requested_by}
    return body | {name: value for name, value in optional.items() if value is not None}
