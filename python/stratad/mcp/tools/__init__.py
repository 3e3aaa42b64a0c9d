"""The MCP tools: names, descriptions and argument schemas written for a model, and
what each one asks the daemon.

Arguments are pydantic models (strict: a string is not an integer, unknown
arguments are refused); their JSON schemas, with ``$ref``s inlined and
pydantic's titles dropped, are what ``tools/list`` publishes. IDs are checked
with the daemon's own rule (`stratad.ids.validate_id`, reason
``INVALID_ID``) before anything is sent. A failure of any kind becomes a tool
result with ``isError`` whose text starts with the gRPC code and the stratad
reason (``NOT_FOUND SESSION_NOT_FOUND: ...``) and whose structured content
carries them as ``error.code``, ``error.reason``, ``error.message``,
``error.metadata``: the model reads why and can fix its call; the server goes
on serving.

The modules: `stratad.mcp.tools.base` (what a tool is), `.arguments` (the
argument models), `.convert` (the daemon's answers as JSON, and the checks of
what is sent), `.cognitive`, `.crystals`, `.checkpoints`, `.tasks` (the tools
of each service); this one lists them all (`TOOLS`) and runs a call
(`call_tool`).
"""

from __future__ import annotations

import json
from typing import Any

from mcp_types import CallToolResult, TextContent
from pydantic import ValidationError

from stratad.errors import InternalError, InvalidArgumentError, StratadError
from stratad.mcp.daemon import log
from stratad.mcp.tools import checkpoints, cognitive, crystals, tasks
from stratad.mcp.tools.base import (
    DEFAULT_MAX_STATE_BYTES,
    Call,
    Limits,
    Output,
    ToolSpec,
    input_schema,
)
from stratad.mcp.tools.checkpoints import list_checkpoints
from stratad.mcp.tools.convert import (
    check_state_size,
    checkpoint_dict,
    cognitive_state,
    crystal_dict,
    decode_state,
    error_entry,
)

#: Every tool by name, in the order ``tools/list`` shows them.
TOOLS: dict[str, ToolSpec] = {
    spec.name: spec
    for toolbox in (cognitive.toolbox, crystals.toolbox, checkpoints.toolbox, tasks.toolbox)
    for spec in toolbox.specs
}


def error_result(exc: StratadError) -> CallToolResult:
    """A stratad error as a tool result the model can read and act on."""
    head = f"{exc.grpc_status} {exc.reason}" if exc.reason != exc.grpc_status else exc.grpc_status
    error = {
        "code": exc.grpc_status,
        "reason": exc.reason,
        "message": exc.message,
        "metadata": exc.metadata,
    }
    return CallToolResult(
        content=[TextContent(type="text", text=f"{head}: {exc.message}")],
        structured_content={"error": error},
        is_error=True,
    )


def arguments_error(name: str, exc: ValidationError) -> InvalidArgumentError:
    """Pydantic's findings as INVALID_ARGUMENT, naming each argument (never echoing values)."""
    problems = []
    for err in exc.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in err["loc"]) or "arguments"
        problems.append(f"{where}: {err['msg']}")
        if len(problems) == 10:
            break
    return InvalidArgumentError(
        f"invalid arguments for {name}: " + "; ".join(problems),
        reason="INVALID_ARGUMENTS",
        metadata={"tool": name},
    )


async def call_tool(spec: ToolSpec, arguments: dict[str, Any], call: Call) -> CallToolResult:
    """Validate, run, and shape one tool call; every failure becomes an error result."""
    try:
        try:
            args = spec.args.model_validate(arguments)
        except ValidationError as exc:
            raise arguments_error(spec.name, exc) from None
        output = await spec.handler(call, args)
    except StratadError as exc:
        return error_result(exc)
    except Exception as exc:  # a bug: say so, log it, keep serving
        log.exception("tool %s failed", spec.name)
        return error_result(InternalError(f"{spec.name} failed: {type(exc).__name__}"))
    text = output.text if output.text is not None else json.dumps(output.data, ensure_ascii=False)
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=output.data
    )


__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "TOOLS",
    "Call",
    "Limits",
    "Output",
    "ToolSpec",
    "arguments_error",
    "call_tool",
    "check_state_size",
    "checkpoint_dict",
    "cognitive_state",
    "crystal_dict",
    "decode_state",
    "error_entry",
    "error_result",
    "input_schema",
    "list_checkpoints",
]
