"""Pipeline-side client of the API (SPEC §3), used by the CLI."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

import aiohttp

from gate.config import Config, UnixListen, parse_listen
from gate.core.requests import quorum_unreachable_message
from gate.errors import GateError


class ClientError(GateError):
    """The gate could not be reached, or answered with an error (``status`` is HTTP, 0 if none)."""


def api_base(config: Config) -> str:
    """Return the API base URL for ``api.listen``: ``http://host:port`` or ``unix:/path``.

    A wildcard bind address (0.0.0.0, ::) is reached on loopback.
    """
    parsed = parse_listen(config.api.listen)
    if isinstance(parsed, UnixListen):
        return f"unix:{parsed.path}"
    host = parsed.host
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{parsed.port}"


def _detail(answer: dict[str, Any]) -> str | None:
    """What an error answer's additive fields say, in words (the gate sends no human message):
    for 422 ``quorum_unreachable``, who asked and how many approvers remain."""
    if answer.get("reason") == "quorum_unreachable":
        requester, left = answer.get("requested_by"), answer.get("approvers_left")
        quorum = answer.get("quorum_required")
        if isinstance(requester, str) and isinstance(left, int) and isinstance(quorum, int):
            return quorum_unreachable_message(requester, left, quorum)
    return None


class ApiClient:
    """Async client: ``async with ApiClient(base, token) as api: await api.create(...)``.

    Every method returns the decoded JSON answer or raises ClientError carrying the
    gate's ``reason`` as ``code``.
    """

    def __init__(self, base: str, token: str) -> None:
        if base.startswith("unix:"):
            self._connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=base[5:])
            self._base = "http://localhost"
        else:
            self._connector = aiohttp.TCPConnector()
            self._base = base.rstrip("/")
        self._display = base
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            headers={"Authorization": f"Bearer {token}"},
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            trust_env=False,
        )

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._session.close()

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        url = self._base + path
        data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
        hdrs = dict(headers or {})
        if data is not None:
            hdrs["Content-Type"] = "application/json; charset=utf-8"
        try:
            async with self._session.request(
                method, url, data=data, params=params, headers=hdrs
            ) as resp:
                text = await resp.text(encoding="utf-8")
                status = resp.status
        except aiohttp.ClientError as exc:
            raise ClientError(
                "gate_unreachable", f"cannot reach the gate at {self._display}: {exc}", status=0
            ) from exc
        try:
            answer = json.loads(text) if text else {}
        except ValueError:
            raise ClientError(
                "bad_answer", f"the gate answered HTTP {status} without JSON", status=status
            ) from None
        if status >= 400:
            reason = answer.get("reason", "error") if isinstance(answer, dict) else "error"
            message = answer.get("message") if isinstance(answer, dict) else None
            detail = _detail(answer) if isinstance(answer, dict) else None
            raise ClientError(
                str(reason),
                message
                or f"the gate answered HTTP {status} {reason}" + (f": {detail}" if detail else ""),
                status=status,
                extra=answer if isinstance(answer, dict) else None,
            )
        return status, answer

    async def create(
        self, body: dict[str, Any], idempotency_key: str | None = None
    ) -> tuple[Any, bool]:
        """POST /v1/approvals; returns ``(approval object, created)``: ``created`` is False when
        the gate answered 200, i.e. the same request with this Idempotency-Key was made before
        (SPEC §3) and the object is that earlier approval as it stands now."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        status, answer = await self._call("POST", "/v1/approvals", body=body, headers=headers)
        return answer, status == 201

    async def get(self, approval_id: str, wait: float | None = None) -> Any:
        """GET /v1/approvals/{id}, long-polling up to ``wait`` seconds when given."""
        params = None if wait is None else {"wait": f"{wait:g}"}
        return (await self._call("GET", f"/v1/approvals/{approval_id}", params=params))[1]

    async def list(self, state: str, pipeline: str | None, limit: int, cursor: str | None) -> Any:
        """GET /v1/approvals with filters; returns ``{items, next_cursor}``."""
        params = {"state": state, "limit": str(limit)}
        if pipeline:
            params["pipeline"] = pipeline
        if cursor:
            params["cursor"] = cursor
        return (await self._call("GET", "/v1/approvals", params=params))[1]

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        """One admin API call (issue 16: ``/v1/admin/...``; the client must hold the admin
        token); returns the decoded answer."""
        return (await self._call(method, path, body=body))[1]

    async def cancel(self, approval_id: str) -> Any:
        """POST /v1/approvals/{id}/cancel; returns the resolved approval."""
        return (await self._call("POST", f"/v1/approvals/{approval_id}/cancel"))[1]

    # ---- questions (issue 15): their own endpoints, never the approvals' ----------------

    async def create_question(
        self, body: dict[str, Any], idempotency_key: str | None = None
    ) -> tuple[Any, bool]:
        """POST /v1/questions; returns ``(question object, created)`` as ``create`` does for
        approvals (``created`` False: the gate answered 200, an earlier create with this
        Idempotency-Key; issue 15)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        status, answer = await self._call("POST", "/v1/questions", body=body, headers=headers)
        return answer, status == 201

    async def get_question(self, question_id: str, wait: float | None = None) -> Any:
        """GET /v1/questions/{id}, long-polling up to ``wait`` seconds when given."""
        params = None if wait is None else {"wait": f"{wait:g}"}
        return (await self._call("GET", f"/v1/questions/{question_id}", params=params))[1]

    async def list_questions(
        self, state: str, pipeline: str | None, limit: int, cursor: str | None
    ) -> Any:
        """GET /v1/questions with filters; returns ``{items, next_cursor}``."""
        params = {"state": state, "limit": str(limit)}
        if pipeline:
            params["pipeline"] = pipeline
        if cursor:
            params["cursor"] = cursor
        return (await self._call("GET", "/v1/questions", params=params))[1]

    async def cancel_question(self, question_id: str) -> Any:
        """POST /v1/questions/{id}/cancel; returns the resolved question."""
        return (await self._call("POST", f"/v1/questions/{question_id}/cancel"))[1]
