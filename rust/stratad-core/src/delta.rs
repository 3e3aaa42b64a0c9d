//! Delta frames: an object stored as the difference to another object.
//!
//! A checkpoint of a growing state rewrites its last chunk on every save:
//! the new chunk is the old one plus a little. Framed on its own it costs
//! its whole compressed size again; compressed with the chunk it replaces as
//! zstd's prefix (a raw-content dictionary) it costs about what was added.
//!
//! A delta frame is an ordinary frame (same 52-byte checked header: codec
//! [`CODEC_ZSTD_DELTA`], the length and BLAKE3 digest of the *decoded* data)
//! whose payload is
//!
//! ```text
//! 32-byte BLAKE3 digest of the base's data | u8 depth | zstd frame (base as prefix)
//! ```
//!
//! `depth` is 1 + the base's depth (a plain frame has depth 0). Chains are
//! bounded by [`MAX_DELTA_DEPTH`] so that reading an object decodes at most
//! that many frames. Decoding needs the base's data; the result is checked
//! against the header's digest like any frame, so a wrong or damaged base
//! can only fail, never produce other data.

use zstd::zstd_safe::{self, DCtx};

use crate::compress::{
    buffer_with_capacity, decompress_exact, set_frame_parameters, validate_level, with_cctx,
    zstd_error_name,
};
use crate::digest::{digest, DIGEST_SIZE};
use crate::error::{Error, Result};
use crate::frame::{
    check_single_zstd_frame, encode_frame, parse_header, write_header, CODEC_ZSTD_DELTA,
    FRAME_HEADER_SIZE,
};

/// Longest chain of delta frames: a base at this depth gets a plain frame.
pub const MAX_DELTA_DEPTH: u8 = 16;
/// Bytes of the delta payload before its zstd frame (base digest + depth).
pub const DELTA_PREFIX_SIZE: usize = DIGEST_SIZE + 1;

/// Frames `data` as a delta on `base` (whose own delta depth is `base_depth`)
/// when that is smaller than framing it alone; otherwise the plain frame.
///
/// A base at [`MAX_DELTA_DEPTH`] or beyond gives the plain frame too.
pub fn encode_delta_frame(data: &[u8], base: &[u8], base_depth: u8, level: i32) -> Result<Vec<u8>> {
    encode_delta_frame_beside(data, base, base_depth, level, None)
}

/// [`encode_delta_frame`] for a caller that already holds `data`'s plain
/// frame (an uploaded, verified one): it is compared with, and returned when
/// no delta is smaller, instead of compressing `data` a second time. It is
/// not re-checked.
pub fn encode_delta_frame_beside(
    data: &[u8],
    base: &[u8],
    base_depth: u8,
    level: i32,
    plain: Option<&[u8]>,
) -> Result<Vec<u8>> {
    let plain = match plain {
        Some(frame) => std::borrow::Cow::Borrowed(frame),
        None => std::borrow::Cow::Owned(encode_frame(data, level)?),
    };
    if base_depth >= MAX_DELTA_DEPTH || base.is_empty() || data.is_empty() {
        return Ok(plain.into_owned());
    }
    let delta = delta_frame(data, base, base_depth, level)?;
    if delta.len() >= plain.len() {
        return Ok(plain.into_owned());
    }
    Ok(delta)
}

/// The delta frame of `data` on `base`, whatever its size: for a sender that
/// compresses a rewritten chunk once, against the chunk it replaces, where
/// [`encode_delta_frame`] also makes the plain frame to compare with (a delta
/// on the chunk a grown one started from is smaller but for a few bytes).
///
/// Errors (`InvalidInput`) when `base_depth` is [`MAX_DELTA_DEPTH`] or beyond,
/// or `data` or `base` is empty.
pub fn encode_delta_frame_always(
    data: &[u8],
    base: &[u8],
    base_depth: u8,
    level: i32,
) -> Result<Vec<u8>> {
    if base_depth >= MAX_DELTA_DEPTH {
        return Err(Error::invalid(format!(
            "a base at depth {base_depth} takes no delta (at most {})",
            MAX_DELTA_DEPTH - 1
        )));
    }
    if base.is_empty() || data.is_empty() {
        return Err(Error::invalid("a delta needs non-empty data and base"));
    }
    delta_frame(data, base, base_depth, level)
}

