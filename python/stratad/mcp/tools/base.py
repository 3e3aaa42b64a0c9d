"""What a tool is: its `ToolSpec` (name, title, description, argument model,
handler, annotations), the `Toolbox` a service's tools are defined in, what a
handler gets (`Call`) and gives back (`Output`), and the JSON schema of its
arguments as ``tools/list`` publishes it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from mcp_types import Tool, ToolAnnotations
from pydantic import BaseModel

from stratad.mcp.daemon import DaemonLink, Identity
from stratad.mcp.tools.arguments import Args

#: The default cap on a checkpoint state passed through MCP (bytes, decoded).
DEFAULT_MAX_STATE_BYTES = 1 << 20

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Limits:
    """What the MCP layer itself refuses (the daemon has its own limits behind)."""

    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES


@dataclass(frozen=True, slots=True)
class Call:
    """What a tool handler works with: the daemon, the caller, the limits."""

    link: DaemonLink
    who: Identity
    limits: Limits

    async def ask(self, method: Callable[..., Awaitable[R]], request: Any) -> R:
        """One unary call to the daemon as the caller (a failure raises its `stratad.errors`
        class, which the call path turns into an error result)."""
        return await self.link.call(method, request, self.who)

    async def ensure_session(self, session_id: str) -> None:
        """Create the session unless it exists (the tools that start work do this)."""
        await self.link.ensure_session(session_id, self.who)


@dataclass(slots=True)
class Output:
    """A tool's answer: structured data, and the text the model reads (JSON of
    the data unless a tool gives prose, e.g. the persistent context)."""

    data: dict[str, Any]
    text: str | None = None


A = TypeVar("A", bound=Args)
Handler = Callable[[Call, Any], Awaitable[Output]]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    title: str
    description: str
    args: type[Args]
    handler: Handler
    annotations: ToolAnnotations = field(default_factory=ToolAnnotations)

    def tool(self) -> Tool:
        return Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=input_schema(self.args),
            annotations=self.annotations,
        )


WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
IDEMPOTENT = ToolAnnotations(
    read_only_hint=False, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)
READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class Toolbox:
    """The tools of one service, in the order they are defined (``tools/list`` keeps it)."""

    def __init__(self) -> None:
        self.specs: list[ToolSpec] = []

    def tool(
        self, name: str, title: str, args: type[A], annotations: ToolAnnotations = WRITES
    ) -> Callable[[Callable[[Call, A], Awaitable[Output]]], Callable[[Call, A], Awaitable[Output]]]:
        """Define a tool; its description is the handler's docstring."""

        def register(
            fn: Callable[[Call, A], Awaitable[Output]],
        ) -> Callable[[Call, A], Awaitable[Output]]:
            description = " ".join((fn.__doc__ or "").split())
            self.specs.append(ToolSpec(name, title, description, args, fn, annotations))
            return fn

        return register


def input_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema as a model reads it best: ``$ref``s inlined, no titles."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                inlined = dict(defs[ref.removeprefix("#/$defs/")])
                extra = {k: v for k, v in node.items() if k != "$ref"}
                return clean({**inlined, **extra})
            out: dict[str, Any] = {}
            for key, value in node.items():
                if key == "title" and isinstance(value, str):
                    continue
                if key == "properties" and isinstance(value, dict):
                    out[key] = {name: _not_null(clean(prop)) for name, prop in value.items()}
                else:
                    out[key] = clean(value)
            return out
        if isinstance(node, list):
            return [clean(item) for item in node]
        return node

    cleaned: dict[str, Any] = clean(schema)
    return cleaned


def _not_null(prop: Any) -> Any:
    """An optional argument whose null means "not given", published as its plain type:
    ``{"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}`` becomes
    ``{"type": "string"}``."""
    if not isinstance(prop, dict) or prop.get("default", 0) is not None:
        return prop
    options = prop.get("anyOf")
    if options is None and "type" not in prop:  # any JSON value: null is a value, not "unset"
        return {k: v for k, v in prop.items() if k != "default"}
    if not isinstance(options, list) or {"type": "null"} not in options or len(options) != 2:
        return prop
    (kept,) = [o for o in options if o != {"type": "null"}]
    rest = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
    return {**kept, **rest}


__all__ = [
    "DEFAULT_MAX_STATE_BYTES",
    "IDEMPOTENT",
    "READS",
    "WRITES",
    "Call",
    "Handler",
    "Limits",
    "Output",
    "ToolSpec",
    "Toolbox",
    "input_schema",
]
