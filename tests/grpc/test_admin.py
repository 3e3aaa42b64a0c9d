"""AdminService over gRPC: Verify, CollectGarbage and GetStoreStats, per tenant."""

from __future__ import annotations

import json
import os
import random
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from stratad.api.v1 import admin_pb2, checkpoint_pb2, session_pb2
from stratad.store.objects import find_on_disk

if TYPE_CHECKING:
    from conftest import Api


def verify(api: Api) -> Any:
    return api.call(api.admin.Verify, admin_pb2.VerifyRequest())


def collect(api: Api) -> Any:
    return api.call(api.admin.CollectGarbage, admin_pb2.CollectGarbageRequest())


def stats(api: Api) -> Any:
    return api.call(api.admin.GetStoreStats, admin_pb2.GetStoreStatsRequest())


def delete_session(api: Api, session_id: str) -> None:
    api.call(api.sessions.DeleteSession, session_pb2.DeleteSessionRequest(session_id=session_id))


def object_on_disk(api: Api, digest: str, tenant: str = "default") -> tuple[Path, int, int]:
    """(pack file, offset, length) of an object, once the daemon wrote it out (done here)."""
    api.server.resources.engine.store.sync_objects()
    found = find_on_disk(api.server.config.data_dir / "tenants" / tenant / "objects", digest)
    assert found is not None, f"object {digest} is not on disk"
    return found


#: The vocabulary of the reference workload (docs/design.md).
WORDS = [
    *["the", "agent", "decided", "to", "call", "search", "tool", "because", "user", "asked"],
    *["about", "quarterly", "revenue", "figures", "and", "then", "it", "summarized", "results"],
    *["into", "a", "table", "with", "notes", "errors", "retries", "timeouts"],
]


def conversation(steps: int) -> list[bytes]:
    """The growing conversation of docs/design.md: each state repeats the whole history."""
    rng = random.Random(7)
    messages: list[dict[str, str]] = []
    states = []
    for i in range(steps):
        content = " ".join(rng.choice(WORDS) for _ in range(300))
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": content})
        state = {"messages": messages, "step": i, "scratch": {"tool": "search", "n": i}}
        states.append(json.dumps(state, separators=(",", ":")).encode())
    return states


def corrupt(where: tuple[Path, int, int]) -> None:
    """Flip a bit near the end of an object's frame."""
    path, offset, length = where
    with open(path, "r+b") as f:
        f.seek(offset + length - 10)
        byte = f.read(1)[0]
        f.seek(offset + length - 10)
        f.write(bytes([byte ^ 0x01]))


# -- Verify -------------------------------------------------------------------------------


def test_verify_is_ok_on_a_clean_store(api: Api) -> None:
    api.create("s")
    for state in conversation(5):
        api.save("s", state)
    report = verify(api)
    assert report.ok
    assert report.objects_checked > 0
    assert list(report.corrupt_objects) == []
    assert list(report.damaged_sessions) == []


def test_verify_of_an_empty_store_is_ok(api: Api) -> None:
    report = verify(api)
    assert (report.ok, report.objects_checked) == (True, 0)


def test_verify_names_a_corrupt_object_and_every_session_using_it(api: Api) -> None:
    api.create("s")
    saved = api.save("s", os.urandom(1500))  # one raw chunk: the root is the chunk
    fork = checkpoint_pb2.ForkSessionRequest(checkpoint_id=saved.checkpoint_id, new_session_id="f")
    api.call(api.checkpoints.ForkSession, fork)
    corrupt(object_on_disk(api, saved.digest))
    report = verify(api)
    assert not report.ok
    (bad,) = report.corrupt_objects
    assert bad.digest == saved.digest
    assert bad.problem
    assert sorted(bad.session_ids) == ["f", "s"]


def test_verify_reports_a_missing_object(api: Api) -> None:
    api.create("s")
    saved = api.save("s", os.urandom(1500))
    path, offset, _ = object_on_disk(api, saved.digest)
    os.truncate(path, offset)  # its bytes are gone
    report = verify(api)
    assert not report.ok
    assert [(c.digest, list(c.session_ids)) for c in report.corrupt_objects] == [
        (saved.digest, ["s"])
    ]


def test_verify_checks_only_the_callers_tenant(api: Api) -> None:
    damaged, clean = api.as_tenant("damaged"), api.as_tenant("clean")
    damaged.create("s")
    corrupt(object_on_disk(api, damaged.save("s", os.urandom(1500)).digest, "damaged"))
    clean.create("s")
    clean.save("s", os.urandom(1500))
    assert verify(clean).ok
    assert verify(clean).objects_checked == 1
    assert not verify(damaged).ok


# -- CollectGarbage -------------------------------------------------------------------------


def test_gc_of_a_store_without_garbage_removes_nothing(api: Api) -> None:
    api.create("s")
    states = conversation(5)
    for state in states:
        api.save("s", state)
    before = stats(api)
    report = collect(api)
    assert (report.objects_removed, report.bytes_freed) == (0, 0)
    assert report.objects_kept == before.objects
    assert api.load("s").data == states[-1]


def test_gc_after_delete_session_frees_its_bytes(api: Api) -> None:
    api.create("kept")
    api.save("kept", b"kept state " * 100)
    api.create("gone")
    api.save("gone", os.urandom(100_000))
    objects_before = stats(api).objects
    delete_session(api, "gone")
    report = collect(api)
    assert report.bytes_freed > 100_000  # random bytes do not compress
    assert report.objects_removed > 0
    assert stats(api).objects == objects_before - report.objects_removed
    assert api.load("kept").data == b"kept state " * 100
    assert verify(api).ok
    again = collect(api)
    assert (again.objects_removed, again.bytes_freed) == (0, 0)


