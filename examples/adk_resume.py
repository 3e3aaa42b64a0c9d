"""An ADK agent whose conversation outlives its process: StratadSessionService keeps it.

A note-keeping `LlmAgent` runs one turn per process. Its model is scripted
(`ScriptedModel`, a subclass of ADK's `BaseLlm`: no network, no API key) and
answers from what ADK sends it: the conversation so far and the instruction,
into which ADK puts the session's state. The agent's tool writes state in each
of ADK's scopes: `user:notes` (every session of the user), `app:notes_total`
(every user of the app), `notes_here` (this session) and `temp:last_note`
(this invocation only: never stored). The session lives in the stratad daemon,
so the second turn, in a new process, continues the conversation:

    stratad serve &                                                # the sidecar
    python examples/adk_resume.py turn --session s1 "remember: invoice due Friday"
    python examples/adk_resume.py turn --session s1 "what do you remember?"   # a new process

    python examples/adk_resume.py demo     # all of it: a daemon of its own, two processes

Each turn prints the events it added (`[author] ...`), then one line
`seen: {...}`: what the model was sent on its last call (the conversation as
`role: text` lines and the instruction), as JSON. Needs `pip install stratad[adk]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools import ToolContext
from google.genai import types
from pydantic import Field

from stratad.integrations.adk import StratadSessionService

APP = "notes"
INSTRUCTION = (
    "You keep notes for the user. Notes so far: {user:notes?}. "
    "Notes taken by everyone: {app:notes_total?}."
)


def describe(content: types.Content) -> str:
    """One content as `role: text`, a function call or a function response."""
    pieces = []
    for part in content.parts or []:
        if part.text:
            pieces.append(part.text)
        elif part.function_call:
            pieces.append(f"call {part.function_call.name}({json.dumps(part.function_call.args)})")
        elif part.function_response:
            response = json.dumps(part.function_response.response)
            pieces.append(f"result {part.function_response.name} {response}")
    return f"{content.role}: {' '.join(pieces)}"


class ScriptedModel(BaseLlm):
    """A model that needs no network: its answers are a script, applied to what it is sent.

    - the tool just answered: confirm, with the tool's count;
    - the user said "remember: X": call the tool `remember` with X;
    - anything else: answer with what the instruction says the notes are, and
      how many user messages the conversation it was sent holds.

    `seen` keeps what it was sent on each call (`describe`d), for the caller to check.
    """

    model: str = "scripted"
    seen: list[dict[str, Any]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        contents = llm_request.contents
        instruction = str(llm_request.config.system_instruction or "")
        self.seen.append({"contents": [describe(c) for c in contents], "instruction": instruction})
        last = contents[-1] if contents else types.Content(role="user", parts=[])
        parts = last.parts or []
        said = " ".join(p.text for p in parts if p.text).strip()
        if any(p.function_response for p in parts):
            result = next(p.function_response for p in parts if p.function_response)
            count = (result.response or {}).get("notes")
            reply = types.Part(text=f"Noted. I keep {count} note(s) for you.")
        elif said.lower().startswith("remember:"):
            note = said.split(":", 1)[1].strip()
            reply = types.Part(
                function_call=types.FunctionCall(name="remember", args={"note": note})
            )
        else:
            asked = sum(
                1 for c in contents if c.role == "user" and any(p.text for p in c.parts or [])
            )
            notes = instruction.split("Notes so far: ", 1)[-1].split(". Notes taken", 1)[0]
            said = f"You have sent me {asked} message(s) in this conversation."
            reply = types.Part(text=f"{said} Your notes: {notes}")
        yield LlmResponse(content=types.Content(role="model", parts=[reply]))


def remember(note: str, tool_context: ToolContext) -> dict[str, Any]:
    """Remember a note for the user.

    Args:
        note: what to remember.
    """
    notes = [*tool_context.state.get("user:notes", []), note]
    tool_context.state["user:notes"] = notes  # every session of this user
    tool_context.state["app:notes_total"] = tool_context.state.get("app:notes_total", 0) + 1
    tool_context.state["notes_here"] = tool_context.state.get("notes_here", 0) + 1  # this session
    tool_context.state["temp:last_note"] = note  # this invocation only
    return {"notes": len(notes)}


def build(model: ScriptedModel) -> LlmAgent:
    return LlmAgent(
        name="note_keeper",
        model=model,
        instruction=INSTRUCTION,
        tools=[remember],
        output_key="last_reply",
    )


async def turn(
    service: StratadSessionService, user: str, session_id: str, text: str
) -> dict[str, Any]:
    """One turn of the conversation (the session is created by the first);
    prints its events and returns what the model was sent last."""
    model = ScriptedModel()
    runner = Runner(app_name=APP, agent=build(model), session_service=service)
    session = await service.get_session(app_name=APP, user_id=user, session_id=session_id)
    if session is None:
        await service.create_session(app_name=APP, user_id=user, session_id=session_id)
        print(f"new session {session_id}", flush=True)
    else:
        print(f"resuming session {session_id}: {len(session.events)} events", flush=True)
    message = types.Content(role="user", parts=[types.Part(text=text)])
    async for event in runner.run_async(user_id=user, session_id=session_id, new_message=message):
        if event.content:
            print(f"[{event.author}] {describe(event.content)}", flush=True)
    seen = model.seen[-1] if model.seen else {}
    print("seen: " + json.dumps(seen), flush=True)
    return seen


def demo(user: str) -> None:
    """Start a daemon of its own, run two turns in two processes, stop it."""
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        s.close()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "stratad", "serve", "--listen", address,
             "--data-dir", str(Path(tmp) / "data"), "--metrics-listen", "off"],
        )  # fmt: skip
        try:
            turns = [("first", "remember: invoice due Friday"), ("second", "what do you remember?")]
            for label, text in turns:
                worker = [sys.executable, __file__, "turn", "--address", address,
                          "--user", user, "--session", "demo", text]  # fmt: skip
                done = subprocess.run(worker, capture_output=True, text=True, check=True)
                for line in done.stdout.splitlines():
                    print(f"[{label} process] {line}")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["turn", "demo"])
    parser.add_argument("text", nargs="?", default="what do you remember?")
    parser.add_argument("--address", default=os.environ.get("STRATAD_ADDRESS", "127.0.0.1:50051"))
    parser.add_argument("--user", default="ada")
    parser.add_argument("--session", default="s1")
    args = parser.parse_intermixed_args(argv)
    if args.mode == "demo":
        demo(args.user)
        return

    async def one_turn() -> None:
        async with StratadSessionService(args.address) as service:
            await turn(service, args.user, args.session, args.text)

    asyncio.run(one_turn())


if __name__ == "__main__":
    main()
