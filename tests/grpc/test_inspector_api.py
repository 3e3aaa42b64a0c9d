"""The web inspector's JSON API and pages, against a real in-process daemon.

Each test starts the daemon with ``inspector_listen = 127.0.0.1:0``, fills it
through the SDK (tests/inspector_data.py) and reads the inspector over HTTP.
"""

from __future__ import annotations

import datetime
import http.client
import json
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from inspector_data import (
    AI_TEXT,
    DECISION,
    HUMAN_TEXT,
    LANGGRAPH_TENANT,
    OTHER_TENANT,
    QUESTION,
    STATE_2,
    STATE_3,
    TENANT,
    XSS,
    Filled,
    LangGraphFilled,
    fill,
    fill_langgraph,
)

import stratad
from stratad.api.v1 import agent_pb2, agent_pb2_grpc
from stratad.server.auth import token_digest
from stratad.server.inspector import reader as reader_module
from stratad.server.inspector.http import HttpStartError
from stratad.server.inspector.reader import Reader
from stratad.server.registry import SERVICES

ADMIN_TOKEN = "admin-secret-token"
AGENT_TOKEN = "agent-secret-token"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json", self.headers
        return json.loads(self.body)

    @property
    def reason(self) -> str:
        return str(self.json()["error"]["reason"])


def http_get(
    address: str, path: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> Reply:
    """One raw request: the path is sent exactly as given (``..`` included)."""
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        body = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
    finally:
        conn.close()


@dataclass
class Inspected:
    server: Any
    address: str
    filled: Filled

    @property
    def data_dir(self) -> Path:
        return Path(self.server.config.data_dir)

    def get(self, path: str, **kwargs: Any) -> Reply:
        return http_get(self.address, path, **kwargs)

    def api(self, path: str, **kwargs: Any) -> Any:
        reply = self.get(path, **kwargs)
        assert reply.status == 200, (reply.status, reply.body)
        return reply.json()


@pytest.fixture
def inspected(inprocess_server: Callable[..., Any]) -> Inspected:
    server = inprocess_server(services=SERVICES, inspector_listen="127.0.0.1:0")
    address = server.server.inspector_address
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")
    return Inspected(server, address, fill(server.target))


SESSION = f"/api/tenants/{TENANT}/sessions"
GRAPHS = f"/api/tenants/{LANGGRAPH_TENANT}/sessions"
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
LANGGRAPH_MSGPACK = "application/vnd.langgraph.checkpoint+msgpack"


def assert_iso(shown: Any, seconds: float | None = None) -> None:
    """``shown`` is an ISO 8601 UTC time (of ``seconds``, to the millisecond)."""
    assert isinstance(shown, str) and ISO_UTC.fullmatch(shown), shown
    if seconds is not None:
        parsed = datetime.datetime.fromisoformat(shown.replace("Z", "+00:00"))
        assert parsed.tzinfo == datetime.UTC
        assert abs(parsed.timestamp() - seconds) < 0.001, (shown, seconds)


# -- tenants and sessions ------------------------------------------------------------------


def test_tenants_lists_each_tenant_with_its_counts(inspected: Inspected) -> None:
    tenants = inspected.api("/api/tenants")["tenants"]
    assert tenants == [
        {"tenant": TENANT, "sessions": 3, "crystals": 2},
        {"tenant": OTHER_TENANT, "sessions": 1, "crystals": 0},
    ]


def test_a_directory_that_no_tenant_id_can_name_is_not_a_tenant(inspected: Inspected) -> None:
    (inspected.data_dir / "tenants" / ".partial").mkdir()
    listed = [t["tenant"] for t in inspected.api("/api/tenants")["tenants"]]
    assert listed == [TENANT, OTHER_TENANT]


def test_sessions_are_listed_by_id_with_their_summary(inspected: Inspected) -> None:
    listed = inspected.api(SESSION)
    assert [s["session_id"] for s in listed["sessions"]] == ["batch-7", "chat-1", "chat-1-fork"]
    assert (listed["total"], listed["matched"], listed["truncated"]) == (3, 3, False)
    chat = listed["sessions"][1]
    assert chat["labels"] == {"team": "support", "payload": XSS}
    assert chat["checkpoint_count"] == 4 and chat["status"] == "active"
    batch = listed["sessions"][0]
    assert batch["facets"] == ["cognitive", "tasks", "agent"]
    assert listed["sessions"][2]["forked_from"] == inspected.filled.c2


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("chat", ["chat-1", "chat-1-fork"]),
        ("FORK", ["chat-1-fork"]),  # case-insensitive
        ("research", ["batch-7"]),  # a label value
        ("team=support", ["chat-1", "chat-1-fork"]),  # key=value
        ("nothing-like-this", []),
    ],
)
def test_session_search_matches_id_or_label(
    inspected: Inspected, query: str, expected: list[str]
) -> None:
    listed = inspected.api(f"{SESSION}?q={query}")
    assert [s["session_id"] for s in listed["sessions"]] == expected
    assert listed["matched"] == len(expected) and listed["total"] == 3


