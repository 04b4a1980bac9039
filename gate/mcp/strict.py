"""Strict MCP tools: an argument a tool does not take is a tool error naming
it, not silently dropped (a misspelt ``spend`` would otherwise ask without it). The ``mcp``
package validates a call's arguments with a pydantic model built from the function; here that
model forbids extra keys (``additionalProperties: false`` in the published input schema too)
and names the unknown ones first. Whatever the model refuses is one tool error naming each
argument in a few words (``spend: must be a number``), without pydantic's report around it
(its error count, model name, type codes and documentation URL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import ConfigDict, ValidationError, model_validator


def unknown_arguments(given: Any, known: set[str]) -> str | None:
    """The message for the keys of ``given`` (a call's arguments) not in ``known``:
    ``unknown argument(s): a, b (this tool takes: …)``, or None when there are none."""
    if not isinstance(given, dict):
        return None
    extra = sorted(str(k) for k in given if k not in known)
    if not extra:
        return None
    noun = "argument" if len(extra) == 1 else "arguments"
    return f"unknown {noun}: {', '.join(extra)} (this tool takes: {', '.join(sorted(known))})"


# pydantic's error type -> what the argument must be (JSON words: an agent reads them)
_MUST = {
    "missing": "required",
    "string_too_short": "must not be empty",
    "string_type": "must be a string",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "list_type": "must be an array",
    "dict_type": "must be an object",
    "extra_forbidden": "unknown argument",
}
_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "more than"),
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
}


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _problem(error: Any) -> str:
    """One pydantic error (``ValidationError.errors()`` item) in a few words."""
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    if kind in _MUST:
        return _MUST[kind]
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        return f"must be {words} {_number(ctx.get(key))}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    message = str(error.get("msg", "is not valid"))
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return message.replace("Input should be ", "must be ", 1)


def argument_problems(exc: ValidationError) -> str:
    """The errors of a tool call's arguments, one ``<argument>: <problem>`` each (an element
    as ``options[0]``), joined by ``; ``; a whole-call problem (unknown arguments) as is."""
    out = []
    for error in exc.errors(include_url=False, include_input=False, include_context=True):
        where = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]
        ).lstrip(".")
        out.append(f"{where}: {_problem(error)}" if where else _problem(error))
    return "; ".join(out)


class StrictTool(Tool):
    """A Tool whose argument errors are ``argument_problems``: the package's ``Tool.run``
    reports the whole pydantic text; this keeps its prefix (``Error executing tool NAME:``)
    and the ValidationError as the cause (what the package logs: field names only)."""

    async def run(
        self, arguments: dict[str, Any], context: Any, convert_result: bool = False
    ) -> Any:
        try:
            return await super().run(arguments, context, convert_result)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError) or not isinstance(cause, ValidationError):
                raise  # the tool's own error, or a crash (its text stays on the server)
            text = f"Error executing tool {self.name}: {argument_problems(cause)}"
            raise ToolError(text) from cause


def strict_tool(fn: Callable[..., Any], description: str, annotations: ToolAnnotations) -> Tool:
    """The MCP Tool of ``fn`` (as ``MCPServer.add_tool`` makes it) whose argument model
    refuses unknown arguments: the call is a tool error (``isError``) naming them and the
    function does not run. Validation errors never quote the values (a draft is the
    caller's data)."""
    tool = Tool.from_function(fn, description=description, annotations=annotations)
    base = tool.fn_metadata.arg_model
    known = {field.alias or name for name, field in base.model_fields.items()}

    class Strict(base):  # type: ignore[misc, valid-type]
        model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

        @model_validator(mode="before")
        @classmethod
        def _no_unknown(cls, data: Any) -> Any:
            problem = unknown_arguments(data, known)
            if problem is not None:
                raise ValueError(problem)
            return data

    Strict.__name__ = base.__name__
    metadata = tool.fn_metadata.model_copy(update={"arg_model": Strict})
    parameters = {**tool.parameters, "additionalProperties": False}
    fields = {name: getattr(tool, name) for name in Tool.model_fields}
    return StrictTool.model_construct(
        **(fields | {"fn_metadata": metadata, "parameters": parameters})
    )
