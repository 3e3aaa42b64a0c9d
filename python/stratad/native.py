"""The native core of stratad: the only module that imports `stratad._core`.

Everything else imports the hot paths (digests, chunking, zstd, object
frames, the crystal index's Jaccard matching, goal generalization) and the
native gRPC front door (`NativeFront`, used by server/front.py) and the SDK's
native unary client (`NativeChannel`, used by sdk/native.py) from here. The
contract is docs/native.md; the extension raises the exception classes of
`stratad.errors`.
"""

from __future__ import annotations

import struct

from stratad._core import (
    DEFAULT_AVG_CHUNK,
    DEFAULT_MAX_CHUNK,
    DEFAULT_MIN_CHUNK,
    FORMAT_VERSION,
    FRAME_HEADER_SIZE,
    MAX_DELTA_DEPTH,
    CrystalIndex,
    Digester,
    FrontCall,
    NativeChannel,
    NativeFront,
    chunk_boundaries,
    common_prefix_length,
    compress,
    decode_delta_frame,
    decode_frame,
    decompress,
    detect_entity_types,
    digest_hex,
    encode_delta_frame,
    encode_delta_frame_always,
    encode_frame,
    frame_delta_base,
    frame_digest_hex,
    generalize_goal,
    tokenize,
    verify_frame,
    with_delta_depth,
)

__all__ = [
    "DEFAULT_AVG_CHUNK",
    "DEFAULT_MAX_CHUNK",
    "DEFAULT_MIN_CHUNK",
    "FORMAT_VERSION",
    "FRAME_HEADER_SIZE",
    "MAX_DELTA_DEPTH",
    "CrystalIndex",
    "Digester",
    "FrontCall",
    "NativeChannel",
    "NativeFront",
    "chunk_boundaries",
    "common_prefix_length",
    "compress",
    "decode_delta_frame",
    "decode_frame",
    "decompress",
    "detect_entity_types",
    "digest_hex",
    "encode_delta_frame",
    "encode_delta_frame_always",
    "encode_frame",
    "frame_delta_base",
    "frame_digest_hex",
    "frame_length",
    "generalize_goal",
    "tokenize",
    "verify_frame",
    "with_delta_depth",
]

_LENGTH = struct.Struct("<Q")
#: Where a frame header records the uncompressed length (docs/native.md).
_LENGTH_OFFSET = 8


def frame_length(frame: bytes) -> int:
    """The uncompressed length a frame's header records, after checking the header.

    Costs a header check, not a decompression: what a server needs to refuse
    a small upload that claims to expand to gigabytes before doing any work.
    """
    frame_digest_hex(frame)  # raises CorruptObjectError on a bad header
    return int(_LENGTH.unpack_from(frame, _LENGTH_OFFSET)[0])
