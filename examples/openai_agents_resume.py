"""A conversation that outlives its process: StratadSession keeps the history.

Each `turn` is a new process: it runs one `Runner.run` of an OpenAI Agents SDK
agent with `session=StratadSession(...)`, so the agent sees everything said in
earlier turns, by earlier processes, because the sidecar kept it. The model is
scripted (a `Model` that answers from its input, no network and no API key),
and it prints what it was given, so you can see the history arrive.

    stratad serve &                                     # the sidecar (127.0.0.1:50051)
    python examples/openai_agents_resume.py turn --session chat-1 "My name is Ada."
    python examples/openai_agents_resume.py turn --session chat-1 "What is my name?"
    python examples/openai_agents_resume.py show --session chat-1
    python examples/openai_agents_resume.py clear --session chat-1

    python examples/openai_agents_resume.py demo    # all of it: a daemon of its own,
                                                    # two turns in two processes

Needs `pip install stratad[openai-agents]`.
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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, Usage, set_tracing_disabled
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from stratad import Client
from stratad.integrations.openai_agents import StratadSession


def text_of(item: Any) -> str:
    """The text of an input item (a user message's string, an assistant's output_text)."""
    content = item.get("content") if isinstance(item, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


class RecallModel(Model):
    """A scripted model: it answers from what it was given (no network).

    It remembers nothing itself: everything it knows about earlier turns is
    the history the Runner read from the session and put in its input.
    """

    def __init__(self) -> None:
        self.inputs: list[list[Any]] = []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:  # fmt: skip
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        self.inputs.append(items)
        said = [text_of(i) for i in items if isinstance(i, dict) and i.get("role") == "user"]
        name = next((s.split("is", 1)[1].strip(" .") for s in said if "name is" in s), None)
        if said and said[-1].rstrip("?").endswith("my name"):
            reply = f"Your name is {name}." if name else "You have not told me your name."
        else:
            reply = f"Noted ({len(items) - 1} earlier items in this conversation)."
        message = ResponseOutputMessage(
            id=f"msg-{len(items)}", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(text=reply, type="output_text", annotations=[])],
        )  # fmt: skip
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("RecallModel answers Runner.run, not run_streamed")
        yield  # an async generator


async def turn(address: str, session_id: str, text: str) -> str:
    """One turn of the conversation in this process; returns the reply."""
    model = RecallModel()
    agent = Agent(name="assistant", instructions="Be brief.", model=model)
    with StratadSession(session_id, address) as session:
        result = await Runner.run(agent, text, session=session)
    seen = [f"{i.get('role', i.get('type'))}: {text_of(i)}" for i in model.inputs[0]]
    print(f"model input ({len(seen)} items): {json.dumps(seen)}", flush=True)
    print(f"reply: {result.final_output}", flush=True)
    return str(result.final_output)


async def show(address: str, session_id: str) -> None:
    with StratadSession(session_id, address) as session:
        for item in await session.get_items():
            print(f"{item.get('role', item.get('type'))}: {text_of(item)}")


async def clear(address: str, session_id: str) -> None:
    with StratadSession(session_id, address) as session:
        await session.clear_session()
    print("cleared")


def demo() -> None:
    """Start a daemon, run two turns in two processes, show the stored conversation."""
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        s.close()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "stratad", "serve", "--listen", address,
             "--data-dir", str(Path(tmp) / "data"), "--metrics-listen", "off"],
        )  # fmt: skip
        try:
            with Client(address) as client:
                client.wait_ready(timeout=30)
            me = [sys.executable, __file__]
            for n, text in enumerate(["My name is Ada.", "What is my name?"], 1):
                turn_n = [*me, "turn", text, "--address", address, "--session", "demo"]
                out = subprocess.run(turn_n, capture_output=True, text=True, check=True)
                for line in out.stdout.splitlines():
                    print(f"[process {n}] {line}")
            out = subprocess.run([*me, "show", "--address", address, "--session", "demo"],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            print("[stored]", *out.stdout.splitlines(), sep="\n  ")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("mode", choices=["turn", "show", "clear", "demo"])
    parser.add_argument("text", nargs="?", default="Hello!")
    parser.add_argument("--address", default=os.environ.get("STRATAD_ADDRESS", "127.0.0.1:50051"))
    parser.add_argument("--session", default="chat-1")
    args = parser.parse_intermixed_args(argv)
    set_tracing_disabled(True)  # no trace export: this runs without an OpenAI account
    if args.mode == "demo":
        demo()
    elif args.mode == "turn":
        asyncio.run(turn(args.address, args.session, args.text))
    elif args.mode == "show":
        asyncio.run(show(args.address, args.session))
    else:
        asyncio.run(clear(args.address, args.session))


if __name__ == "__main__":
    main()
