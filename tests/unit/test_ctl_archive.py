"""The session archive of `stratad ctl export/import`: round trip, dedup, and refusal
of every kind of damage before anything is imported."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from stratad import native
from stratad.ctl.archive import (
    MANIFEST,
    MANIFEST_DIGEST,
    ArchivedCheckpoint,
    ArchivedSession,
    ArchiveError,
    ArchiveReader,
    ArchiveWriter,
)


def session() -> ArchivedSession:
    return ArchivedSession("chat", "active", {"team": "a"}, 10, 0.0, "c2")


def checkpoint(checkpoint_id: str, data: bytes, **fields: object) -> ArchivedCheckpoint:
    values: dict[str, object] = {
        "parent_checkpoint_id": "",
        "namespace": "",
        "name": "",
        "content_type": "application/json",
        "metadata": {"k": 1},
        "created_at": "",
        "version": 1,
    }
    values.update(fields)
    return ArchivedCheckpoint(
        checkpoint_id=checkpoint_id,
        size=len(data),
        digest=native.digest_hex(data),
        chunks=[],
        **values,  # type: ignore[arg-type]
    )


def growing(n: int) -> list[bytes]:
    lines = [f"line {i}: the agent called the search tool and summarized\n" * 20 for i in range(n)]
    return ["".join(lines[: i + 1]).encode() for i in range(n)]


def write(path: Path, states: list[bytes]) -> None:
    with ArchiveWriter(path, session(), {"address": "test"}) as writer:
        for i, data in enumerate(states):
            writer.add_checkpoint(checkpoint(f"c{i}", data, parent_checkpoint_id=f"c{i - 1}"), data)


def test_round_trip_keeps_every_field_and_byte(tmp_path: Path) -> None:
    states = [*growing(20), b""]
    path = tmp_path / "a.tar"
    write(path, states)
    with ArchiveReader(path) as reader:
        reader.verify()
        assert reader.manifest.session == session()
        got = list(reader.states())
    assert [data for _, data in got] == states
    assert [cp.checkpoint_id for cp, _ in got] == [f"c{i}" for i in range(len(states))]
    assert got[3][0].parent_checkpoint_id == "c2"
    assert got[0][0].metadata == {"k": 1}


def test_chunks_are_stored_once(tmp_path: Path) -> None:
    states = growing(40)
    path = tmp_path / "a.tar"
    write(path, states)
    logical = sum(len(s) for s in states)
    assert path.stat().st_size < logical / 5  # shared chunks, each compressed once
    with ArchiveReader(path) as reader:
        referenced = {d for cp in reader.manifest.checkpoints for d in cp.chunks}
        assert len(reader.manifest.entries) == len(referenced)


def test_a_failed_export_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    with pytest.raises(RuntimeError), ArchiveWriter(path, session(), {}) as writer:
        writer.add_checkpoint(checkpoint("c0", b"x"), b"x")
        raise RuntimeError("the daemon went away")
    assert list(tmp_path.iterdir()) == []


def test_a_state_that_does_not_match_its_digest_is_not_archived(tmp_path: Path) -> None:
    with (
        pytest.raises(Exception, match="digest"),
        ArchiveWriter(tmp_path / "a.tar", session(), {}) as w,
    ):
        w.add_checkpoint(checkpoint("c0", b"right"), b"wrong")


def rewrite(src: Path, dst: Path, edit: Callable[[str, bytes], bytes | None]) -> None:
    """Copy a tar, passing each member through ``edit`` (None drops it)."""
    with tarfile.open(src) as a, tarfile.open(dst, "w") as b:
        for info in a.getmembers():
            f = a.extractfile(info)
            assert f is not None
            payload = edit(info.name, f.read())
            if payload is not None:
                info.size = len(payload)
                b.addfile(info, io.BytesIO(payload))


def flip(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def resign(document: bytes) -> tuple[bytes, bytes]:
    return document, (native.digest_hex(document) + "\n").encode()


def edit_manifest(
    change: Callable[[dict[str, object]], None],
) -> Callable[[str, bytes], bytes | None]:
    """Change the manifest and fix its digest: only the deeper checks can catch it."""
    state: dict[str, bytes] = {}

    def edit(name: str, payload: bytes) -> bytes | None:
        if name == MANIFEST:
            doc = json.loads(payload)
            change(doc)
            state["doc"], state["digest"] = resign(json.dumps(doc).encode())
            return state["doc"]
        if name == MANIFEST_DIGEST:
            return state["digest"]
        return payload

    return edit


def _first_chunk(doc: dict[str, object]) -> str:
    return sorted(doc["entries"])[0]  # type: ignore[call-overload, no-any-return]


def _drop_entry(doc: dict[str, object]) -> None:
    del doc["entries"][_first_chunk(doc)]  # type: ignore[attr-defined]


def _wrong_size(doc: dict[str, object]) -> None:
    doc["entries"][_first_chunk(doc)]["size"] += 1  # type: ignore[index]


def _wrong_state_digest(doc: dict[str, object]) -> None:
    doc["checkpoints"][0]["digest"] = "0" * 64  # type: ignore[index]


def _swap_chunks(doc: dict[str, object]) -> None:
    chunks = doc["checkpoints"][-1]["chunks"]  # type: ignore[index]
    chunks[0], chunks[1] = chunks[1], chunks[0]


def _future_version(doc: dict[str, object]) -> None:
    doc["format_version"] = 2


def chunks(change: Callable[[bytes], bytes | None]) -> Callable[[str, bytes], bytes | None]:
    """Apply ``change`` to every chunk of the archive."""

    def edit(name: str, payload: bytes) -> bytes | None:
        return change(payload) if name.startswith("chunks/") else payload

    return edit


DAMAGE: dict[str, tuple[Callable[[str, bytes], bytes | None], str]] = {
    "flipped chunk byte": (chunks(flip), "does not match its BLAKE3 digest"),
    "flipped manifest byte": (lambda n, p: flip(p) if n == MANIFEST else p, "MANIFEST.json"),
    "missing manifest digest": (lambda n, p: None if n == MANIFEST_DIGEST else p, "no MANIFEST"),
    "missing chunk": (chunks(lambda p: None), "has no chunks/"),
    "extra member": (
        lambda n, p: p,  # replaced below: adds an unlisted file
        "unexpected entry",
    ),
    "unlisted chunk": (edit_manifest(_drop_entry), "unexpected entry"),
    "wrong entry size": (edit_manifest(_wrong_size), "bytes"),
    "wrong state digest": (edit_manifest(_wrong_state_digest), "does not match its digest"),
    "chunks out of order": (edit_manifest(_swap_chunks), "does not match its digest"),
    "future format version": (edit_manifest(_future_version), "format_version"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_archives_are_refused(tmp_path: Path, damage: str) -> None:
    good = tmp_path / "good.tar"
    write(good, growing(30))
    bad = tmp_path / "bad.tar"
    edit, words = DAMAGE[damage]
    rewrite(good, bad, edit)
    if damage == "extra member":
        with tarfile.open(bad, "a") as tar:
            info = tarfile.TarInfo("../../etc/evil")
            info.size = 4
            tar.addfile(info, io.BytesIO(b"evil"))
    with pytest.raises(ArchiveError, match=words), ArchiveReader(bad) as reader:
        reader.verify()


def test_not_an_archive(tmp_path: Path) -> None:
    path = tmp_path / "x.tar"
    path.write_bytes(b"not a tar file at all" * 100)
    with pytest.raises(ArchiveError, match="tar"):
        ArchiveReader(path)
    good = tmp_path / "good.tar"
    write(good, growing(3))
    half = tmp_path / "half.tar"
    half.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(ArchiveError), ArchiveReader(half) as reader:
        reader.verify()
