"""The one HTTP client of the pipeline API (SPEC §3): a call per endpoint, JSON in and out.

Used by the SDK (``AsyncGate``) and, through ``gate.client.api.ApiClient``, by the CLI.
Errors are the SDK's: ``GateUnavailable`` (no connection) and ``GateRequestError`` (an error
answer, or one that is not JSON).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import quote

import aiohttp

from gate.sdk.errors import GateRequestError, GateUnavailable

# every request is bounded (review 18c finding 6): a long-poll by its wait plus this margin,
# any other call by CALL_TIMEOUT_S; a gate that does not answer in time is GateUnavailable
MARGIN_S = 10.0
CALL_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of request of the pipeline API: ``name`` (``approval``, ``question``; what a
    message calls it), ``id_key`` (the id field of its objects) and ``path`` (its endpoints'
    root). The calls are the same for every kind; only these differ."""

    name: str
    id_key: str
    path: str


APPROVALS = Kind("approval", "approval_id", "/v1/approvals")
QUESTIONS = Kind("question", "question_id", "/v1/questions")


def _seg(value: str) -> str:
    """``value`` as one percent-encoded URL path segment (``/`` included): an id can never
    reach another endpoint (review 18c finding 11)."""
    return quote(value, safe="")


class Transport:
    """Async pipeline API client: ``async with Transport(base, token) as t:`` then, e.g.,
    ``await t.get_in(APPROVALS, approval_id)``.

    ``base`` is ``http(s)://host:port[/prefix]`` or ``unix:/path`` (a Unix socket); ``token``
    the pipeline API bearer token. The HTTP session is opened on the first call (inside the
    running event loop) and closed by ``close()`` or leaving the ``async with``. Every method
    returns the decoded JSON answer, or raises ``GateUnavailable`` / ``GateRequestError``.
    """

    def __init__(self, base: str, token: str) -> None:
        self._unix = base[5:] if base.startswith("unix:") else None
        self._base = "http://localhost" if self._unix is not None else base.rstrip("/")
        self._display = base
        self._token = token
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _open(self) -> aiohttp.ClientSession:
        """The HTTP session of the running event loop: one made in an earlier loop (a
        former ``asyncio.run``) is left behind, never used across loops (review 18c
        finding 9)."""
        loop = asyncio.get_running_loop()
        if self._session is not None and self._loop is not loop:
            self._session.detach()  # its loop is gone or another one: it cannot be used here
            self._session = None
        if self._session is None or self._session.closed:
            self._loop = loop
            # force_close: no keep-alive socket outlives the event loop it was made in
            connector: aiohttp.BaseConnector = (
                aiohttp.UnixConnector(path=self._unix, force_close=True)
                if self._unix is not None
                else aiohttp.TCPConnector(force_close=True)
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                headers={"Authorization": f"Bearer {self._token}"},
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                trust_env=False,
            )
        return self._session

    async def close(self) -> None:
        """Close the HTTP session (idempotent); one of another event loop is dropped."""
        if self._session is not None:
            if self._loop is asyncio.get_running_loop():
                await self._session.close()
            else:
                self._session.detach()
        self._session = None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        """One HTTP call; returns ``(status, decoded JSON)`` for a status below 400.

        Bounded: ``timeout`` seconds, else a long-poll's ``wait`` + ``MARGIN_S``, else
        ``CALL_TIMEOUT_S``. Raises GateUnavailable when the gate cannot be reached or does
        not answer in time, GateRequestError for an
        error answer (its ``reason`` and ``field``) or an answer that is not JSON
        (``bad_answer``)."""
        url = self._base + path
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        hdrs = dict(headers or {})
        if data is not None:
            hdrs["Content-Type"] = "application/json; charset=utf-8"
        if timeout is None:
            wait = (params or {}).get("wait")
            timeout = float(wait) + MARGIN_S if wait is not None else CALL_TIMEOUT_S
        try:
            async with self._open().request(
                method,
                url,
                data=data,
                params=params,
                headers=hdrs,
                timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=min(10.0, timeout)),
            ) as resp:
                text = await resp.text(encoding="utf-8")
                status = resp.status
        except aiohttp.ClientError as exc:
            raise GateUnavailable(f"cannot reach the gate at {self._display}: {exc}") from exc
        except TimeoutError:
            raise GateUnavailable(
                f"the gate at {self._display} did not answer within {timeout:g} s"
            ) from None
        try:
            answer = json.loads(text) if text else {}
        except ValueError:
            raise GateRequestError(
                status, "bad_answer", message=f"the gate answered HTTP {status} without JSON"
            ) from None
        if status >= 400:
            obj = answer if isinstance(answer, dict) else None
            said = {k: v for k, v in (obj or {}).items() if isinstance(v, str)}
            reason = str((obj or {}).get("reason", "error"))
            raise GateRequestError(
                status, reason, said.get("field"), message=said.get("message"), answer=obj
            )
        return status, answer

    # ---- one family of calls per kind of request (SPEC §3) -------------------------------

    async def create_in(
        self,
        kind: Kind,
        body: dict[str, Any],
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> tuple[Any, bool]:
        """POST the create of ``kind``; returns ``(object, created)``: ``created`` is False
        when the gate answered 200, i.e. the same request with this Idempotency-Key was made
        before (SPEC §3) and the object is that earlier one as it stands now."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        status, answer = await self._call(
            "POST", kind.path, body=body, headers=headers, timeout=timeout
        )
        return answer, status == 201

    async def get_in(
        self, kind: Kind, item_id: str, wait: float | None = None, timeout: float | None = None
    ) -> Any:
        """GET one object of ``kind``, long-polling up to ``wait`` seconds when given."""
        params = None if wait is None else {"wait": f"{wait:g}"}
        path = f"{kind.path}/{_seg(item_id)}"
        return (await self._call("GET", path, params=params, timeout=timeout))[1]

    async def list_in(
        self, kind: Kind, state: str, pipeline: str | None, limit: int, cursor: str | None
    ) -> Any:
        """GET the list of ``kind`` with filters; returns ``{items, next_cursor}``."""
        params = {"state": state, "limit": str(limit)}
        if pipeline:
            params["pipeline"] = pipeline
        if cursor:
            params["cursor"] = cursor
        return (await self._call("GET", kind.path, params=params))[1]

    async def cancel_in(self, kind: Kind, item_id: str) -> Any:
        """POST the cancel of one object of ``kind``; returns it resolved."""
        return (await self._call("POST", f"{kind.path}/{_seg(item_id)}/cancel"))[1]
