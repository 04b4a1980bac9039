"""``Gate``: the synchronous twin of ``AsyncGate``, for code without an event loop.

Each call runs the async client on its own short-lived event loop (``asyncio.run``); called
from inside a running loop it refuses with a RuntimeError naming AsyncGate, since blocking
there would stall every other task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

from gate.sdk.client import AsyncGate
from gate.sdk.models import Approval, Question

T = TypeVar("T")


class Gate:
    """Synchronous client: the same methods, arguments and results as ``AsyncGate``, blocking.

    ``Gate(url, token)``, ``Gate.from_env()``, ``Gate.from_config(path)``. Raises as AsyncGate
    does, and RuntimeError when called inside a running event loop (use AsyncGate there).
    """

    def __init__(self, url: str, token: str) -> None:
        AsyncGate(url, token)  # the same checks, at once
        self.url = url
        self._token = token

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """A client for ``$HITL_GATE_URL`` with ``$HITL_GATE_TOKEN`` (AsyncGate.from_env)."""
        gate = AsyncGate.from_env(environ)
        return cls(gate.url, gate._token)

    @classmethod
    def from_config(cls, path: str | Path, environ: Mapping[str, str] | None = None) -> Self:
        """A client for a gate config file as the CLI reads it (AsyncGate.from_config)."""
        gate = AsyncGate.from_config(path, environ)
        return cls(gate.url, gate._token)

    def _run(self, call: Callable[[AsyncGate], Awaitable[T]]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "gate.sdk.Gate blocks and cannot run inside a running event loop; "
                "use gate.sdk.AsyncGate (await its methods) there"
            )

        async def main() -> T:
            async with AsyncGate(self.url, self._token) as gate:
                return await call(gate)

        return asyncio.run(main())

    def request_approval(
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
        """AsyncGate.request_approval, blocking."""
        return self._run(
            lambda g: g.request_approval(
                pipeline,
                step,
                draft,
                content_type=content_type,
                run_id=run_id,
                idempotency_key=idempotency_key,
                requested_by=requested_by,
                spend=spend,
                wait=wait,
            )
        )

    def get_approval(self, approval_id: str, wait: float | None = None) -> Approval:
        """AsyncGate.get_approval, blocking."""
        return self._run(lambda g: g.get_approval(approval_id, wait))

    def cancel_approval(self, approval_id: str) -> Approval:
        """AsyncGate.cancel_approval, blocking."""
        return self._run(lambda g: g.cancel_approval(approval_id))

    def list_pending(self, pipeline: str | None = None) -> list[Approval]:
        """AsyncGate.list_pending, blocking."""
        return self._run(lambda g: g.list_pending(pipeline))

    def list_pending_questions(self, pipeline: str | None = None) -> list[Question]:
        """AsyncGate.list_pending_questions, blocking."""
        return self._run(lambda g: g.list_pending_questions(pipeline))

    def ask(
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
        """AsyncGate.ask, blocking."""
        return self._run(
            lambda g: g.ask(
                pipeline,
                step,
                text,
                response_type=response_type,
                options=options,
                schema=schema,
                reason=reason,
                run_id=run_id,
                idempotency_key=idempotency_key,
                requested_by=requested_by,
                wait=wait,
            )
        )

    def get_question(self, question_id: str, wait: float | None = None) -> Question:
        """AsyncGate.get_question, blocking."""
        return self._run(lambda g: g.get_question(question_id, wait))

    def cancel_question(self, question_id: str) -> Question:
        """AsyncGate.cancel_question, blocking."""
        return self._run(lambda g: g.cancel_question(question_id))