def test_gc_keeps_the_objects_a_fork_shares_with_a_deleted_session(api: Api) -> None:
    api.create("source")
    shared = os.urandom(100_000)
    saved = api.save("source", shared)
    api.save("source", os.urandom(50_000))  # garbage once the source is gone
    fork = checkpoint_pb2.ForkSessionRequest(checkpoint_id=saved.checkpoint_id, new_session_id="f")
    api.call(api.checkpoints.ForkSession, fork)
    delete_session(api, "source")
    report = collect(api)
    assert 50_000 < report.bytes_freed < 100_000
    assert api.load("f").data == shared
    assert verify(api).ok


def test_gc_frees_what_a_deleted_checkpoint_alone_used(api: Api) -> None:
    api.create("s")
    api.save("s", b"small")
    big = api.save("s", os.urandom(60_000))
    api.save("s", b"latest")
    delete = checkpoint_pb2.DeleteCheckpointRequest(checkpoint_id=big.checkpoint_id)
    api.call(api.checkpoints.DeleteCheckpoint, delete)
    assert collect(api).bytes_freed > 60_000
    assert api.load("s").data == b"latest"


def test_gc_frees_checkpoints_dropped_by_retention(api: Api) -> None:
    api.create("s", retention=session_pb2.RetentionPolicy(keep_last=1))
    for _ in range(3):
        api.save("s", os.urandom(20_000))
    assert collect(api).bytes_freed > 40_000
    assert verify(api).ok


def test_gc_after_retention_keeps_what_the_remaining_deltas_need(api: Api) -> None:
    api.create("s", retention=session_pb2.RetentionPolicy(keep_last=2))
    states = conversation(25)  # manifests are deltas on the previous, now dropped, ones
    for state in states:
        api.save("s", state)
        collect(api)
    for checkpoint_id, state in zip(api.checkpoint_ids("s"), states[::-1], strict=False):
        assert api.load("s", checkpoint_id=checkpoint_id).data == state
    assert verify(api).ok


def test_gc_collects_only_the_callers_tenant(api: Api) -> None:
    mine, theirs = api.as_tenant("mine"), api.as_tenant("theirs")
    mine.create("s")
    mine.save("s", os.urandom(30_000))
    delete_session(mine, "s")
    assert collect(theirs).bytes_freed == 0
    assert collect(mine).bytes_freed > 30_000


def test_gc_running_alongside_saves_never_loses_a_saved_state(api: Api) -> None:
    """Objects written (or newly shared) after a collection started are never swept."""
    api.create("writer")
    states = conversation(30)
    saved: list[tuple[str, bytes]] = []
    stop = threading.Event()

    def churn() -> None:  # make garbage and collect it, over and over
        n = 0
        while not stop.is_set():
            api.create(f"tmp{n}")
            api.save(f"tmp{n}", states[n % len(states)])
            delete_session(api, f"tmp{n}")
            collect(api)
            n += 1

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for state in states:
            saved.append((api.save("writer", state).checkpoint_id, state))
    finally:
        stop.set()
        thread.join()
    for checkpoint_id, state in saved:
        assert api.load("writer", checkpoint_id=checkpoint_id).data == state
    assert verify(api).ok


# -- GetStoreStats ------------------------------------------------------------------------


def test_stats_of_an_empty_tenant(api: Api) -> None:
    empty = stats(api.as_tenant("nobody"))
    assert (empty.sessions, empty.checkpoints, empty.objects, empty.logical_bytes) == (0, 0, 0, 0)
    assert empty.dedup_ratio == 1.0


def test_stats_count_sessions_checkpoints_and_logical_bytes(api: Api) -> None:
    api.create("a")
    api.create("b")
    api.save("a", b"x" * 1000)
    api.save("a", b"y" * 2000)
    api.save("b", b"z" * 3000)
    report = stats(api)
    assert (report.sessions, report.checkpoints, report.logical_bytes) == (2, 3, 6000)
    assert report.unique_bytes == 6000
    assert report.objects == 3
    assert report.stored_bytes > 0


def test_stats_show_dedup_and_compression_of_a_growing_state(api: Api) -> None:
    api.create("s")
    states = conversation(20)
    for state in states:
        api.save("s", state)
    report = stats(api)
    assert report.logical_bytes == sum(len(s) for s in states)
    assert report.dedup_ratio > 2  # every step repeats the whole history
    assert report.dedup_ratio == pytest.approx(report.logical_bytes / report.unique_bytes)
    assert report.compression_ratio > 1  # repetitive text compresses


def test_stats_are_per_tenant(api: Api) -> None:
    api.as_tenant("t1").create("s")
    api.as_tenant("t1").save("s", b"data")
    assert stats(api.as_tenant("t2")).sessions == 0
    assert stats(api.as_tenant("t1")).sessions == 1


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("rpc", ["Verify", "CollectGarbage", "GetStoreStats"])
@pytest.mark.parametrize("tenant", ["../x", "k" * 1024])
def test_admin_calls_reject_a_bad_tenant(api: Api, rpc: str, tenant: str) -> None:
    bad = api.as_tenant(tenant)
    request = getattr(admin_pb2, f"{rpc}Request")()
    bad.fails(getattr(bad.admin, rpc), request, grpc.StatusCode.INVALID_ARGUMENT, "tenant")
    assert list((api.server.config.data_dir / "tenants").iterdir()) == []