def test_session_shows_every_checkpoint_its_parents_and_its_fork(inspected: Inspected) -> None:
    f = inspected.filled
    session = inspected.api(f"{SESSION}/chat-1")
    parents = {c["checkpoint_id"]: c["parent_id"] for c in session["checkpoints"]}
    assert parents == {f.c1: "", f.c2: f.c1, f.c3: f.c2, f.c1b: f.c1}
    c3 = next(c for c in session["checkpoints"] if c["checkpoint_id"] == f.c3)
    assert c3["size"] == len(json.dumps(STATE_3).encode())
    assert c3["content_type"] == "application/json" and c3["created_at"] > 0
    assert [(k["session_id"], k["checkpoint_id"]) for k in session["forks"]] == [
        ("chat-1-fork", f.c2)
    ]
    assert session["forked_from"] is None

    fork = inspected.api(f"{SESSION}/chat-1-fork")
    assert fork["forked_from"] == {"checkpoint_id": f.c2, "session_id": "chat-1"}
    assert [c["checkpoint_id"] for c in fork["checkpoints"]] == [f.fork_first, f.fork_second]


# -- checkpoints and diffs ------------------------------------------------------------------


def test_checkpoint_state_is_decoded_as_json(inspected: Inspected) -> None:
    shown = inspected.api(f"{SESSION}/chat-1/checkpoints/{inspected.filled.c2}")
    assert shown["checkpoint"]["checkpoint_id"] == inspected.filled.c2
    assert shown["state"]["encoding"] == "json"
    assert shown["state"]["value"] == STATE_2


def test_a_binary_state_is_summarised_in_hex(inspected: Inspected) -> None:
    shown = inspected.api(f"{SESSION}/batch-7/checkpoints/{inspected.filled.binary}")
    assert shown["state"] == {
        "encoding": "binary",
        "size": len(b"\x00\x01\xfe\xffbinary"),
        "hex": b"\x00\x01\xfe\xffbinary".hex(),
    }


def test_diff_lists_added_removed_and_changed_paths(inspected: Inspected) -> None:
    f = inspected.filled
    diff = inspected.api(f"{SESSION}/chat-1/diff?a={f.c2}&b={f.c3}")
    assert diff["comparable"] is True and diff["identical"] is False
    changes = {(c["op"], c["pointer"]) for c in diff["changes"]}
    assert changes == {
        ("removed", "/draft"),
        ("added", "/note"),
        ("changed", "/messages/1/content"),
        ("changed", "/step"),
    }
    step = next(c for c in diff["changes"] if c["pointer"] == "/step")
    assert (step["before"], step["after"]) == ("2", "3")


def test_diff_of_a_checkpoint_with_itself_is_empty(inspected: Inspected) -> None:
    c1 = inspected.filled.c1
    diff = inspected.api(f"{SESSION}/chat-1/diff?a={c1}&b={c1}")
    assert diff["identical"] is True and diff["changes"] == []


