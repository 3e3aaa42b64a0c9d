"""The session archive of `stratad ctl export/import`: round trip, dedup, and refusal
of every kind of damage before anything is imported."""

from __future__ import annotations

import io
import json
import tarfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from stratad import native
from stratad.ctl import archive
from stratad.ctl.archive import (
    DEFAULT_MAX_STATE_BYTES,
    MANIFEST,
    MANIFEST_DIGEST,
    MAX_MANIFEST_BYTES,
    ArchivedCheckpoint,
    ArchivedSession,
    ArchiveError,
    ArchiveReader,
    ArchiveWriter,
    Manifest,
    chunk_entry,
)
from stratad.errors import ResourceExhaustedError


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
    doc["format_version"] = 3


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


# --- hostile archives: sizes are checked before anything is read or decompressed ------------

MiB = 1 << 20


def hostile(
    path: Path,
    checkpoints: list[ArchivedCheckpoint],
    chunks: list[bytes],
    *,
    sizes: dict[str, int] | None = None,
    tail: bytes = b"",
) -> None:
    """Write an archive member by member, as an attacker would: a well-signed manifest
    listing ``checkpoints`` (their sizes and chunk lists as given) and ``chunks``
    (stored compressed), entry sizes overridden by ``sizes``, and the raw bytes
    ``tail`` (forged headers) after the last member."""
    stored = {chunk_entry(native.digest_hex(c)): native.compress(c) for c in chunks}
    entries = {
        name: {"size": len(payload), "blake3": native.digest_hex(payload)}
        for name, payload in stored.items()
    }
    for name, size in (sizes or {}).items():
        entries.setdefault(name, {"blake3": "0" * 64})["size"] = size
    manifest = Manifest(session=session()).to_json()
    manifest["checkpoints"] = [cp.to_json() for cp in checkpoints]
    manifest["entries"] = entries
    document, digest = resign(json.dumps(manifest).encode())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, payload in [(MANIFEST, document), (MANIFEST_DIGEST, digest), *stored.items()]:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        end = tar.offset  # before the end-of-archive blocks
    path.write_bytes(buffer.getvalue()[:end] + tail + b"\0" * 1024)


