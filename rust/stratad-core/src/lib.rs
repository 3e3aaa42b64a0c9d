//! `stratad-core`: the pure-Rust hot paths of stratad.
//!
//! This crate deliberately has no Python dependency: it is tested with plain
//! `cargo test`, and `stratad-py` wraps it as the `stratad._core` extension
//! module (converting types and releasing the GIL, nothing else). The
//! contract every function follows is `docs/native.md`.

pub mod chunking;
pub mod compress;
pub mod delta;
pub mod digest;
pub mod error;
pub mod frame;
pub mod generalize;
pub mod similarity;

pub use chunking::{chunk_boundaries, DEFAULT_AVG_CHUNK, DEFAULT_MAX_CHUNK, DEFAULT_MIN_CHUNK};
pub use compress::{compress, decompress};
pub use delta::{
    decode_delta_frame, encode_delta_frame, encode_delta_frame_always, encode_delta_frame_beside,
    frame_delta_base, with_delta_depth, MAX_DELTA_DEPTH,
};
pub use digest::{common_prefix_len, digest, digest_hex, to_hex, Digester};
pub use error::{Error, Result};
pub use frame::{
    decode_frame, encode_frame, frame_digest, verify_frame, FORMAT_VERSION, FRAME_HEADER_SIZE,
};
pub use generalize::{detect_entity_types, generalize_goal};
pub use similarity::tokenize;
