"""``require_approval``: a person approves each call of a function before it runs.

The call's arguments are rendered as the draft (JSON by default, or a renderer's text); the
call blocks until the approval resolves; the function runs only on approved (with the
arguments as called) or adjusted (with the arguments parsed back from the approver's edit);
anything else raises, and the function does not run.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
import os
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from gate.sdk.client import AsyncGate
from gate.sdk.errors import AdjustNotApplicable, ArgumentsChanged
from gate.sdk.models import Approval
from gate.sdk.render import JsonRenderer, Renderer, check_edit, function_name

__all__ = ["JsonRenderer", "Renderer", "call_key", "occurrence", "require_approval"]
from gate.sdk.sync import Gate

F = TypeVar("F", bound=Callable[..., Any])
RUN_ID_ENV = "HITL_RUN_ID"
# the receiver of a method is the object it runs on: shown and keyed, never editable
RECEIVERS = ("self", "cls")

_counts: dict[tuple[str, str, str, str], int] = {}
_counts_lock = threading.Lock()


def occurrence(run_id: str, function: str, receiver: str, draft: str) -> int:
    """The number (1, 2, 3 ...) of this call among the identical calls (same run, function,
    receiver and draft) made by this process, counted under a lock across threads and tasks."""
    with _counts_lock:
        n = _counts.get((run_id, function, receiver, draft), 0) + 1
        _counts[(run_id, function, receiver, draft)] = n
        return n


def call_key(
    run_id: str, pipeline: str, step: str, function: str, receiver: str, draft: str, n: int
) -> str:
    """The Idempotency-Key of a gated call: ``hitl-sdk-call-`` + SHA-256 (hex) of the JSON
    array ``[run_id, pipeline, step, function, receiver, draft, n]`` where ``function`` is
    ``module.qualname``, ``receiver`` the ``repr`` of a method's ``self``/``cls`` ("" for a
    function) and ``n`` the occurrence number of that identical call in this process. A
    restarted agent replaying its calls in the same order joins the same approvals; a
    second identical call, or a parallel one, is a new approval (never the reverse)."""
    material = json.dumps(
        [run_id, pipeline, step, function, receiver, draft, n], ensure_ascii=False
    )
    return "hitl-sdk-call-" + hashlib.sha256(material.encode("utf-8")).hexdigest()


def _run_id(given: str | Callable[[], str | None] | None) -> str | None:
    """The run id: ``given`` (a string, or a callable returning one), else ``$HITL_RUN_ID``."""
    value = given() if callable(given) else given
    return value or os.environ.get(RUN_ID_ENV) or None


def _takes_receiver(method: Callable[..., Any]) -> bool:
    try:
        return "receiver" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True, slots=True)
class _Call:
    """One call as drafted: its bound arguments (the receiver's object kept), the shown
    arguments (deep copies), the receiver's repr and the draft text."""

    arguments: dict[str, Any]
    copies: dict[str, Any]
    receiver: str | None
    draft: str


class _Gated:
    """What one decorated function needs: its signature, how to render it, where to ask."""

    def __init__(
        self,
        fn: Callable[..., Any],
        pipeline: str,
        step: str,
        renderer: Renderer,
        run_id: str | Callable[[], str | None] | None,
        content_type: str,
    ) -> None:
        self.fn = fn
        self.sig = inspect.signature(fn)
        self.pipeline, self.step = pipeline, step
        self.renderer, self.run_id, self.content_type = renderer, run_id, content_type
        params = list(self.sig.parameters)
        self.receiver = params[0] if params and params[0] in RECEIVERS else None
        self.render_receiver = _takes_receiver(renderer.render)
        self.parse_receiver = _takes_receiver(renderer.parse)

    def _render(self, arguments: dict[str, Any], receiver: str | None) -> str:
        shown = {k: v for k, v in arguments.items() if k != self.receiver}
        given = {"receiver": receiver} if self.render_receiver else {}
        rendered = cast(Any, self.renderer).render(self.fn, shown, **given)
        return str(rendered) if self.render_receiver else rendered

    def draft(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """One call drafted: defaults applied, the arguments rendered from deep copies (what
        a person sees cannot change under them). Raises TypeError for a call that does not
        fit the signature or an argument that cannot be copied or rendered (naming it)."""
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        receiver = repr(arguments[self.receiver]) if self.receiver in arguments else None
        copies: dict[str, Any] = {}
        for name, value in arguments.items():
            if name == self.receiver:
                continue
            try:
                copies[name] = copy.deepcopy(value)
            except Exception as exc:  # noqa: BLE001 - any failure to copy names the argument
                raise TypeError(
                    f"require_approval: argument {name!r} of {self.fn.__qualname__} cannot be "
                    f"copied ({exc}); pass a copyable value"
                ) from None
        return _Call(arguments, copies, receiver, self._render(copies, receiver))

    def request(self, call: _Call) -> dict[str, Any]:
        """The keyword arguments of ``request_approval`` for ``call``."""
        run_id = _run_id(self.run_id)
        if run_id:
            name, receiver = function_name(self.fn), call.receiver or ""
            n = occurrence(run_id, name, receiver, call.draft)
            key = call_key(run_id, self.pipeline, self.step, name, receiver, call.draft, n)
        else:
            key = f"hitl-sdk-call-{uuid.uuid4().hex}"  # no run id: a fresh approval per call
        return {"content_type": self.content_type, "run_id": run_id, "idempotency_key": key}

    def arguments_for(
        self, approval: Approval, call: _Call
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` to run with. Approved (the body is the draft as sent): the
        call's own arguments, only if rendering them now still gives that draft (else
        AdjustNotApplicable: they changed during the wait). Adjusted (or another body): the
        arguments parsed from the edit, which must name exactly the draft's arguments, each
        with its JSON type. Raises the outcome's ApprovalNotGranted, or AdjustNotApplicable
        (the function must not run)."""
        approval.raise_for_outcome()
        if approval.body == call.draft:
            try:
                now = self._render(call.arguments, call.receiver)
            except TypeError:
                now = None
            if now != call.draft:
                raise ArgumentsChanged(approval, self._changed(call))
            return self._split(call.arguments)
        if approval.body is None:
            raise AdjustNotApplicable(approval, "the gate sent no final body")
        try:
            given = {"receiver": call.receiver} if self.parse_receiver else {}
            edited = cast(Any, self.renderer).parse(self.fn, approval.body, **given)
        except (ValueError, TypeError, LookupError) as exc:
            raise AdjustNotApplicable(approval, str(exc)) from None
        if not isinstance(edited, dict):
            raise AdjustNotApplicable(approval, "the renderer did not return arguments (a dict)")
        shown = {k: v for k, v in call.arguments.items() if k != self.receiver}
        why = check_edit(shown, edited)
        if why is not None:
            raise AdjustNotApplicable(approval, why)
        if self.receiver is not None:
            edited = {self.receiver: call.arguments[self.receiver], **edited}
        try:
            return self._split(edited)
        except TypeError as exc:
            raise AdjustNotApplicable(approval, f"the edited arguments do not fit: {exc}") from None

    def _changed(self, call: _Call) -> list[str]:
        """The arguments whose rendering now differs from the copy a person saw."""
        names = []
        for name, seen in call.copies.items():
            try:
                same = self._render({name: call.arguments[name]}, None) == self._render(
                    {name: seen}, None
                )
            except TypeError:
                same = False
            if not same:
                names.append(name)
        return names

    def _split(self, arguments: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Arguments by name back into ``(args, kwargs)`` as the signature binds them (every
        parameter present, in order; ``*args`` a sequence, ``**kwargs`` an object)."""
        ordered: dict[str, Any] = {}
        for name, param in self.sig.parameters.items():
            value = arguments[name]
            if param.kind is param.VAR_POSITIONAL and not isinstance(value, list | tuple):
                raise TypeError(f"*{name} must be a list")
            if param.kind is param.VAR_KEYWORD and not isinstance(value, dict):
                raise TypeError(f"**{name} must be an object")
            ordered[name] = tuple(value) if param.kind is param.VAR_POSITIONAL else value
        bound = inspect.BoundArguments(self.sig, ordered)  # type: ignore[arg-type,unused-ignore]
        return bound.args, bound.kwargs


def require_approval(
    gate: Gate | AsyncGate,
    *,
    pipeline: str,
    step: str,
    renderer: Renderer | None = None,
    run_id: str | Callable[[], str | None] | None = None,
    content_type: str | None = None,
    wait: float | None = None,
) -> Callable[[F], F]:
    """Decorate a function so that each call asks ``pipeline``/``step`` for approval first.

    A plain function needs a ``Gate``, an ``async def`` an ``AsyncGate`` (else TypeError at
    decoration). Each call: its arguments (defaults applied, deep-copied) are rendered by
    ``renderer`` (default ``JsonRenderer``: pretty JSON of ``{"function": module.qualname,
    "arguments": {...}}`` plus ``"receiver": repr(self)`` for a method,
    ``application/json``); the call blocks up to ``wait`` seconds (None: until resolved),
    then runs the function on approved only if its arguments still render as approved (else
    ArgumentsChanged), runs it with the arguments parsed back from the edit on adjusted (the
    draft's argument names exactly, each keeping its JSON type, else AdjustNotApplicable:
    the function does not run), and raises ApprovalDenied (with the reason),
    ApprovalTimedOut, ApprovalCancelled or ApprovalPending otherwise.

    ``run_id`` (a string, a callable returning one, else ``$HITL_RUN_ID``) makes the call's
    Idempotency-Key (``call_key``): run, function, receiver, draft and the occurrence number
    of that identical call in this process. A restarted agent replaying its calls in the
    same order joins the same approvals; a second or parallel identical call is a new
    approval. Without any run id each call gets a fresh key.
    """
    chosen = renderer if renderer is not None else JsonRenderer()
    ctype = content_type or getattr(chosen, "content_type", None) or "text/plain"

    def decorate(fn: F) -> F:
        gated = _Gated(fn, pipeline, step, chosen, run_id, ctype)
        if inspect.iscoroutinefunction(fn):
            if not isinstance(gate, AsyncGate):
                raise TypeError(f"require_approval: {fn.__qualname__} is async; pass an AsyncGate")
            agate = gate

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                call = gated.draft(args, kwargs)
                approval = await agate.request_approval(
                    pipeline, step, call.draft, wait=wait, **gated.request(call)
                )
                call_args, call_kwargs = gated.arguments_for(approval, call)
                return await cast(Callable[..., Coroutine[Any, Any, Any]], fn)(
                    *call_args, **call_kwargs
                )

            return cast(F, run_async)
        if not isinstance(gate, Gate):
            raise TypeError(
                f"require_approval: {fn.__qualname__} is not async; pass a Gate (the "
                "synchronous client), or make it async def with an AsyncGate"
            )
        sgate = gate

        @functools.wraps(fn)
        def run_sync(*args: Any, **kwargs: Any) -> Any:
            call = gated.draft(args, kwargs)
            approval = sgate.request_approval(
                pipeline, step, call.draft, wait=wait, **gated.request(call)
            )
            call_args, call_kwargs = gated.arguments_for(approval, call)
            return fn(*call_args, **call_kwargs)

        return cast(F, run_sync)

    return decorate
