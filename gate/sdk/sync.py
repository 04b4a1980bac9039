"""``Gate``: the synchronous twin of ``AsyncGate``, for code without an event loop.

Each call runs the async client on its own short-lived event loop (``asyncio.run``); called
from inside a running loop it refuses with a RuntimeError naming AsyncGate, since blocking
there would stall every other task.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Concatenate, ParamSpec, Self, TypeVar

from gate.sdk.client import AsyncGate

T = TypeVar("T")
P = ParamSpec("P")


def blocking(
    method: Callable[Concatenate[AsyncGate, P], Awaitable[T]],
) -> Callable[Concatenate[Gate, P], T]:
    """``Gate``'s twin of an ``AsyncGate`` method: the same arguments (its signature and
    docstring, via ``functools.wraps``) and result, blocking (``Gate._run``)."""

    @functools.wraps(method)
    def call(self: Gate, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(lambda gate: method(gate, *args, **kwargs))

    return call


class Gate:
    """Synchronous client: the same methods, arguments and results as ``AsyncGate``, blocking
    (each made from the AsyncGate method by ``blocking``, so the two cannot drift apart).

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

    request_approval = blocking(AsyncGate.request_approval)
    get_approval = blocking(AsyncGate.get_approval)
    cancel_approval = blocking(AsyncGate.cancel_approval)
    list_pending = blocking(AsyncGate.list_pending)
    list_pending_questions = blocking(AsyncGate.list_pending_questions)
    ask = blocking(AsyncGate.ask)
    get_question = blocking(AsyncGate.get_question)
    cancel_question = blocking(AsyncGate.cancel_question)