/// `frame`, a delta frame, with its depth set to `depth` (1 to
/// [`MAX_DELTA_DEPTH`]). The depth is the receiver's to know (its base's own
/// depth + 1), not the sender's; it is outside what the frame's digest covers
/// (the decoded data), so setting it changes nothing the frame decodes to.
pub fn with_delta_depth(frame: &[u8], depth: u8) -> Result<Vec<u8>> {
    if depth == 0 || depth > MAX_DELTA_DEPTH {
        return Err(Error::invalid(format!(
            "a delta depth is 1 to {MAX_DELTA_DEPTH}, not {depth}"
        )));
    }
    if frame_delta_base(frame)?.is_none() {
        return Err(Error::invalid("not a delta frame"));
    }
    let mut out = frame.to_vec();
    out[FRAME_HEADER_SIZE + DIGEST_SIZE] = depth;
    Ok(out)
}

fn delta_frame(data: &[u8], base: &[u8], base_depth: u8, level: i32) -> Result<Vec<u8>> {
    let packed = compress_with_prefix(data, base, level)?;
    let mut out = Vec::with_capacity(FRAME_HEADER_SIZE + DELTA_PREFIX_SIZE + packed.len());
    write_header(&mut out, CODEC_ZSTD_DELTA, data.len() as u64, &digest(data));
    out.extend_from_slice(&digest(base));
    out.push(base_depth + 1);
    out.extend_from_slice(&packed);
    Ok(out)
}

/// The base a frame is a delta on, as (digest, depth of this frame); `None`
/// for a plain frame. Checks the header, not the payload.
pub fn frame_delta_base(frame: &[u8]) -> Result<Option<([u8; DIGEST_SIZE], u8)>> {
    let header = parse_header(frame)?;
    if header.codec != CODEC_ZSTD_DELTA {
        return Ok(None);
    }
    let prefix = frame
        .get(FRAME_HEADER_SIZE..FRAME_HEADER_SIZE + DELTA_PREFIX_SIZE)
        .ok_or_else(|| Error::corrupt("delta frame too short for its base"))?;
    let mut base = [0u8; DIGEST_SIZE];
    base.copy_from_slice(&prefix[..DIGEST_SIZE]);
    let depth = prefix[DIGEST_SIZE];
    if depth == 0 || depth > MAX_DELTA_DEPTH {
        return Err(Error::corrupt(format!(
            "delta frame of impossible depth {depth}"
        )));
    }
    Ok(Some((base, depth)))
}

/// Decodes a delta frame given its base's data: checks the header, that
/// `base` is the base the frame names, the sizes and the result's digest.
pub fn decode_delta_frame(frame: &[u8], base: &[u8], max_size: u64) -> Result<Vec<u8>> {
    let header = parse_header(frame)?;
    let (base_digest, _) = frame_delta_base(frame)?
        .ok_or_else(|| Error::invalid("not a delta frame (decode it with decode_frame)"))?;
    if header.length > max_size {
        return Err(Error::TooLarge { limit: max_size });
    }
    if digest(base) != base_digest {
        return Err(Error::corrupt("delta frame decoded against the wrong base"));
    }
    let payload = &frame[FRAME_HEADER_SIZE + DELTA_PREFIX_SIZE..];
    check_single_zstd_frame(payload)?;
    let size = usize::try_from(header.length).map_err(|_| Error::TooLarge { limit: max_size })?;
    let data = decompress_with_prefix(payload, base, size, max_size)?;
    if digest(&data) != header.digest {
        return Err(Error::corrupt("frame digest mismatch"));
    }
    Ok(data)
}

fn zstd_internal(code: usize) -> Error {
    Error::Internal(format!("zstd: {}", zstd_error_name(code)))
}

/// One zstd frame of `data` compressed with `prefix` as raw-content
/// dictionary. A prefix is never parsed as a trained dictionary, whatever
/// its first bytes are.
fn compress_with_prefix(data: &[u8], prefix: &[u8], level: i32) -> Result<Vec<u8>> {
    validate_level(level)?;
    with_cctx(|cctx| {
        set_frame_parameters(cctx, level)?;
        // SAFETY: zstd reads a referenced prefix only while it compresses the
        // next frame, which `compress2` does whole before returning; the
        // session is reset right after (and `with_cctx` resets it again before
        // any later use), so the reference never outlives this call.
        let prefix: &'static [u8] =
            unsafe { std::slice::from_raw_parts(prefix.as_ptr(), prefix.len()) };
        cctx.ref_prefix(prefix).map_err(zstd_internal)?;
        let mut out = Vec::with_capacity(zstd_safe::compress_bound(data.len()));
        let done = cctx.compress2(&mut out, data).map_err(zstd_internal);
        let _ = cctx.reset(zstd_safe::ResetDirective::SessionOnly);
        done.map(|_| out)
    })
}

/// The first bytes of a trained zstd dictionary (`ZSTD_MAGIC_DICTIONARY`).
const DICTIONARY_MAGIC: [u8; 4] = 0xEC30_A437u32.to_le_bytes();

