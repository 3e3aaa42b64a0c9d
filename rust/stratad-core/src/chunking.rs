//! Content-defined chunking with FastCDC (2020 variant, normalization level 1).
//!
//! A growing state keeps most of its bytes from one checkpoint to the next;
//! cutting it where the content says (not at fixed offsets) lets successive
//! checkpoints share almost all chunks, so only new chunks are stored and
//! sent. The cut points are exactly those of the `fastcdc::v2020` crate so
//! that the pure-Python reference in the tests can be held to them.

use fastcdc::v2020::{
    FastCDC, Normalization, AVERAGE_MAX, AVERAGE_MIN, MAXIMUM_MAX, MAXIMUM_MIN, MINIMUM_MAX,
    MINIMUM_MIN,
};

use crate::error::{Error, Result};

/// Default minimum chunk size (see "Chunk size defaults" in docs/native.md).
pub const DEFAULT_MIN_CHUNK: usize = 2048;
/// Default average (target) chunk size.
pub const DEFAULT_AVG_CHUNK: usize = 8192;
/// Default maximum chunk size.
pub const DEFAULT_MAX_CHUNK: usize = 32768;

/// Checks chunk sizes against the crate's limits; the crate itself only
/// `debug_assert`s them (and odd sizes silently shift its cut points).
pub fn validate_sizes(min_size: usize, avg_size: usize, max_size: usize) -> Result<()> {
    let check = |name: &str, value: usize, lo: usize, hi: usize| {
        if value < lo || value > hi {
            Err(Error::invalid(format!(
                "{name} must be in {lo}..={hi}, got {value}"
            )))
        } else if value % 2 != 0 {
            Err(Error::invalid(format!("{name} must be even, got {value}")))
        } else {
            Ok(())
        }
    };
    check("min_size", min_size, MINIMUM_MIN, MINIMUM_MAX)?;
    check("avg_size", avg_size, AVERAGE_MIN, AVERAGE_MAX)?;
    check("max_size", max_size, MAXIMUM_MIN, MAXIMUM_MAX)?;
    if !(min_size <= avg_size && avg_size <= max_size) {
        return Err(Error::invalid(format!(
            "chunk sizes must satisfy min <= avg <= max, got {min_size}/{avg_size}/{max_size}"
        )));
    }
    Ok(())
}

/// FastCDC 2020 cut points of `data` as `(offset, length)` pairs covering
/// `data` in order. Empty input gives no chunks.
pub fn chunk_boundaries(
    data: &[u8],
    min_size: usize,
    avg_size: usize,
    max_size: usize,
) -> Result<Vec<(usize, usize)>> {
    validate_sizes(min_size, avg_size, max_size)?;
    Ok(
        FastCDC::with_level(data, min_size, avg_size, max_size, Normalization::Level1)
            .map(|chunk| (chunk.offset, chunk.length))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random byte stream (xorshift), so tests need
    /// no extra crate.
    pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    fn defaults(data: &[u8]) -> Vec<(usize, usize)> {
        chunk_boundaries(
            data,
            DEFAULT_MIN_CHUNK,
            DEFAULT_AVG_CHUNK,
            DEFAULT_MAX_CHUNK,
        )
        .expect("default sizes are valid")
    }

    #[test]
    fn empty_input_has_no_chunks() {
        assert!(defaults(b"").is_empty());
    }

    #[test]
    fn small_input_is_one_chunk() {
        assert_eq!(defaults(b"hello"), vec![(0, 5)]);
        let data = noise(DEFAULT_MIN_CHUNK, 1);
        assert_eq!(defaults(&data), vec![(0, DEFAULT_MIN_CHUNK)]);
    }

    #[test]
    fn chunks_tile_the_input_within_limits() {
        let data = noise(1 << 20, 7);
        let chunks = defaults(&data);
        assert!(chunks.len() > 10);
        let mut expected_offset = 0;
        for (i, &(offset, length)) in chunks.iter().enumerate() {
            assert_eq!(offset, expected_offset);
            assert!(length <= DEFAULT_MAX_CHUNK);
            if i + 1 < chunks.len() {
                assert!(length >= DEFAULT_MIN_CHUNK);
            }
            expected_offset += length;
        }
        assert_eq!(expected_offset, data.len());
    }

    #[test]
    fn same_as_the_crate_iterator() {
        let data = noise(300_000, 3);
        let ours = chunk_boundaries(&data, 4096, 16384, 65536).expect("valid sizes");
        let theirs: Vec<_> = FastCDC::new(&data, 4096, 16384, 65536)
            .map(|c| (c.offset, c.length))
            .collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn cut_points_are_content_defined() {
        // Inserting bytes at the front only changes the first chunk(s): the
        // later cut points move by exactly the inserted length.
        let data = noise(400_000, 11);
        let mut shifted = b"a few new bytes at the front".to_vec();
        shifted.extend_from_slice(&data);
        let delta = shifted.len() - data.len();
        let before = defaults(&data);
        let after = defaults(&shifted);
        let ends_before: std::collections::HashSet<usize> =
            before.iter().map(|&(o, l)| o + l + delta).collect();
        let shared = after
            .iter()
            .filter(|&&(o, l)| ends_before.contains(&(o + l)))
            .count();
        assert!(shared + 2 >= after.len(), "{shared} of {}", after.len());
    }

    #[test]
    fn all_zero_input_cuts_at_max() {
        let data = vec![0u8; 100_000];
        let chunks = chunk_boundaries(&data, 1024, 4096, 8192).expect("valid sizes");
        assert!(chunks[..chunks.len() - 1].iter().all(|&(_, l)| l == 8192));
    }

    #[test]
    fn sizes_are_validated() {
        for (min, avg, max) in [
            (63, 256, 1024),
            (62, 256, 1024),
            (64, 254, 1024),
            (64, 256, 1022),
            (2 << 20, 4 << 20, 16 << 20),
            (64, 8 << 20, 16 << 20),
            (64, 256, 32 << 20),
            (4096, 2048, 8192),
            (1024, 8192, 4096),
            (1025, 4096, 8192),
            (1024, 4097, 8192),
            (1024, 4096, 8193),
        ] {
            let err = chunk_boundaries(b"x", min, avg, max).unwrap_err();
            assert!(matches!(err, Error::InvalidInput(_)), "{min}/{avg}/{max}");
        }
        assert!(chunk_boundaries(b"x", 64, 256, 1024).is_ok());
        assert!(chunk_boundaries(b"x", 1 << 20, 4 << 20, 16 << 20).is_ok());
        assert!(chunk_boundaries(b"x", 1024, 1024, 1024).is_ok());
    }
}
