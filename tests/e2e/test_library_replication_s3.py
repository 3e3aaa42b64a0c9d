"""Tenant libraries and structured state replicated to a real S3 server (SeaweedFS).

Real daemons, real object storage (docs/replication.md, "Resume anywhere"):

1. Sync mode: daemon A stores crystals, reuses, deletions, a library config and
   user profiles, and is SIGKILLed, its data directory deleted; daemon B, with
   an empty data directory, answers ListCrystals (page by page), QueryCrystals,
   GetCrystal, GetCrystalStats, the config and GetProfile byte for byte as A did.
   The same for a session's structured state (cognitive, tasks, agent loop).
2. Two daemons write one tenant's library at once: each ends up serving the
   union, the same answer for a profile both updated, and every RecordReuse of
   both counted.
3. Async mode: the acknowledged library writes lost with the pod are the last
   ones of each writer, from the last shipping period; the test prints the window.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import json_format, struct_pb2
from test_replication_s3 import replicated

from stratad.api.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    cognitive_pb2,
    cognitive_pb2_grpc,
    crystal_pb2,
    crystal_pb2_grpc,
    profile_pb2,
    profile_pb2_grpc,
    task_pb2,
    task_pb2_grpc,
)
from stratad.errors import NotFoundError, StratadError
from stratad.sdk.client import Client

GOALS = [
    "deploy the billing service to staging",
    "summarize the incident report for the team",
    "migrate the user table to the new schema",
    "write release notes for version 2.4",
    "rotate the database credentials",
    "triage the open bugs in the tracker",
]


class Api:
    """The library services of one daemon (tenant `acme`)."""

    def __init__(self, target: str) -> None:
        self.client = Client(target, tenant="acme", timeout=30)
        channel = self.client.channel
        self._crystals = crystal_pb2_grpc.CrystalServiceStub(channel)
        self._profiles = profile_pb2_grpc.ProfileServiceStub(channel)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def crystals(self, name: str, request: Any) -> Any:
        return self.client.call(getattr(self._crystals, name), request)

    def profiles(self, name: str, request: Any) -> Any:
        return self.client.call(getattr(self._profiles, name), request)

    def crystallize(self, goal: str, tools: list[str], session: str = "s1") -> str:
        steps = [crystal_pb2.TraceStep(decision=f"use {t}", tool=t) for t in tools]
        request = crystal_pb2.CrystallizeRequest(
            goal=goal, execution_trace=steps, success_score=0.8, session_id=session
        )
        response = self.crystals("Crystallize", request)
        assert response.crystal.crystal_id, response
        return str(response.crystal.crystal_id)

    def reuse(self, crystal_id: str, success: bool) -> crystal_pb2.Crystal:
        request = crystal_pb2.RecordReuseRequest(crystal_id=crystal_id, success=success)
        return self.crystals("RecordReuse", request).crystal

    def update_profile(self, user: str, **fields: Any) -> profile_pb2.UserProfile:
        return self.profiles(
            "UpdateProfile", profile_pb2.UpdateProfileRequest(user_id=user, **fields)
        ).profile

    def listing(self, page_size: int = 2) -> list[bytes]:
        """Every crystal, page by page, serialized (byte-for-byte comparison)."""
        pages, token = [], ""
        while True:
            request = crystal_pb2.ListCrystalsRequest(page_size=page_size, page_token=token)
            response = self.crystals("ListCrystals", request)
            pages.extend(c.SerializeToString(deterministic=True) for c in response.crystals)
            token = response.next_page_token
            if not token:
                return pages

    def answers(self, users: list[str]) -> dict[str, Any]:
        """What a client sees of the library, serialized."""
        queries = {
            goal: self.crystals(
                "QueryCrystals", crystal_pb2.QueryCrystalsRequest(goal_text=goal, top_k=10)
            ).SerializeToString(deterministic=True)
            for goal in ("deploy the search service to staging", "rotate the api credentials")
        }
        stats = self.crystals("GetCrystalStats", crystal_pb2.GetCrystalStatsRequest())
        profiles: dict[str, bytes | None] = {}
        for user in users:
            try:
                got = self.profiles("GetProfile", profile_pb2.GetProfileRequest(user_id=user))
                profiles[user] = got.SerializeToString(deterministic=True)
            except NotFoundError:
                profiles[user] = None
        config = self.crystals(
            "GetCrystalLibraryConfig", crystal_pb2.GetCrystalLibraryConfigRequest()
        )
        return {
            "listing": self.listing(),
            "queries": queries,
            "stats": (
                stats.total_crystals,
                stats.effective_crystals,
                stats.total_reuses,
                stats.avg_effectiveness,
                stats.max_crystals,
            ),
            "config": config.SerializeToString(deterministic=True),
            "profiles": profiles,
        }


def test_an_empty_daemon_answers_for_the_library_byte_for_byte(
    s3_server: Any, start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    prefix = f"library-sync-{uuid.uuid4().hex[:8]}"
    a = replicated(start_daemon, s3_server, prefix, "sync", node="a", data_dir=tmp_path / "a")
    users = ["ann", "bob", "cy"]
    with Api(a.target) as api:
        ids = [api.crystallize(goal, [f"tool{n}", "shell"]) for n, goal in enumerate(GOALS)]
        for n, outcome in enumerate([True, False, True, True]):
            api.reuse(ids[n % 2], outcome)
        api.crystals("DeleteCrystal", crystal_pb2.DeleteCrystalRequest(crystal_id=ids[5]))
        api.crystals(
            "SetCrystalLibraryConfig",
            crystal_pb2.SetCrystalLibraryConfigRequest(max_crystals=40, min_success_score=0.6),
        )
        api.update_profile(
            "ann", goals=["ship v2"], interests=["jazz"], communication_style="terse"
        )
        api.update_profile("ann", expertise=["go", "sql"])
        api.update_profile("bob", goals=["learn rust"])
        api.update_profile("cy", goals=["gone soon"])
        api.profiles("DeleteProfile", profile_pb2.DeleteProfileRequest(user_id="cy"))
        before = api.answers(users)
    a.kill()  # SIGKILL: every answer above was acknowledged, so it is in the bucket
    shutil.rmtree(tmp_path / "a")

    b = replicated(start_daemon, s3_server, prefix, "sync", node="b", data_dir=tmp_path / "b")
    with Api(b.target) as api:
        after = api.answers(users)
        assert len(after["listing"]) == 5 and after["profiles"]["cy"] is None
        for key in before:
            assert after[key] == before[key], f"{key} differs after hydration"
        reused = api.crystals("GetCrystal", crystal_pb2.GetCrystalRequest(crystal_id=ids[0]))
        assert reused.crystal.reuse_count == 2


def test_two_daemons_writing_one_library_converge_and_count_every_reuse(
    s3_server: Any, start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    prefix = f"library-multi-{uuid.uuid4().hex[:8]}"
    daemons = [
        replicated(
            start_daemon, s3_server, prefix, "sync", node=name, lag=200, data_dir=tmp_path / name
        )
        for name in ("a", "b")
    ]
    with Api(daemons[0].target) as api:
        shared = api.crystallize("index the product catalog for search", ["indexer"])
    reuses, per_writer = 10, 4
    successes: list[int] = []
    last_profiles: list[profile_pb2.UserProfile] = []
    lock = threading.Lock()

    def writer(n: int, target: str) -> None:
        with Api(target) as api:
            wait_for(lambda: _has(api, shared), "the shared crystal reached both daemons")
            won = 0
            for i in range(reuses):
                success = (i + n) % 3 != 0
                api.reuse(shared, success)
                won += success
                if i < per_writer:
                    api.crystallize(f"writer {n} handles request kind {i}", [f"w{n}t{i}"], f"s{n}")
                    api.update_profile(f"user-{n}", goals=[f"goal {i}"])
                last = api.update_profile("shared-user", goals=[f"writer {n} step {i}"])
            with lock:
                successes.append(won)
                last_profiles.append(last)

    threads = [threading.Thread(target=writer, args=(n, d.target)) for n, d in enumerate(daemons)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(successes) == 2, "a writer failed (see the daemon logs)"

    apis = [Api(d.target) for d in daemons]
    try:
        wait_for(lambda: apis[0].listing() == apis[1].listing(), "the two libraries converged")
        wait_for(
            lambda: _profile(apis[0], "shared-user") == _profile(apis[1], "shared-user"),
            "the shared profile converged",
        )
        listing = apis[0].listing()
        assert len(listing) == 1 + 2 * per_writer  # the union
        for api in apis:
            got = api.crystals("GetCrystal", crystal_pb2.GetCrystalRequest(crystal_id=shared))
            merged = got.crystal
            assert merged.reuse_count == 2 * reuses, "a concurrent RecordReuse was lost"
            expected = (0.8 + sum(successes)) / (1 + 2 * reuses)
            assert abs(merged.effectiveness - expected) < 1e-12
            for n in range(2):
                assert list(_profile_pb(api, f"user-{n}").goals) == [
                    f"goal {i}" for i in range(per_writer)
                ]
        # Last writer wins, whole, and the same on both: one writer's final profile.
        shared_profile = _profile(apis[0], "shared-user")
        assert shared_profile in [p.SerializeToString(deterministic=True) for p in last_profiles]
    finally:
        for api in apis:
            api.client.close()


@dataclass(frozen=True)
class Ack:
    writer: int
    crystal_id: str
    at: float


def test_async_mode_loses_only_the_last_shipping_period_of_library_writes(
    s3_server: Any, start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    lag_ms, writers = 500, 4
    prefix = f"library-async-{uuid.uuid4().hex[:8]}"
    a = replicated(start_daemon, s3_server, prefix, "async", node="a", lag=lag_ms,
                   data_dir=tmp_path / "a")  # fmt: skip
    with Api(a.target) as api:  # no eviction: every crystal acknowledged must be served
        request = crystal_pb2.SetCrystalLibraryConfigRequest(max_crystals=1_000_000)
        api.crystals("SetCrystalLibraryConfig", request)
    acks: list[Ack] = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(n: int) -> None:
        with Api(a.target) as api:
            i = 0
            while not stop.is_set():
                try:
                    crystal_id = api.crystallize(
                        f"writer {n} job {i} on host{i}", [f"w{n}-{i}"], f"w{n}"
                    )
                except StratadError:
                    return  # the daemon died under us: not acknowledged
                with lock:
                    acks.append(Ack(n, crystal_id, time.time()))
                i += 1

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)
    a.kill()
    killed_at = time.time()
    stop.set()
    for thread in threads:
        thread.join(30)
    acks = [ack for ack in acks if ack.at <= killed_at]
    shutil.rmtree(tmp_path / "a")

    b = replicated(start_daemon, s3_server, prefix, "async", node="b", data_dir=tmp_path / "b")
    with Api(b.target) as api:
        present = {c.crystal_id for c in _all_crystals(api)}
    lost = [ack for ack in acks if ack.crystal_id not in present]
    last = max(ack.at for ack in acks)
    window = last - min((ack.at for ack in lost), default=last)
    print(
        f"async library replication (lag {lag_ms} ms): {len(acks)} crystals acknowledged, "
        f"{len(acks) - len(lost)} served by the new daemon, {len(lost)} lost; "
        f"loss window {window * 1000:.0f} ms"
    )
    assert len(acks) - len(lost) > 0, "nothing was shipped"
    for n in range(writers):
        mine = [ack.crystal_id for ack in acks if ack.writer == n]
        kept = [crystal_id in present for crystal_id in mine]
        assert kept == sorted(kept, reverse=True), f"writer {n}: a hole, not a lost suffix"
    assert window <= 2 * lag_ms / 1000 + 1.0, f"loss window {window:.2f}s"


def test_structured_state_of_a_session_resumes_on_an_empty_daemon(
    s3_server: Any, start_daemon: Callable[..., Any], tmp_path: Path
) -> None:
    prefix = f"structured-{uuid.uuid4().hex[:8]}"
    a = replicated(start_daemon, s3_server, prefix, "sync", node="a", data_dir=tmp_path / "a")
    with Client(a.target, timeout=30) as client:
        client.create_session("run-1")
        cog = cognitive_pb2_grpc.CognitiveStateServiceStub(client.channel)
        tasks = task_pb2_grpc.TaskServiceStub(client.channel)
        agent = agent_pb2_grpc.AgentStateServiceStub(client.channel)
        s = "run-1"
        writes = [
            (cog.Initialize, cognitive_pb2.InitializeRequest(
                session_id=s, goal="Build a REST API", constraints=["Use PostgreSQL"])),
            (cog.RecordDecision, cognitive_pb2.RecordDecisionRequest(
                session_id=s, step=1, decision="FastAPI", rationale="async")),
            (tasks.UpdateTaskStatus, task_pb2.UpdateTaskStatusRequest(
                session_id=s, task_id="t1", status=task_pb2.TASK_STATUS_COMPLETED)),
            (tasks.StoreTaskResult, task_pb2.StoreTaskResultRequest(
                session_id=s, task_id="t1", result=_value({"rows": 42}))),
            (tasks.UpdateGlobalState, task_pb2.UpdateGlobalStateRequest(
                session_id=s, key="files", value=_value(["a.py"]))),
            (agent.StartAgent, agent_pb2.StartAgentRequest(session_id=s, query="Q3 revenue")),
            (agent.ApplyReasoning, agent_pb2.ApplyReasoningRequest(
                session_id=s, thinking="look it up")),
        ]  # fmt: skip
        for method, request in writes:
            client.call(method, request)
        before = _structured(client, "run-1")
    a.kill()
    shutil.rmtree(tmp_path / "a")

    b = replicated(start_daemon, s3_server, prefix, "sync", node="b", data_dir=tmp_path / "b")
    with Client(b.target, timeout=30) as client:
        assert _structured(client, "run-1") == before


# -- helpers ----------------------------------------------------------------------------------


def wait_for(condition: Callable[[], bool], what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def _has(api: Api, crystal_id: str) -> bool:
    try:
        api.crystals("GetCrystal", crystal_pb2.GetCrystalRequest(crystal_id=crystal_id))
        return True
    except NotFoundError:
        return False


def _profile_pb(api: Api, user: str) -> profile_pb2.UserProfile:
    return api.profiles("GetProfile", profile_pb2.GetProfileRequest(user_id=user)).profile


def _profile(api: Api, user: str) -> bytes:
    return bytes(_profile_pb(api, user).SerializeToString(deterministic=True))


def _all_crystals(api: Api) -> list[crystal_pb2.Crystal]:
    found, token = [], ""
    while True:
        request = crystal_pb2.ListCrystalsRequest(page_size=1000, page_token=token)
        response = api.crystals("ListCrystals", request)
        found.extend(response.crystals)
        token = response.next_page_token
        if not token:
            return found


def _value(v: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    json_format.ParseDict(v, out)
    return out


def _structured(client: Client, session: str) -> list[bytes]:
    """Every read of the session's structured state, serialized."""
    cog = cognitive_pb2_grpc.CognitiveStateServiceStub(client.channel)
    tasks = task_pb2_grpc.TaskServiceStub(client.channel)
    agent = agent_pb2_grpc.AgentStateServiceStub(client.channel)
    reads = [
        (cog.GetCognitiveState, cognitive_pb2.GetCognitiveStateRequest(session_id=session)),
        (tasks.ListTasks, task_pb2.ListTasksRequest(session_id=session)),
        (tasks.GetTaskResult, task_pb2.GetTaskResultRequest(session_id=session, task_id="t1")),
        (tasks.GetGlobalState, task_pb2.GetGlobalStateRequest(session_id=session)),
        (agent.GetAgentState, agent_pb2.GetAgentStateRequest(session_id=session)),
    ]
    return [client.call(m, r).SerializeToString(deterministic=True) for m, r in reads]
