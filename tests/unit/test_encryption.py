"""Encryption at rest (docs/security.md): keys, sealing, and the store with encryption on.

Everything here runs the real store over a temporary data directory; the
daemon-level round trip (gRPC, restart with a rotated key) is in
tests/e2e/test_encryption_daemon.py.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from stratad.domain.checkpoints import SaveInput
from stratad.domain.crystals import TraceStep
from stratad.domain.engine import Engine
from stratad.errors import CorruptObjectError, DataLossError
from stratad.store import journal as journal_mod
from stratad.store.crypto import (
    NONCE_BYTES,
    OBJECT_MAGIC,
    TENANT_KEY_NAME,
    EncryptionKeyError,
    Keyring,
    MasterKey,
    TenantCipher,
    keyring_from_settings,
    load_master_key,
    new_master_key_text,
    parse_master_key,
)
from stratad.store.journal import Record

TENANT = "acme"
#: A string that must appear in no file of the data directory.
SECRET = "the-launch-code-is-7731-swordfish"


def master(text: str | None = None) -> MasterKey:
    return parse_master_key((text or new_master_key_text()).encode(), "test key")


def open_engine(data: Path, keyring: Keyring | None) -> Engine:
    engine = Engine(data, keyring=keyring, fsync_interval=3600.0)
    engine.open()
    return engine


@pytest.fixture
def key() -> MasterKey:
    return master()


@pytest.fixture
def engine(tmp_path: Path, key: MasterKey) -> Iterator[Engine]:
    engine = open_engine(tmp_path / "data", Keyring(key))
    try:
        yield engine
    finally:
        engine.close()


def state(n: int = 300_000) -> bytes:
    """A multi-chunk state with SECRET in it (incompressible around it)."""
    return os.urandom(n // 2) + SECRET.encode() * 10 + os.urandom(n // 2)


def fill(engine: Engine) -> bytes:
    """A session with a state, structured state, a profile and a crystal, all with SECRET."""
    data = state()
    engine.sessions.create(TENANT, "s1", labels={"purpose": "test"})
    engine.checkpoints.save_state(TENANT, "s1", SaveInput(data=data, metadata={"note": SECRET}))
    engine.cognitive.initialize(TENANT, "s1", goal="ship it")
    engine.cognitive.record_decision(TENANT, "s1", step=1, decision=SECRET)
    engine.profiles.update(TENANT, "user-1", {"preferences": {"motto": SECRET}})
    engine.crystals.crystallize(
        TENANT, f"deploy {SECRET}", [TraceStep(decision=SECRET, tool="kubectl")], 0.9, "s1"
    )
    engine.store.sync_objects()
    return data


def files_containing(root: Path, needle: bytes) -> list[str]:
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            if needle in (Path(directory) / name).read_bytes():
                found.append(os.path.join(directory, name))
    return found


# -- keys --------------------------------------------------------------------------------


def test_master_key_parses_hex_and_base64_with_a_stable_id() -> None:
    raw = os.urandom(32)
    from_hex = parse_master_key(raw.hex().encode() + b"\n", "hex")
    from_b64 = parse_master_key(base64.b64encode(raw), "b64")
    assert from_hex.key == from_b64.key == raw
    assert from_hex.key_id == from_b64.key_id and from_hex.key_id.startswith("mk-")
    assert raw.hex() not in repr(from_hex)  # never printed


@pytest.mark.parametrize("text", [b"", b"short", b"zz" * 32, base64.b64encode(b"x" * 16)])
def test_a_malformed_key_is_refused_naming_its_source(text: bytes) -> None:
    with pytest.raises(EncryptionKeyError, match=r"my\.key does not hold a 256-bit key"):
        parse_master_key(text, "my.key")


def test_key_from_file_or_env(tmp_path: Path) -> None:
    text = new_master_key_text()
    (tmp_path / "k").write_text(text)
    assert load_master_key(tmp_path / "k").key.hex() == text
    from_env = keyring_from_settings("", (), {"STRATAD_ENCRYPTION_KEY": text})
    assert from_env.master.key.hex() == text
    with pytest.raises(EncryptionKeyError, match="needs the master key"):
        keyring_from_settings("", (), {})
    with pytest.raises(EncryptionKeyError, match="cannot read encryption key file"):
        load_master_key(tmp_path / "absent")


def test_data_key_wraps_and_unwraps_and_is_bound_to_its_tenant(tmp_path: Path) -> None:
    keyring = Keyring(master())
    (tmp_path / "a").mkdir()
    cipher = keyring.open_tenant(tmp_path / "a", "a")
    key_file = json.loads((tmp_path / "a" / TENANT_KEY_NAME).read_text())
    assert key_file["master_key_id"] == keyring.key_id
    assert key_file["algorithm"] == "AES-256-GCM"
    again = keyring.open_tenant(tmp_path / "a", "a")
    sealed = cipher.seal_object("ab" * 32, b"frame")
    assert again.open_object("ab" * 32, sealed) == b"frame"
    # The same KEY file under another tenant's name does not unwrap.
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / TENANT_KEY_NAME).write_bytes((tmp_path / "a" / TENANT_KEY_NAME).read_bytes())
    with pytest.raises(DataLossError, match="damaged or belongs to another tenant"):
        keyring.open_tenant(tmp_path / "b", "b")


def test_wrong_master_key_is_refused_naming_the_key_it_needs(tmp_path: Path) -> None:
    first = Keyring(master())
    (tmp_path / "a").mkdir()
    first.open_tenant(tmp_path / "a", "a")
    with pytest.raises(EncryptionKeyError, match=first.key_id) as info:
        Keyring(master()).open_tenant(tmp_path / "a", "a")
    assert info.value.metadata["key_id"] == first.key_id


def test_nonces_are_unique() -> None:
    cipher = TenantCipher("t", os.urandom(32))
    sealed = [cipher.seal_object("00" * 32, b"same frame") for _ in range(2000)]
    nonces = {s[4 : 4 + NONCE_BYTES] for s in sealed}
    assert len(nonces) == len(sealed)
    records = cipher.records("t/sessions/s/journal")
    assert len({records.seal(b"x")[4:16] for _ in range(2000)}) == 2000


def test_sealed_object_is_bound_to_its_digest_and_tenant() -> None:
    data_key = os.urandom(32)
    cipher = TenantCipher("t", data_key)
    sealed = cipher.seal_object("aa" * 32, b"frame")
    assert sealed.startswith(OBJECT_MAGIC) and b"frame" not in sealed
    with pytest.raises(CorruptObjectError, match="fails authentication"):
        cipher.open_object("bb" * 32, sealed)  # swapped between objects
    with pytest.raises(CorruptObjectError):
        TenantCipher("u", data_key).open_object("aa" * 32, sealed)  # another tenant
    flipped = bytearray(sealed)
    flipped[-1] ^= 1
    with pytest.raises(CorruptObjectError):
        cipher.open_object("aa" * 32, bytes(flipped))
    with pytest.raises(CorruptObjectError, match="is not encrypted"):
        cipher.open_object("aa" * 32, b"STRD plain frame")


# -- the store with encryption on --------------------------------------------------------


def test_round_trip_and_no_plaintext_on_disk(tmp_path: Path, key: MasterKey) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir, Keyring(key))
    try:
        data = fill(engine)
        info = engine.checkpoints.fork_session(
            TENANT, engine.sessions.live(TENANT, "s1").state.head, new_session_id="s2"
        )
        assert info.session_id == "s2"
    finally:
        engine.close()
    assert files_containing(data_dir, SECRET.encode()) == []
    assert files_containing(data_dir, data[:64]) == []
    engine = open_engine(data_dir, Keyring(key))
    try:
        assert engine.checkpoints.load_state(TENANT, "s1").data == data
        assert engine.checkpoints.load_state(TENANT, "s2").data == data
        cognitive = json.dumps(engine.cognitive.state(TENANT, "s1").result)
        assert SECRET in cognitive
        assert engine.profiles.get(TENANT, "user-1")["preferences"]["motto"] == SECRET
        crystals = engine.crystals.list(TENANT)
        assert crystals[0][0].decision_chain == (SECRET,)
        assert engine.admin.verify().ok
    finally:
        engine.close()


def test_dedup_within_a_tenant_still_shares_objects(engine: Engine) -> None:
    data = state(1_000_000)
    engine.sessions.create(TENANT, "a")
    engine.checkpoints.save_state(TENANT, "a", SaveInput(data=data))
    once = engine.store.tenant(TENANT).objects.stored_bytes
    engine.sessions.create(TENANT, "b")
    engine.checkpoints.save_state(TENANT, "b", SaveInput(data=data))
    assert engine.store.tenant(TENANT).objects.stored_bytes == once
    assert once < len(data) * 1.05  # framing, manifest, seals: a few percent


def overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_a_flipped_byte_in_an_object_file_is_data_loss_and_verify_names_it(
    tmp_path: Path, engine: Engine
) -> None:
    fill(engine)
    objects = engine.store.tenant(TENANT).objects
    victim = objects.digests()[0]
    path, offset, length = objects.locate(victim)
    byte = path.read_bytes()[offset + length // 2]
    overwrite(path, offset + length // 2, bytes([byte ^ 0x01]))
    report = engine.admin.verify(TENANT)
    assert [c.digest for c in report.corrupt] == [victim]
    assert "fails authentication" in report.corrupt[0].problem
    with pytest.raises(CorruptObjectError):
        objects.get(victim, 1 << 30)


def test_ciphertext_moved_between_objects_is_detected(engine: Engine) -> None:
    """Object A's stored bytes replaced by A's frame sealed as object B: authentic
    ciphertext of this tenant, in the wrong place. Opening it fails."""
    fill(engine)
    objects = engine.store.tenant(TENANT).objects
    cipher = engine.store.tenant(TENANT).cipher
    assert cipher is not None
    victim, other = objects.digests()[:2]
    path, offset, length = objects.locate(victim)
    frame = objects.read_frame(victim)
    moved = cipher.seal_object(other, frame)
    assert len(moved) == length
    overwrite(path, offset, moved)
    assert [c.digest for c in engine.admin.verify(TENANT).corrupt] == [victim]


def journal_of(data_dir: Path, session: str) -> Path:
    return data_dir / "tenants" / TENANT / "sessions" / session / "journal"


def test_damage_in_the_middle_and_torn_tail_are_told_apart(tmp_path: Path, key: MasterKey) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir, Keyring(key))
    try:
        engine.sessions.create(TENANT, "s1")
        for i in range(3):
            engine.checkpoints.save_state(TENANT, "s1", SaveInput(data=f"{SECRET}{i}".encode()))
    finally:
        engine.close()
    path = journal_of(data_dir, "s1")
    whole = path.read_bytes()
    cipher = (
        Keyring(key)
        .open_tenant(data_dir / "tenants" / TENANT, TENANT)
        .records(f"{TENANT}/sessions/s1/journal")
    )
    replay = journal_mod.parse_records(whole, cipher)
    assert [r.kind for r in replay.records] == ["create", "save", "save", "save"]
    # A torn append: half of a new record at the end is cut, nothing is damage.
    torn = whole + Record("save", {"v": 9}).encode(cipher)[:30]
    assert journal_mod.parse_records(torn, cipher).torn_bytes == 30
    # A byte flipped in the second record's ciphertext, records after it: damage.
    second = _record_starts(whole)[1]
    damaged = bytearray(whole)
    damaged[second + 20] ^= 0x01
    result = journal_mod.parse_records(bytes(damaged), cipher)
    assert result.corrupt_at == second and len(result.records) == 1
    # A record sealed for another journal (moved in, CRC intact): damage, not a tail.
    other = (
        Keyring(key)
        .open_tenant(data_dir / "tenants" / TENANT, TENANT)
        .records(f"{TENANT}/sessions/other/journal")
    )
    moved = whole + Record("save", {"v": 5}).encode(other)
    assert journal_mod.parse_records(moved, cipher).corrupt_at == len(whole)
    # A plaintext record in an encrypted journal (CRC intact): damage too.
    injected = whole + Record("save", {"v": 5}).encode()
    assert journal_mod.parse_records(injected, cipher).corrupt_at == len(whole)


def test_a_damaged_first_record_never_deletes_the_session(tmp_path: Path, key: MasterKey) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir, Keyring(key))
    try:
        engine.sessions.create(TENANT, "s1")
        engine.checkpoints.save_state(TENANT, "s1", SaveInput(data=b"acknowledged"))
    finally:
        engine.close()
    path = journal_of(data_dir, "s1")
    raw = bytearray(path.read_bytes())
    raw[30] ^= 0x01  # in the create record's ciphertext; the save record follows
    path.write_bytes(bytes(raw))
    engine = open_engine(data_dir, Keyring(key))
    try:
        assert not engine.sessions.is_loaded(TENANT, "s1")
    finally:
        engine.close()
    assert path.read_bytes() == bytes(raw), "damaged history must be kept as it is"


def _record_starts(data: bytes) -> list[int]:
    starts, pos = [], 0
    while pos < len(data):
        starts.append(pos)
        pos += 8 + int.from_bytes(data[pos : pos + 4], "little")
    return starts


def test_damaged_session_after_restart_is_reported(tmp_path: Path, key: MasterKey) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir, Keyring(key))
    try:
        engine.sessions.create(TENANT, "s1")
        for i in range(3):
            engine.checkpoints.save_state(TENANT, "s1", SaveInput(data=f"{SECRET}{i}".encode()))
    finally:
        engine.close()
    path = journal_of(data_dir, "s1")
    raw = bytearray(path.read_bytes())
    raw[_record_starts(bytes(raw))[2] + 20] ^= 0x01
    path.write_bytes(bytes(raw))
    engine = open_engine(data_dir, Keyring(key))
    try:
        assert engine.admin.verify(TENANT).damaged_sessions == [f"{TENANT}/s1"]
        with pytest.raises(DataLossError):
            engine.checkpoints.save_state(TENANT, "s1", SaveInput(data=b"more"))
    finally:
        engine.close()


def test_compaction_keeps_records_sealed(tmp_path: Path, key: MasterKey) -> None:
    data_dir = tmp_path / "data"
    engine = Engine(data_dir, keyring=Keyring(key), fsync_interval=3600.0, compact_min_bytes=1)
    engine.open()
    try:
        engine.sessions.create(TENANT, "s1")
        for _ in range(5):
            engine.checkpoints.save_state(TENANT, "s1", SaveInput(data=state(50_000)))
        engine.checkpoints.save_state(TENANT, "s1", SaveInput(data=SECRET.encode()))
        engine.sessions.compact(TENANT, "s1")
        ids = []
        for i in range(6):  # distinct goals and tools: each one is novel
            trace = [TraceStep(decision=SECRET, tool=f"tool{i}-{j}") for j in range(3)]
            created = engine.crystals.crystallize(TENANT, f"goal{i} {SECRET}", trace, 0.9, "s1")
            assert created.crystal is not None
            ids.append(created.crystal.crystal_id)
        for crystal_id in ids[:5]:  # the journal outgrows what one crystal needs
            engine.crystals.delete(TENANT, crystal_id)
        engine.store.sync_objects()
    finally:
        engine.close()
    assert files_containing(data_dir, SECRET.encode()) == []
    crystal_journal = data_dir / "tenants" / TENANT / "crystals" / "journal"
    cipher = Keyring(key).open_tenant(data_dir / "tenants" / TENANT, TENANT)
    kinds = [
        r.kind
        for r in journal_mod.read_records(
            crystal_journal, cipher.records(f"{TENANT}/crystals/journal")
        ).records
    ]
    assert kinds.count("crystal") < 6, f"the crystal journal was not compacted: {kinds}"
    session_kinds = [
        r.kind
        for r in journal_mod.read_records(
            journal_of(data_dir, "s1"), cipher.records(f"{TENANT}/sessions/s1/journal")
        ).records
    ]
    assert session_kinds[0] == "snapshot"
    engine = open_engine(data_dir, Keyring(key))
    try:
        assert engine.checkpoints.load_state(TENANT, "s1").data == SECRET.encode()
        assert [c.crystal_id for c in engine.crystals.list(TENANT)[0]] == ids[5:]
        assert engine.crystals.get(TENANT, ids[5]).decision_chain[0] == SECRET
    finally:
        engine.close()


# -- mixed data directories and rotation --------------------------------------------------


def test_encryption_off_on_an_encrypted_data_dir_refuses(tmp_path: Path, key: MasterKey) -> None:
    data_dir = tmp_path / "data"
    open_engine(data_dir, Keyring(key)).close()
    Engine(data_dir, keyring=Keyring(key)).store.tenant(TENANT)
    with pytest.raises(EncryptionKeyError, match=f"encrypted.*{key.key_id}"):
        Engine(data_dir)


def test_encryption_on_over_plaintext_data_refuses(tmp_path: Path, key: MasterKey) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir, None)
    engine.sessions.create(TENANT, "s1")
    engine.close()
    with pytest.raises(EncryptionKeyError, match="holds data written without encryption"):
        Engine(data_dir, keyring=Keyring(key))


def test_a_tenant_whose_key_creation_was_interrupted_gets_a_key(
    tmp_path: Path, key: MasterKey
) -> None:
    tenant_root = tmp_path / "data" / "tenants" / TENANT
    (tenant_root / "sessions").mkdir(parents=True)
    (tenant_root / (TENANT_KEY_NAME + ".tmp")).write_bytes(b"{half")  # crash mid-write
    engine = open_engine(tmp_path / "data", Keyring(key))
    try:
        engine.sessions.create(TENANT, "s1")
    finally:
        engine.close()
    assert json.loads((tenant_root / TENANT_KEY_NAME).read_text())["master_key_id"] == key.key_id


def test_rotation_rewraps_data_keys_and_the_old_key_is_no_longer_needed(
    tmp_path: Path, key: MasterKey
) -> None:
    data_dir = tmp_path / "data"
    engine = open_engine(data_dir, Keyring(key))
    try:
        data = fill(engine)
    finally:
        engine.close()
    new = master()
    engine = open_engine(data_dir, Keyring(new, [key]))  # rotation: old key listed once
    try:
        assert engine.checkpoints.load_state(TENANT, "s1").data == data
    finally:
        engine.close()
    key_file = json.loads((data_dir / "tenants" / TENANT / TENANT_KEY_NAME).read_text())
    assert key_file["master_key_id"] == new.key_id
    engine = open_engine(data_dir, Keyring(new))  # the old key is gone
    try:
        assert engine.checkpoints.load_state(TENANT, "s1").data == data
        assert engine.profiles.get(TENANT, "user-1")["preferences"]["motto"] == SECRET
        assert engine.admin.verify().ok
    finally:
        engine.close()
    with pytest.raises(EncryptionKeyError, match=new.key_id):
        open_engine(data_dir, Keyring(key))  # the old key alone no longer opens it
