"""What the inspector tests put in a daemon, through the Python SDK (`stratad.Client`).

`fill(target)` writes, in tenant ``acme``:

- ``chat-1`` (labels team=support and an HTML/script payload): three JSON
  checkpoints c1 -> c2 -> c3 (c2 adds a message, c3 changes ``step`` and a
  nested value and removes ``draft``), and c1b, a second child of c1 (a branch);
- ``chat-1-fork``: ForkSession from c2, then one save of its own;
- ``batch-7`` (team=research): a binary state, cognitive state with decisions,
  tasks with a result, agent state;
- two crystals (one reused successfully, so the scores differ);

and in tenant ``other``: the session ``elsewhere``.

`fill_langgraph(target)` runs a real LangGraph graph through StratadSaver in
tenant ``graphs`` (thread ``trip-planner``): a human message in, a node that
answers with an AI message and sets ``destination``, then a node that
interrupts with a question (a pending write on the last checkpoint).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from google.protobuf import struct_pb2
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt

import stratad
from stratad.api.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    cognitive_pb2,
    cognitive_pb2_grpc,
    crystal_pb2,
    crystal_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from stratad.integrations.langgraph import StratadSaver, session_id_of, stratad_checkpoint_id

TENANT = "acme"
OTHER_TENANT = "other"
LANGGRAPH_TENANT = "graphs"
THREAD = "trip-planner"
HUMAN_TEXT = "Plan a day trip from Paris"
AI_TEXT = "Take the 9:40 train to Lyon."
QUESTION = "Which day?"
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=1</script>'
DECISION = "Chose FastAPI for the REST layer"

STATE_1 = {"step": 1, "messages": [{"role": "user", "content": "hello"}], "draft": "tmp"}
STATE_2 = {
    "step": 2,
    "messages": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
    ],
    "draft": "tmp",
}
STATE_3 = {
    "step": 3,
    "messages": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi, how can I help?"},
    ],
    "note": XSS,
}


@dataclass(frozen=True)
class Filled:
    c1: str
    c2: str
    c3: str
    c1b: str
    fork_first: str
    fork_second: str
    binary: str
    crystal_reused: str
    crystal_plain: str


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def fill(target: str, token: str = "") -> Filled:
    with stratad.Client(target, tenant=TENANT, token=token or None) as client:
        client.create_session("chat-1", labels={"team": "support", "payload": XSS})
        save = client.save_state
        kind = {"content_type": "application/json"}
        c1 = save("chat-1", _json(STATE_1), **kind).checkpoint_id
        c2 = save("chat-1", _json(STATE_2), **kind).checkpoint_id
        c3 = save("chat-1", _json(STATE_3), **kind).checkpoint_id
        c1b = save(
            "chat-1", _json({**STATE_1, "step": 10}), parent_checkpoint_id=c1, **kind
        ).checkpoint_id
        fork = client.fork_session(c2, "chat-1-fork", labels={"team": "support"})
        fork_first = fork.head_checkpoint_id
        fork_second = save("chat-1-fork", _json({**STATE_2, "step": 20}), **kind).checkpoint_id

        client.create_session("batch-7", labels={"team": "research"})
        binary = save("batch-7", b"\x00\x01\xfe\xffbinary", content_type="").checkpoint_id
        _structured(client, "batch-7")
        crystal_reused, crystal_plain = _crystals(client)
    with stratad.Client(target, tenant=OTHER_TENANT, token=token or None) as client:
        client.create_session("elsewhere")
        client.save_state("elsewhere", b"{}")
    return Filled(c1, c2, c3, c1b, fork_first, fork_second, binary, crystal_reused, crystal_plain)


@dataclass(frozen=True)
class LangGraphFilled:
    session_id: str
    #: stratad checkpoint IDs by LangGraph step: -1 (the input), 0 (the human
    #: message in the channels), 1 (the AI answer and the destination added).
    by_step: dict[int, str]


class Trip(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    destination: str


def fill_langgraph(target: str, token: str = "") -> LangGraphFilled:
    def plan(state: Trip) -> Trip:
        return {"messages": [AIMessage(content=AI_TEXT)], "destination": "Lyon"}

    def ask(state: Trip) -> Trip:
        day = interrupt({"question": QUESTION})
        return {"messages": [HumanMessage(content=f"on {day}")]}

    builder = StateGraph(Trip)
    builder.add_node("plan", plan)
    builder.add_node("ask", ask)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "ask")
    builder.add_edge("ask", END)
    config: Any = {"configurable": {"thread_id": THREAD}}
    with StratadSaver(target, tenant=LANGGRAPH_TENANT, token=token or None) as saver:
        graph = builder.compile(checkpointer=saver)
        out = graph.invoke({"messages": [HumanMessage(content=HUMAN_TEXT)]}, config)
        assert out["__interrupt__"][0].value == {"question": QUESTION}, out
        by_step = {
            int(t.metadata["step"]): stratad_checkpoint_id(
                THREAD, "", t.config["configurable"]["checkpoint_id"]
            )
            for t in saver.list(config)
        }
    assert sorted(by_step) == [-1, 0, 1], by_step
    return LangGraphFilled(session_id_of(THREAD), by_step)


def _structured(client: stratad.Client, session_id: str) -> None:
    cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(client.channel)
    client.call(
        cognitive.Initialize,
        cognitive_pb2.InitializeRequest(
            session_id=session_id, goal="Build a REST API", constraints=["Use PostgreSQL"]
        ),
    )
    client.call(
        cognitive.RecordDecision,
        cognitive_pb2.RecordDecisionRequest(
            session_id=session_id, step=3, decision=DECISION, rationale="async support"
        ),
    )
    tasks = task_pb2_grpc.TaskServiceStub(client.channel)
    client.call(
        tasks.UpdateTaskStatus,
        task_pb2.UpdateTaskStatusRequest(
            session_id=session_id, task_id="fetch-docs", status=task_pb2.TASK_STATUS_COMPLETED
        ),
    )
    result = struct_pb2.Value()
    result.struct_value.update({"pages": 12, "summary": XSS})
    client.call(
        tasks.StoreTaskResult,
        task_pb2.StoreTaskResultRequest(session_id=session_id, task_id="fetch-docs", result=result),
    )
    agent = agent_pb2_grpc.AgentStateServiceStub(client.channel)
    client.call(
        agent.StartAgent,
        agent_pb2.StartAgentRequest(session_id=session_id, query="summarise the docs"),
    )


def _crystals(client: stratad.Client) -> tuple[str, str]:
    crystals = crystal_pb2_grpc.CrystalServiceStub(client.channel)

    def crystallize(goal: str, tools: list[str], score: float) -> str:
        trace = [crystal_pb2.TraceStep(decision=f"use {t}", tool=t) for t in tools]
        request = crystal_pb2.CrystallizeRequest(
            goal=goal, execution_trace=trace, success_score=score, session_id="chat-1"
        )
        response = client.call(crystals.Crystallize, request)
        assert response.outcome == crystal_pb2.CRYSTALLIZE_OUTCOME_CREATED, response
        return str(response.crystal.crystal_id)

    reused = crystallize("Deploy the billing service to staging", ["git", "docker", "kubectl"], 0.8)
    plain = crystallize("Summarise customer feedback emails", ["imap", "llm"], 0.75)
    client.call(
        crystals.RecordReuse, crystal_pb2.RecordReuseRequest(crystal_id=reused, success=True)
    )
    return reused, plain
