"""``require_approval``: a person approves each call of a function before it runs (issue 18).

The call's arguments are rendered as the draft (JSON by default, or a renderer's text); the
call blocks until the approval resolves; the function runs only on approved (with the
arguments as called) or adjusted (with the arguments parsed back from the approver's edit);
anything else raises, and the function does not run.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar, cast

from gate.sdk.client import AsyncGate
from gate.sdk.errors import AdjustNotApplicable
from gate.sdk.models import Approval
from gate.sdk.sync import Gate

F = TypeVar("F", bound=Callable[..., Any])
RUN_ID_ENV = "HITL_RUN_ID"
# the receiver of a method is the object, not an argument a person can judge or edit
RECEIVERS = ("self", "cls")


class Renderer(Protocol):
    """Turns a call into a draft and an approver's edit back into arguments.

    ``render(fn, arguments)`` returns the draft text for ``arguments`` (parameter name ->
    value, defaults applied); ``parse(fn, text)`` returns the arguments (a dict of parameter
    name -> value) an edited draft stands for, or raises ValueError saying why it cannot.
    """

    def render(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> str: ...

    def parse(self, fn: Callable[..., Any], text: str) -> dict[str, Any]: ...


class JsonRenderer:
    """The default renderer: pretty JSON ``{"arguments": {...}, "function": qualname}``
    (sorted keys, two-space indent, UTF-8 unescaped, newline-terminated), content type
    ``application/json``. ``parse`` accepts an edit of that shape naming the same function."""

    content_type = "application/json"

    def render(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> str:
        """The draft for ``arguments``; raises TypeError naming an argument JSON cannot hold
        (use a custom renderer for such functions)."""
        for name, value in arguments.items():
            try:
                json.dumps(value, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"require_approval: argument {name!r} of {fn.__qualname__} cannot be shown "
                    f"as JSON ({exc}); pass renderer= to render it"
                ) from None
        doc = {"function": fn.__qualname__, "arguments": arguments}
        return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def parse(self, fn: Callable[..., Any], text: str) -> dict[str, Any]:
        """The arguments of an edited draft; raises ValueError when it is not JSON, not an
        object with ``arguments`` (an object), or names another function."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"the edited draft is not JSON ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("arguments"), dict):
            raise ValueError('the edited draft is not an object with "arguments" (an object)')
        if doc.get("function", fn.__qualname__) != fn.__qualname__:
            raise ValueError(
                f"the edited draft names function {doc.get('function')!r}, not {fn.__qualname__!r}"
            )
        return dict(doc["arguments"])


def call_key(run_id: str, pipeline: str, step: str, qualname: str, draft: str) -> str:
    """The Idempotency-Key of a gated call: ``hitl-sdk-call-`` + SHA-256 (hex) of the JSON
    array ``[run_id, pipeline, step, qualname, draft]``. The same run repeating the same call
    (an agent restarted after a crash) joins the same approval; any other call is apart."""
    material = json.dumps([run_id, pipeline, step, qualname, draft], ensure_ascii=False)
    return "hitl-sdk-call-" + hashlib.sha256(material.encode("utf-8")).hexdigest()


