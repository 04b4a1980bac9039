"""How ``require_approval`` shows a call as a draft and reads an approver's edit back:
the ``Renderer`` protocol, the default ``JsonRenderer`` and the checks an edit must pass
(the draft's argument names exactly, each with the JSON type it had)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

from gate.protocol.canonical import json_type


class Renderer(Protocol):
    """Turns a call into a draft and an approver's edit back into arguments.

    ``render(fn, arguments)`` returns the draft text for ``arguments`` (parameter name ->
    value, defaults applied, the receiver left out); ``parse(fn, text)`` returns the
    arguments (a dict of parameter name -> value) an edited draft stands for, or raises
    ValueError saying why it cannot. A renderer whose ``render``/``parse`` also take a
    keyword ``receiver`` (``repr`` of the ``self``/``cls`` of a method, else None) is given
    it, as ``JsonRenderer`` is.
    """

    def render(self, fn: Callable[..., Any], arguments: dict[str, Any]) -> str: ...

    def parse(self, fn: Callable[..., Any], text: str) -> dict[str, Any]: ...


def function_name(fn: Callable[..., Any]) -> str:
    """``module.qualname`` of ``fn``: what the draft shows and the key holds."""
    return f"{getattr(fn, '__module__', None) or '?'}.{fn.__qualname__}"


class JsonRenderer:
    """The default renderer: pretty JSON ``{"arguments": {...}, "function": module.qualname}``
    plus ``"receiver": repr(self)`` for a method (sorted keys, two-space indent, UTF-8
    unescaped, newline-terminated), content type ``application/json``. ``parse`` accepts an
    edit of that shape naming the same function and receiver."""

    content_type = "application/json"

    def render(
        self, fn: Callable[..., Any], arguments: dict[str, Any], receiver: str | None = None
    ) -> str:
        """The draft for ``arguments``; raises TypeError naming an argument JSON cannot hold
        (not JSON, NaN, keys that are not all strings; use a custom renderer for those)."""
        for name, value in arguments.items():
            try:
                json.dumps(value, allow_nan=False, sort_keys=True)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"require_approval: argument {name!r} of {fn.__qualname__} cannot be shown "
                    f"as JSON ({exc}); pass renderer= to render it"
                ) from None
        doc: dict[str, Any] = {"function": function_name(fn), "arguments": arguments}
        if receiver is not None:
            doc["receiver"] = receiver
        return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def parse(
        self, fn: Callable[..., Any], text: str, receiver: str | None = None
    ) -> dict[str, Any]:
        """The arguments of an edited draft; raises ValueError when it is not JSON, not an
        object with ``arguments`` (an object), or names another function or receiver."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"the edited draft is not JSON ({exc})") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("arguments"), dict):
            raise ValueError('the edited draft is not an object with "arguments" (an object)')
        name = function_name(fn)
        if doc.get("function", name) != name:
            raise ValueError(
                f"the edited draft names function {doc.get('function')!r}, not {name!r}"
            )
        if doc.get("receiver", receiver) != receiver:
            raise ValueError(f"the edit may not change the receiver ({receiver!r})")
        return dict(doc["arguments"])


# json_type's words that the SDK says otherwise (and an int and a float apart)
_KIND_WORDS = {"boolean": "bool", "array": "list"}


def json_kind(value: Any) -> str:
    """The JSON type of ``value`` (``gate.protocol.canonical.json_type`` in Python's words:
    ``int`` and ``float`` apart, so an int stays an int), or the Python type name for what
    JSON cannot hold."""
    if value is not None and not isinstance(value, bool | int | float | str | list | tuple | dict):
        return type(value).__name__
    kind = json_type(value)
    if kind == "number":
        return "int" if isinstance(value, int) else "float"
    return _KIND_WORDS.get(kind, kind)


def check_edit(shown: dict[str, Any], edited: dict[str, Any]) -> str | None:
    """Why ``edited`` cannot replace the draft's arguments ``shown``, or None: it must name
    exactly the same arguments (none missing, none extra) and keep each one's JSON type (a
    number given for a float is fine; an int stays an int)."""
    missing, extra = sorted(set(shown) - set(edited)), sorted(set(edited) - set(shown))
    if missing or extra:
        parts = [f"missing: {', '.join(missing)}"] if missing else []
        parts += [f"extra: {', '.join(extra)}"] if extra else []
        return "the edit must name exactly the draft's arguments (" + "; ".join(parts) + ")"
    for name, value in shown.items():
        was, now = json_kind(value), json_kind(edited[name])
        if was != now and not (was == "float" and now == "int"):
            return f"argument {name!r} must stay {was} (the edit gives {now})"
    return None
