//! `prepare_chunks`: the save path's hot loop in one call.
//!
//! Cutting, hashing and framing every chunk of a state in Rust, with one
//! zstd context reused for all chunks, means the Python side makes one call
//! (with the GIL released) per save instead of several per chunk.

use crate::chunking::chunk_boundaries;
use crate::digest::{digest, DIGEST_SIZE};
use crate::error::Result;
use crate::frame::FrameEncoder;

/// One chunk of a state, ready to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedChunk {
    /// BLAKE3 digest of the chunk's bytes (the object name).
    pub digest: [u8; DIGEST_SIZE],
    /// Offset of the chunk in the input.
    pub offset: usize,
    /// Length of the chunk.
    pub length: usize,
    /// The chunk's object frame (see `frame.rs`).
    pub frame: Vec<u8>,
}

/// Cuts `data` with FastCDC, then digests and frames every chunk.
pub fn prepare_chunks(
    data: &[u8],
    level: i32,
    min_size: usize,
    avg_size: usize,
    max_size: usize,
) -> Result<Vec<PreparedChunk>> {
    let boundaries = chunk_boundaries(data, min_size, avg_size, max_size)?;
    let mut encoder = FrameEncoder::new(level)?;
    boundaries
        .into_iter()
        .map(|(offset, length)| {
            let bytes = &data[offset..offset + length];
            Ok(PreparedChunk {
                digest: digest(bytes),
                offset,
                length,
                frame: encoder.encode(bytes)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::frame::{decode_frame, frame_digest};

    fn state(messages: usize) -> Vec<u8> {
        let mut out = String::from("{\"messages\":[");
        for i in 0..messages {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&format!(
                "{{\"role\":\"user\",\"content\":\"message {i} about revenue {} and tables\"}}",
                i * 7919 % 10007
            ));
        }
        out.push_str("]}");
        out.into_bytes()
    }

    #[test]
    fn chunks_cover_the_input_and_decode_back() {
        let data = state(3000);
        let chunks = prepare_chunks(&data, 3, 2048, 8192, 32768).expect("prepare");
        assert!(chunks.len() > 5);
        let boundaries = chunk_boundaries(&data, 2048, 8192, 32768).expect("cut");
        assert_eq!(
            chunks
                .iter()
                .map(|c| (c.offset, c.length))
                .collect::<Vec<_>>(),
            boundaries
        );
        let mut rebuilt = Vec::new();
        for chunk in &chunks {
            let bytes = &data[chunk.offset..chunk.offset + chunk.length];
            assert_eq!(chunk.digest, digest(bytes));
            assert_eq!(frame_digest(&chunk.frame).expect("header"), chunk.digest);
            rebuilt.extend(decode_frame(&chunk.frame, chunk.length as u64).expect("decode"));
        }
        assert_eq!(rebuilt, data);
    }

    #[test]
    fn growing_state_shares_chunks() {
        let old = prepare_chunks(&state(2000), 3, 2048, 8192, 32768).expect("prepare");
        let new = prepare_chunks(&state(2010), 3, 2048, 8192, 32768).expect("prepare");
        let old_digests: std::collections::HashSet<_> = old.iter().map(|c| c.digest).collect();
        let fresh = new
            .iter()
            .filter(|c| !old_digests.contains(&c.digest))
            .count();
        assert!(fresh <= 3, "{fresh} new chunks of {}", new.len());
    }

    #[test]
    fn empty_input_and_bad_arguments() {
        assert!(prepare_chunks(b"", 3, 2048, 8192, 32768)
            .expect("empty")
            .is_empty());
        assert!(matches!(
            prepare_chunks(b"abc", 3, 2047, 8192, 32768),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            prepare_chunks(b"abc", 99, 2048, 8192, 32768),
            Err(Error::InvalidInput(_))
        ));
    }
}
