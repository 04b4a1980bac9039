"""``AsyncGate``: the SDK's asynchronous client of the pipeline API (SPEC §3).

Creates approvals and questions, waits for them in bounded long-polls, and retries what
passes by itself (no connection, 502/503/504) as ``hitl-gate request --wait`` does: always
with an Idempotency-Key, so a retried create joins the approval it made.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from gate.sdk.errors import GateRequestError, GateUnavailable, HitlGateError
from gate.sdk.models import Approval, Question
from gate.sdk.transport import CALL_TIMEOUT_S, MARGIN_S, Transport

log = logging.getLogger(__name__)

# one long-poll hop (seconds): well under the gate's limit (300) and any proxy's idle timeout
HOP_S = 50.0
# pauses while the gate cannot be reached: 0.5 s doubling to 5 s (as gate/client/request.py)
RETRY_BASE_S = 0.5
RETRY_CAP_S = 5.0
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


def _transient(exc: HitlGateError) -> bool:
    """True for a failure that passes by itself: no connection, or 502/503/504."""
    return isinstance(exc, GateUnavailable) or (
        isinstance(exc, GateRequestError) and exc.status in (502, 503, 504)
    )


def _pause(outage: int, deadline: float | None) -> float:
    """Seconds to wait after the ``outage``-th failure in a row, never past ``deadline``."""
    pause = min(RETRY_CAP_S, RETRY_BASE_S * float(2 ** (outage - 1)))
    return pause if deadline is None else min(pause, max(0.0, deadline - time.monotonic()))


def _deadline(wait: float | None) -> float | None:
    """The monotonic time a call with ``wait`` seconds ends (None: until resolved)."""
    return None if wait is None else time.monotonic() + wait


def _bound(deadline: float | None) -> float:
    """The timeout (seconds) of one plain request made before ``deadline``: what is left of
    the wait + MARGIN_S, at most CALL_TIMEOUT_S (review 18c finding 6)."""
    if deadline is None:
        return CALL_TIMEOUT_S
    return min(CALL_TIMEOUT_S, max(0.0, deadline - time.monotonic()) + MARGIN_S)


def _check_wait(wait: float | None) -> None:
    if wait is not None and not wait >= 0:
        raise ValueError(f"wait must be None or seconds >= 0, got {wait!r}")


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


def check_key(key: str | None) -> str | None:
    """``key`` (None: absent) once the gate would take it as an Idempotency-Key: 1-200
    characters, not blank, printable (no newline or other control character; SPEC §3,
    gate/core/requests/fields.py). Raises ValueError starting ``idempotency_key: `` (review 18c
    finding 12)."""
    if key is None:
        return None
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_KEY_CHARS:
        raise ValueError(f"idempotency_key: must be 1-{MAX_KEY_CHARS} characters, not blank")
    if not key.isprintable():
        raise ValueError("idempotency_key: must not hold a newline or control character")
    return key


async def _all_pages(
    list_page: Callable[[str, str | None, int, str | None], Awaitable[Any]], pipeline: str | None
) -> list[dict[str, Any]]:
    """Every pending item of one list endpoint (``list_page(state, pipeline, limit,
    cursor)``, e.g. ``Transport.list``), following ``next_cursor`` to the last page."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await list_page("pending", pipeline, 100, cursor)
        out.extend(page.get("items") or [])
        cursor = page.get("next_cursor")
        if not cursor:
            return out