def test_diff_with_a_binary_state_is_not_comparable(inspected: Inspected) -> None:
    with stratad.Client(inspected.server.target, tenant=TENANT) as client:
        text = client.save_state("batch-7", b'{"ok": true}').checkpoint_id
    diff = inspected.api(f"{SESSION}/batch-7/diff?a={inspected.filled.binary}&b={text}")
    assert diff["comparable"] is False and diff["identical"] is False
    assert "changes" not in diff
    assert diff["states"]["b"] == {"encoding": "json"}
    assert diff["states"]["a"]["encoding"] == "not_json"
    assert "neither JSON nor a LangGraph checkpoint" in diff["states"]["a"]["why"]


# -- LangGraph checkpoints (StratadSaver) -------------------------------------------------------


@pytest.fixture
def graphs(inspected: Inspected) -> LangGraphFilled:
    """A real LangGraph graph run through StratadSaver into the inspected daemon."""
    return fill_langgraph(inspected.server.target)


def test_a_langgraph_checkpoint_is_decoded_with_its_messages(
    inspected: Inspected, graphs: LangGraphFilled
) -> None:
    shown = inspected.api(f"{GRAPHS}/{graphs.session_id}/checkpoints/{graphs.by_step[1]}")
    assert shown["checkpoint"]["content_type"] == LANGGRAPH_MSGPACK
    state = shown["state"]
    assert state["encoding"] == "langgraph" and state["serde"] == "msgpack"
    assert "hex" not in state and "undecoded" not in state
    # The messages, readable: their type and text.
    assert state["messages"] == [
        {
            "pointer": "/checkpoint/channel_values/messages/0",
            "type": "human",
            "class": "HumanMessage",
            "content": HUMAN_TEXT,
        },
        {
            "pointer": "/checkpoint/channel_values/messages/1",
            "type": "ai",
            "class": "AIMessage",
            "content": AI_TEXT,
        },
    ]
    assert state["messages_truncated"] is False
    # The channel values as JSON, as `stratad ctl checkpoints show --decode langgraph`.
    value = state["value"]
    channels = value["checkpoint"]["channel_values"]
    assert channels["destination"] == "Lyon"
    assert [(m["$type"], m["type"], m["content"]) for m in channels["messages"]] == [
        ("HumanMessage", "human", HUMAN_TEXT),
        ("AIMessage", "ai", AI_TEXT),
    ]
    assert (value["metadata"]["step"], value["metadata"]["source"]) == (1, "loop")
    assert value["parent_checkpoint_id"] is not None
    # The interrupt the graph stopped at: a pending write, decoded too.
    interrupts = [w for w in state["pending_writes"] if w["channel"] == "__interrupt__"]
    assert len(interrupts) == 1
    assert interrupts[0]["value"][0]["$type"] == "Interrupt"
    assert interrupts[0]["value"][0]["value"] == {"question": QUESTION}


def test_the_input_checkpoints_messages_are_found_inside_their_channel(
    inspected: Inspected, graphs: LangGraphFilled
) -> None:
    shown = inspected.api(f"{GRAPHS}/{graphs.session_id}/checkpoints/{graphs.by_step[-1]}")
    state = shown["state"]
    assert state["value"]["metadata"]["source"] == "input"
    assert [(m["pointer"], m["type"], m["content"]) for m in state["messages"]] == [
        ("/checkpoint/channel_values/__start__/messages/0", "human", HUMAN_TEXT)
    ]


