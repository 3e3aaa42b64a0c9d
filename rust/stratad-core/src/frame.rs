//! The object frame: how every stored object and chunk is laid out on disk
//! and on the wire (format version 1, see docs/native.md).
//!
//! The frame carries the BLAKE3 digest of the uncompressed bytes and a check
//! of its own header, so that decoding either returns exactly the bytes that
//! were framed or fails with `Corrupt`: a flipped bit in the header is never
//! misread (for example as a huge length), and whatever happens to the
//! payload, data is returned only when it has the recorded digest.

use zstd::zstd_safe;

use crate::compress::{
    decompress_exact, set_frame_parameters, validate_level, with_cctx, zstd_error_name,
};
use crate::digest::{digest, DIGEST_SIZE};
use crate::error::{Error, Result};

/// The four magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"STRD";
/// The frame format version this code writes and reads.
pub const FORMAT_VERSION: u8 = 1;
/// Size of the frame header; the payload starts here.
pub const FRAME_HEADER_SIZE: usize = 52;
/// Codec byte: the payload is the data itself.
pub const CODEC_RAW: u8 = 0;
/// Codec byte: the payload is one zstd frame.
pub const CODEC_ZSTD: u8 = 1;
/// Codec byte: the payload is a delta on a base object (see `delta.rs`).
pub const CODEC_ZSTD_DELTA: u8 = 2;
const CHECKED_LEN: usize = 48;
const CHECK_SIZE: usize = 4;

/// The parsed, checked header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// `CODEC_RAW`, `CODEC_ZSTD` or `CODEC_ZSTD_DELTA`.
    pub codec: u8,
    /// Length of the uncompressed data.
    pub length: u64,
    /// BLAKE3 digest of the uncompressed data.
    pub digest: [u8; DIGEST_SIZE],
}

fn header_check(first_48: &[u8]) -> [u8; CHECK_SIZE] {
    let hash = blake3::hash(first_48);
    let mut check = [0u8; CHECK_SIZE];
    check.copy_from_slice(&hash.as_bytes()[..CHECK_SIZE]);
    check
}

pub(crate) fn write_header(out: &mut Vec<u8>, codec: u8, length: u64, digest: &[u8; DIGEST_SIZE]) {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.push(FORMAT_VERSION);
    out.push(codec);
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(digest);
    let check = header_check(&out[start..start + CHECKED_LEN]);
    out.extend_from_slice(&check);
}

/// Parses and checks the 52-byte header (not the payload).
pub fn parse_header(frame: &[u8]) -> Result<FrameHeader> {
    let header = frame
        .get(..FRAME_HEADER_SIZE)
        .ok_or_else(|| Error::corrupt(format!("frame of {} bytes is too short", frame.len())))?;
    if header[..4] != MAGIC {
        return Err(Error::corrupt("not a stratad frame (bad magic)"));
    }
    if header_check(&header[..CHECKED_LEN])[..] != header[CHECKED_LEN..FRAME_HEADER_SIZE] {
        return Err(Error::corrupt("frame header check mismatch"));
    }
    if header[4] != FORMAT_VERSION {
        return Err(Error::corrupt(format!(
            "unsupported frame format version {}",
            header[4]
        )));
    }
    let codec = header[5];
    if codec != CODEC_RAW && codec != CODEC_ZSTD && codec != CODEC_ZSTD_DELTA {
        return Err(Error::corrupt(format!("unknown frame codec {codec}")));
    }
    if header[6..8] != [0, 0] {
        return Err(Error::corrupt("unknown frame flags"));
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&header[8..16]);
    let mut digest = [0u8; DIGEST_SIZE];
    digest.copy_from_slice(&header[16..CHECKED_LEN]);
    Ok(FrameHeader {
        codec,
        length: u64::from_le_bytes(length),
        digest,
    })
}

/// Encodes frames at one level, with the thread's reused zstd context.
pub struct FrameEncoder {
    level: i32,
}

impl FrameEncoder {
    /// An encoder compressing at `level` (zstd's range).
    pub fn new(level: i32) -> Result<Self> {
        validate_level(level)?;
        Ok(Self { level })
    }

    /// Frames `data`: codec zstd when that is smaller than `data`, else raw.
    pub fn encode(&mut self, data: &[u8]) -> Result<Vec<u8>> {
        let digest = digest(data);
        let compressed = self.compress_smaller(data)?;
        let payload_len = compressed.as_ref().map_or(data.len(), Vec::len);
        let mut out = Vec::with_capacity(FRAME_HEADER_SIZE + payload_len);
        match compressed {
            Some(payload) => {
                write_header(&mut out, CODEC_ZSTD, data.len() as u64, &digest);
                out.extend_from_slice(&payload);
            }
            None => {
                write_header(&mut out, CODEC_RAW, data.len() as u64, &digest);
                out.extend_from_slice(data);
            }
        }
        Ok(out)
    }

