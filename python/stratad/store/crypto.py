"""Encryption at rest: master keys, per-tenant data keys, and sealing with AES-256-GCM.

Key hierarchy (docs/security.md, "Encryption at rest"):

- The **master key** (256 bits) comes from ``encryption_key_file`` or the
  ``STRATAD_ENCRYPTION_KEY`` variable. Its **key id** is a hash of it, so a
  wrong key is named without revealing it. Old master keys
  (``encryption_old_key_files``) are only ever used to unwrap, during rotation.
- Each tenant has a random 256-bit **data key**, stored in
  ``<data>/tenants/<tenant>/KEY`` wrapped (AES-256-GCM) by the master key,
  with the id of the master key that wrapped it. Rotating the master key
  re-wraps these small files; no data is rewritten.
- The data key seals every object file and every journal record payload of
  the tenant (AES-256-GCM, a random 96-bit nonce each). The associated data
  binds a sealed object to its digest and tenant, and a sealed record to its
  journal (tenant and path), so ciphertext moved to another place fails to
  open: damage, reported as such, never someone else's data.

Only this module imports `cryptography`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from stratad.errors import CorruptObjectError, DataLossError, FailedPreconditionError
from stratad.store.fsync import FILE_MODE, fsync_dir

log = logging.getLogger(__name__)

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
#: Env variable holding the master key itself (hex or base64), instead of a file.
KEY_ENV = "STRATAD_ENCRYPTION_KEY"
#: The wrapped data key, in each tenant's directory.
TENANT_KEY_NAME = "KEY"
KEY_FILE_FORMAT = 1
ALGORITHM = "AES-256-GCM"

#: A sealed object file starts with this (a plaintext frame starts with b"STRD").
OBJECT_MAGIC = b"STRE"
#: A sealed journal record payload starts with this. Read as the u32 body
#: length a plaintext payload starts with, it exceeds the largest record, so a
#: payload can never be taken for the other kind.
RECORD_MAGIC = b"STRJ"
#: Bytes sealing adds: magic, nonce, authentication tag.
SEAL_OVERHEAD = 4 + NONCE_BYTES + TAG_BYTES

_OBJECT_AD = b"stratad-object/1\0"
_RECORD_AD = b"stratad-record/1\0"
_DATA_KEY_AD = b"stratad-data-key/1\0"
_KEY_ID_DOMAIN = b"stratad-master-key-id/1\0"


class EncryptionKeyError(FailedPreconditionError):
    """A master key is missing, malformed or not the one the data needs."""

    default_reason = "ENCRYPTION_KEY"


class SealError(DataLossError):
    """Sealed bytes failed authentication: damaged, moved, or sealed with another key."""


# -- master keys -------------------------------------------------------------------


@dataclass(frozen=True)
class MasterKey:
    key: bytes
    #: "mk-" and 16 hex digits of a domain-separated SHA-256 of the key.
    key_id: str
    #: Where it came from (a file name or the env variable), for messages.
    source: str

    def __repr__(self) -> str:  # never print the key
        return f"MasterKey({self.key_id}, from {self.source})"


def key_id_of(key: bytes) -> str:
    return "mk-" + hashlib.sha256(_KEY_ID_DOMAIN + key).hexdigest()[:16]


def parse_master_key(text: bytes, source: str) -> MasterKey:
    """A master key from 64 hex digits or base64 of 32 bytes (surrounding space ignored)."""
    raw = text.strip()
    key: bytes | None = None
    if len(raw) == 2 * KEY_BYTES:
        with contextlib.suppress(ValueError):
            key = bytes.fromhex(raw.decode("ascii", "replace"))
    if key is None:
        with contextlib.suppress(binascii.Error, ValueError):
            decoded = base64.b64decode(raw, validate=True)
            if len(decoded) == KEY_BYTES:
                key = decoded
    if key is None:
        raise EncryptionKeyError(
            f"{source} does not hold a 256-bit key: expected 64 hex digits or the base64 "
            "of 32 bytes (generate one with `stratad keygen` or `openssl rand -hex 32`)"
        )
    return MasterKey(key, key_id_of(key), source)


def load_master_key(path: str | Path) -> MasterKey:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise EncryptionKeyError(
            f"cannot read encryption key file {path}: {exc.strerror}"
        ) from None
    return parse_master_key(text, f"encryption key file {path}")


def new_master_key_text() -> str:
    """A fresh master key as 64 hex digits (what `stratad keygen` prints)."""
    return secrets.token_bytes(KEY_BYTES).hex()


# -- sealing -----------------------------------------------------------------------------


def _seal(aead: AESGCM, magic: bytes, data: bytes, ad: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return magic + nonce + aead.encrypt(nonce, data, ad)


def _open(aead: AESGCM, magic: bytes, sealed: bytes, ad: bytes) -> bytes | None:
    """The plaintext, or None when `sealed` is not authentic under this key and `ad`."""
    if len(sealed) < SEAL_OVERHEAD or sealed[:4] != magic:
        return None
    nonce = sealed[4 : 4 + NONCE_BYTES]
    try:
        return aead.decrypt(nonce, memoryview(sealed)[4 + NONCE_BYTES :], ad)
    except InvalidTag:
        return None


class RecordCipher:
    """Seals the record payloads of one journal (its identity is the associated data)."""

    def __init__(self, aead: AESGCM, journal: str) -> None:
        self._aead = aead
        self.journal = journal
        self._ad = _RECORD_AD + journal.encode()

    def seal(self, payload: bytes) -> bytes:
        return _seal(self._aead, RECORD_MAGIC, payload, self._ad)

    def open(self, sealed: bytes) -> bytes:
        """The payload; SealError if it is not a record sealed for this journal."""
        payload = _open(self._aead, RECORD_MAGIC, sealed, self._ad)
        if payload is None:
            what = "is not encrypted" if sealed[:4] != RECORD_MAGIC else "fails authentication"
            raise SealError(f"a record of journal {self.journal} {what}")
        return payload


class TenantCipher:
    """One tenant's data key: seals its objects and its journals' records."""

    def __init__(self, tenant: str, data_key: bytes) -> None:
        self.tenant = tenant
        self._aead = AESGCM(data_key)

    def seal_object(self, digest: str, frame: bytes) -> bytes:
        return _seal(self._aead, OBJECT_MAGIC, frame, self._object_ad(digest))

    def open_object(self, digest: str, sealed: bytes) -> bytes:
        """The frame; CorruptObjectError if the file is not this object sealed by this tenant."""
        frame = _open(self._aead, OBJECT_MAGIC, sealed, self._object_ad(digest))
        if frame is None:
            what = "is not encrypted" if sealed[:4] != OBJECT_MAGIC else "fails authentication"
            raise CorruptObjectError(f"object {digest} {what} (damaged or moved)")
        return frame

    def _object_ad(self, digest: str) -> bytes:
        return _OBJECT_AD + self.tenant.encode() + b"\0" + digest.encode()

    def records(self, journal: str) -> RecordCipher:
        """The cipher of the journal named `journal` (its path below the tenants directory)."""
        return RecordCipher(self._aead, journal)


# -- per-tenant data keys ------------------------------------------------------------------


class SharedKeys(Protocol):
    """Where daemons sharing object storage keep each tenant's wrapped data key
    (store/remote.py): a tenant hydrated on another daemon needs the same key."""

    def read_tenant_key(self, tenant: str) -> bytes | None: ...

    def create_tenant_key(self, tenant: str, raw: bytes) -> bytes:
        """Store `raw` unless a key is there already; return the one stored."""
        ...

    def put_tenant_key(self, tenant: str, raw: bytes) -> None: ...


class Keyring:
    """The daemon's master key (and old ones, for rotation): unwraps tenants' data keys."""

    def __init__(self, master: MasterKey, old: list[MasterKey] | None = None) -> None:
        self.master = master
        self._by_id = {k.key_id: k for k in [*(old or []), master]}

    @property
    def key_id(self) -> str:
        return self.master.key_id

    def open_tenant(
        self, tenant_root: Path, tenant: str, shared: SharedKeys | None = None
    ) -> TenantCipher:
        """The tenant's cipher: its data key unwrapped (re-wrapped if an old key wrapped it).

        A tenant without a KEY file adopts the one in `shared` (object storage)
        if there is one, else gets a new random data key (published to `shared`).
        """
        path = tenant_root / TENANT_KEY_NAME
        try:
            local: bytes | None = path.read_bytes()
        except FileNotFoundError:
            local = None
        raw = local
        if raw is None and shared is not None:
            raw = shared.read_tenant_key(tenant)
        if raw is None:
            raw = _encode_key_file(self.wrap(tenant, secrets.token_bytes(KEY_BYTES)))
            if shared is not None:
                raw = shared.create_tenant_key(tenant, raw)  # another daemon may have won
        wrapped = parse_key_file(path, raw)
        data_key = self.unwrap(path, tenant, wrapped)
        if wrapped["master_key_id"] != self.key_id:  # rotation
            raw = _encode_key_file(self.wrap(tenant, data_key))
            log.warning(
                "re-wrapped the data key of tenant %r from master key %s to %s",
                tenant, wrapped["master_key_id"], self.key_id,
            )  # fmt: skip
            if shared is not None:
                shared.put_tenant_key(tenant, raw)
        if raw != local:
            write_key_file(path, raw)
        return TenantCipher(tenant, data_key)

    def same_data_key(self, tenant: str, ours: bytes, theirs: bytes) -> bool:
        """Whether two KEY files of a tenant wrap the same data key."""
        where = Path(f"<{tenant} data key>")
        return self.unwrap(where, tenant, parse_key_file(where, ours)) == self.unwrap(
            where, tenant, parse_key_file(where, theirs)
        )

    def wrap(self, tenant: str, data_key: bytes) -> dict[str, object]:
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self.master.key).encrypt(nonce, data_key, _DATA_KEY_AD + tenant.encode())
        return {
            "format": KEY_FILE_FORMAT,
            "algorithm": ALGORITHM,
            "tenant": tenant,
            "master_key_id": self.key_id,
            "nonce": base64.b64encode(nonce).decode(),
            "wrapped_key": base64.b64encode(sealed).decode(),
            "wrapped_at": time.time(),
        }

    def unwrap(self, path: Path, tenant: str, wrapped: dict[str, object]) -> bytes:
        key_id = str(wrapped["master_key_id"])
        master = self._by_id.get(key_id)
        if master is None:
            raise EncryptionKeyError(
                f"the data key of tenant {tenant!r} ({path}) is wrapped by master key "
                f"{key_id}, but the key given is {self.key_id} and no "
                f"encryption_old_key_files entry has that id; start with the key {key_id}",
                metadata={"key_id": key_id},
            )
        try:
            nonce = base64.b64decode(str(wrapped["nonce"]), validate=True)
            sealed = base64.b64decode(str(wrapped["wrapped_key"]), validate=True)
            data_key = AESGCM(master.key).decrypt(nonce, sealed, _DATA_KEY_AD + tenant.encode())
        except (binascii.Error, ValueError, InvalidTag):
            raise DataLossError(
                f"{path} is damaged or belongs to another tenant: it does not unwrap with "
                f"master key {key_id}"
            ) from None
        if len(data_key) != KEY_BYTES:
            raise DataLossError(f"{path} holds a data key of the wrong size")
        return data_key


def parse_key_file(path: Path, raw: bytes) -> dict[str, object]:
    try:
        wrapped = json.loads(raw)
        if wrapped.get("format") != KEY_FILE_FORMAT or wrapped.get("algorithm") != ALGORITHM:
            raise ValueError(f"unknown format {wrapped.get('format')!r}")
        for name in ("master_key_id", "nonce", "wrapped_key"):
            if not isinstance(wrapped.get(name), str):
                raise ValueError(f"{name} is missing")
    except (ValueError, AttributeError) as exc:
        raise DataLossError(f"the data key file {path} is damaged: {exc}") from None
    return dict(wrapped)


def key_file_id(path: Path) -> str:
    """The master key id recorded in a tenant's KEY file."""
    return str(parse_key_file(path, path.read_bytes())["master_key_id"])


