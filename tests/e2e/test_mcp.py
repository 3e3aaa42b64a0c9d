"""``stratad mcp`` driven by the MCP SDK's own clients against a real daemon.

Every scenario runs over both transports: stdio (the server is a subprocess of
the client, `mcp.stdio_client`) and streamable HTTP (the server is a
subprocess listening on a free loopback port, `streamable_http_client`). Both
speak the handshake era of the protocol through `mcp.ClientSession`;
`test_2026_protocol_and_listen` also drives the 2026-07-28 era through
`mcp.Client`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import ssl
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp_types import BlobResourceContents, CallToolResult, TextResourceContents
from pki import Pki

import stratad
from stratad.errors import NotFoundError

TRANSPORTS = ("stdio", "http")


def _stratad_has_mcp() -> bool:
    from stratad.cli import build_parser
    from stratad.ctl import subcommands

    return "mcp" in subcommands(build_parser())


#: How the tests start the MCP server: `stratad mcp` once the stratad command has
#: the subcommand, else `python -m stratad.mcp` (the same options and behaviour).
MCP_COMMAND = (
    [sys.executable, "-m", "stratad", "mcp"]
    if _stratad_has_mcp()
    else [sys.executable, "-m", "stratad.mcp"]
)


def mcp_command(*args: str) -> list[str]:
    """The command line of the MCP server with these options."""
    return [*MCP_COMMAND, *args]


EXPECTED_TOOLS = {
    "cognitive_initialize",
    "cognitive_update_progress",
    "cognitive_record_decision",
    "cognitive_record_error",
    "cognitive_resolve_error",
    "cognitive_add_learned_constraint",
    "cognitive_add_entity_relationship",
    "cognitive_add_pattern",
    "cognitive_build_context",
    "crystal_crystallize",
    "crystal_query",
    "crystal_apply",
    "crystal_record_reuse",
    "checkpoint_save",
    "checkpoint_load",
    "checkpoint_list",
    "task_update",
}

#: corteX's own example of StateFileManager.build_persistent_context, built by the scenario.
SEED_CONTEXT = """\
## Goal
Build a REST API
## Constraints
- Must use PostgreSQL
## Success Criteria
- All endpoints return JSON
## Progress: 45%
## Current Focus
Implementing user endpoints
## Key Decisions
- Step 3: Chose FastAPI (lightweight, async support)
## Unresolved Errors
- Step 7: Connection refused on port 5432"""

#: corteX's MemoryCrystallizer example and its prompt, as docs/crystals.md shows it.
SEED_TRACE = [
    {"decision": "Read config", "tool": "file_read"},
    {"decision": "Validate schema", "tool": "code_interpreter"},
    {
        "decision": "Deploy",
        "tool": "shell",
        "error": "Timeout",
        "resolution": "Increased timeout to 60s",
    },
]
SEED_PROMPT = """\
## Similar Past Success ({pct}% effective, used {n}x)
Goal pattern: Deploy {{file_path}} to {{url}}
Approach: Read config -> Validate schema -> Deploy
Tools used: file_read, code_interpreter, shell
Known pitfalls:
  - Timeout: Increased timeout to 60s"""


# --- starting servers and connecting ----------------------------------------------------------


@dataclass
class HttpServer:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class Endpoint:
    """One MCP server over one transport; `session()` connects a ClientSession to it."""

    transport: str
    args: list[str]
    env: dict[str, str]
    log: Path
    http: HttpServer | None = None
    errlogs: list[Any] = field(default_factory=list)

    def output(self) -> str:
        return self.http.output() if self.http is not None else self.log.read_text(errors="replace")

    @contextlib.asynccontextmanager
    async def session(
        self,
        *,
        headers: dict[str, str] | None = None,
        message_handler: Callable[[Any], Any] | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> AsyncIterator[ClientSession]:
        async with self.streams(headers=headers, verify=verify) as (read, write):
            session = ClientSession(read, write, message_handler=message_handler)
            async with session:
                await session.initialize()
                yield session

    @contextlib.asynccontextmanager
    async def streams(
        self, *, headers: dict[str, str] | None = None, verify: ssl.SSLContext | bool = True
    ) -> AsyncIterator[Any]:
        if self.http is None:
            command = mcp_command(*self.args)
            params = StdioServerParameters(command=command[0], args=command[1:], env=self.env)
            errlog = self.log.open("a")
            self.errlogs.append(errlog)
            async with stdio_client(params, errlog=errlog) as streams:
                yield streams
        else:
            timeout = httpx2.Timeout(30.0, read=300.0)
            async with (
                httpx2.AsyncClient(headers=headers, timeout=timeout, verify=verify) as http,
                streamable_http_client(self.http.url, http_client=http) as streams,
            ):
                yield streams

    def transport_for_client(self) -> Any:
        """What `mcp.Client` connects with."""
        if self.http is None:
            command = mcp_command(*self.args)
            return StdioServerParameters(command=command[0], args=command[1:], env=self.env)
        return self.http.url


@pytest.fixture
def start_http(tmp_path: Path, stratad_env: dict[str, str]) -> Iterator[Callable[..., HttpServer]]:
    servers: list[HttpServer] = []

    def start(*args: str, scheme: str = "http") -> HttpServer:
        log = tmp_path / f"mcp-http-{len(servers)}.log"
        command = mcp_command("--transport", "http", "--listen", "127.0.0.1:0", *args)
        with log.open("wb") as out:
            proc = subprocess.Popen(command, env=stratad_env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = re.search(rf"serving MCP at ({scheme}://\S+)", log.read_text(errors="replace"))
            if found:
                server = HttpServer(proc, found.group(1), log)
                servers.append(server)
                return server
            if proc.poll() is not None:
                pytest.fail(f"the MCP server exited with {proc.returncode}:\n{log.read_text()}")
            time.sleep(0.05)
        proc.kill()
        pytest.fail(f"the MCP server did not start:\n{log.read_text()}")

    yield start
    for server in servers:
        if server.proc.poll() is None:
            server.proc.terminate()
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=10)


@pytest.fixture
def mcp_endpoint(
    tmp_path: Path, stratad_env: dict[str, str], start_http: Callable[..., HttpServer]
) -> Iterator[Callable[..., Endpoint]]:
    """``mcp_endpoint(transport, *args)``: an MCP server with these options."""
    made: list[Endpoint] = []

    def make(transport: str, *args: str) -> Endpoint:
        log = tmp_path / f"mcp-{transport}-{len(made)}.log"
        log.touch()
        http = start_http(*args) if transport == "http" else None
        endpoint = Endpoint(transport, list(args), stratad_env, log, http)
        made.append(endpoint)
        return endpoint

    yield make
    for endpoint in made:
        for errlog in endpoint.errlogs:
            errlog.close()


def data_of(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def error_of(result: CallToolResult) -> dict[str, Any]:
    """The stratad error of a tool result that failed, checked to say so in its text too."""
    assert result.is_error, result.structured_content
    assert isinstance(result.structured_content, dict)
    error = result.structured_content["error"]
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith(error["code"]), text
    assert error["reason"] in text.split(":", 1)[0], text
    return error  # type: ignore[no-any-return]


def text_of(result: CallToolResult) -> str:
    assert not result.is_error, result.content
    return result.content[0].text  # type: ignore[union-attr]


# --- listing --------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_lists_tools_resources_and_prompts(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    endpoint = mcp_endpoint(transport, "--address", daemon.target)

    async def scenario() -> None:
        async with endpoint.session() as session:
            info = session.initialize_result
            assert info is not None and info.server_info.name == "stratad"
            assert info.instructions and "cognitive_build_context" in info.instructions
            capabilities = session.server_capabilities
            assert capabilities is not None and capabilities.resources is not None
            assert capabilities.resources.subscribe is True

            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert set(tools) == EXPECTED_TOOLS
            for tool in tools.values():
                assert tool.description and len(tool.description) > 60, tool.name
                assert tool.input_schema["type"] == "object"
                assert tool.input_schema["additionalProperties"] is False, tool.name
                assert "$defs" not in json.dumps(tool.input_schema), tool.name
            init = tools["cognitive_initialize"].input_schema
            assert set(init["required"]) == {"session_id", "goal"}
            assert init["properties"]["session_id"]["pattern"].startswith("^[A-Za-z0-9]")
            assert init["properties"]["constraints"]["type"] == "array"
            trace = tools["crystal_crystallize"].input_schema["properties"]["execution_trace"]
            assert set(trace["items"]["properties"]) == {"decision", "tool", "error", "resolution"}
            assert tools["cognitive_build_context"].annotations.read_only_hint is True  # type: ignore[union-attr]
            # Identity is never a tool argument.
            arguments = {p for t in tools.values() for p in t.input_schema["properties"]}
            assert not arguments & {"tenant", "tenant_id", "token", "authorization"}

            templates = (await session.list_resource_templates()).resource_templates
            assert {t.uri_template for t in templates} == {
                "stratad://sessions/{session_id}/context{?max_tokens}",
                "stratad://sessions/{session_id}/cognitive-state",
                "stratad://sessions/{session_id}/open-errors",
                "stratad://sessions/{session_id}/checkpoints",
                "stratad://sessions/{session_id}/checkpoints/{checkpoint_id}",
            }
            assert (await session.list_resources()).resources == []
            await session.call_tool("checkpoint_save", {"session_id": "s-1", "state": {"a": 1}})
            listed = (await session.list_resources()).resources
            assert {str(r.uri) for r in listed} == {
                "stratad://sessions/s-1/context",
                "stratad://sessions/s-1/cognitive-state",
                "stratad://sessions/s-1/open-errors",
                "stratad://sessions/s-1/checkpoints",
            }

            prompts = (await session.list_prompts()).prompts
            assert [p.name for p in prompts] == ["similar_past_success"]
            assert prompts[0].arguments is not None
            assert [(a.name, a.required) for a in prompts[0].arguments] == [
                ("goal", True),
                ("top_k", False),
            ]

    asyncio.run(scenario())


# --- the cognitive scenario -------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cognitive_scenario(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    endpoint = mcp_endpoint(transport, "--address", daemon.target)
    sid = "sess_001"

    async def scenario() -> None:
        async with endpoint.session() as s:
            # Before initialize, a cognitive update is the daemon's FAILED_PRECONDITION.
            early = await s.call_tool(
                "cognitive_record_decision", {"session_id": sid, "step": 1, "decision": "x"}
            )
            assert error_of(early)["reason"] in ("SESSION_NOT_FOUND", "NOT_INITIALIZED")

            started = data_of(
                await s.call_tool(
                    "cognitive_initialize",
                    {
                        "session_id": sid,
                        "goal": "Build a REST API",
                        "constraints": ["Must use PostgreSQL"],
                        "success_criteria": ["All endpoints return JSON"],
                    },
                )
            )
            assert started["goal"] == "Build a REST API"
            assert started["constraints"] == ["Must use PostgreSQL"]
            again = await s.call_tool("cognitive_initialize", {"session_id": sid, "goal": "Other"})
            assert error_of(again)["code"] == "ALREADY_EXISTS"

            fluid = data_of(
                await s.call_tool(
                    "cognitive_update_progress",
                    {
                        "session_id": sid,
                        "progress": 0.45,
                        "current_sub_goal": "Implementing user endpoints",
                        "entities": {"User": "Main entity"},
                    },
                )
            )
            assert fluid["progress"] == 0.45 and fluid["active_entities"] == {"User": "Main entity"}
            decision = data_of(
                await s.call_tool(
                    "cognitive_record_decision",
                    {
                        "session_id": sid,
                        "step": 3,
                        "decision": "Chose FastAPI",
                        "rationale": "lightweight, async support",
                    },
                )
            )
            assert decision["step"] == 3 and decision["version"] > started["version"]
            error = data_of(
                await s.call_tool(
                    "cognitive_record_error",
                    {"session_id": sid, "step": 7, "error": "Connection refused on port 5432"},
                )
            )
            assert error["status"] == "open"

            # The persistent context is corteX's format, word for word.
            built = await s.call_tool("cognitive_build_context", {"session_id": sid})
            assert text_of(built) == SEED_CONTEXT
            assert data_of(built)["context"] == SEED_CONTEXT
            assert data_of(built)["truncated"] is False
            resource = await s.read_resource(f"stratad://sessions/{sid}/context")
            assert isinstance(resource.contents[0], TextResourceContents)
            assert resource.contents[0].text == SEED_CONTEXT
            assert resource.contents[0].mime_type == "text/markdown"
            small = await s.read_resource(f"stratad://sessions/{sid}/context?max_tokens=10")
            assert small.contents[0].text.startswith("## Goal\nBuild a REST API")  # type: ignore[union-attr]
            assert "Unresolved Errors" not in small.contents[0].text  # type: ignore[union-attr]

            open_errors = await s.read_resource(f"stratad://sessions/{sid}/open-errors")
            listed = json.loads(open_errors.contents[0].text)  # type: ignore[union-attr]
            assert [e["error"] for e in listed["open_errors"]] == [
                "Connection refused on port 5432"
            ]

            # The error is resolved; what was learned is added.
            not_there = data_of(
                await s.call_tool(
                    "cognitive_resolve_error", {"session_id": sid, "step": 6, "resolution": "x"}
                )
            )
            assert not_there["resolved"] is False
            resolved = data_of(
                await s.call_tool(
                    "cognitive_resolve_error",
                    {"session_id": sid, "step": 7, "resolution": "Started PostgreSQL service"},
                )
            )
            assert resolved["resolved"] is True
            learned = {
                "cognitive_add_learned_constraint": {
                    "constraint": "Port 5432 needs the service running"
                },
                "cognitive_add_entity_relationship": {
                    "entity_a": "User",
                    "relation": "stored_in",
                    "entity_b": "PostgreSQL",
                },
                "cognitive_add_pattern": {"pattern": "Connection errors precede startup"},
            }
            for name, args in learned.items():
                assert data_of(await s.call_tool(name, {"session_id": sid, **args}))["added"]
                assert not data_of(await s.call_tool(name, {"session_id": sid, **args}))["added"]

            final = text_of(await s.call_tool("cognitive_build_context", {"session_id": sid}))
            assert final == (
                SEED_CONTEXT.removesuffix(
                    "\n## Unresolved Errors\n- Step 7: Connection refused on port 5432"
                )
                + "\n## Learned Constraints\n- Port 5432 needs the service running"
                + "\n## Entity Relationships\n- User stored_in PostgreSQL"
                + "\n## Pattern Observations\n- Connection errors precede startup"
            )
            open_errors = await s.read_resource(f"stratad://sessions/{sid}/open-errors")
            assert json.loads(open_errors.contents[0].text)["open_errors"] == []  # type: ignore[union-attr]
            state = await s.read_resource(f"stratad://sessions/{sid}/cognitive-state")
            layers = json.loads(state.contents[0].text)  # type: ignore[union-attr]
            assert layers["crystallized"]["goal"] == "Build a REST API"
            assert layers["fluid"]["current_sub_goal"] == "Implementing user endpoints"
            assert layers["insights"]["error_journal"][0]["status"] == "resolved"
            assert (
                layers["insights"]["decision_log"][0]["rationale"] == "lightweight, async support"
            )

    asyncio.run(scenario())


# --- the crystal scenario ---------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_crystal_scenario(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    endpoint = mcp_endpoint(transport, "--address", daemon.target)
    goal = "Deploy app.py to https://prod.example.com"

    async def scenario() -> None:
        async with endpoint.session() as s:
            low = data_of(
                await s.call_tool(
                    "crystal_crystallize",
                    {"goal": goal, "execution_trace": SEED_TRACE, "success_score": 0.5},
                )
            )
            assert low["outcome"] == "below_threshold" and "crystal" not in low

            made = data_of(
                await s.call_tool(
                    "crystal_crystallize",
                    {
                        "goal": goal,
                        "execution_trace": SEED_TRACE,
                        "success_score": 0.9,
                        "session_id": "sess_001",
                    },
                )
            )
            assert made["outcome"] == "created"
            crystal = made["crystal"]
            assert crystal["goal_template"] == "Deploy {file_path} to {url}"
            assert crystal["tool_sequence"] == ["file_read", "code_interpreter", "shell"]
            assert crystal["crystal_id"].startswith("crystal_sess_001_")
            twice = data_of(
                await s.call_tool(
                    "crystal_crystallize",
                    {"goal": goal, "execution_trace": SEED_TRACE, "success_score": 0.95},
                )
            )
            assert twice["outcome"] == "not_novel"
            assert twice["similar_crystal_id"] == crystal["crystal_id"]

            found = data_of(
                await s.call_tool("crystal_query", {"goal_text": "Deploy server.py to staging"})
            )
            assert found["goal_template"] == "Deploy {file_path} to staging"
            (match,) = found["matches"]
            assert match["crystal_id"] == crystal["crystal_id"]
            assert match["similarity"] == pytest.approx(0.6)
            assert match["score"] == pytest.approx(0.57)
            nothing = data_of(await s.call_tool("crystal_query", {"goal_text": "Bake bread"}))
            assert nothing["matches"] == []

            applied = await s.call_tool("crystal_apply", {"crystal_id": crystal["crystal_id"]})
            assert text_of(applied) == SEED_PROMPT.format(pct=90, n=0)

            reused = data_of(
                await s.call_tool(
                    "crystal_record_reuse", {"crystal_id": crystal["crystal_id"], "success": True}
                )
            )
            assert reused["reuse_count"] == 1
            assert reused["effectiveness"] == pytest.approx(0.95)

            prompt = await s.get_prompt(
                "similar_past_success", {"goal": "Deploy server.py to staging"}
            )
            (message,) = prompt.messages
            assert message.role == "user"
            assert message.content.text == SEED_PROMPT.format(pct=95, n=1)  # type: ignore[union-attr]
            none = await s.get_prompt("similar_past_success", {"goal": "Bake bread"})
            assert (
                none.messages[0].content.text
                == "No similar past success is stored for this goal yet."
            )  # type: ignore[union-attr]

            gone = await s.call_tool("crystal_apply", {"crystal_id": "crystal_nope_1"})
            assert error_of(gone)["code"] == "NOT_FOUND"

    asyncio.run(scenario())


# --- checkpoints and tasks --------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_checkpoints_and_tasks(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    endpoint = mcp_endpoint(transport, "--address", daemon.target)
    sid = "run-1"
    state = {"messages": [{"role": "user", "content": "hi"}], "step": 1, "ok": True, "x": None}
    blob = b"\x89PNG\r\n\x1a\n" + bytes(range(256))

    async def scenario() -> None:
        async with endpoint.session() as s:
            first = data_of(
                await s.call_tool(
                    "checkpoint_save",
                    {"session_id": sid, "state": state, "metadata": {"step": 1}},
                )
            )
            assert first["content_type"] == "application/json"
            assert first["size"] == len(json.dumps(state, separators=(",", ":")))
            second = data_of(
                await s.call_tool(
                    "checkpoint_save",
                    {
                        "session_id": sid,
                        "state_base64": base64.b64encode(blob).decode(),
                        "content_type": "image/png",
                        "name": "before-deploy",
                        "checkpoint_id": "shot-2",
                    },
                )
            )
            assert second["checkpoint_id"] == "shot-2" and second["name"] == "before-deploy"

            latest = data_of(await s.call_tool("checkpoint_load", {"session_id": sid}))
            assert latest["content_type"] == "image/png"
            assert base64.b64decode(latest["state_base64"]) == blob
            assert "state" not in latest
            loaded = data_of(
                await s.call_tool(
                    "checkpoint_load", {"session_id": sid, "checkpoint_id": first["checkpoint_id"]}
                )
            )
            assert loaded["state"] == state and loaded["metadata"] == {"step": 1}

            listed = data_of(await s.call_tool("checkpoint_list", {"session_id": sid}))
            ids = [c["checkpoint_id"] for c in listed["checkpoints"]]
            assert set(ids) == {first["checkpoint_id"], "shot-2", second["named_checkpoint_id"]}
            assert ids[-1] == first["checkpoint_id"]  # newest first
            names = {c["checkpoint_id"]: c["name"] for c in listed["checkpoints"]}
            assert names[second["named_checkpoint_id"]] == "before-deploy"
            one = data_of(await s.call_tool("checkpoint_list", {"session_id": sid, "limit": 1}))
            assert len(one["checkpoints"]) == 1 and one["more"] is True

            text = data_of(
                await s.call_tool(
                    "checkpoint_save",
                    {
                        "session_id": sid,
                        "state_base64": base64.b64encode("héllo".encode()).decode(),
                        "content_type": "text/plain; charset=utf-8",
                    },
                )
            )
            shown = data_of(
                await s.call_tool(
                    "checkpoint_load", {"session_id": sid, "checkpoint_id": text["checkpoint_id"]}
                )
            )
            assert shown["state_text"] == "héllo"

            # The same through resources.
            as_list = await s.read_resource(f"stratad://sessions/{sid}/checkpoints")
            documents = json.loads(as_list.contents[0].text)["checkpoints"]  # type: ignore[union-attr]
            assert len(documents) == 4
            as_json = await s.read_resource(
                f"stratad://sessions/{sid}/checkpoints/{first['checkpoint_id']}"
            )
            (contents,) = as_json.contents
            assert isinstance(contents, TextResourceContents)
            assert contents.mime_type == "application/json"
            assert json.loads(contents.text) == state
            as_blob = await s.read_resource(f"stratad://sessions/{sid}/checkpoints/shot-2")
            (contents,) = as_blob.contents
            assert isinstance(contents, BlobResourceContents)
            assert contents.mime_type == "image/png"
            assert base64.b64decode(contents.blob) == blob

            missing = await s.call_tool(
                "checkpoint_load", {"session_id": sid, "checkpoint_id": "no-such-checkpoint"}
            )
            assert error_of(missing)["code"] == "NOT_FOUND"

            # Tasks: status, then result, in the same session.
            started = data_of(
                await s.call_tool(
                    "task_update",
                    {"session_id": sid, "task_id": "extract", "status": "in_progress"},
                )
            )
            assert started["status"] == "in_progress" and started["has_result"] is False
            done = data_of(
                await s.call_tool(
                    "task_update",
                    {
                        "session_id": sid,
                        "task_id": "extract",
                        "status": "completed",
                        "result": {"rows": 1200, "file": "out/a.csv"},
                    },
                )
            )
            assert done["status"] == "completed"
            assert done["result"] == {"rows": 1200, "file": "out/a.csv"}

    asyncio.run(scenario())
    # The daemon holds what the tools wrote.
    with stratad.Client(daemon.target) as client:
        assert client.load_state(sid, "shot-2").data == blob


# --- bad input --------------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


#: Tool calls that must fail: (tool, arguments, stratad reason, a word the message names).
BAD_CALLS: list[tuple[str, dict[str, Any], str, str]] = [
    # wrong types
    (
        "cognitive_record_decision",
        {"session_id": "s-1", "step": "three", "decision": "d"},
        "INVALID_ARGUMENTS",
        "step",
    ),
    (
        "cognitive_record_decision",
        {"session_id": "s-1", "step": 1.5, "decision": "d"},
        "INVALID_ARGUMENTS",
        "step",
    ),
    (
        "cognitive_initialize",
        {"session_id": "s-2", "goal": "g", "constraints": "one"},
        "INVALID_ARGUMENTS",
        "constraints",
    ),
    (
        "cognitive_update_progress",
        {"session_id": "s-1", "progress": "high"},
        "INVALID_ARGUMENTS",
        "progress",
    ),
    (
        "cognitive_update_progress",
        {"session_id": "s-1", "progress": 1.5},
        "INVALID_ARGUMENTS",
        "progress",
    ),
    (
        "crystal_record_reuse",
        {"crystal_id": "c1", "success": "yes"},
        "INVALID_ARGUMENTS",
        "success",
    ),
    ("cognitive_initialize", {"session_id": 42, "goal": "g"}, "INVALID_ARGUMENTS", "session_id"),
    # missing, unknown and identity arguments
    ("cognitive_initialize", {"session_id": "s-2"}, "INVALID_ARGUMENTS", "goal"),
    (
        "cognitive_initialize",
        {"session_id": "s-2", "goal": "g", "tenant": "acme"},
        "INVALID_ARGUMENTS",
        "tenant",
    ),
    ("cognitive_build_context", {"session_id": "s-1", "token": "t"}, "INVALID_ARGUMENTS", "token"),
    ("cognitive_update_progress", {"session_id": "s-1"}, "NOTHING_TO_UPDATE", ""),
    ("task_update", {"session_id": "s-1", "task_id": "t"}, "NOTHING_TO_UPDATE", ""),
    ("checkpoint_save", {"session_id": "s-1"}, "STATE_REQUIRED", ""),
    (
        "checkpoint_save",
        {"session_id": "s-1", "state": 1, "state_base64": "AA=="},
        "STATE_REQUIRED",
        "",
    ),
    ("checkpoint_save", {"session_id": "s-1", "state_base64": "not base64!"}, "INVALID_BASE64", ""),
    # bad IDs
    ("cognitive_build_context", {"session_id": "../../etc/passwd"}, "INVALID_ID", "session_id"),
    ("cognitive_build_context", {"session_id": "has space"}, "INVALID_ID", "session_id"),
    ("cognitive_build_context", {"session_id": ""}, "INVALID_ID", "session_id"),
    ("cognitive_build_context", {"session_id": "a" * 129}, "INVALID_ID", "session_id"),
    (
        "checkpoint_load",
        {"session_id": "s-1", "checkpoint_id": "a/b"},
        "INVALID_ID",
        "checkpoint_id",
    ),
    ("crystal_apply", {"crystal_id": "crystal with spaces"}, "INVALID_ID", "crystal_id"),
    (
        "task_update",
        {"session_id": "s-1", "task_id": ".hidden", "status": "failed"},
        "INVALID_ID",
        "task_id",
    ),
    # oversize
    (
        "cognitive_record_decision",
        {"session_id": "s-1", "step": 1, "decision": "d" * 70_000},
        "INVALID_ARGUMENTS",
        "decision",
    ),
    (
        "cognitive_initialize",
        {"session_id": "s-3", "goal": "g", "constraints": ["c"] * 1001},
        "INVALID_ARGUMENTS",
        "constraints",
    ),
    (
        "checkpoint_save",
        {"session_id": "s-1", "state": {"blob": "x" * 2000}},
        "STATE_TOO_LARGE",
        "1000",
    ),
    ("checkpoint_load", {"session_id": "big"}, "STATE_TOO_LARGE", "5000"),
    (
        "task_update",
        {"session_id": "s-1", "task_id": "t", "result": _nested(40)},
        "INVALID_VALUE",
        "nested",
    ),
    # the daemon's own refusals, with its reasons
    ("cognitive_build_context", {"session_id": "nobody"}, "SESSION_NOT_FOUND", "nobody"),
    ("checkpoint_load", {"session_id": "s-1"}, "CHECKPOINT_NOT_FOUND", ""),
]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_input_gives_tool_errors_and_the_server_keeps_serving(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    endpoint = mcp_endpoint(transport, "--address", daemon.target, "--max-state-bytes", "1000")
    with stratad.Client(daemon.target) as client:
        client.create_session("big")
        client.save_state("big", b"x" * 5000, content_type="application/octet-stream")

    async def scenario() -> None:
        async with endpoint.session() as s:
            ok = {"session_id": "s-1", "goal": "Ship it"}
            assert not (await s.call_tool("cognitive_initialize", ok)).is_error

            cases = BAD_CALLS
            for name, arguments, reason, mentioned in cases:
                result = await s.call_tool(name, arguments)
                error = error_of(result)
                assert error["reason"] == reason, (name, arguments, error)
                assert mentioned in error["message"], (name, error)
            # Nothing was created by the refused calls.
            templates = [str(r.uri) for r in (await s.list_resources()).resources]
            assert not [u for u in templates if "/s-2/" in u or "/s-3/" in u]

            # Protocol-level mistakes are JSON-RPC errors, not crashes.
            with pytest.raises(MCPError):
                await s.call_tool("no_such_tool", {})
            for uri in (
                "stratad://sessions/has space/context",
                "stratad://sessions/s-1/secrets",
                "stratad://sessions/s-1/context?max_tokens=zero",
                "file:///etc/passwd",
            ):
                with pytest.raises(MCPError) as refused:
                    await s.read_resource(uri)
                assert refused.value.code == -32602, uri
            with pytest.raises(MCPError) as gone:
                await s.read_resource("stratad://sessions/nobody/cognitive-state")
            assert gone.value.data["reason"] == "SESSION_NOT_FOUND"
            with pytest.raises(MCPError):
                await s.get_prompt("similar_past_success", {})
            with pytest.raises(MCPError):
                await s.get_prompt("similar_past_success", {"goal": "g", "top_k": "many"})

            # ... and the server still serves.
            built = await s.call_tool("cognitive_build_context", {"session_id": "s-1"})
            assert text_of(built) == "## Goal\nShip it\n## Progress: 0%"

    asyncio.run(scenario())
    assert "Traceback" not in endpoint.output()
    if endpoint.http is not None:  # still serving; SIGTERM stops it cleanly
        endpoint.http.proc.terminate()
        assert endpoint.http.proc.wait(timeout=30) == 0, endpoint.output()


def test_an_unreachable_daemon_is_a_tool_error(
    mcp_endpoint: Callable[..., Endpoint], get_free_port: Callable[[], int]
) -> None:
    endpoint = mcp_endpoint("stdio", "--address", f"127.0.0.1:{get_free_port()}", "--timeout", "5")

    async def scenario() -> None:
        async with endpoint.session() as s:
            for _ in range(2):
                result = await s.call_tool("cognitive_build_context", {"session_id": "s-1"})
                assert error_of(result)["code"] == "UNAVAILABLE"
            assert len((await s.list_tools()).tools) == len(EXPECTED_TOOLS)

    asyncio.run(scenario())


# --- change notifications ---------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_resource_subscriptions_notify_changes(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    endpoint = mcp_endpoint(transport, "--address", daemon.target)
    sid = "watched"
    context_uri = f"stratad://sessions/{sid}/context"
    errors_uri = f"stratad://sessions/{sid}/open-errors"

    async def scenario() -> None:
        updated: list[str] = []
        arrived = anyio.Event()

        async def on_message(message: Any) -> None:
            root = getattr(message, "root", message)
            if getattr(root, "method", "") == "notifications/resources/updated":
                updated.append(root.params.uri)
                arrived.set()

        async with endpoint.session(message_handler=on_message) as s:
            await s.call_tool("cognitive_initialize", {"session_id": sid, "goal": "Watch me"})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                with pytest.raises(MCPError):  # a session that does not exist
                    await s.subscribe_resource("stratad://sessions/nobody/context")
                await s.subscribe_resource(context_uri)
                await s.subscribe_resource(errors_uri)
            await asyncio.sleep(0.3)  # the watch starts
            assert updated == []
            await s.call_tool(
                "cognitive_record_error", {"session_id": sid, "step": 1, "error": "boom"}
            )
            with anyio.fail_after(10):
                while not {context_uri, errors_uri} <= set(updated):
                    await arrived.wait()
                    arrived = anyio.Event()
            # A change from outside MCP (another agent on the SDK) is seen too.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await s.unsubscribe_resource(errors_uri)
            updated.clear()
            with stratad.Client(daemon.target) as client:
                client.save_state(sid, b"{}", content_type="application/json")
            with anyio.fail_after(10):
                while context_uri not in updated:
                    await arrived.wait()
                    arrived = anyio.Event()
            await asyncio.sleep(0.3)
            assert errors_uri not in updated

    asyncio.run(scenario())


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_2026_protocol_and_listen(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    """The 2026-07-28 era (no handshake; `subscriptions/listen` streams) through `mcp.Client`."""
    endpoint = mcp_endpoint(transport, "--address", daemon.target)
    sid = "modern"
    uri = f"stratad://sessions/{sid}/context"

    async def scenario() -> None:
        async with Client(endpoint.transport_for_client()) as client:
            assert client.protocol_version == "2026-07-28"
            started = await client.call_tool(
                "cognitive_initialize", {"session_id": sid, "goal": "Go modern"}
            )
            assert data_of(started)["goal"] == "Go modern"
            bad = await client.call_tool("cognitive_build_context", {"session_id": "no way"})
            assert error_of(bad)["reason"] == "INVALID_ID"
            async with client.listen(resource_subscriptions=[uri]) as subscription:
                await client.call_tool(
                    "cognitive_record_decision", {"session_id": sid, "step": 1, "decision": "Go"}
                )
                with anyio.fail_after(10):
                    async for event in subscription:
                        assert getattr(event, "uri", None) == uri
                        break
            read = await client.read_resource(uri)
            assert (
                read.contents[0].text
                == "## Goal\nGo modern\n## Progress: 0%\n## Key Decisions\n- Step 1: Go"
            )  # type: ignore[union-attr]

    asyncio.run(scenario())


# --- identity ---------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_tenant_comes_from_the_server_configuration(
    transport: str, daemon: Any, mcp_endpoint: Callable[..., Endpoint]
) -> None:
    endpoint = mcp_endpoint(transport, "--address", daemon.target, "--tenant", "acme")

    async def scenario() -> None:
        # Without --http-auth, request headers cannot pick another tenant.
        async with endpoint.session(headers={"X-Stratad-Tenant": "globex"}) as s:
            data_of(await s.call_tool("cognitive_initialize", {"session_id": "t-1", "goal": "g"}))

    asyncio.run(scenario())
    with stratad.Client(daemon.target, tenant="acme") as acme:
        assert acme.get_session("t-1").session_id == "t-1"
    for other in ("default", "globex"):
        with stratad.Client(daemon.target, tenant=other) as client, pytest.raises(NotFoundError):
            client.get_session("t-1")


def _new_token(run_stratad: Callable[..., Any], tenant: str, role: str) -> tuple[str, str]:
    made = run_stratad("ctl", "token", "new", "--for-tenant", tenant, "--role", role)
    assert made.returncode == 0, made.stderr
    token, entry = made.stdout.splitlines()
    return token, entry


def test_http_bearer_tokens_pass_through_to_the_daemon_over_tls(
    start_daemon: Callable[..., Any],
    run_stratad: Callable[..., Any],
    start_http: Callable[..., HttpServer],
    mcp_endpoint: Callable[..., Endpoint],
    pki: Pki,
    tmp_path: Path,
) -> None:
    acme, acme_entry = _new_token(run_stratad, "acme", "agent")
    globex, globex_entry = _new_token(run_stratad, "globex", "agent")
    admin, admin_entry = _new_token(run_stratad, "default", "admin")
    identities = tmp_path / "identities.toml"
    identities.write_text(f"[tokens]\n{acme_entry}\n{globex_entry}\n{admin_entry}\n")
    daemon = start_daemon("--auth", "token", "--auth-tokens-file", str(identities))
    issued = pki.server()
    server = start_http(
        "--address", daemon.target,
        "--http-auth", "bearer",
        "--http-tls-cert", str(issued.cert),
        "--http-tls-key", str(issued.key),
        scheme="https",
    )  # fmt: skip
    assert server.url.startswith("https://127.0.0.1:")
    endpoint = Endpoint("http", [], {}, server.log, server)
    trust = ssl.create_default_context(cafile=str(pki.ca_file))

    def bearer(token: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", **extra}

    async def scenario() -> None:
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        }
        async with httpx2.AsyncClient(verify=trust) as raw:
            headers = {"Accept": "application/json, text/event-stream"}
            for sent in ({}, bearer("not-a-known-token"), {"Authorization": "Basic abc"}):
                answer = await raw.post(server.url, json=initialize, headers={**headers, **sent})
                assert answer.status_code == 401, (sent, answer.text)
                assert answer.headers["www-authenticate"].startswith("Bearer")

        async with endpoint.session(headers=bearer(acme), verify=trust) as s:
            made = await s.call_tool("cognitive_initialize", {"session_id": "plan-1", "goal": "g"})
            data_of(made)
        async with endpoint.session(headers=bearer(globex), verify=trust) as s:
            hidden = await s.call_tool("cognitive_build_context", {"session_id": "plan-1"})
            assert error_of(hidden)["code"] == "NOT_FOUND"
            assert (await s.list_resources()).resources == []
        async with endpoint.session(
            headers=bearer(acme, **{"X-Stratad-Tenant": "globex"}), verify=trust
        ) as s:
            crossing = await s.call_tool("cognitive_build_context", {"session_id": "plan-1"})
            error = error_of(crossing)
            assert (error["code"], error["reason"]) == ("PERMISSION_DENIED", "TENANT_MISMATCH")
        async with endpoint.session(
            headers=bearer(admin, **{"X-Stratad-Tenant": "acme"}), verify=trust
        ) as s:
            built = await s.call_tool("cognitive_build_context", {"session_id": "plan-1"})
            assert text_of(built) == "## Goal\ng\n## Progress: 0%"

    asyncio.run(scenario())
    with stratad.Client(daemon.target, token=admin, tenant="acme") as client:
        assert client.get_session("plan-1").session_id == "plan-1"
    assert acme not in server.output() and globex not in server.output()


def test_http_refuses_to_start_where_it_would_be_unsafe(
    daemon: Any, stratad_env: dict[str, str], pki: Pki, get_free_port: Callable[[], int]
) -> None:
    issued = pki.server()
    tls = ["--http-tls-cert", str(issued.cert), "--http-tls-key", str(issued.key)]
    bearer = ["--http-auth", "bearer"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        command = mcp_command("--transport", "http", "--address", daemon.target, *args)
        return subprocess.run(
            command, env=stratad_env, capture_output=True, text=True, timeout=60, check=False
        )

    for listen in ("0.0.0.0", "[::]", "10.1.2.3", "my-host.example"):
        for extra in ([], tls, bearer):
            refused = run("--listen", f"{listen}:{get_free_port()}", *extra)
            assert refused.returncode == 2, (listen, extra, refused.stderr)
            assert "would serve MCP beyond this host" in refused.stderr, refused.stderr
            assert "Traceback" not in refused.stderr
    half = run("--listen", f"127.0.0.1:{get_free_port()}", "--http-tls-cert", str(issued.cert))
    assert half.returncode == 2 and "--http-tls-key" in half.stderr
    # A port that is taken: exit 1, said on stderr.
    taken = run("--listen", daemon.target)
    assert taken.returncode == 1, taken.stderr
    assert f"cannot serve on {daemon.target}" in taken.stderr
    # HTTP options on stdio are refused, not ignored.
    stdio = subprocess.run(
        mcp_command("--address", daemon.target, "--http-auth", "bearer"),
        env=stratad_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert stdio.returncode == 2 and "only with --transport http" in stdio.stderr
    # Bearer tokens passed through to a daemon that checks none would let anyone in.
    open_daemon = run("--listen", f"127.0.0.1:{get_free_port()}", *bearer)
    assert open_daemon.returncode == 2, open_daemon.stderr
    assert "accepts any token" in open_daemon.stderr
