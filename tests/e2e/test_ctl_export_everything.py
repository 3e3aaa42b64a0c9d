"""``ctl export`` / ``import`` carry everything a client can read back: states,
pending writes, the structured state each checkpoint captured, and the
session's cognitive state, tasks, global state and agent state. Compared
over gRPC between the source daemon and a fresh one (two real daemons)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

import stratad
from stratad.api.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    checkpoint_pb2,
    cognitive_pb2,
    cognitive_pb2_grpc,
    session_pb2,
    task_pb2,
    task_pb2_grpc,
)
from stratad.ctl.archive import ArchiveReader

Daemon = Any
StartDaemon = Callable[..., Daemon]
STRATAD = [sys.executable, "-m", "stratad"]


def ctl(env: dict[str, str], address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*STRATAD, "ctl", *args, "--address", address],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Session:
    """Raw stubs over one client: every read the API offers for a session."""

    def __init__(self, client: stratad.Client, session_id: str) -> None:
        self.client = client
        self.id = session_id
        channel = client.channel
        self.cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(channel)
        self.tasks = task_pb2_grpc.TaskServiceStub(channel)
        self.agent = agent_pb2_grpc.AgentStateServiceStub(channel)

    def call(self, method: Any, request: Any) -> Any:
        return self.client.call(method, request)

    def everything(self) -> dict[str, Any]:
        """What a user can read back, minus versions and times stratad assigns anew."""
        info = json_format.MessageToDict(self.client.get_session(self.id))
        for assigned in ("version", "createdAt", "updatedAt"):
            info.pop(assigned, None)
        checkpoints = []
        for cp in self.client.list_checkpoints(self.id):
            loaded = self.call(
                self.client.checkpoints.LoadState,
                checkpoint_pb2.LoadStateRequest(
                    session_id=self.id,
                    checkpoint_id=cp.checkpoint_id,
                    include_writes=True,
                    include_structured=True,
                ),
            )
            meta = json_format.MessageToDict(loaded.checkpoint)
            for assigned in ("version", "createdAt", "storedBytes"):
                meta.pop(assigned, None)
            checkpoints.append(
                {
                    "meta": meta,
                    "data": loaded.data,
                    "structured": json.loads(loaded.structured_json or b"{}"),
                }
            )
        return {
            "session": info,
            "checkpoints": checkpoints,
            "structured": self._structured(),
            **self._facets(),
        }

    def _structured(self) -> Any:
        response = self.call(
            self.client.sessions.GetStructuredState,
            session_pb2.GetStructuredStateRequest(session_id=self.id),
        )
        return json.loads(response.structured_json)

    def _facets(self) -> dict[str, Any]:
        sid = self.id
        state = self.call(
            self.cognitive.GetCognitiveState,
            cognitive_pb2.GetCognitiveStateRequest(session_id=sid),
        ).state
        stats = self.call(
            self.cognitive.GetCognitiveStats, cognitive_pb2.GetCognitiveStatsRequest(session_id=sid)
        )
        context = self.call(
            self.cognitive.BuildContext, cognitive_pb2.BuildContextRequest(session_id=sid)
        ).context
        tasks = self.call(
            self.tasks.ListTasks, task_pb2.ListTasksRequest(session_id=sid, include_results=True)
        ).tasks
        global_state = self.call(
            self.tasks.GetGlobalState, task_pb2.GetGlobalStateRequest(session_id=sid)
        ).value
        agent = self.call(self.agent.GetAgentState, agent_pb2.GetAgentStateRequest(session_id=sid))
        return {
            "cognitive": json_format.MessageToDict(state),
            "cognitive_stats": json_format.MessageToDict(stats),
            "context": context,
            "tasks": [json_format.MessageToDict(t) for t in tasks],
            "global": json_format.MessageToDict(global_state),
            "agent": json_format.MessageToDict(agent.state),
        }


def build_rich_session(s: Session) -> None:
    """States, a namespace, a named checkpoint, pending writes, and every facet,
    changed between saves so that each checkpoint captures a different one."""
    client, sid = s.client, s.id
    client.create_session(sid, labels={"team": "search"}, keep_last=0)
    s.call(
        s.cognitive.Initialize,
        cognitive_pb2.InitializeRequest(
            session_id=sid, goal="find the bug", constraints=["no prod access"]
        ),
    )
    first = client.save_state(sid, b'{"messages": ["hi"]}', metadata={"step": 1})
    client.put_writes(
        sid,
        first.checkpoint_id,
        "task-a",
        [(0, "messages", "json", b'"draft"'), (-1, "__error__", "json", b'"boom"')],
        task_path="~__pregel_pull, node",
    )
    client.put_writes(sid, first.checkpoint_id, "task-b", [(0, "branch:x", "bytes", b"\x00\xff")])
    s.call(
        s.cognitive.RecordDecision,
        cognitive_pb2.RecordDecisionRequest(
            session_id=sid, step=1, decision="read the logs", rationale="cheapest first"
        ),
    )
    s.call(
        s.tasks.UpdateTaskStatus,
        task_pb2.UpdateTaskStatusRequest(
            session_id=sid, task_id="t1", status=task_pb2.TASK_STATUS_COMPLETED
        ),
    )
    s.call(
        s.tasks.StoreTaskResult,
        task_pb2.StoreTaskResultRequest(
            session_id=sid, task_id="t1", result=struct_pb2.Value(string_value="42 lines")
        ),
    )
    second = client.save_state(sid, b'{"messages": ["hi", "there"]}', metadata={"step": 2})
    client.save_state(sid, b"scratch", namespace="scratch")
    client.create_checkpoint(sid, "milestone")
    s.call(
        s.agent.StartAgent,
        agent_pb2.StartAgentRequest(session_id=sid, query="why?", user_id="u1", max_iterations=5),
    )
    s.call(
        s.tasks.UpdateGlobalState,
        task_pb2.UpdateGlobalStateRequest(
            session_id=sid, key="budget", value=struct_pb2.Value(number_value=3)
        ),
    )
    third = client.save_state(sid, b'{"messages": ["hi", "there", "bye"]}')
    client.put_writes(sid, third.checkpoint_id, "task-c", [(0, "messages", "json", b'"late"')])
    # After the last save: only the session's current structured state has it.
    s.call(
        s.cognitive.RecordError,
        cognitive_pb2.RecordErrorRequest(session_id=sid, step=3, error="timeout", pattern="net"),
    )
    client.restore_checkpoint(second.checkpoint_id, make_current=False)


def test_export_import_round_trips_everything_readable(
    start_daemon: StartDaemon, stratad_env: dict[str, str], tmp_path: Path
) -> None:
    source, target = start_daemon(), start_daemon()
    archive = tmp_path / "rich.stratad.tar"
    with stratad.Client(source.target) as client:
        original = Session(client, "rich")
        build_rich_session(original)
        before = original.everything()
    # The captures differ from checkpoint to checkpoint, and writes are there.
    assert len({json.dumps(c["structured"], sort_keys=True) for c in before["checkpoints"]}) >= 3
    assert sum(len(c["meta"].get("pendingWrites", [])) for c in before["checkpoints"]) == 4
    assert before["cognitive"]["insights"]["errorJournal"]  # recorded after the last save

    exported = ctl(stratad_env, source.target, "export", "rich", "-o", str(archive))
    assert exported.returncode == 0, exported.stderr
    with ArchiveReader(archive) as reader:
        assert reader.manifest.session.structured is not None
    imported = ctl(stratad_env, target.target, "import", str(archive))
    assert imported.returncode == 0, imported.stderr

    with stratad.Client(target.target) as client:
        after = Session(client, "rich").everything()
    assert after["checkpoints"] == before["checkpoints"]
    assert after["structured"] == before["structured"]
    assert after == before


def test_a_version_1_archive_still_imports(
    start_daemon: StartDaemon, stratad_env: dict[str, str], tmp_path: Path
) -> None:
    """Format 1 (states only): rewrite a plain session's archive as version 1."""
    import io
    import tarfile

    from stratad import native
    from stratad.ctl.archive import MANIFEST, MANIFEST_DIGEST

    source, target = start_daemon(), start_daemon()
    with stratad.Client(source.target) as client:
        client.create_session("old")
        client.save_state("old", b"one")
        client.save_state("old", b"two")
    archive = tmp_path / "old.tar"
    assert ctl(stratad_env, source.target, "export", "old", "-o", str(archive)).returncode == 0
    v1 = tmp_path / "v1.tar"
    with tarfile.open(archive) as src, tarfile.open(v1, "w", format=tarfile.PAX_FORMAT) as dst:
        manifest = json.loads(src.extractfile(MANIFEST).read())  # type: ignore[union-attr]
        manifest["format_version"] = 1
        for cp in manifest["checkpoints"]:
            del cp["pending_writes"]
        document = json.dumps(manifest).encode()
        for member in src.getmembers():
            if member.name == MANIFEST_DIGEST:
                payload = (native.digest_hex(document) + "\n").encode()
            elif member.name == MANIFEST:
                payload = document
            else:
                payload = src.extractfile(member).read()  # type: ignore[union-attr]
            member.size = len(payload)
            dst.addfile(member, io.BytesIO(payload))
    result = ctl(stratad_env, target.target, "import", str(v1))
    assert result.returncode == 0, result.stderr
    with stratad.Client(target.target) as client:
        assert client.load_state("old").data == b"two"