def _encode_key_file(wrapped: dict[str, object]) -> bytes:
    return json.dumps(wrapped, indent=1).encode() + b"\n"


def write_key_file(path: Path, raw: bytes) -> None:
    """Replace a KEY file atomically and durably (temp file, fsync, rename, dir fsync)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.write(fd, raw)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def keyring_from_settings(
    key_file: str,
    old_key_files: tuple[str, ...] | list[str],
    environ: dict[str, str],
    data_dir: Path | None = None,
) -> Keyring:
    """The keyring `encryption = on` runs with: the master key from `key_file`, else
    from STRATAD_ENCRYPTION_KEY; the old keys (rotation) from their files."""
    if key_file:
        master = load_master_key(key_file)
    elif environ.get(KEY_ENV):
        master = parse_master_key(environ[KEY_ENV].encode(), KEY_ENV)
    else:
        needed = recorded_key_id(data_dir) if data_dir is not None else None
        hint = f"; the data in {data_dir} needs master key {needed}" if needed else ""
        raise EncryptionKeyError(
            f"encryption = on needs the master key: set encryption_key_file or {KEY_ENV}{hint}"
        )
    return Keyring(master, [load_master_key(path) for path in old_key_files])


def recorded_key_id(data_dir: Path) -> str | None:
    """The master key id a tenant's KEY file in `data_dir` records (None: no KEY file)."""
    tenants = data_dir / "tenants"
    for root in sorted(tenants.iterdir()) if tenants.is_dir() else []:
        path = root / TENANT_KEY_NAME
        if path.is_file():
            with contextlib.suppress(DataLossError, OSError):
                return key_file_id(path)
    return None


def rotate_data_dir(
    data_dir: Path, key_file: str, old_key_files: tuple[str, ...], environ: dict[str, str]
) -> list[tuple[str, str, str]]:
    """Offline rotation (`stratad rotate-key`): re-wrap every tenant's data key with the
    master key of `key_file`; return (tenant, key id before, key id after) for each.

    Takes the data directory's lock, so it never runs beside a daemon.
    """
    from stratad.store.datadir import open_data_dir  # the lock and FORMAT check

    keyring = keyring_from_settings(key_file, old_key_files, environ)
    done = []
    with open_data_dir(data_dir) as opened:
        tenants = opened.path / "tenants"
        for root in sorted(tenants.iterdir()) if tenants.is_dir() else []:
            if not (root / TENANT_KEY_NAME).is_file():
                continue
            before = key_file_id(root / TENANT_KEY_NAME)
            keyring.open_tenant(root, root.name)
            done.append((root.name, before, key_file_id(root / TENANT_KEY_NAME)))
    return done