def forged_header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    """A tar header claiming ``size`` bytes, followed by a few of them."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.type = kind
    return info.tobuf(format=tarfile.USTAR_FORMAT) + b"x" * 512


def sparse_member(name: str, size: int) -> bytes:
    """A GNU sparse member of ``size`` bytes: 512 on disk, then a hole up to ``size``."""
    info = tarfile.TarInfo(name)
    info.size = 512
    info.type = tarfile.GNUTYPE_SPARSE
    header = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    header[386:398] = b"%011o\0" % 0  # data at offset 0,
    header[398:410] = b"%011o\0" % 512  # 512 bytes of it,
    header[483:495] = b"%011o\0" % size  # in a file this large
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header) + b"x" * 512


def claimed(checkpoint_id: str, size: int, state: bytes, chunks: list[bytes]) -> ArchivedCheckpoint:
    """A checkpoint declaring ``size`` bytes with the digest of ``state``, made of ``chunks``."""
    cp = checkpoint(checkpoint_id, state)
    cp.size = size
    cp.chunks = [native.digest_hex(c) for c in chunks]
    return cp


def peak_bytes(action: Callable[[], object]) -> int:
    """The peak of traced allocations while ``action`` runs (it must raise ArchiveError)."""
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError) as refused:
            action()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"refused: {refused.value.message}; peak {peak / MiB:.1f} MiB")
    return peak


@pytest.mark.parametrize("through", ["verify", "state"])
def test_chunks_expanding_past_the_declared_size_are_refused_in_bounded_memory(
    tmp_path: Path, through: str
) -> None:
    # 200 references to one 1 MiB chunk of zeros (a few hundred bytes compressed) under
    # a declared size of 1 MiB: joining them first would allocate 200 MiB.
    zeros = bytes(MiB)
    path = tmp_path / "bomb.tar"
    hostile(path, [claimed("bomb", MiB, zeros, [zeros] * 200)], [zeros])
    assert path.stat().st_size < 20_000
    with ArchiveReader(path, max_state_bytes=MiB) as reader:
        cp = reader.manifest.checkpoints[0]
        action = reader.verify if through == "verify" else lambda: reader.state(cp)
        peak = peak_bytes(action)
    assert peak < 3 * MiB
    with ArchiveReader(path, max_state_bytes=MiB) as reader, pytest.raises(ArchiveError) as e:
        reader.verify()
    assert e.value.message == (
        "checkpoint bomb: its chunks add up to more than the 1048576 bytes it declares"
    )


def test_chunks_adding_up_to_less_than_the_declared_size_are_refused(tmp_path: Path) -> None:
    piece = b"a" * 1000
    path = tmp_path / "short.tar"
    hostile(path, [claimed("short", 3000, piece * 3, [piece, piece])], [piece])
    with (
        ArchiveReader(path) as reader,
        pytest.raises(ArchiveError, match="add up to 2000 bytes, it declares 3000"),
    ):
        reader.verify()
    with ArchiveReader(path) as reader, pytest.raises(ArchiveError, match="add up to 2000"):
        reader.state(reader.manifest.checkpoints[0])


@pytest.mark.parametrize(("limit", "declared"), [(MiB, 200 * MiB), (None, (64 << 20) + 1)])
def test_a_declared_state_size_over_the_limit_is_refused_before_decompressing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int | None, declared: int
) -> None:
    zeros = bytes(MiB)
    path = tmp_path / "big.tar"
    hostile(path, [claimed("big", declared, zeros, [zeros] * 200)], [zeros])

    def no_decompression(*args: object) -> bytes:
        raise AssertionError("decompressed before checking the declared size")

    monkeypatch.setattr(native, "decompress", no_decompression)
    opened = ArchiveReader(path) if limit is None else ArchiveReader(path, max_state_bytes=limit)
    words = (
        f"checkpoint big declares a state of {declared} bytes, more than the maximum "
        f"state size of {limit or DEFAULT_MAX_STATE_BYTES} bytes"
    )
    with opened as reader:
        with pytest.raises(ArchiveError, match=words):
            reader.verify()
        with pytest.raises(ArchiveError, match=words):
            reader.state(reader.manifest.checkpoints[0])


def test_a_sparse_chunk_claiming_a_huge_size_is_refused(tmp_path: Path) -> None:
    # 512 bytes on disk read as 256 MiB (holes are zeros), and the manifest agrees.
    name = chunk_entry("ab" * 32)
    path = tmp_path / "huge-chunk.tar"
    hostile(
        path,
        [claimed("c", 100, b"s" * 100, [])],
        [],
        sizes={name: 256 * MiB},
        tail=sparse_member(name, 256 * MiB),
    )
    assert path.stat().st_size < 20_000
    with ArchiveReader(path) as reader:
        assert peak_bytes(reader.verify) < MiB
    with ArchiveReader(path) as reader, pytest.raises(ArchiveError) as refused:
        reader.verify()
    assert refused.value.message == f"{name} is a sparse file ({256 * MiB} bytes)"


def test_a_sparse_manifest_claiming_a_huge_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "huge-manifest.tar"
    path.write_bytes(sparse_member(MANIFEST, 512 * MiB) + b"\0" * 1024)
    assert peak_bytes(lambda: ArchiveReader(path)) < MiB
    with pytest.raises(ArchiveError, match=f"MANIFEST.json is a sparse file \\({512 * MiB} bytes"):
        ArchiveReader(path)


def test_a_manifest_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big-manifest.tar"
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo(MANIFEST)
        info.size = MAX_MANIFEST_BYTES + 1
        tar.addfile(info, io.BytesIO(b" " * info.size))
    assert peak_bytes(lambda: ArchiveReader(path)) < MiB
    with pytest.raises(ArchiveError, match=f"MANIFEST.json is larger than {64 * MiB} bytes"):
        ArchiveReader(path)


def test_a_forged_pax_header_costs_no_more_than_the_archive(tmp_path: Path) -> None:
    # tarfile reads a PAX header with one read() of its claimed size.
    path = tmp_path / "pax.tar"
    write(path, growing(3))
    archive = path.read_bytes()
    with tarfile.open(path) as tar:
        end = tar.offset if tar.getmembers() else 0
    path.write_bytes(archive[:end] + forged_header("pax", 1 << 30, tarfile.XHDTYPE))
    assert peak_bytes(lambda: ArchiveReader(path).verify()) < 2 * path.stat().st_size


def test_states_up_to_the_limit_round_trip_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    states = growing(12)
    path = tmp_path / "a.tar"
    write(path, states)
    largest = max(len(s) for s in states)
    with ArchiveReader(path, max_state_bytes=largest) as reader:
        reader.verify()
        assert [data for _, data in reader.states()] == states
    with (
        ArchiveReader(path, max_state_bytes=largest - 1) as reader,
        pytest.raises(ArchiveError, match=f"c11 declares a state of {largest} bytes"),
    ):
        reader.verify()


def test_export_refuses_a_manifest_no_import_would_accept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(archive, "MAX_MANIFEST_BYTES", 1000)
    with pytest.raises(ResourceExhaustedError, match="manifest would be"):
        write(tmp_path / "a.tar", growing(5))
    assert list(tmp_path.iterdir()) == []