def test_replace_structured_state_refuses_what_it_cannot_serve(daemon: Daemon) -> None:
    with stratad.Client(daemon.target) as client:
        client.create_session("s")
        version = client.get_session("s").version
        for bad, words in [
            (b"[1]", "JSON object"),
            (b"{not json", "not JSON"),
            (b'{"crystals": {}}', "unknown facet"),
            (b'{"cognitive": []}', "must be an object"),
            (b'{"cognitive": {"fluid": 1}}', "'cognitive' facet is not one stratad can serve"),
            (b'{"agent": {"query": "x"}}', "'agent' facet"),
            (b'{"tasks": {"tasks": {"t": {"status": 7}}}}', "'tasks' facet"),
            (b'{"cognitive": {"x": NaN}}', "JSON"),
            # The facet's parse names the field (the facet's JSON path).
            (b'{"tasks": {"tasks": {}, "global_state": {}, "x": 1}}', "tasks: unknown key 'x'"),
            (
                b'{"agent": {"execution": {}, "reasoning": {}}}',
                "'agent' facet is not one stratad can serve: agent.execution.query: required",
            ),
        ]:
            with pytest.raises(grpc.RpcError) as excinfo:
                client.sessions.ReplaceStructuredState(
                    session_pb2.ReplaceStructuredStateRequest(session_id="s", structured_json=bad),
                    metadata=client.metadata,
                )
            assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
            assert words in (excinfo.value.details() or ""), (bad, excinfo.value.details())
        # Nothing was journaled, and the session still serves.
        assert client.get_session("s").version == version
        assert client.save_state("s", b"fine").version == version + 1

        # A facet the daemon wrote, with one field wrong: refused naming the field.
        cognitive = cognitive_pb2_grpc.CognitiveStateServiceStub(client.channel)
        client.call(cognitive.Initialize, cognitive_pb2.InitializeRequest(session_id="s", goal="g"))
        got = client.sessions.GetStructuredState(
            session_pb2.GetStructuredStateRequest(session_id="s"), metadata=client.metadata
        )
        structured = json.loads(got.structured_json)
        structured["cognitive"]["fluid"]["progress"] = "x"
        request = session_pb2.ReplaceStructuredStateRequest(
            session_id="s", structured_json=json.dumps(structured).encode()
        )
        with pytest.raises(grpc.RpcError) as excinfo:
            client.sessions.ReplaceStructuredState(request, metadata=client.metadata)
        assert excinfo.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cognitive.fluid.progress: expected a number between 0 and 1, got 'x'" in (
            excinfo.value.details() or ""
        )
        assert client.get_session("s").version == got.version
