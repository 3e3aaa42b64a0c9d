"""StratadSaver in real LangGraph graphs, beyond the conformance suite.

Against a `stratad serve` subprocess: a graph's history, interrupts and
`Command(resume=...)` (pending writes on special channels), the async API in
an async graph, thread IDs that are not stratad IDs, a daemon restart, and
that copy_thread / prune / delete_for_runs leave a thread LangGraph can use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

import stratad
from stratad.integrations.langgraph import StratadSaver, session_id_of


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def counting_graph(steps: int) -> StateGraph[Chat]:
    def talk(state: Chat) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": f"m{len(state['messages'])}"}]}

    graph = StateGraph(Chat)
    graph.add_node("talk", talk)
    graph.add_edge(START, "talk")
    graph.add_conditional_edges(
        "talk", lambda s: "talk" if len(s["messages"]) < steps else END, ["talk", END]
    )
    return graph


def contents(state: dict[str, Any]) -> list[str]:
    return [m.content for m in state["messages"]]


def config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def test_history_update_state_and_a_restart(start_daemon: Callable[..., Any]) -> None:
    daemon = start_daemon()
    with StratadSaver(daemon.target) as saver:
        graph = counting_graph(4).compile(checkpointer=saver)
        assert contents(graph.invoke({"messages": []}, config("t"))) == ["m0", "m1", "m2", "m3"]
        history = list(graph.get_state_history(config("t")))
        assert [len(h.values.get("messages", [])) for h in history] == [4, 3, 2, 1, 0, 0]
        # Time travel: fork from the checkpoint with two messages.
        two = next(h for h in history if len(h.values.get("messages", [])) == 2)
        forked = graph.update_state(two.config, {"messages": [{"role": "user", "content": "x"}]})
        assert contents(graph.get_state(forked).values) == ["m0", "m1", "x"]
    daemon.kill()
    again = start_daemon(data_dir=daemon.data_dir)
    with StratadSaver(again.target) as saver:
        graph = counting_graph(4).compile(checkpointer=saver)
        assert contents(graph.get_state(config("t")).values) == ["m0", "m1", "x"]
        assert len(list(graph.get_state_history(config("t")))) == 7


def test_interrupt_and_resume_use_pending_writes(start_daemon: Callable[..., Any]) -> None:
    daemon = start_daemon()

    def ask(state: Chat) -> dict[str, Any]:
        answer = interrupt({"question": "name?"})
        return {"messages": [{"role": "user", "content": f"name={answer}"}]}

    builder = StateGraph(Chat)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", END)
    with StratadSaver(daemon.target) as saver:
        graph = builder.compile(checkpointer=saver)
        out = graph.invoke({"messages": []}, config("hitl"))
        assert out["__interrupt__"][0].value == {"question": "name?"}
        state = graph.get_state(config("hitl"))
        assert state.next == ("ask",) and state.tasks[0].interrupts
    # A new process (a new saver) answers the interrupt.
    with StratadSaver(daemon.target) as saver:
        graph = builder.compile(checkpointer=saver)
        out = graph.invoke(Command(resume="ada"), config("hitl"))
        assert contents(out) == ["name=ada"]


def test_async_graph_and_odd_thread_ids(start_daemon: Callable[..., Any]) -> None:
    daemon = start_daemon()
    odd = "user 42 / chat #7 " + "x" * 200  # not a stratad ID: hashed to a session ID

    async def main() -> None:
        async with StratadSaver(daemon.target) as saver:
            graph = counting_graph(3).compile(checkpointer=saver)
            out = await graph.ainvoke({"messages": []}, config(odd))
            assert contents(out) == ["m0", "m1", "m2"]
            state = await graph.aget_state(config(odd))
            assert contents(state.values) == ["m0", "m1", "m2"]
            threads = {t.config["configurable"]["thread_id"] async for t in saver.alist(None)}
            assert threads == {odd}

    asyncio.run(main())
    session = session_id_of(odd)
    assert session.startswith("lg-")
    with stratad.Client(daemon.target) as client:
        labels = client.get_session(session).labels
    assert labels["langgraph.thread_id"] == odd


def test_copy_prune_and_delete_for_runs_keep_threads_usable(
    start_daemon: Callable[..., Any],
) -> None:
    daemon = start_daemon()
    with StratadSaver(daemon.target) as saver:
        graph = counting_graph(3).compile(checkpointer=saver)
        # LangGraph copies `configurable` strings into checkpoint metadata (as the
        # LangGraph platform does with its run IDs).
        graph.invoke({"messages": []}, {"configurable": {"thread_id": "a", "run_id": "run-1"}})
        saver.copy_thread("a", "b")
        assert contents(graph.get_state(config("b")).values) == ["m0", "m1", "m2"]
        # The copy goes on by itself; the source does not change.
        graph = counting_graph(5).compile(checkpointer=saver)
        graph.invoke({"messages": [{"role": "user", "content": "again"}]}, config("b"))
        assert contents(graph.get_state(config("b")).values) == ["m0", "m1", "m2", "again", "m4"]
        assert contents(graph.get_state(config("a")).values) == ["m0", "m1", "m2"]
        saver.prune(["b"], strategy="keep_latest")
        assert len(list(saver.list(config("b")))) == 1
        graph.invoke({"messages": [{"role": "user", "content": "after prune"}]}, config("b"))
        assert contents(graph.get_state(config("b")).values)[-2:] == ["after prune", "m6"]
        assert {t.metadata.get("run_id") for t in saver.list(config("a"))} == {"run-1"}
        saver.delete_for_runs(["run-1"])
        assert list(saver.list(config("a"))) == []
        # The copy's checkpoints carry run-1 too (copies keep their metadata).
        assert list(saver.list(config("b"), filter={"run_id": "run-1"})) == []