def test_a_diff_between_two_langgraph_checkpoints_lists_the_changed_channels(
    inspected: Inspected, graphs: LangGraphFilled
) -> None:
    before, after = graphs.by_step[0], graphs.by_step[1]
    diff = inspected.api(f"{GRAPHS}/{graphs.session_id}/diff?a={before}&b={after}")
    assert diff["comparable"] is True and diff["identical"] is False
    assert diff["states"] == {"a": {"encoding": "langgraph"}, "b": {"encoding": "langgraph"}}
    changes = {c["pointer"]: c for c in diff["changes"]}
    message = changes["/checkpoint/channel_values/messages/1"]
    assert message["op"] == "added" and AI_TEXT in message["after"]
    destination = changes["/checkpoint/channel_values/destination"]
    assert (destination["op"], destination["after"]) == ("added", '"Lyon"')
    step = changes["/metadata/step"]
    assert (step["op"], step["before"], step["after"]) == ("changed", "0", "1")
    # The human message, in both, is no change.
    assert not any(p.startswith("/checkpoint/channel_values/messages/0") for p in changes)


def test_a_langgraph_checkpoint_that_cannot_be_decoded_says_why(
    inspected: Inspected, graphs: LangGraphFilled
) -> None:
    with stratad.Client(inspected.server.target, tenant=LANGGRAPH_TENANT) as client:
        save = client.save_state
        garbled = save(graphs.session_id, b"\xc1\xc1 not msgpack", content_type=LANGGRAPH_MSGPACK)
        pickled = save(
            graphs.session_id,
            b"\x80\x04K\x01.",
            content_type="application/vnd.langgraph.checkpoint+pickle",
        )
    base = f"{GRAPHS}/{graphs.session_id}"
    shown = inspected.api(f"{base}/checkpoints/{garbled.checkpoint_id}")["state"]
    assert shown["encoding"] == "binary" and shown["hex"].startswith("c1c1")
    assert "LangGraph's serializer cannot read this msgpack checkpoint" in shown["undecoded"]
    shown = inspected.api(f"{base}/checkpoints/{pickled.checkpoint_id}")["state"]
    assert shown["encoding"] == "binary" and "never unpickles" in shown["undecoded"]

    diff = inspected.api(f"{base}/diff?a={graphs.by_step[1]}&b={pickled.checkpoint_id}")
    assert diff["comparable"] is False and "changes" not in diff
    assert diff["states"]["a"] == {"encoding": "langgraph"}
    assert "never unpickles" in diff["states"]["b"]["why"]


def test_a_langgraph_payload_naming_a_callable_never_calls_it(
    inspected: Inspected, graphs: LangGraphFilled, tmp_path: Path
) -> None:
    """The daemon decodes every tenant's bytes: LangGraph's serializer runs strict, so a
    payload naming ``os.mkdir`` (LangGraph's default would call it) shows its arguments."""
    import ormsgpack

    target = tmp_path / "made-by-a-payload"
    call = ormsgpack.Ext(1, ormsgpack.packb(["os", "mkdir", [str(target)]]))  # constructor
    envelope = {
        "checkpoint": {"v": 4, "id": "x", "ts": "", "channel_values": {"evil": call}},
        "metadata": {"step": 7},
        "parent_checkpoint_id": None,
    }
    with stratad.Client(inspected.server.target, tenant=LANGGRAPH_TENANT) as client:
        saved = client.save_state(
            graphs.session_id, ormsgpack.packb(envelope), content_type=LANGGRAPH_MSGPACK
        )
    shown = inspected.api(f"{GRAPHS}/{graphs.session_id}/checkpoints/{saved.checkpoint_id}")
    assert shown["state"]["encoding"] == "langgraph"
    assert shown["state"]["value"]["checkpoint"]["channel_values"] == {"evil": [str(target)]}
    assert not target.exists()


# -- times --------------------------------------------------------------------------------------


