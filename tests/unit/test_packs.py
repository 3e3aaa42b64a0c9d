"""Pack files: what a save writes, what a crash or damage leaves, GC and migration.

In-process on `Engine` over a temp dir; the layout is docs/storage.md's.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratad.domain.checkpoints import SaveInput
from stratad.domain.engine import Engine
from stratad.store import objects as objects_module
from stratad.store.objects import ENTRY, PACKS_DIR, ObjectStore, pack_entries

TENANT = "default"


def open_engine(path: Path) -> Engine:
    engine = Engine(path, fsync_interval=3600.0)
    engine.open()
    return engine


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = open_engine(tmp_path / "data")
    try:
        yield engine
    finally:
        engine.close()


def objects_root(data_dir: Path) -> Path:
    return data_dir / "tenants" / TENANT / "objects"


def store_of(engine: Engine) -> ObjectStore:
    return engine.store.tenant(TENANT).objects


def save(engine: Engine, session: str, data: bytes) -> tuple[str, str]:
    """Save; return (session, checkpoint ID) for `load`."""
    result = engine.checkpoints.save_state(TENANT, session, SaveInput(data=data))
    return session, result.checkpoint.checkpoint_id


def load(engine: Engine, saved: tuple[str, str]) -> bytes:
    session, checkpoint_id = saved
    return engine.checkpoints.load_state(TENANT, session, checkpoint_id).data


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def reopen(engine: Engine, data_dir: Path) -> Engine:
    engine.close()
    return open_engine(data_dir)


def test_saves_create_no_files_and_use_the_space_they_store(tmp_path: Path) -> None:
    """One file per object cost a filesystem block (4 KiB) per small object."""
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir)
    try:
        engine.sessions.create(TENANT, "s")
        save(engine, "s", os.urandom(1000))
        engine.store.sync_objects()
        before = files_under(objects_root(data_dir))
        rng = random.Random(1)
        saved = {save(engine, "s", rng.randbytes(rng.randint(100, 3000))): None for _ in range(300)}
        engine.store.sync_objects()
        assert files_under(objects_root(data_dir)) == before  # the same single pack
        (pack,) = before
        allocated = os.stat(pack).st_blocks * 512
        assert allocated < store_of(engine).stored_bytes * 1.1 + 8192
        assert len(saved) == 300
    finally:
        engine.close()


def test_everything_reads_back_after_a_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir)
    rng = random.Random(2)
    try:
        engine.sessions.create(TENANT, "s")
        saved = {
            save(engine, "s", data): data for data in (rng.randbytes(40_000) for _ in range(20))
        }
        engine = reopen(engine, data_dir)
        for checkpoint_id, data in saved.items():
            assert load(engine, checkpoint_id) == data
        assert engine.admin.verify(TENANT).ok
    finally:
        engine.close()


def test_a_torn_entry_at_the_end_of_a_pack_is_cut_at_start(tmp_path: Path) -> None:
    """A crash mid-append leaves part of an entry; later appends must follow a sound one."""
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir)
    try:
        engine.sessions.create(TENANT, "s")
        first = save(engine, "s", os.urandom(20_000))
        engine.store.sync_objects()
        (pack,) = (objects_root(data_dir) / PACKS_DIR).glob("*.pack")
        sound_size = pack.stat().st_size
        engine.close()
        with open(pack, "ab") as f:  # a header and half a frame
            f.write(objects_module.entry_header("ab" * 32, 5000) + os.urandom(2500))
        engine = open_engine(data_dir)
        assert pack.stat().st_size == sound_size
        assert not store_of(engine).damaged_packs
        later = save(engine, "s", os.urandom(20_000))
        engine = reopen(engine, data_dir)
        assert len(load(engine, first)) == len(load(engine, later)) == 20_000
        assert engine.admin.verify(TENANT).ok
    finally:
        engine.close()


def test_a_damaged_entry_header_loses_that_object_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir)
    rng = random.Random(3)
    try:
        saved = {}
        for session in ("a", "b", "c"):
            engine.sessions.create(TENANT, session)
            data = rng.randbytes(1500)  # one chunk: the checkpoint's root
            saved[save(engine, session, data)] = data
        engine.sessions.compact(TENANT, "b")  # its journal no longer carries the object
        engine.store.sync_objects()
        entries = list(pack_entries(objects_root(data_dir) / PACKS_DIR))
        path, offset, victim, _ = entries[1]
        engine.close()
        with open(path, "r+b") as f:
            f.seek(offset - ENTRY.size + 8)  # inside the header's digest
            f.write(b"\xff")
        engine = open_engine(data_dir)
        assert store_of(engine).damaged_packs
        (lost,) = [cp for cp, data in saved.items() if victim == _digest_of(data)]
        for checkpoint_id, data in saved.items():
            if checkpoint_id != lost:
                assert load(engine, checkpoint_id) == data
        report = engine.admin.verify(TENANT)
        assert [c.digest for c in report.corrupt] == [victim]
    finally:
        engine.close()


def _digest_of(data: bytes) -> str:
    from stratad import native

    return native.digest_hex(data)


def test_collected_objects_stay_gone_after_a_restart_and_packs_are_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(objects_module, "PACK_BYTES", 256 << 10)  # several packs
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir)
    rng = random.Random(4)
    try:
        engine.sessions.create(TENANT, "keep")
        kept = {save(engine, "keep", d): d for d in (rng.randbytes(30_000) for _ in range(5))}
        engine.sessions.create(TENANT, "drop")
        for _ in range(60):
            save(engine, "drop", rng.randbytes(30_000))
            engine.store.sync_objects()  # spread over packs as a long run would
        packs = objects_root(data_dir) / PACKS_DIR
        before = sum(p.stat().st_size for p in packs.glob("*.pack"))
        assert len(list(packs.glob("*.pack"))) > 3
        engine.sessions.delete(TENANT, "drop")
        report = engine.admin.collect_garbage(TENANT)
        assert report.objects_removed >= 60
        after = sum(p.stat().st_size for p in packs.glob("*.pack"))
        assert after < before / 2, (before, after)  # the space came back
        stored = store_of(engine).stored_bytes
        engine = reopen(engine, data_dir)
        assert store_of(engine).stored_bytes == stored  # nothing collected came back
        for checkpoint_id, data in kept.items():
            assert load(engine, checkpoint_id) == data
        assert engine.admin.verify(TENANT).ok
    finally:
        engine.close()


def test_a_data_dir_of_the_one_file_per_object_layout_opens_and_migrates(tmp_path: Path) -> None:
    """Objects stored as objects/ab/<rest> by earlier versions are read and collected."""
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir)
    rng = random.Random(5)
    try:
        engine.sessions.create(TENANT, "old")
        old = {save(engine, "old", d): d for d in (rng.randbytes(30_000) for _ in range(4))}
        engine.sessions.compact(TENANT, "old")  # no inline copies left in the journal
        engine.store.sync_objects()
        engine.close()
        root = objects_root(data_dir)
        for path, offset, digest, length in list(pack_entries(root / PACKS_DIR)):
            with open(path, "rb") as f:
                f.seek(offset)
                frame = f.read(length)
            (root / digest[:2]).mkdir(exist_ok=True)
            (root / digest[:2] / digest[2:]).write_bytes(frame)
        for pack in (root / PACKS_DIR).iterdir():
            pack.unlink()
        engine = open_engine(data_dir)
        for checkpoint_id, data in old.items():
            assert load(engine, checkpoint_id) == data
        engine.sessions.create(TENANT, "new")
        new = save(engine, "new", rng.randbytes(30_000))
        engine.store.sync_objects()
        assert list((root / PACKS_DIR).glob("*.pack"))  # new objects go to packs
        loose = [p for p in root.glob("??/*") if p.is_file()]
        engine.sessions.delete(TENANT, "old")
        engine.admin.collect_garbage(TENANT)
        assert not any(p.exists() for p in loose)  # collected like any object
        engine = reopen(engine, data_dir)
        assert len(load(engine, new)) == 30_000
        assert engine.admin.verify(TENANT).ok
    finally:
        engine.close()


def test_durability_none_stops_carrying_objects_once_written(tmp_path: Path) -> None:
    """With `durability none` nothing is fsynced: an object written to its pack is
    as safe as a journal's copy, so sessions sharing it stop carrying copies.
    Otherwise they would carry every shared chunk inline on every save, for ever."""
    engine = Engine(tmp_path / "data", durability="none", fsync_interval=3600.0)
    engine.open()
    try:
        engine.sessions.create(TENANT, "first")
        engine.sessions.create(TENANT, "second")
        state = os.urandom(400_000)
        saved = save(engine, "first", state)
        engine.store.sync_objects()  # the background syncer's tick
        journal = engine.sessions.live(TENANT, "second").journal
        before = journal.size
        again = save(engine, "second", state)
        # The record names the shared chunks; it does not carry ~400 KB of them.
        assert journal.size - before < 4096
        assert load(engine, saved) == load(engine, again) == state
    finally:
        engine.close()
    reopened = open_engine(tmp_path / "data")
    try:
        assert load(reopened, again) == state
    finally:
        reopened.close()
