"""PutWrites, CopySession, PruneCheckpoints, DeleteCheckpoints and SaveState's no_parent.

Good and bad input for each RPC, tenancy, and that every change survives a
restart (the records replay) and a journal compaction (the snapshot keeps it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import struct_pb2

from stratad.api.v1 import checkpoint_pb2, session_pb2
from stratad.domain.writes import MAX_WRITE_VALUE_BYTES

if TYPE_CHECKING:
    from conftest import Api

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
EXISTS = grpc.StatusCode.ALREADY_EXISTS
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
ABORTED = grpc.StatusCode.ABORTED

KEEP = checkpoint_pb2.PRUNE_STRATEGY_KEEP_LATEST
DELETE = checkpoint_pb2.PRUNE_STRATEGY_DELETE


def struct(value: dict[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def wv(idx: int, channel: str, value: bytes, type_: str = "bytes") -> checkpoint_pb2.WriteValue:
    return checkpoint_pb2.WriteValue(idx=idx, channel=channel, type=type_, value=value)


def put_writes(
    session_id: str = "s", checkpoint_id: str = "c2", task_id: str = "t1", **fields: Any
) -> checkpoint_pb2.PutWritesRequest:
    fields.setdefault("writes", [wv(0, "ch", b"v0")])
    return checkpoint_pb2.PutWritesRequest(
        session_id=session_id, checkpoint_id=checkpoint_id, task_id=task_id, **fields
    )


def writes_of(api: Api, session_id: str = "s", checkpoint_id: str = "c2") -> list[tuple[Any, ...]]:
    loaded = api.load(session_id, checkpoint_id=checkpoint_id, include_writes=True)
    assert loaded.checkpoint.pending_write_count == len(loaded.checkpoint.pending_writes)
    return [
        (w.task_path, w.task_id, w.idx, w.channel, w.type, w.value)
        for w in loaded.checkpoint.pending_writes
    ]


def listed(api: Api, session_id: str, **fields: Any) -> list[checkpoint_pb2.Checkpoint]:
    request = checkpoint_pb2.ListCheckpointsRequest(session_id=session_id, **fields)
    return list(api.call(api.checkpoints.ListCheckpoints, request).checkpoints)


@pytest.fixture
def s(api: Api) -> str:
    """Session s: c1 then c2 (head)."""
    api.create("s")
    api.save("s", b"first", checkpoint_id="c1", metadata=struct({"run_id": "r1", "step": 1}))
    api.save("s", b"second", checkpoint_id="c2", metadata=struct({"run_id": "r2", "step": 2}))
    return "s"


# -- PutWrites --------------------------------------------------------------------


def test_put_writes_are_returned_in_task_path_task_id_idx_order(api: Api, s: str) -> None:
    two = put_writes(task_id="t2", task_path="b", writes=[wv(1, "y", b"2"), wv(0, "x", b"1")])
    api.call(api.checkpoints.PutWrites, two)
    response = api.call(api.checkpoints.PutWrites, put_writes(task_id="t1", task_path="a"))
    assert response.stored == 1
    assert writes_of(api) == [
        ("a", "t1", 0, "ch", "bytes", b"v0"),
        ("b", "t2", 0, "x", "bytes", b"1"),
        ("b", "t2", 1, "y", "bytes", b"2"),
    ]
    # Without include_writes only the count comes back.
    plain = api.load("s", checkpoint_id="c2")
    assert plain.checkpoint.pending_write_count == 3
    assert not plain.checkpoint.pending_writes
    assert writes_of(api, checkpoint_id="c1") == []


def test_put_writes_regular_writes_are_kept_special_ones_replaced(api: Api, s: str) -> None:
    api.call(api.checkpoints.PutWrites, put_writes(writes=[wv(0, "ch", b"a"), wv(-1, "err", b"x")]))
    version = api.get("s").version
    again = api.call(api.checkpoints.PutWrites, put_writes(writes=[wv(0, "ch", b"a")]))
    assert (again.stored, again.version) == (0, version)  # a retried call is no mutation
    assert api.get("s").version == version
    changed = api.call(
        api.checkpoints.PutWrites, put_writes(writes=[wv(0, "ch", b"b"), wv(-1, "err", b"y")])
    )
    assert changed.stored == 1
    assert writes_of(api) == [
        ("", "t1", -1, "err", "bytes", b"y"),
        ("", "t1", 0, "ch", "bytes", b"a"),
    ]


def test_put_writes_attach_to_the_checkpoint_not_the_session(api: Api, s: str) -> None:
    api.call(api.checkpoints.PutWrites, put_writes(checkpoint_id="c2"))
    api.save("s", b"third", checkpoint_id="c3")
    assert writes_of(api, checkpoint_id="c3") == []
    assert len(writes_of(api, checkpoint_id="c2")) == 1
    page = listed(api, "s", include_writes=True)
    assert [(c.checkpoint_id, len(c.pending_writes)) for c in page] == [
        ("c3", 0), ("c2", 1), ("c1", 0)
    ]  # fmt: skip
    assert [c.pending_write_count for c in listed(api, "s")] == [0, 1, 0]


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"checkpoint_id": "nope"}, NOT_FOUND, "nope"),
        ({"checkpoint_id": "../x"}, INVALID, "checkpoint_id"),
        ({"session_id": "other"}, NOT_FOUND, "other"),
        ({"task_id": ""}, INVALID, "task_id"),
        ({"task_id": "x\n"}, INVALID, "task_id"),
        ({"writes": []}, INVALID, "writes"),
        ({"writes": [wv(0, "", b"")]}, INVALID, "channel"),
        ({"writes": [wv(0, "a", b""), wv(0, "b", b"")]}, INVALID, "idx"),
        ({"task_path": "p" * 2000}, INVALID, "task_path"),
        ({"writes": [wv(0, "a", b"x" * (MAX_WRITE_VALUE_BYTES + 1))]}, EXHAUSTED, "limit"),
        ({"expected_version": 99}, ABORTED, "version"),
    ],
)
def test_put_writes_refuses_bad_input(
    api: Api, s: str, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    api.fails(api.checkpoints.PutWrites, put_writes(**fields), code, word, keeps="s")
    assert writes_of(api) == []


def test_put_writes_is_tenant_scoped(api: Api, s: str) -> None:
    other = api.as_tenant("t2")
    other.fails(other.checkpoints.PutWrites, put_writes(), NOT_FOUND, "s")


# -- SaveState no_parent ------------------------------------------------------------


def test_no_parent_starts_a_new_line(api: Api, s: str) -> None:
    api.save("s", b"third", checkpoint_id="c3", no_parent=True)
    assert api.load("s").checkpoint.parent_checkpoint_id == ""
    api.save("s", b"fourth", checkpoint_id="c4")
    assert api.load("s").checkpoint.parent_checkpoint_id == "c3"
    request = checkpoint_pb2.SaveStateRequest(
        session_id="s", data=b"x", parent_checkpoint_id="c1", no_parent=True
    )
    api.fails(api.checkpoints.SaveState, request, INVALID, "no_parent", keeps="s")


# -- CopySession --------------------------------------------------------------------


def test_copy_session_copies_every_checkpoint_in_order(api: Api, s: str) -> None:
    api.save("s", b"child", checkpoint_id="k1", namespace="child:1")
    api.call(api.checkpoints.PutWrites, put_writes(checkpoint_id="c2"))
    request = checkpoint_pb2.CopySessionRequest(
        source_session_id="s", target_session_id="copy", checkpoint_ids={"c2": "c2-copy"}
    )
    response = api.call(api.checkpoints.CopySession, request)
    mapping = dict(response.checkpoint_ids)
    assert set(mapping) == {"c1", "c2", "k1"} and mapping["c2"] == "c2-copy"
    assert response.session.checkpoint_count == 3
    assert response.session.head_checkpoint_id == mapping["k1"]
    src, dst = listed(api, "s"), listed(api, "copy", include_writes=True)
    assert [mapping[c.checkpoint_id] for c in src] == [c.checkpoint_id for c in dst]
    for a, b in zip(src, dst, strict=True):
        assert (a.namespace, a.digest, a.metadata, a.size) == (
            b.namespace,
            b.digest,
            b.metadata,
            b.size,
        )
        assert b.parent_checkpoint_id == mapping.get(a.parent_checkpoint_id, "")
        assert b.stored_bytes == 0  # objects are shared
    assert [len(c.pending_writes) for c in dst] == [0, 1, 0]
    assert api.load("copy", checkpoint_id="c2-copy").data == b"second"
    assert api.load("copy", namespace="child:1").data == b"child"
    # Paging works on the copy (each copy has its own version).
    first = listed(api, "copy", page_size=2)
    assert len(first) == 2
    # The source is untouched and the copies are independent.
    api.call(
        api.checkpoints.DeleteCheckpoint,
        checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id="c2-copy"),
    )
    assert api.load("s", checkpoint_id="c2").data == b"second"


def test_copy_session_generates_ids_and_keeps_labels(api: Api) -> None:
    api.create("src", labels={"team": "a"})
    api.save("src", b"x", checkpoint_id="x1")
    response = api.call(
        api.checkpoints.CopySession, checkpoint_pb2.CopySessionRequest(source_session_id="src")
    )
    assert response.session.session_id.startswith("sess-")
    assert dict(response.session.labels) == {"team": "a"}
    assert response.checkpoint_ids["x1"].startswith("ckpt-")
    empty = api.create("empty")
    copied = api.call(
        api.checkpoints.CopySession,
        checkpoint_pb2.CopySessionRequest(source_session_id=empty.session_id,
                                          target_session_id="empty2", labels={"k": "v"}),
    )  # fmt: skip
    assert copied.session.checkpoint_count == 0 and dict(copied.session.labels) == {"k": "v"}


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({"source_session_id": "nope"}, NOT_FOUND, "nope"),
        ({"target_session_id": "s"}, EXISTS, "s"),
        ({"target_session_id": "a/b"}, INVALID, "target_session_id"),
        ({"checkpoint_ids": {"zz": "new"}}, NOT_FOUND, "zz"),
        ({"checkpoint_ids": {"c1": "c2"}}, EXISTS, "c2"),
        ({"checkpoint_ids": {"c1": "../x"}}, INVALID, "checkpoint_ids"),
        ({"checkpoint_ids": {"c1": "n", "c2": "n"}}, INVALID, "twice"),
    ],
)
def test_copy_session_refuses_bad_input(
    api: Api, s: str, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    fields.setdefault("source_session_id", "s")
    fields.setdefault("target_session_id", "t")
    request = checkpoint_pb2.CopySessionRequest(**fields)
    api.fails(api.checkpoints.CopySession, request, code, word, keeps="s")
    if fields["target_session_id"] == "t":
        get = session_pb2.GetSessionRequest(session_id="t")
        api.fails(api.sessions.GetSession, get, NOT_FOUND)  # no half-made copy is left


def test_copy_session_is_tenant_scoped(api: Api, s: str) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.CopySessionRequest(source_session_id="s", target_session_id="t")
    other.fails(other.checkpoints.CopySession, request, NOT_FOUND, "s")


# -- PruneCheckpoints ---------------------------------------------------------------


def test_prune_keep_latest_keeps_the_latest_of_each_namespace(api: Api, s: str) -> None:
    api.save("s", b"k1", checkpoint_id="k1", namespace="child")
    api.save("s", b"k2", checkpoint_id="k2", namespace="child")
    api.call(api.checkpoints.PutWrites, put_writes(checkpoint_id="c2"))
    api.call(
        api.checkpoints.CreateCheckpoint,
        checkpoint_pb2.CreateCheckpointRequest(session_id="s", name="pin", checkpoint_id="pin"),
    )
    api.create("other")
    api.save("other", b"o", checkpoint_id="o1")
    api.save("other", b"o2", checkpoint_id="o2")
    request = checkpoint_pb2.PruneCheckpointsRequest(session_ids=["s", "ghost"], strategy=KEEP)
    response = api.call(api.checkpoints.PruneCheckpoints, request)
    # "pin" pins the head k2 (namespace child) and is now the latest there.
    assert response.checkpoints_deleted == 3  # c1, k1, k2
    assert list(response.missing_session_ids) == ["ghost"]
    assert [c.checkpoint_id for c in listed(api, "s")] == ["pin", "c2"]
    assert len(writes_of(api, checkpoint_id="c2")) == 1
    assert [c.checkpoint_id for c in listed(api, "other")] == ["o2", "o1"]


def test_prune_delete_removes_every_checkpoint(api: Api, s: str) -> None:
    request = checkpoint_pb2.PruneCheckpointsRequest(session_ids=["s"], strategy=DELETE)
    assert api.call(api.checkpoints.PruneCheckpoints, request).checkpoints_deleted == 2
    session = api.get("s")
    assert (session.checkpoint_count, session.head_checkpoint_id) == (0, "")
    api.fails(api.checkpoints.RestoreCheckpoint,
              checkpoint_pb2.RestoreCheckpointRequest(checkpoint_id="c1"), NOT_FOUND)  # fmt: skip
    # The IDs are free again.
    api.save("s", b"again", checkpoint_id="c1")


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        ({"session_ids": ["s"]}, "strategy"),
        ({"session_ids": ["a/b"], "strategy": KEEP}, "session_id"),
        ({"session_ids": ["s"] * 1001, "strategy": KEEP}, "1000"),
    ],
)
def test_prune_refuses_bad_input(api: Api, s: str, fields: dict[str, Any], word: str) -> None:
    request = checkpoint_pb2.PruneCheckpointsRequest(**fields)
    api.fails(api.checkpoints.PruneCheckpoints, request, INVALID, word, keeps="s")


def test_prune_is_tenant_scoped(api: Api, s: str) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.PruneCheckpointsRequest(session_ids=["s"], strategy=DELETE)
    assert list(other.call(other.checkpoints.PruneCheckpoints, request).missing_session_ids) == [
        "s"
    ]
    assert api.get("s").checkpoint_count == 2


# -- DeleteCheckpoints --------------------------------------------------------------


def test_delete_checkpoints_by_metadata_across_sessions(api: Api, s: str) -> None:
    api.create("s2")
    api.save("s2", b"x", checkpoint_id="x1", metadata=struct({"run_id": "r1"}))
    api.save("s2", b"y", checkpoint_id="x2", metadata=struct({"run_id": "r3"}))
    request = checkpoint_pb2.DeleteCheckpointsRequest(
        metadata_filters=[struct({"run_id": "r1"}), struct({"run_id": "r9"})]
    )
    response = api.call(api.checkpoints.DeleteCheckpoints, request)
    assert response.checkpoints_deleted == 2
    assert list(response.session_ids) == ["s", "s2"]
    assert [c.checkpoint_id for c in listed(api, "s")] == ["c2"]
    assert [c.checkpoint_id for c in listed(api, "s2")] == ["x2"]
    # Deleting the head moves it to the newest remaining checkpoint.
    request = checkpoint_pb2.DeleteCheckpointsRequest(
        session_id="s2", metadata_filters=[struct({"run_id": "r3"})]
    )
    assert api.call(api.checkpoints.DeleteCheckpoints, request).checkpoints_deleted == 1
    assert api.get("s2").head_checkpoint_id == ""


def test_delete_checkpoints_filter_needs_every_field(api: Api, s: str) -> None:
    request = checkpoint_pb2.DeleteCheckpointsRequest(
        session_id="s", metadata_filters=[struct({"run_id": "r2", "step": 1})]
    )
    assert api.call(api.checkpoints.DeleteCheckpoints, request).checkpoints_deleted == 0
    request = checkpoint_pb2.DeleteCheckpointsRequest(
        session_id="s", metadata_filters=[struct({"run_id": "r2", "step": 2})], namespace="other"
    )
    assert api.call(api.checkpoints.DeleteCheckpoints, request).checkpoints_deleted == 0
    request.ClearField("namespace")
    assert api.call(api.checkpoints.DeleteCheckpoints, request).checkpoints_deleted == 1
    assert api.get("s").head_checkpoint_id == "c1"


@pytest.mark.parametrize(
    ("fields", "code", "word"),
    [
        ({}, INVALID, "filter"),
        ({"metadata_filters": [struct({})]}, INVALID, "filter"),
        ({"session_id": "ghost", "metadata_filters": [struct({"a": 1})]}, NOT_FOUND, "ghost"),
        ({"session_id": "a/b", "metadata_filters": [struct({"a": 1})]}, INVALID, "session_id"),
    ],
)
def test_delete_checkpoints_refuses_bad_input(
    api: Api, s: str, fields: dict[str, Any], code: grpc.StatusCode, word: str
) -> None:
    request = checkpoint_pb2.DeleteCheckpointsRequest(**fields)
    api.fails(api.checkpoints.DeleteCheckpoints, request, code, word, keeps="s")


def test_delete_checkpoints_is_tenant_scoped(api: Api, s: str) -> None:
    other = api.as_tenant("t2")
    request = checkpoint_pb2.DeleteCheckpointsRequest(metadata_filters=[struct({"run_id": "r1"})])
    assert other.call(other.checkpoints.DeleteCheckpoints, request).checkpoints_deleted == 0
    assert api.get("s").checkpoint_count == 2


# -- durability -----------------------------------------------------------------------


@pytest.mark.parametrize("compact", [False, True])
def test_everything_replays_after_a_restart(start_api: Any, tmp_path: Any, compact: bool) -> None:
    data_dir = tmp_path / "replay"
    api = start_api(data_dir=data_dir)
    api.create("s")
    api.save("s", b"one", checkpoint_id="c1", metadata=struct({"run_id": "a"}))
    api.save("s", b"two", checkpoint_id="c2", metadata=struct({"run_id": "b"}))
    api.save("s", b"three", checkpoint_id="c3", metadata=struct({"run_id": "c"}))
    api.call(api.checkpoints.PutWrites, put_writes(checkpoint_id="c3", writes=[wv(-3, "i", b"!")]))
    copy = checkpoint_pb2.CopySessionRequest(source_session_id="s", target_session_id="t",
                                             checkpoint_ids={"c3": "t3"})  # fmt: skip
    api.call(api.checkpoints.CopySession, copy)
    delete = checkpoint_pb2.DeleteCheckpointsRequest(
        session_id="s", metadata_filters=[struct({"run_id": "a"})]
    )
    api.call(api.checkpoints.DeleteCheckpoints, delete)
    prune = checkpoint_pb2.PruneCheckpointsRequest(session_ids=["t"], strategy=KEEP)
    api.call(api.checkpoints.PruneCheckpoints, prune)
    if compact:
        for session_id in ("s", "t"):
            api.server.resources.engine.sessions.compact("default", session_id)
    before = {sid: [(c.checkpoint_id, c.version, c.pending_write_count) for c in listed(api, sid)]
              for sid in ("s", "t")}  # fmt: skip
    versions = {sid: api.get(sid).version for sid in ("s", "t")}
    api.server.stop()
    again = start_api(data_dir=data_dir)
    after = {sid: [(c.checkpoint_id, c.version, c.pending_write_count) for c in listed(again, sid)]
             for sid in ("s", "t")}  # fmt: skip
    assert after == before
    assert before["t"] == [("t3", before["t"][0][1], 1)]
    assert {sid: again.get(sid).version for sid in ("s", "t")} == versions
    assert writes_of(again, "t", "t3") == [("", "t1", -3, "i", "bytes", b"!")]
    # The index knows the copies and forgot the deleted: IDs stay unique.
    again.fails(again.checkpoints.SaveState, checkpoint_pb2.SaveStateRequest(
        session_id="s", data=b"x", checkpoint_id="t3"), EXISTS)  # fmt: skip
    again.save("s", b"x", checkpoint_id="c1")


# -- ListCheckpoints metadata filter (LangGraph's `list(filter=...)`) -------------------


def test_list_metadata_filter_needs_the_field_and_keeps_bools_apart(api: Api) -> None:
    api.create("m")
    api.save("m", b"a", checkpoint_id="a", metadata=struct({"step": 1, "flag": None}))
    api.save("m", b"b", checkpoint_id="b", metadata=struct({"step": True, "src": "loop"}))
    api.save("m", b"c", checkpoint_id="c", metadata=struct({"step": 1.0, "src": "loop"}))

    def ids(flt: dict[str, Any]) -> list[str]:
        return [c.checkpoint_id for c in listed(api, "m", metadata_filter=struct(flt))]

    assert ids({"step": 1}) == ["c", "a"]  # Struct numbers are doubles: 1 == 1.0
    assert ids({"step": True}) == ["b"]
    assert ids({"flag": None}) == ["a"]  # null matches null, not a missing field
    assert ids({"src": "loop", "step": 1}) == ["c"]
    assert ids({"src": "input"}) == []


# -- the SDK ---------------------------------------------------------------------------


def test_sdk_methods_sync_and_async(api: Api, s: str) -> None:
    import asyncio

    import stratad

    with stratad.Client(api.target) as client:
        assert client.put_writes("s", "c2", "t", [(0, "ch", "bytes", b"v")]).stored == 1
        loaded = client.load_state_with_writes("s", "c2")
        assert [w.value for w in loaded.checkpoint.pending_writes] == [b"v"]
        copied = client.copy_session("s", "s-copy", checkpoint_ids={"c2": "c2c"})
        assert copied.checkpoint_ids["c2"] == "c2c"
        assert client.prune_checkpoints(["s-copy"]).checkpoints_deleted == 1
        assert (
            client.delete_checkpoints([{"run_id": "r1"}], session_id="s").checkpoints_deleted == 1
        )
        with pytest.raises(ValueError, match="strategy"):
            client.prune_checkpoints(["s"], "newest")

    async def run() -> None:
        async with stratad.AsyncClient(api.target) as client:
            response = await client.put_writes("s", "c2", "t2", [(-1, "err", "str", b"x")])
            assert response.stored == 1
            loaded = await client.load_state_with_writes("s")
            assert len(loaded.checkpoint.pending_writes) == 2
            await client.copy_session("s", "s-async")
            deleted = await client.prune_checkpoints(["s-async"], "delete")
            assert deleted.checkpoints_deleted == 1
            gone = await client.delete_checkpoints([{"run_id": "r2"}])
            assert list(gone.session_ids) == ["s", "s-copy"]  # c2 and its copy

    asyncio.run(run())