def test_times_are_iso_8601_utc_next_to_their_number(
    inspected: Inspected, graphs: LangGraphFilled
) -> None:
    listed = inspected.api(SESSION)["sessions"][1]
    assert_iso(listed["created_at_iso"], listed["created_at"])
    assert_iso(listed["updated_at_iso"], listed["updated_at"])
    session = inspected.api(f"{SESSION}/chat-1")
    assert_iso(session["created_at_iso"], session["created_at"])
    for checkpoint in session["checkpoints"]:
        assert_iso(checkpoint["created_at_iso"], checkpoint["created_at"])
    assert_iso(session["forks"][0]["created_at_iso"], session["forks"][0]["created_at"])
    shown = inspected.api(f"{SESSION}/chat-1/checkpoints/{inspected.filled.c1}")
    assert_iso(shown["checkpoint"]["created_at_iso"], shown["checkpoint"]["created_at"])
    diff = inspected.api(f"{SESSION}/chat-1/diff?a={inspected.filled.c1}&b={inspected.filled.c2}")
    assert_iso(diff["a"]["created_at_iso"], diff["a"]["created_at"])
    for crystal in inspected.api(f"/api/tenants/{TENANT}/crystals")["crystals"]:
        assert_iso(crystal["created_at_iso"], crystal["created_at"])
    lg = inspected.api(f"{GRAPHS}/{graphs.session_id}")
    assert all(ISO_UTC.fullmatch(c["created_at_iso"]) for c in lg["checkpoints"])


def test_the_structured_states_times_are_iso_8601_utc(inspected: Inspected) -> None:
    with stratad.Client(inspected.server.target, tenant=TENANT) as client:
        agent = agent_pb2_grpc.AgentStateServiceStub(client.channel)
        request = agent_pb2.ApplyReasoningRequest(session_id="batch-7", thinking="read the index")
        client.call(agent.ApplyReasoning, request)
    shown = inspected.api(f"{SESSION}/batch-7/structured")
    cognitive = shown["cognitive"]
    assert_iso(cognitive["crystallized"]["created_at"])
    assert_iso(cognitive["fluid"]["last_updated"])
    decision = cognitive["insights"]["decision_log"][0]
    assert decision["decision"] == DECISION and decision["step"] == 3
    assert_iso(decision["timestamp"])
    task = shown["tasks"]["tasks"]["fetch-docs"]
    assert_iso(task["created_at"])
    assert_iso(task["updated_at"])
    # Thoughts are stamped in the daemon's local time without a zone (as Cogency
    # does): shown in UTC.
    thought = shown["agent"]["reasoning"]["thoughts"][0]
    assert thought["thinking"] == "read the index"
    assert_iso(thought["timestamp"])
    # The agent's own values are left alone.
    assert task["result"] == {"pages": 12, "summary": XSS}


# -- structured state and crystals --------------------------------------------------------------


def test_structured_state_shows_cognitive_tasks_and_agent(inspected: Inspected) -> None:
    shown = inspected.api(f"{SESSION}/batch-7/structured")
    assert DECISION in json.dumps(shown["cognitive"])
    assert shown["cognitive"]["crystallized"]["goal"] == "Build a REST API"
    task = shown["tasks"]["tasks"]["fetch-docs"]
    assert task["status"] == "completed" and task["result"] == {"pages": 12, "summary": XSS}
    assert shown["tasks"]["task_count"] == 1 and shown["tasks"]["truncated"] is False
    assert shown["agent"]["execution"]["query"] == "summarise the docs"


def test_a_session_without_structured_state_has_none(inspected: Inspected) -> None:
    shown = inspected.api(f"{SESSION}/chat-1/structured")
    assert (shown["cognitive"], shown["tasks"], shown["agent"]) == (None, None, None)


def test_crystals_are_listed_most_effective_first_with_scores(inspected: Inspected) -> None:
    f = inspected.filled
    shown = inspected.api(f"/api/tenants/{TENANT}/crystals")
    crystals = shown["crystals"]
    assert [c["crystal_id"] for c in crystals] == [f.crystal_reused, f.crystal_plain]
    reused, plain = crystals
    assert reused["effectiveness"] == pytest.approx((0.8 + 1.0) / 2)
    assert (reused["success_score"], reused["reuse_count"]) == (pytest.approx(0.8), 1)
    assert (plain["effectiveness"], plain["reuse_count"]) == (pytest.approx(0.75), 0)
    assert reused["tool_sequence"] == ["git", "docker", "kubectl"]
    assert shown["stats"]["total_crystals"] == 2 and shown["stats"]["total_reuses"] == 1
    assert inspected.api(f"/api/tenants/{OTHER_TENANT}/crystals")["crystals"] == []


