"""Checkpoint manifests: the ordered list of chunks a state is made of.

A state of more than one chunk is stored as a manifest object listing its
chunks (32-byte BLAKE3 digest + u32 length each, "entries"). Successive
checkpoints of a growing state share almost all of their chunks, and so almost
all of their manifest: a manifest may therefore be a *delta* naming a base
manifest, how many of the base's leading entries it keeps, and the entries it
adds. Without deltas the manifests alone of a 2,000-step conversation would
outweigh its chunks. Chains are bounded (MAX_DEPTH) so a read resolves at most
MAX_DEPTH small objects, and resolved manifests are cached.

Manifest content (before framing)::

    b"SMF1", u8 kind (0 full, 1 delta), u8 depth, u16 reserved (0)
    delta only: 32-byte base manifest digest, u32 LE keep
    u32 LE count, count * (32-byte digest, u32 LE length)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from stratad.errors import CorruptObjectError

MAGIC = b"SMF1"
ENTRY = struct.Struct("<32sI")
_HEAD = struct.Struct("<4sBBH")
_DELTA = struct.Struct("<32sI")
_COUNT = struct.Struct("<I")
FULL, DELTA = 0, 1
#: Longest chain of deltas before a full manifest is written again.
MAX_DEPTH = 32


@dataclass(frozen=True)
class Manifest:
    kind: int
    depth: int
    base: str  # hex digest of the base manifest ("" for a full manifest)
    keep: int
    added: bytes  # entries blob


def entries_blob(chunks: Sequence[tuple[str, int]]) -> bytes:
    """Pack (hex digest, length) pairs into an entries blob."""
    return b"".join(ENTRY.pack(bytes.fromhex(d), n) for d, n in chunks)


def iter_entries(blob: bytes) -> Iterator[tuple[str, int]]:
    for raw, length in ENTRY.iter_unpack(blob):
        yield raw.hex(), length


def entry_digest(blob: bytes, index: int) -> str:
    """The hex digest of entry `index` of a blob."""
    start = index * ENTRY.size
    return blob[start : start + 32].hex()


def entry_count(blob: bytes) -> int:
    return len(blob) // ENTRY.size


def total_length(blob: bytes) -> int:
    return sum(length for _, length in ENTRY.iter_unpack(blob))


def common_prefix(a: bytes, b: bytes) -> int:
    """Number of leading entries two blobs share."""
    n = min(len(a), len(b)) // ENTRY.size
    if a[: n * ENTRY.size] == b[: n * ENTRY.size]:
        return n
    lo, hi = 0, n  # binary search on the longest equal prefix
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[: mid * ENTRY.size] == b[: mid * ENTRY.size]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def encode(entries: bytes, base: tuple[str, bytes, int] | None = None) -> bytes:
    """Encode `entries`, as a delta on `base` = (digest, entries, depth) when it pays."""
    if base is not None:
        base_digest, base_entries, base_depth = base
        keep = common_prefix(entries, base_entries)
        if base_depth < MAX_DEPTH and keep * 2 >= entry_count(entries):
            added = entries[keep * ENTRY.size :]
            return b"".join(
                (
                    _HEAD.pack(MAGIC, DELTA, base_depth + 1, 0),
                    _DELTA.pack(bytes.fromhex(base_digest), keep),
                    _COUNT.pack(entry_count(added)),
                    added,
                )
            )
    return _HEAD.pack(MAGIC, FULL, 0, 0) + _COUNT.pack(entry_count(entries)) + entries


def decode(content: bytes) -> Manifest:
    try:
        magic, kind, depth, reserved = _HEAD.unpack_from(content, 0)
        pos = _HEAD.size
        base, keep = "", 0
        if magic != MAGIC or reserved or kind not in (FULL, DELTA):
            raise ValueError("bad manifest header")
        if kind == DELTA:
            raw_base, keep = _DELTA.unpack_from(content, pos)
            base = raw_base.hex()
            pos += _DELTA.size
        (count,) = _COUNT.unpack_from(content, pos)
        pos += _COUNT.size
        added = content[pos:]
        if len(added) != count * ENTRY.size:
            raise ValueError("manifest entry count does not match its size")
    except (struct.error, ValueError) as exc:
        raise CorruptObjectError(f"malformed manifest: {exc}") from exc
    return Manifest(kind, depth, base, keep, added)


def references(content: bytes) -> Iterator[str]:
    """Every object a manifest refers to (its base and its added chunks): for GC."""
    m = decode(content)
    if m.base:
        yield m.base
    for digest, _ in iter_entries(m.added):
        yield digest
