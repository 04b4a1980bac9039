"""Pipeline-side client of the API (SPEC §3), used by the CLI: the SDK's transport with the
CLI's errors (ClientError)."""

from __future__ import annotations

from typing import Any

from gate.core.approvals.create import quorum_unreachable_message
from gate.errors import GateError
from gate.sdk.errors import GateRequestError, GateUnavailable
from gate.sdk.transport import Transport


class ClientError(GateError):
    """The gate could not be reached, or answered with an error (``status`` is HTTP, 0 if none)."""


def _detail(answer: dict[str, Any]) -> str | None:
    """What an error answer's additive fields say, in words (the gate sends no human message):
    for 422 ``quorum_unreachable``, who asked and how many approvers remain."""
    if answer.get("reason") == "quorum_unreachable":
        requester, left = answer.get("requested_by"), answer.get("approvers_left")
        quorum = answer.get("quorum_required")
        if isinstance(requester, str) and isinstance(left, int) and isinstance(quorum, int):
            return quorum_unreachable_message(requester, left, quorum)
    return None


def client_error(exc: GateUnavailable | GateRequestError) -> ClientError:
    """The CLI's error for what a call of the SDK's transport raised: ``gate_unreachable``
    (status 0) when the gate cannot be reached, else the gate's ``reason`` as ``code`` with
    its message (or ``the gate answered HTTP <status> <reason>``, and what the answer's
    fields say) and the answer as ``extra``."""
    if isinstance(exc, GateUnavailable):
        return ClientError("gate_unreachable", str(exc), status=0)
    answer = exc.answer
    if answer is None and exc.reason == "bad_answer":
        return ClientError("bad_answer", exc.message, status=exc.status)
    message = answer.get("message") if answer is not None else None
    detail = _detail(answer) if answer is not None else None
    return ClientError(
        exc.reason,
        message
        or f"the gate answered HTTP {exc.status} {exc.reason}" + (f": {detail}" if detail else ""),
        status=exc.status,
        extra=answer,
    )


class ApiClient(Transport):
    """Async client: ``async with ApiClient(base, token) as api:`` then, e.g.,
    ``await api.create_in(APPROVALS, body)``.

    The SDK's transport (``gate.sdk.transport``, one HTTP client of the pipeline API) with
    the CLI's errors: every method returns the decoded JSON answer or raises ClientError
    carrying the gate's ``reason`` as ``code`` (``client_error``).
    """

    async def _call(self, method: str, path: str, **options: Any) -> tuple[int, Any]:
        try:
            return await super()._call(method, path, **options)
        except (GateUnavailable, GateRequestError) as exc:
            raise client_error(exc) from exc

    async def admin(self, method: str, path: str, body: Any = None) -> Any:
        """One admin API call (``/v1/admin/...``; the client must hold the admin
        token); returns the decoded answer."""
        return (await self._call(method, path, body=body))[1]