# -- not found, bad IDs, unknown tenants --------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (f"{SESSION}/no-such-session", "SESSION_NOT_FOUND"),
        (f"{SESSION}/no-such-session/structured", "SESSION_NOT_FOUND"),
        (f"{SESSION}/chat-1/checkpoints/ckpt-none", "CHECKPOINT_NOT_FOUND"),
        (f"{SESSION}/chat-1/diff?a=ckpt-none&b=ckpt-none", "CHECKPOINT_NOT_FOUND"),
        (f"/api/tenants/{OTHER_TENANT}/sessions/chat-1", "SESSION_NOT_FOUND"),  # another tenant's
        ("/api/no-such-route", "NOT_FOUND"),
        ("/api/tenants/acme/sessions/chat-1/extra/part", "NOT_FOUND"),
        ("/no-such-page", "NOT_FOUND"),
    ],
)
def test_what_does_not_exist_is_404(inspected: Inspected, path: str, reason: str) -> None:
    reply = inspected.get(path)
    assert reply.status == 404 and reply.reason == reason


def test_a_checkpoint_of_another_session_is_not_found(inspected: Inspected) -> None:
    reply = inspected.get(f"{SESSION}/batch-7/checkpoints/{inspected.filled.c1}")
    assert reply.status == 404 and reply.reason == "CHECKPOINT_NOT_FOUND"


TENANT_PATHS = [
    "/api/tenants/{t}/sessions",
    "/api/tenants/{t}/sessions/chat-1",
    "/api/tenants/{t}/sessions/chat-1/checkpoints/ckpt-1",
    "/api/tenants/{t}/sessions/chat-1/diff?a=x&b=y",
    "/api/tenants/{t}/sessions/chat-1/structured",
    "/api/tenants/{t}/crystals",
]


@pytest.mark.parametrize("template", TENANT_PATHS)
def test_an_unknown_tenant_is_404_and_creates_nothing(inspected: Inspected, template: str) -> None:
    tenants = inspected.data_dir / "tenants"
    before = sorted(p.name for p in tenants.iterdir())
    reply = inspected.get(template.format(t="ghost"))
    assert reply.status == 404 and reply.reason == "NOT_FOUND"
    assert "ghost" in reply.json()["error"]["message"]
    assert sorted(p.name for p in tenants.iterdir()) == before
    assert not (tenants / "ghost").exists()


@pytest.mark.parametrize(
    "path",
    [
        "/api/tenants/../sessions",
        "/api/tenants/..%2F..%2Fetc/sessions",
        "/api/tenants/%2e%2e/crystals",
        f"{SESSION}/..%2Fchat-1",
        f"{SESSION}/chat-1/checkpoints/..%2F..%2Fjournal",
        f"{SESSION}/.hidden/structured",
        f"{SESSION}/has%20space",
        f"{SESSION}/chat-1/diff?a=../x&b=y",
        f"{SESSION}/chat-1/diff?a=&b=",
    ],
)
def test_bad_ids_are_400_invalid_id(inspected: Inspected, path: str) -> None:
    reply = inspected.get(path)
    assert reply.status == 400, reply.body
    assert reply.reason == "INVALID_ID"


# -- HTTP behaviour, security headers, pages ---------------------------------------------------


def test_pages_are_served_with_their_types_and_strict_headers(inspected: Inspected) -> None:
    for path, kind in [
        ("/", "text/html"),
        ("/static/app.js", "text/javascript"),
        ("/static/style.css", "text/css"),
    ]:
        reply = inspected.get(path)
        assert reply.status == 200 and reply.headers["content-type"].startswith(kind)
        assert "script-src 'self'" in reply.headers["content-security-policy"]
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["x-frame-options"] == "DENY"
    assert b"/static/app.js" in inspected.get("/").body
    for path in ("/static/../reader.py", "/static/reader.py", "/static/", "/index.html"):
        assert inspected.get(path).status in (400, 404), path