/// Decodes a zstd frame made by [`compress_with_prefix`] into exactly `size` bytes.
///
/// zstd's one-shot dictionary call (on the thread's reused context) takes a
/// buffer as raw content, which is what a prefix is, unless it starts with
/// the dictionary magic: such a base goes through a context of its own with
/// `refPrefix`, which never parses it.
fn decompress_with_prefix(
    payload: &[u8],
    prefix: &[u8],
    size: usize,
    limit: u64,
) -> Result<Vec<u8>> {
    if !prefix.starts_with(&DICTIONARY_MAGIC) {
        return decompress_exact(payload, size, Some(prefix), limit);
    }
    let mut out = buffer_with_capacity(size, limit)?;
    let mut dctx =
        DCtx::try_create().ok_or_else(|| Error::Internal("cannot create a zstd context".into()))?;
    dctx.ref_prefix(prefix)
        .map_err(|code| Error::corrupt(format!("zstd: {}", zstd_error_name(code))))?;
    let written = dctx
        .decompress(&mut out, payload)
        .map_err(|code| Error::corrupt(format!("zstd: {}", zstd_error_name(code))))?;
    if written != size {
        return Err(Error::corrupt(format!(
            "zstd frame decoded to {written} bytes, declared {size}"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_frame, frame_digest, verify_frame, CODEC_ZSTD};

    fn conversation(messages: usize) -> Vec<u8> {
        let words = [
            "agent ",
            "search ",
            "revenue ",
            "table ",
            "retries ",
            "notes ",
            "the ",
            "user ",
            "asked ",
            "about ",
            "quarterly ",
            "figures ",
            "tool ",
            "because ",
            "timeouts ",
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut out = b"{\"messages\":[".to_vec();
        for _ in 0..messages {
            out.extend_from_slice(b"{\"content\":\"");
            for _ in 0..80 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                out.extend_from_slice(words[(state % words.len() as u64) as usize].as_bytes());
            }
            out.extend_from_slice(b"\"},");
        }
        out.extend_from_slice(format!("],\"step\":{messages}}}").as_bytes());
        out
    }

    #[test]
    fn a_grown_chunk_costs_about_what_was_added() {
        let old = conversation(10);
        let new = conversation(11);
        let plain = encode_frame(&new, 3).expect("plain");
        let delta = encode_delta_frame(&new, &old, 0, 3).expect("delta");
        assert_eq!(delta[5], CODEC_ZSTD_DELTA);
        assert!(
            delta.len() * 3 < plain.len(),
            "{} vs {}",
            delta.len(),
            plain.len()
        );
        assert_eq!(
            decode_delta_frame(&delta, &old, u64::MAX).expect("decode"),
            new
        );
        assert_eq!(frame_digest(&delta).expect("digest"), digest(&new));
        assert_eq!(
            frame_delta_base(&delta).expect("base"),
            Some((digest(&old), 1))
        );
        assert_eq!(frame_delta_base(&plain).expect("base"), None);
    }

    #[test]
    fn plain_frame_when_the_delta_does_not_pay_or_the_chain_is_full() {
        let new = conversation(3);
        let unrelated: Vec<u8> = (0..4000u32).map(|i| (i * 7919 % 251) as u8).collect();
        for (base, depth) in [
            (&unrelated[..], 0),
            (&conversation(2)[..], MAX_DELTA_DEPTH),
            (&[][..], 0),
        ] {
            let frame = encode_delta_frame(&new, base, depth, 3).expect("encode");
            assert_eq!(frame[5], CODEC_ZSTD, "depth {depth}");
            assert_eq!(decode_frame(&frame, u64::MAX).expect("decode"), new);
        }
        let deep =
            encode_delta_frame(&new, &conversation(2), MAX_DELTA_DEPTH - 1, 3).expect("encode");
        assert_eq!(
            frame_delta_base(&deep).expect("base").map(|b| b.1),
            Some(MAX_DELTA_DEPTH)
        );
    }

    #[test]
    fn an_always_delta_decodes_and_takes_the_receivers_depth() {
        let old = conversation(10);
        let new = conversation(11);
        let delta = encode_delta_frame_always(&new, &old, 0, 3).expect("delta");
        assert_eq!(
            delta,
            encode_delta_frame(&new, &old, 0, 3).expect("smaller one")
        );
        let deeper = with_delta_depth(&delta, 7).expect("depth");
        assert_eq!(
            frame_delta_base(&deeper).expect("base"),
            Some((digest(&old), 7))
        );
        assert_eq!(
            decode_delta_frame(&deeper, &old, u64::MAX).expect("decode"),
            new
        );
        // Unrelated data still gets a delta frame (larger than plain, never wrong).
        let unrelated: Vec<u8> = (0..4000u32).map(|i| (i * 7919 % 251) as u8).collect();
        let forced = encode_delta_frame_always(&unrelated, &old, 2, 3).expect("forced");
        assert_eq!(
            frame_delta_base(&forced).expect("base").map(|b| b.1),
            Some(3)
        );
        assert_eq!(
            decode_delta_frame(&forced, &old, u64::MAX).expect("decode"),
            unrelated
        );
        for (base, depth) in [(&old[..], MAX_DELTA_DEPTH), (&[][..], 0)] {
            assert!(matches!(
                encode_delta_frame_always(&new, base, depth, 3),
                Err(Error::InvalidInput(_))
            ));
        }
        let plain = encode_frame(&new, 3).expect("plain");
        for (frame, depth) in [(&delta, 0), (&delta, MAX_DELTA_DEPTH + 1), (&plain, 1)] {
            assert!(matches!(
                with_delta_depth(frame, depth),
                Err(Error::InvalidInput(_))
            ));
        }
    }

    #[test]
    fn the_wrong_base_or_no_base_never_yields_data() {
        let old = conversation(10);
        let new = conversation(11);
        let delta = encode_delta_frame(&new, &old, 0, 3).expect("delta");
        let mut other = old.clone();
        other[20] ^= 1;
        assert!(matches!(
            decode_delta_frame(&delta, &other, u64::MAX),
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(
            decode_frame(&delta, u64::MAX),
            Err(Error::Corrupt(_))
        ));
        assert!(matches!(
            verify_frame(&delta, u64::MAX),
            Err(Error::Corrupt(_))
        ));
        let plain = encode_frame(&new, 3).expect("plain");
        assert!(matches!(
            decode_delta_frame(&plain, &old, u64::MAX),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            decode_delta_frame(&delta, &old, new.len() as u64 - 1),
            Err(Error::TooLarge { .. })
        ));
    }

    #[test]
    fn every_corrupted_byte_fails() {
        let old = conversation(6);
        let new = conversation(7);
        let delta = encode_delta_frame(&new, &old, 3, 3).expect("delta");
        for position in 0..delta.len() {
            let mut bad = delta.clone();
            bad[position] ^= 0xFF;
            match decode_delta_frame(&bad, &old, u64::MAX) {
                Err(Error::Corrupt(_)) => {}
                Ok(data) if position >= FRAME_HEADER_SIZE + DELTA_PREFIX_SIZE => {
                    assert_eq!(data, new, "byte {position}")
                }
                other => panic!("byte {position}: {other:?}"),
            }
        }
        for cut in 0..delta.len() {
            assert!(
                decode_delta_frame(&delta[..cut], &old, u64::MAX).is_err(),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn the_reused_context_forgets_each_base_after_its_frame() {
        // Deltas share the thread's compression context with plain frames:
        // a base must never carry over into the next frame made on it.
        let states: Vec<Vec<u8>> = (5..12).map(conversation).collect();
        let elsewhere = conversation(3);
        for pair in states.windows(2) {
            let (old, new) = (&pair[0], &pair[1]);
            let delta = encode_delta_frame(new, old, 0, 3).expect("delta");
            assert_eq!(
                decode_delta_frame(&delta, old, u64::MAX).expect("decodes"),
                *new
            );
            // A plain frame made next decodes without any base.
            let plain = encode_frame(new, 3).expect("plain");
            assert_eq!(decode_frame(&plain, u64::MAX).expect("plain decodes"), *new);
            // And a delta on another base needs that base, not the last one.
            let other = encode_delta_frame(new, &elsewhere, 0, 3).expect("delta");
            assert!(decode_delta_frame(&other, old, u64::MAX).is_err());
            assert_eq!(
                decode_delta_frame(&other, &elsewhere, u64::MAX).expect("ok"),
                *new
            );
        }
    }

    #[test]
    fn a_base_that_looks_like_a_trained_dictionary_is_still_raw_content() {
        // zstd's dictionary magic first: a loader that guessed would misparse it.
        let mut old = vec![0x37, 0xA4, 0x30, 0xEC];
        old.extend_from_slice(&conversation(5));
        let mut new = old.clone();
        new.extend_from_slice(&conversation(1));
        let delta = encode_delta_frame(&new, &old, 0, 3).expect("delta");
        assert_eq!(delta[5], CODEC_ZSTD_DELTA);
        assert_eq!(
            decode_delta_frame(&delta, &old, u64::MAX).expect("decode"),
            new
        );
    }
}
