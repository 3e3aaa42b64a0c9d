"""A LangGraph run that survives being killed: StratadSaver keeps its checkpoints.

A small StateGraph writes a report in N steps (one message per step, a short
sleep standing in for an LLM call). Every step is checkpointed in a stratad
daemon. Kill the process at any point (SIGKILL, OOM, a node crash) and start
it again with the same thread ID: the new process finds the thread's latest
checkpoint in the sidecar and carries on from there, without redoing the
finished steps.

    stratad serve &                                   # the sidecar (127.0.0.1:50051)
    python examples/langgraph_resume.py run --thread report-1    # kill it mid-run ...
    python examples/langgraph_resume.py run --thread report-1    # ... it resumes

    python examples/langgraph_resume.py demo    # all of it: a daemon, a run killed
                                                # with SIGKILL, a second process resuming

Needs `pip install stratad[langgraph]`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from stratad.integrations.langgraph import StratadSaver


class Report(TypedDict):
    messages: Annotated[list[Any], add_messages]
    step: int


def build(steps: int, delay: float) -> StateGraph[Report]:
    def write(state: Report) -> dict[str, Any]:
        i = len(state["messages"])
        time.sleep(delay)  # the slow part: an LLM call, a tool
        print(f"step {i}", flush=True)
        role = "user" if i % 2 == 0 else "assistant"
        return {"messages": [{"role": role, "content": f"section {i}"}], "step": i}

    def more(state: Report) -> str:
        return "write" if len(state["messages"]) < steps else END

    graph = StateGraph(Report)
    graph.add_node("write", write)
    graph.add_edge(START, "write")
    graph.add_conditional_edges("write", more, ["write", END])
    return graph


def run(address: str, thread: str, steps: int, delay: float) -> list[str]:
    """Run (or resume) the thread to completion; returns the message contents."""
    with StratadSaver(address) as saver:
        graph = build(steps, delay).compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": thread}, "recursion_limit": steps + 10}
        state = graph.get_state(config)
        if state.next:  # a run was interrupted: continue from its last checkpoint
            print(f"resuming at {len(state.values['messages'])} messages", flush=True)
            out = graph.invoke(None, config)
        elif state.values:
            print("already finished", flush=True)
            out = state.values
        else:
            print("starting", flush=True)
            out = graph.invoke({"messages": [], "step": 0}, config)
    contents = [m.content for m in out["messages"]]
    print(f"done: {len(contents)} messages", flush=True)
    return contents


def demo(steps: int, delay: float) -> None:
    """Start a daemon, kill a run mid-way with SIGKILL, resume it in a new process."""
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        s.close()
        daemon = subprocess.Popen(
            [sys.executable, "-m", "stratad", "serve", "--listen", address,
             "--data-dir", str(Path(tmp) / "data"), "--metrics-listen", "off"],
        )  # fmt: skip
        try:
            worker = [sys.executable, __file__, "run", "--address", address, "--thread", "demo",
                      "--steps", str(steps), "--delay", str(delay)]  # fmt: skip
            first = subprocess.Popen(worker, stdout=subprocess.PIPE, text=True)
            assert first.stdout is not None
            for line in first.stdout:
                print(f"[first]  {line}", end="")
                if line.startswith(f"step {steps // 2}"):
                    first.send_signal(signal.SIGKILL)
                    break
            first.wait()
            print(f"[first]  killed with SIGKILL (exit {first.returncode})")
            second = subprocess.run(worker, capture_output=True, text=True, check=True)
            for line in second.stdout.splitlines():
                print(f"[second] {line}")
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["run", "demo"])
    parser.add_argument("--address", default=os.environ.get("STRATAD_ADDRESS", "127.0.0.1:50051"))
    parser.add_argument("--thread", default="report-1")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--delay", type=float, default=0.2, help="seconds per step")
    args = parser.parse_args(argv)
    if args.mode == "demo":
        demo(args.steps, args.delay)
    else:
        run(args.address, args.thread, args.steps, args.delay)


if __name__ == "__main__":
    main()
