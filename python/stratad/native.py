"""The native core of stratad: the only module that imports `stratad._core`.

Everything else imports the hot paths (digests, chunking, zstd, object
frames, Jaccard matching, goal generalization) from here. The contract is
docs/native.md; the extension raises the exception classes of
`stratad.errors`.
"""

from __future__ import annotations

from stratad._core import (
    DEFAULT_AVG_CHUNK,
    DEFAULT_MAX_CHUNK,
    DEFAULT_MIN_CHUNK,
    FORMAT_VERSION,
    FRAME_HEADER_SIZE,
    CrystalIndex,
    JaccardIndex,
    PreparedChunk,
    chunk_boundaries,
    compress,
    decode_frame,
    decompress,
    detect_entity_types,
    digest,
    digest_hex,
    encode_frame,
    frame_digest_hex,
    generalize_goal,
    jaccard,
    prepare_chunks,
    tokenize,
    top_k,
    train_dictionary,
    verify_frame,
)

__all__ = [
    "DEFAULT_AVG_CHUNK",
    "DEFAULT_MAX_CHUNK",
    "DEFAULT_MIN_CHUNK",
    "FORMAT_VERSION",
    "FRAME_HEADER_SIZE",
    "CrystalIndex",
    "JaccardIndex",
    "PreparedChunk",
    "chunk_boundaries",
    "compress",
    "decode_frame",
    "decompress",
    "detect_entity_types",
    "digest",
    "digest_hex",
    "encode_frame",
    "frame_digest_hex",
    "generalize_goal",
    "jaccard",
    "prepare_chunks",
    "tokenize",
    "top_k",
    "train_dictionary",
    "verify_frame",
]
