"""StratadSaver's stored layout, and checkpoints written before it.

tests/fixtures/langgraph_saver_v1/ is a data directory the StratadSaver of
before the piece layout wrote (each checkpoint one `serde.dumps_typed` of
{checkpoint, metadata, parent_checkpoint_id}): thread "chat-v1" stopped at an
interrupt, thread "done v1" (not a stratad ID) answered and finished.
tests/fixtures/langgraph_saver_v1.json holds what LangGraph read from it then.
The saver of now must read both, resume the interrupted thread on top of them,
and `stratad ctl checkpoints show --decode langgraph` must decode old and new.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt

import stratad
from stratad.ctl.decode import decode_langgraph
from stratad.integrations.langgraph import (
    LAYOUT_MAGIC,
    StratadSaver,
    decode_layout,
    encode_layout,
    session_id_of,
)
from stratad.integrations.langgraph.encoder import _Encoder
from stratad.integrations.langgraph.layout import _decode

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]
    step: int


def v1_graph(steps: int) -> StateGraph[Chat]:
    """The graph that wrote the fixture (tests/fixtures/langgraph_saver_v1)."""

    def talk(state: Chat) -> dict[str, Any]:
        n = len(state["messages"])
        role = "user" if n % 2 == 0 else "assistant"
        return {"messages": [{"role": role, "content": f"m{n}", "id": f"msg-{n}"}], "step": n}

    def ask(state: Chat) -> dict[str, Any]:
        answer = interrupt("ok?")
        return {"messages": [{"role": "user", "content": f"answer {answer}", "id": "msg-answer"}]}

    g: StateGraph[Chat] = StateGraph(Chat)
    g.add_node("talk", talk)
    g.add_node("ask", ask)
    g.add_edge(START, "talk")
    g.add_conditional_edges(
        "talk", lambda s: "talk" if len(s["messages"]) < steps else "ask", ["talk", "ask"]
    )
    g.add_edge("ask", END)
    return g


def contents(values: dict[str, Any]) -> list[str]:
    return [m.content for m in values["messages"]]


def test_checkpoints_the_previous_saver_wrote_load_and_resume(
    start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    expected = json.loads((FIXTURES / "langgraph_saver_v1.json").read_text())
    data_dir = tmp_path / "v1"
    shutil.copytree(FIXTURES / "langgraph_saver_v1", data_dir)
    daemon = start_daemon(data_dir=data_dir)
    chat: Any = {"configurable": {"thread_id": "chat-v1"}}
    done: Any = {"configurable": {"thread_id": "done v1"}}
    with stratad.Client(daemon.target) as client:
        old = client.load_state("chat-v1")
        assert old.content_type == "application/vnd.langgraph.checkpoint+msgpack"
        assert not old.data.startswith(LAYOUT_MAGIC)  # the fixture is the old layout
        old_decoded = decode_langgraph(old.data, old.content_type)
    assert [m["content"] for m in old_decoded["checkpoint"]["channel_values"]["messages"]] == (
        expected["chat-v1"]["messages"]
    )

    with StratadSaver(daemon.target) as saver:
        graph = v1_graph(5).compile(checkpointer=saver)
        state = graph.get_state(chat)
        assert contents(state.values) == expected["chat-v1"]["messages"]
        assert list(state.next) == expected["chat-v1"]["next"]
        assert [i.value for t in state.tasks for i in t.interrupts] == (
            expected["chat-v1"]["interrupts"]
        )
        assert len(list(graph.get_state_history(chat))) == expected["chat-v1"]["history"]
        finished = graph.get_state(done)
        assert contents(finished.values) == expected["done v1"]["messages"]
        assert len(list(graph.get_state_history(done))) == expected["done v1"]["history"]

        # Resume the interrupted thread: new checkpoints (new layout) on old parents.
        out = graph.invoke(Command(resume="later"), chat)
        assert contents(out) == [*expected["chat-v1"]["messages"], "answer later"]
        history = list(graph.get_state_history(chat))
        assert len(history) == expected["chat-v1"]["history"] + 1
        sizes = [len(h.values.get("messages", [])) for h in history]
        assert sizes[:2] == [6, 5]

    with stratad.Client(daemon.target) as client:
        new = client.load_state("chat-v1")
        assert new.data.startswith(LAYOUT_MAGIC)
        assert new.content_type == "application/vnd.langgraph.checkpoint+msgpack"
        new_decoded = decode_langgraph(new.data, new.content_type)
        assert [m["content"] for m in new_decoded["checkpoint"]["channel_values"]["messages"]][
            -1
        ] == "answer later"
        assert new_decoded["metadata"]["source"] == "loop"
        assert session_id_of("done v1") in {s.session_id for s in client.list_sessions()}

    # A new saver (nothing cached) reads the mix of both layouts.
    with StratadSaver(daemon.target, cache_bytes=0) as fresh:
        graph = v1_graph(5).compile(checkpointer=fresh)
        assert contents(graph.get_state(chat).values)[-1] == "answer later"
        again = [len(h.values.get("messages", [])) for h in graph.get_state_history(chat)]
        assert again == sizes


def test_the_payload_layout_is_still_written_on_request(start_daemon: Callable[..., Any]) -> None:
    daemon = start_daemon()
    config: Any = {"configurable": {"thread_id": "t"}}
    with StratadSaver(daemon.target, layout="payload") as old_style:
        v1_graph(3).compile(checkpointer=old_style).invoke({"messages": [], "step": 0}, config)
    with stratad.Client(daemon.target) as client:
        assert not client.load_state("t").data.startswith(LAYOUT_MAGIC)
    with StratadSaver(daemon.target) as saver:
        graph = v1_graph(3).compile(checkpointer=saver)
        assert contents(graph.get_state(config).values) == ["m0", "m1", "m2"]
        graph.invoke(Command(resume="y"), config)
        assert contents(graph.get_state(config).values)[-1] == "answer y"


def _checkpoint(messages: list[Any], step: int, version: str) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": list(messages), "step": step, "tags": {"a"}}
    checkpoint["channel_versions"] = {"messages": f"{step}", "step": f"{step}", "tags": version}
    return checkpoint


def test_the_layout_round_trips_and_grows_at_its_end() -> None:
    serde = JsonPlusSerializer()
    messages: list[Any] = []
    encoder = _Encoder(serde, 1 << 20)
    previous = b""
    for step in range(40):
        cls = HumanMessage if step % 2 == 0 else AIMessage
        messages = [*messages, cls(content=f"message {step} " * 20, id=f"id-{step}")]
        checkpoint = _checkpoint(messages, step, "1")
        type_, data = encoder.encode(("t", ""), checkpoint, {"step": step}, "parent")
        assert type_ == "msgpack" and data.startswith(LAYOUT_MAGIC)
        # Same bytes as a fresh encoding (the cache changes nothing but the work).
        assert data == encode_layout(serde, checkpoint, {"step": step}, "parent")[1]
        decoded = decode_layout(serde, data)
        assert decoded["checkpoint"]["channel_values"] == checkpoint["channel_values"]
        assert decoded["checkpoint"]["id"] == checkpoint["id"]
        assert (decoded["metadata"], decoded["parent_checkpoint_id"]) == ({"step": step}, "parent")
        if previous:
            # Everything before the previous step's last message and trailer is unchanged.
            common = next(
                (i for i, (a, b) in enumerate(zip(previous, data, strict=False)) if a != b),
                len(previous),
            )
            assert common >= len(previous) - 1200, (step, common, len(previous))
        previous = data


def test_empty_lists_and_a_resumed_thread_are_laid_out_the_same() -> None:
    serde = JsonPlusSerializer()
    checkpoint = _checkpoint([], 0, "1")
    checkpoint["channel_values"]["todo"] = []
    checkpoint["channel_values"]["pair"] = (1, 2)
    _, data = encode_layout(serde, checkpoint, {}, None)
    values = decode_layout(serde, data)["checkpoint"]["channel_values"]
    # A tuple comes back as the serde gives it (a list), a value channel all the same.
    assert values == {"messages": [], "todo": [], "step": 0, "tags": {"a"}, "pair": [1, 2]}
    assert serde.loads_typed(serde.dumps_typed((1, 2))) == [1, 2]
    # An encoder seeded with a loaded checkpoint writes what a fresh one writes.
    checkpoint = _checkpoint([HumanMessage(content="a", id="1")], 1, "1")
    _, data = encode_layout(serde, checkpoint, {}, None)
    encoder = _Encoder(serde, 1 << 20)
    loaded, table = _decode(serde, data, None)
    encoder.seed(("t", ""), loaded["checkpoint"], data, table)
    grown = loaded["checkpoint"]["channel_values"]["messages"] + [AIMessage(content="b", id="2")]
    checkpoint = _checkpoint(grown, 2, "1")
    assert encoder.encode(("t", ""), checkpoint, {}, None) == encode_layout(
        serde, checkpoint, {}, None
    )


def test_a_message_changed_in_place_and_written_again_is_serialized_again() -> None:
    serde = JsonPlusSerializer()
    encoder = _Encoder(serde, 1 << 20)
    messages: list[Any] = [HumanMessage(content="a", id="1"), AIMessage(content="b", id="2")]
    encoder.encode(("t", ""), _checkpoint(messages, 1, "1"), {}, None)
    messages[1].content = "changed"
    encoder.written(("t", ""), [("messages", [messages[1]])])
    _, data = encoder.encode(("t", ""), _checkpoint(messages, 2, "1"), {}, None)
    values = decode_layout(serde, data)["checkpoint"]["channel_values"]
    assert [m.content for m in values["messages"]] == ["a", "changed"]
    # A channel whose version did not change keeps its serialized value.
    _, again = encoder.encode(("t", ""), _checkpoint(messages, 3, "1"), {}, None)
    assert decode_layout(serde, again)["checkpoint"]["channel_values"]["tags"] == {"a"}