def test_api_answers_are_json_never_html(inspected: Inspected) -> None:
    reply = inspected.get(SESSION)
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["cache-control"] == "no-store"
    # The XSS label travels as a JSON string; the page renders it as text.
    assert json.loads(reply.body)["sessions"][1]["labels"]["payload"] == XSS


def test_only_get_and_head_are_allowed(inspected: Inspected) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        reply = inspected.get(SESSION, method=method)
        assert reply.status == 405 and reply.headers["allow"] == "GET, HEAD"
    head = inspected.get(SESSION, method="HEAD")
    assert head.status == 200 and head.body == b"" and int(head.headers["content-length"]) > 0


def test_a_foreign_host_header_is_refused(inspected: Inspected) -> None:
    """DNS rebinding: a name the attacker controls, pointed at 127.0.0.1, is refused."""
    port = inspected.address.rpartition(":")[2]
    reply = inspected.get("/api/tenants", headers={"Host": f"attacker.example:{port}"})
    assert reply.status == 403 and reply.reason == "PERMISSION_DENIED"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1"):
        assert inspected.get("/api/tenants", headers={"Host": host}).status == 200


def test_an_oversized_request_head_is_refused(inspected: Inspected) -> None:
    reply = inspected.get("/api/tenants", headers={"X-Filler": "x" * 20000})
    assert reply.status == 431


# -- read-only, off the event loop ----------------------------------------------------------------


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "LOCK"
    }


def test_reading_every_endpoint_writes_nothing(inspected: Inspected) -> None:
    f = inspected.filled
    inspected.server.resources.engine.store.sync_objects()  # background writes done
    before = _files(inspected.data_dir)
    paths = [
        "/api/tenants",
        SESSION,
        f"{SESSION}?q=chat",
        f"{SESSION}/chat-1",
        f"{SESSION}/chat-1-fork",
        f"{SESSION}/chat-1/checkpoints/{f.c3}",
        f"{SESSION}/chat-1/diff?a={f.c1}&b={f.c3}",
        f"{SESSION}/batch-7/structured",
        f"/api/tenants/{TENANT}/crystals",
        "/api/tenants/ghost/sessions",
    ]
    for path in paths:
        inspected.get(path)
    assert _files(inspected.data_dir) == before


