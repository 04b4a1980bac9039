"""Strict MCP tools (issue 18 review): an argument a tool does not take is a tool error naming
it, not silently dropped (a misspelt ``spend`` would otherwise ask without it). The ``mcp``
package validates a call's arguments with a pydantic model built from the function; here that
model forbids extra keys (``additionalProperties: false`` in the published input schema too)
and names the unknown ones first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver.tools import Tool
from mcp.types import ToolAnnotations
from pydantic import ConfigDict, model_validator


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
    return tool.model_copy(update={"fn_metadata": metadata, "parameters": parameters})