def _run_id(given: str | Callable[[], str | None] | None) -> str | None:
    """The run id: ``given`` (a string, or a callable returning one), else ``$HITL_RUN_ID``."""
    value = given() if callable(given) else given
    return value or os.environ.get(RUN_ID_ENV) or None


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

    def draft(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """``(bound arguments, draft text)`` of one call (defaults applied, receiver left
        out of the draft). Raises TypeError for a call that does not fit the signature."""
        bound = self.sig.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        shown = {k: v for k, v in arguments.items() if k != self.receiver}
        return arguments, self.renderer.render(self.fn, shown)

    def request(self, draft: str) -> dict[str, Any]:
        """The keyword arguments of ``request_approval`` for ``draft``."""
        run_id = _run_id(self.run_id)
        key = (
            call_key(run_id, self.pipeline, self.step, self.fn.__qualname__, draft)
            if run_id
            else f"hitl-sdk-call-{uuid.uuid4().hex}"  # no run id: a fresh approval per call
        )
        return {
            "content_type": self.content_type,
            "run_id": run_id,
            "idempotency_key": key,
        }

    def arguments_for(
        self, approval: Approval, original: dict[str, Any], draft: str
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` to run with: the call's own when the final body is the draft as
        sent (approved), else those parsed from the final body (adjusted: the approver's
        edit; an approved body that differs from the draft is parsed the same way, so the
        function never runs on arguments other than those approved). Raises the outcome's
        ApprovalNotGranted, or AdjustNotApplicable."""
        approval.raise_for_outcome()
        if approval.body == draft:
            return self._split(original)
        if approval.body is None:
            raise AdjustNotApplicable(approval, "the gate sent no final body")
        try:
            edited = self.renderer.parse(self.fn, approval.body)
        except (ValueError, TypeError, LookupError) as exc:
            raise AdjustNotApplicable(approval, str(exc)) from None
        if not isinstance(edited, dict):
            raise AdjustNotApplicable(approval, "the renderer did not return arguments (a dict)")
        if self.receiver is not None:
            if self.receiver in edited:
                raise AdjustNotApplicable(approval, f"the edit may not set {self.receiver!r}")
            edited = {self.receiver: original[self.receiver], **edited}
        unknown = sorted(set(edited) - set(self.sig.parameters))
        if unknown:
            raise AdjustNotApplicable(
                approval,
                f"the edit names arguments {self.fn.__qualname__} does not take: "
                f"{', '.join(unknown)}",
            )
        try:
            args, kwargs = self._split(edited)
            self.sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise AdjustNotApplicable(approval, f"the edited arguments do not fit: {exc}") from None
        return args, kwargs

    def _split(self, arguments: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Arguments by name back into ``(args, kwargs)`` for a call, by parameter kind."""
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        for name, param in self.sig.parameters.items():
            if name not in arguments:
                continue
            value = arguments[name]
            if param.kind is param.POSITIONAL_ONLY:
                args.append(value)
            elif param.kind is param.VAR_POSITIONAL:
                args.extend(value if isinstance(value, list | tuple) else [value])
            elif param.kind is param.VAR_KEYWORD:
                if not isinstance(value, dict):
                    raise TypeError(f"**{name} must be an object")
                kwargs.update(value)
            else:
                kwargs[name] = value
        return tuple(args), kwargs


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
    decoration). Each call: its arguments (defaults applied; ``self``/``cls`` left out) are
    rendered by ``renderer`` (default ``JsonRenderer``: pretty JSON of ``{"function":
    qualname, "arguments": {...}}``, ``application/json``), the call blocks up to ``wait``
    seconds (None: until resolved), then runs the function on approved, runs it with the
    arguments parsed back from the edit on adjusted (AdjustNotApplicable when they cannot be:
    the function does not run), and raises ApprovalDenied (with the reason),
    ApprovalTimedOut, ApprovalCancelled or ApprovalPending otherwise.

    ``run_id`` (a string, a callable returning one, else ``$HITL_RUN_ID``) makes the call's
    Idempotency-Key (``call_key``): an agent restarted with the same run id that repeats the
    same call joins the same approval, and runs the function once it is approved. Without
    any run id each call gets a fresh key: a new approval every time.
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
                original, draft = gated.draft(args, kwargs)
                approval = await agate.request_approval(
                    pipeline, step, draft, wait=wait, **gated.request(draft)
                )
                call_args, call_kwargs = gated.arguments_for(approval, original, draft)
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
            original, draft = gated.draft(args, kwargs)
            approval = sgate.request_approval(
                pipeline, step, draft, wait=wait, **gated.request(draft)
            )
            call_args, call_kwargs = gated.arguments_for(approval, original, draft)
            return fn(*call_args, **call_kwargs)

        return cast(F, run_sync)

    return decorate