def test_reads_run_on_the_worker_pool(
    inspected: Inspected, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[str] = []
    original = Reader.checkpoint

    def recording(self: Reader, *args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return original(self, *args)

    monkeypatch.setattr(Reader, "checkpoint", recording)
    inspected.api(f"{SESSION}/chat-1/checkpoints/{inspected.filled.c1}")
    assert len(threads) == 1 and threads[0].startswith("stratad-worker")


# -- with auth on ------------------------------------------------------------------------------


@pytest.fixture
def guarded(inprocess_server: Callable[..., Any], tmp_path: Path) -> Inspected:
    tokens = tmp_path / "identities.toml"
    tokens.write_text(
        f'[tokens.{token_digest(ADMIN_TOKEN)}]\ntenant = "ops"\nrole = "admin"\n'
        f'[tokens.{token_digest(AGENT_TOKEN)}]\ntenant = "{TENANT}"\nrole = "agent"\n'
    )
    server = inprocess_server(
        services=SERVICES,
        inspector_listen="127.0.0.1:0",
        auth="token",
        auth_tokens_file=str(tokens),
    )
    filled = fill(server.target, token=ADMIN_TOKEN)
    return Inspected(server, server.server.inspector_address, filled)


def test_with_auth_on_the_api_needs_an_admin_token(guarded: Inspected) -> None:
    missing = guarded.get("/api/tenants")
    assert missing.status == 401 and missing.reason == "MISSING_CREDENTIALS"
    assert missing.headers["www-authenticate"].startswith("Bearer")
    wrong = guarded.get("/api/tenants", headers={"Authorization": "Bearer not-a-token"})
    assert wrong.status == 401 and wrong.reason == "INVALID_TOKEN"
    agent = guarded.get("/api/tenants", headers={"Authorization": f"Bearer {AGENT_TOKEN}"})
    assert agent.status == 403 and agent.reason == "ADMIN_ROLE_REQUIRED"
    admin = guarded.api("/api/tenants", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert [t["tenant"] for t in admin["tenants"]] == [TENANT, OTHER_TENANT]


def test_with_auth_on_the_page_itself_is_served(guarded: Inspected) -> None:
    # It holds no data: it asks for the token, then calls the API with it.
    assert guarded.get("/").status == 200
    assert guarded.get("/static/app.js").status == 200


def test_a_taken_inspector_port_stops_start_up(inprocess_server: Callable[..., Any]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(HttpStartError, match=f"cannot listen on 127.0.0.1:{port}"):
            inprocess_server(services=SERVICES, inspector_listen=f"127.0.0.1:{port}")


def test_the_inspector_is_off_unless_asked_for(inprocess_server: Callable[..., Any]) -> None:
    server = inprocess_server(services=SERVICES)
    assert server.server.inspector is None and server.server.inspector_address == ""


def test_a_bug_is_a_json_500_with_an_incident_and_the_daemon_keeps_serving(
    inspected: Inspected, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: Reader) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(Reader, "tenants", broken)
    reply = inspected.get("/api/tenants")
    assert reply.status == 500 and reply.reason == "INTERNAL"
    incident = reply.json()["error"]["message"].split("incident ")[1].rstrip(")")
    assert any(incident in r.getMessage() and r.exc_info for r in caplog.records)
    assert inspected.get(SESSION).status == 200


def test_a_state_with_a_lone_surrogate_is_shown(inspected: Inspected) -> None:
    # Valid JSON that no UTF-8 encoder can write back as is.
    with stratad.Client(inspected.server.target, tenant=TENANT) as client:
        checkpoint = client.save_state("batch-7", b'{"odd": "\\ud800", "text": "caf\\u00e9"}')
    shown = inspected.api(f"{SESSION}/batch-7/checkpoints/{checkpoint.checkpoint_id}")
    assert shown["state"]["value"] == {"odd": "\ud800", "text": "café"}


def test_states_over_the_decode_limit_are_summarised_not_read(
    inspected: Inspected, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "MAX_DECODED_BYTES", 100)  # STATE_3 is 201 bytes
    f = inspected.filled
    shown = inspected.api(f"{SESSION}/chat-1/checkpoints/{f.c3}")
    assert shown["state"] == {
        "encoding": "too_large",
        "size": len(json.dumps(STATE_3)),
        "limit": 100,
    }
    diff = inspected.api(f"{SESSION}/chat-1/diff?a={f.c2}&b={f.c3}")
    assert diff["comparable"] is False and "changes" not in diff


def test_long_task_lists_are_cut_and_counted(
    inspected: Inspected, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reader_module, "MAX_TASKS_LISTED", 0)
    tasks = inspected.api(f"{SESSION}/batch-7/structured")["tasks"]
    assert (tasks["tasks"], tasks["task_count"], tasks["truncated"]) == ({}, 1, True)


def test_a_session_deleted_while_listing_is_left_out(
    inspected: Inspected, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = inspected.server.resources.engine
    listed = engine.sessions.sessions_of(TENANT)
    gone = next(live for live in listed if live.state.session_id == "batch-7")
    # As if DeleteSession ran between the listing and the read of each summary.
    monkeypatch.setattr(engine.sessions, "sessions_of", lambda tenant: listed)
    with stratad.Client(inspected.server.target, tenant=TENANT) as client:
        client.delete_session("batch-7")
    assert gone.deleted
    shown = inspected.api(SESSION)
    assert [s["session_id"] for s in shown["sessions"]] == ["chat-1", "chat-1-fork"]