    /// The zstd frame of `data` if it is strictly smaller than `data`.
    fn compress_smaller(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>> {
        if data.is_empty() {
            return Ok(None);
        }
        let internal = |code: usize| Error::Internal(format!("zstd: {}", zstd_error_name(code)));
        let level = self.level;
        with_cctx(|cctx| {
            set_frame_parameters(cctx, level)?;
            // Full room: zstd may need more space while compressing than the
            // frame it finally writes (a tighter buffer can fail spuriously).
            let mut out = Vec::with_capacity(zstd_safe::compress_bound(data.len()));
            cctx.compress2(&mut out, data).map_err(internal)?;
            Ok((out.len() < data.len()).then_some(out))
        })
    }
}

/// Frames `data` (see [`FrameEncoder::encode`]).
pub fn encode_frame(data: &[u8], level: i32) -> Result<Vec<u8>> {
    FrameEncoder::new(level)?.encode(data)
}

/// The error for a delta frame (or any other codec) given to a decoder that
/// has no base: to it, the frame is undecodable (`Corrupt`), as an unknown
/// codec would be.
fn needs_base() -> Error {
    Error::corrupt("a delta frame cannot be decoded without its base (decode_delta_frame)")
}

/// Checks a frame completely and returns its header and decoded data.
fn decode(frame: &[u8], max_size: u64) -> Result<(FrameHeader, Vec<u8>)> {
    let header = parse_header(frame)?;
    if header.length > max_size {
        return Err(Error::TooLarge { limit: max_size });
    }
    let payload = &frame[FRAME_HEADER_SIZE..];
    let data = match header.codec {
        CODEC_RAW => {
            if payload.len() as u64 != header.length {
                return Err(Error::corrupt(format!(
                    "raw payload of {} bytes, header says {}",
                    payload.len(),
                    header.length
                )));
            }
            payload.to_vec()
        }
        CODEC_ZSTD => decode_zstd_payload(payload, header.length, max_size)?,
        _ => return Err(needs_base()),
    };
    if digest(&data) != header.digest {
        return Err(Error::corrupt("frame digest mismatch"));
    }
    Ok((header, data))
}

/// `Corrupt` unless `payload` is exactly one complete zstd frame.
pub(crate) fn check_single_zstd_frame(payload: &[u8]) -> Result<()> {
    match zstd_safe::find_frame_compressed_size(payload) {
        Ok(size) if size == payload.len() => Ok(()),
        Ok(_) => Err(Error::corrupt("bytes after the zstd frame in payload")),
        Err(code) => Err(Error::corrupt(format!(
            "bad zstd payload: {}",
            zstd_error_name(code)
        ))),
    }
}

fn decode_zstd_payload(payload: &[u8], length: u64, max_size: u64) -> Result<Vec<u8>> {
    check_single_zstd_frame(payload)?;
    let size = usize::try_from(length).map_err(|_| Error::TooLarge { limit: max_size })?;
    // A buffer of exactly `length` bytes: a payload that would decode to
    // more fails inside zstd instead of growing the output.
    decompress_exact(payload, size, None, max_size)
}

/// Decodes a frame: checks the header, sizes and digest and returns the
/// data. `Corrupt` on any mismatch; `TooLarge` when the (valid) header
/// length exceeds `max_size`.
pub fn decode_frame(frame: &[u8], max_size: u64) -> Result<Vec<u8>> {
    decode(frame, max_size).map(|(_, data)| data)
}

/// As [`decode_frame`] but returns only the digest.
pub fn verify_frame(frame: &[u8], max_size: u64) -> Result<[u8; DIGEST_SIZE]> {
    let header = parse_header(frame)?;
    if header.codec == CODEC_RAW {
        // No need to copy a raw payload to hash it.
        if header.length > max_size {
            return Err(Error::TooLarge { limit: max_size });
        }
        let payload = &frame[FRAME_HEADER_SIZE..];
        if payload.len() as u64 != header.length {
            return Err(Error::corrupt("raw payload length mismatch"));
        }
        if digest(payload) != header.digest {
            return Err(Error::corrupt("frame digest mismatch"));
        }
        return Ok(header.digest);
    }
    decode(frame, max_size).map(|(header, _)| header.digest)
}

/// The digest recorded in a frame's header, after checking the header (not
/// the payload).
pub fn frame_digest(frame: &[u8]) -> Result<[u8; DIGEST_SIZE]> {
    parse_header(frame).map(|header| header.digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::digest_hex;

    fn text(len: usize) -> Vec<u8> {
        let words = [
            "agent ", "search ", "revenue ", "table ", "retries ", "notes ",
        ];
        let mut out = Vec::with_capacity(len + 8);
        let mut i = 0usize;
        while out.len() < len {
            out.extend_from_slice(words[(i * 7 + i / 3) % words.len()].as_bytes());
            i += 1;
        }
        out.truncate(len);
        out
    }

    fn noise(len: usize) -> Vec<u8> {
        let mut state = 0x1234_5678_9abc_def1u64;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn layout_matches_the_contract() {
        let data = text(1000);
        let frame = encode_frame(&data, 3).expect("encode");
        assert_eq!(&frame[..4], b"STRD");
        assert_eq!(frame[4], 1);
        assert_eq!(frame[5], CODEC_ZSTD);
        assert_eq!(&frame[6..8], &[0, 0]);
        assert_eq!(&frame[8..16], &1000u64.to_le_bytes());
        assert_eq!(&frame[16..48], &digest(&data));
        assert_eq!(&frame[48..52], &blake3::hash(&frame[..48]).as_bytes()[..4]);
        assert!(frame.len() < 52 + 1000);
        assert_eq!(FRAME_HEADER_SIZE, 52);
    }

    #[test]
    fn round_trip_raw_and_zstd() {
        for data in [
            vec![],
            b"x".to_vec(),
            text(10),
            text(300),
            text(70_000),
            noise(5000),
        ] {
            let frame = encode_frame(&data, 3).expect("encode");
            let expect_codec = if data.len() > 100 && data != noise(5000) {
                CODEC_ZSTD
            } else {
                CODEC_RAW
            };
            assert_eq!(frame[5], expect_codec, "len {}", data.len());
            assert_eq!(
                decode_frame(&frame, data.len() as u64).expect("decode"),
                data
            );
            assert_eq!(
                verify_frame(&frame, data.len() as u64).expect("verify"),
                digest(&data)
            );
            assert_eq!(frame_digest(&frame).expect("digest"), digest(&data));
            assert_eq!(
                crate::digest::to_hex(&frame_digest(&frame).expect("digest")),
                digest_hex(&data)
            );
        }
    }

    #[test]
    fn codec_is_zstd_exactly_when_compress_is_smaller() {
        // Tiny and borderline inputs: zstd wins by a byte or two, or not.
        let mut inputs: Vec<Vec<u8>> = (0..40).map(|n| vec![0u8; n]).collect();
        inputs.extend((0..40).map(|n| text(n * 3)));
        inputs.extend((0..40).map(|n| noise(n * 5)));
        for data in inputs {
            for level in [-5, 0, 3, 19] {
                let frame = encode_frame(&data, level).expect("encode");
                let packed = crate::compress::compress(&data, level).expect("compress");
                let want = if packed.len() < data.len() {
                    CODEC_ZSTD
                } else {
                    CODEC_RAW
                };
                assert_eq!(frame[5], want, "len {} level {level}", data.len());
                if want == CODEC_ZSTD {
                    assert_eq!(&frame[52..], &packed[..]);
                }
            }
        }
    }

    #[test]
    fn raw_when_zstd_is_not_smaller() {
        let data = noise(1000);
        let frame = encode_frame(&data, 3).expect("encode");
        assert_eq!(frame[5], CODEC_RAW);
        assert_eq!(frame.len(), 52 + 1000);
        assert_eq!(&frame[52..], &data[..]);
        let empty = encode_frame(b"", 3).expect("encode");
        assert_eq!(empty.len(), 52);
        assert_eq!(empty[5], CODEC_RAW);
    }

    fn assert_corrupt(frame: &[u8], what: &str) {
        match decode_frame(frame, u64::MAX) {
            Err(Error::Corrupt(_)) => {}
            other => panic!("{what}: expected Corrupt, got {other:?}"),
        }
        assert!(
            matches!(verify_frame(frame, u64::MAX), Err(Error::Corrupt(_))),
            "{what}: verify_frame"
        );
    }

    #[test]
    fn every_corrupted_byte_is_detected() {
        for data in [text(3000), text(20_000), noise(700), text(40), b"".to_vec()] {
            let frame = encode_frame(&data, 3).expect("encode");
            for position in 0..frame.len() {
                let mut bad = frame.clone();
                bad[position] ^= 0xFF;
                assert_corrupt(&bad, &format!("byte {position} inverted"));
            }
        }
    }

    #[test]
    fn no_bit_flip_ever_yields_wrong_data() {
        // zstd ignores a few bits (for example padding after an entropy
        // table description), so a flip there decodes to the same bytes;
        // every other flip is Corrupt. Never is different data returned.
        for data in [text(3000), noise(300), text(64)] {
            let frame = encode_frame(&data, 3).expect("encode");
            let raw = frame[5] == CODEC_RAW;
            for position in 0..frame.len() {
                for bit in 0..8 {
                    let mut bad = frame.clone();
                    bad[position] ^= 1 << bit;
                    match decode_frame(&bad, u64::MAX) {
                        Err(Error::Corrupt(_)) => {}
                        Ok(decoded) if !raw && position >= FRAME_HEADER_SIZE => {
                            assert_eq!(decoded, data, "byte {position} bit {bit}")
                        }
                        other => panic!("byte {position} bit {bit}: {other:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn every_header_bit_flip_is_detected_by_frame_digest() {
        let frame = encode_frame(&text(500), 3).expect("encode");
        for position in 0..FRAME_HEADER_SIZE {
            for bit in 0..8 {
                let mut bad = frame.clone();
                bad[position] ^= 1 << bit;
                assert!(
                    matches!(frame_digest(&bad), Err(Error::Corrupt(_))),
                    "byte {position} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn truncation_and_extension_are_detected() {
        for data in [text(3000), noise(700)] {
            let frame = encode_frame(&data, 3).expect("encode");
            for cut in 0..frame.len() {
                assert_corrupt(&frame[..cut], &format!("cut at {cut}"));
            }
            assert_corrupt(&[frame.clone(), vec![0]].concat(), "one byte more");
            assert_corrupt(&[frame.clone(), frame.clone()].concat(), "twice");
        }
    }

    #[test]
    fn forged_headers_are_refused() {
        let data = text(2000);
        let frame = encode_frame(&data, 3).expect("encode");
        let reseal = |mut bad: Vec<u8>| {
            let check = header_check(&bad[..48]);
            bad[48..52].copy_from_slice(&check);
            bad
        };
        // A consistent header check does not make other fields acceptable.
        let mut version = frame.clone();
        version[4] = 2;
        assert_corrupt(&reseal(version), "version 2");
        let mut codec = frame.clone();
        codec[5] = 2;
        assert_corrupt(&reseal(codec), "codec 2");
        let mut flags = frame.clone();
        flags[6] = 1;
        assert_corrupt(&reseal(flags), "flags");
        let mut length = frame.clone();
        length[8..16].copy_from_slice(&1999u64.to_le_bytes());
        assert_corrupt(&reseal(length), "shorter length");
        let mut digest_bad = frame.clone();
        digest_bad[20] ^= 1;
        assert_corrupt(&reseal(digest_bad), "digest");
        // A zstd payload that decodes to other bytes of the same length.
        let mut other = frame[..52].to_vec();
        let mut changed = data.clone();
        changed[0] ^= 1;
        other.extend_from_slice(&crate::compress::compress(&changed, 3).expect("zstd"));
        assert_corrupt(&other, "other content");
        // A zstd payload of another length.
        let mut shorter = frame[..52].to_vec();
        shorter.extend_from_slice(&crate::compress::compress(&data[1..], 3).expect("zstd"));
        assert_corrupt(&shorter, "shorter content");
        let mut longer = frame[..52].to_vec();
        longer.extend_from_slice(
            &crate::compress::compress(&[&data[..], b"x"].concat(), 3).expect("zstd"),
        );
        assert_corrupt(&longer, "longer content");
    }

    #[test]
    fn length_above_limit_is_too_large_not_corrupt() {
        let data = text(5000);
        let frame = encode_frame(&data, 3).expect("encode");
        assert_eq!(
            decode_frame(&frame, 4999),
            Err(Error::TooLarge { limit: 4999 })
        );
        assert_eq!(verify_frame(&frame, 0), Err(Error::TooLarge { limit: 0 }));
        let raw = encode_frame(&noise(100), 3).expect("encode");
        assert_eq!(decode_frame(&raw, 99), Err(Error::TooLarge { limit: 99 }));
        assert_eq!(verify_frame(&raw, 99), Err(Error::TooLarge { limit: 99 }));
        // Limits are checked only after the header is known to be intact.
        let mut bad = frame.clone();
        bad[10] ^= 0xFF;
        assert!(matches!(decode_frame(&bad, 10), Err(Error::Corrupt(_))));
    }

    #[test]
    fn invalid_level_is_invalid_input() {
        assert!(matches!(
            encode_frame(b"x", 23),
            Err(Error::InvalidInput(_))
        ));
        assert!(matches!(
            FrameEncoder::new(-200_000),
            Err(Error::InvalidInput(_))
        ));
    }
}