def _key(given: str | None, prefix: str) -> str:
    """``given``, else a fresh ``<prefix>-<uuid4 hex>``: every create carries a key, so a
    retried one is found again, never made twice (SPEC §3)."""
    return check_key(given) or f"{prefix}-{uuid.uuid4().hex}"


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

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
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
        _check_wait(wait)
        body: Obj = {
            "pipeline": pipeline,
            "step": step,
            "draft": {"content_type": content_type, "body": draft},
        }
        if run_id:
            body["run_id"] = run_id
        if spend is not None:
            body["spend"] = spend
        if requested_by is not None:
            body["requested_by"] = requested_by
        key = _key(idempotency_key, "hitl-sdk")
        deadline = _deadline(wait)
        obj = await self._create(self._transport.create, body, key, deadline)
        got = await self._wait(self._transport.get, obj, "approval_id", deadline)
        return Approval.from_json(got)

    async def get_approval(self, approval_id: str, wait: float | None = None) -> Approval:
        """The approval ``approval_id``; with ``wait`` (seconds, None: until resolved) wait
        for its outcome first. Raises GateRequestError 404 ``not_found`` for an unknown id."""
        _check_wait(wait)
        deadline = _deadline(wait)
        aid = check_id(approval_id, "approval_id")
        obj = await self._transport.get(aid, timeout=_bound(deadline))
        got = await self._wait(self._transport.get, obj, "approval_id", deadline)
        return Approval.from_json(got)

    async def cancel_approval(self, approval_id: str) -> Approval:
        """Cancel a pending approval (outcome ``cancelled``); raises GateRequestError 409 when
        it is already resolved."""
        return Approval.from_json(
            await self._transport.cancel(check_id(approval_id, "approval_id"))
        )

    async def list_pending(self, pipeline: str | None = None) -> list[Approval]:
        """Every pending approval (of ``pipeline`` when given), oldest first, all pages."""
        items = await _all_pages(self._transport.list, pipeline)
        return [Approval.from_json(item) for item in items]

    async def list_pending_questions(self, pipeline: str | None = None) -> list[Question]:
        """Every pending question (of ``pipeline`` when given), oldest first, all pages."""
        items = await _all_pages(self._transport.list_questions, pipeline)
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
        _check_wait(wait)
        body: Obj = {"pipeline": pipeline, "step": step, "text": text}
        body["response_type"] = response_type
        if run_id:
            body["run_id"] = run_id
        if reason is not None:
            body["reason"] = reason
        if options:
            body["options"] = list(options)
        if schema is not None:
            body["schema"] = schema
        if requested_by is not None:
            body["requested_by"] = requested_by
        key = _key(idempotency_key, "hitl-sdk-ask")
        deadline = _deadline(wait)
        obj = await self._create(self._transport.create_question, body, key, deadline)
        get = self._transport.get_question
        return Question.from_json(await self._wait(get, obj, "question_id", deadline))

    async def get_question(self, question_id: str, wait: float | None = None) -> Question:
        """The question ``question_id``; with ``wait`` wait for its answer first."""
        _check_wait(wait)
        deadline = _deadline(wait)
        qid = check_id(question_id, "question_id")
        obj = await self._transport.get_question(qid, timeout=_bound(deadline))
        get = self._transport.get_question
        return Question.from_json(await self._wait(get, obj, "question_id", deadline))

    async def cancel_question(self, question_id: str) -> Question:
        """Cancel a pending question; raises GateRequestError 409 when already resolved."""
        qid = check_id(question_id, "question_id")
        return Question.from_json(await self._transport.cancel_question(qid))

    # ---- the waiting ------------------------------------------------------------------

    async def _create(
        self,
        send: Callable[..., Awaitable[tuple[Any, bool]]],
        body: Obj,
        key: str,
        deadline: float | None,
    ) -> Obj:
        """POST the create; unless the wait is 0, retry transient failures (same key) until
        the gate takes it or ``deadline`` (monotonic) passes (then raise the last failure).
        Each attempt is bounded by what is left of the wait + MARGIN_S (at most
        CALL_TIMEOUT_S): a gate that hangs never holds the caller past it."""
        wait = None if deadline is None else deadline - time.monotonic()
        outage = 0
        while True:
            try:
                obj, _ = await send(body, key, timeout=_bound(deadline))
                return dict(obj)
            except (GateUnavailable, GateRequestError) as exc:
                if not _transient(exc) or (wait is not None and wait <= 0):
                    raise
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                outage += 1
                if outage == 1:
                    log.warning("gate_unavailable retrying=create idempotency_key=%s", key)
                await asyncio.sleep(_pause(outage, deadline))

    async def _wait(
        self, get: Callable[..., Awaitable[Any]], obj: Obj, id_key: str, deadline: float | None
    ) -> Obj:
        """Long-poll ``get`` until ``obj`` resolves or ``deadline`` (monotonic; None: never)
        passes; transient failures are retried with backoff (the object is durable on the
        gate, SPEC §8)."""
        outage = 0
        while obj["state"] != "resolved":
            remaining = HOP_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                obj = dict(await get(obj[id_key], wait=min(HOP_S, remaining)))
            except (GateUnavailable, GateRequestError) as exc:
                if not _transient(exc):
                    raise
                outage += 1
                if outage == 1:
                    log.warning("gate_unavailable retrying=wait %s=%s", id_key, obj[id_key])
                await asyncio.sleep(_pause(outage, deadline))
                continue
            outage = 0
        return obj
