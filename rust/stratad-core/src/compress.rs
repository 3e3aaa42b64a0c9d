//! zstd compression with a hard cap on what decompression may produce.
//!
//! Stored and uploaded objects are untrusted input: a few bytes of zstd can
//! claim (or really expand to) gigabytes. `decompress` therefore never
//! produces more than the caller's `max_size`, refuses a frame that declares
//! more up front, and never aborts the process on a huge allocation request.

use std::cell::RefCell;
use std::io::Read;

use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, ResetDirective};

use crate::error::{Error, Result};

/// The range of compression levels zstd accepts (negative levels are the
/// fast modes; 0 means zstd's default level, 3).
pub fn level_range() -> std::ops::RangeInclusive<i32> {
    zstd_safe::min_c_level()..=zstd_safe::max_c_level()
}

/// Fails with `InvalidInput` when `level` is outside [`level_range`].
pub fn validate_level(level: i32) -> Result<()> {
    let range = level_range();
    if range.contains(&level) {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "compression level must be in {}..={}, got {level}",
            range.start(),
            range.end()
        )))
    }
}

pub(crate) fn zstd_error_name(code: usize) -> &'static str {
    zstd_safe::get_error_name(code)
}

pub(crate) fn new_cctx<'a>() -> Result<CCtx<'a>> {
    CCtx::try_create().ok_or_else(|| Error::Internal("cannot create a zstd context".into()))
}

/// The parameters of an object frame's zstd payload: `level`, the content
/// size recorded, no checksum (the frame header carries the BLAKE3 digest).
pub(crate) fn set_frame_parameters(cctx: &mut CCtx<'_>, level: i32) -> Result<()> {
    let internal = |code: usize| Error::Internal(format!("zstd: {}", zstd_error_name(code)));
    cctx.set_parameter(CParameter::CompressionLevel(level))
        .map_err(internal)?;
    cctx.set_parameter(CParameter::ContentSizeFlag(true))
        .map_err(internal)?;
    cctx.set_parameter(CParameter::ChecksumFlag(false))
        .map_err(internal)?;
    Ok(())
}

pub(crate) fn new_dctx() -> Result<DCtx<'static>> {
    DCtx::try_create().ok_or_else(|| Error::Internal("cannot create a zstd context".into()))
}

thread_local! {
    /// One decompression context per thread, reused: creating one allocates
    /// about 100 KiB, which costs more than decoding a typical chunk.
    static DCTX: RefCell<Option<DCtx<'static>>> = const { RefCell::new(None) };
    /// One compression context per thread, reused: creating one (and its
    /// tables) took ~10 µs of the ~11 µs a 400-byte journal record cost.
    static CCTX: RefCell<Option<CCtx<'static>>> = const { RefCell::new(None) };
}

/// Runs `work` with this thread's compression context, reset to zstd's
/// defaults (no parameters, no dictionary) first.
pub(crate) fn with_cctx<T>(work: impl FnOnce(&mut CCtx<'static>) -> Result<T>) -> Result<T> {
    let reset = |cctx: &mut CCtx<'static>| {
        cctx.reset(ResetDirective::SessionAndParameters)
            .map(drop)
            .map_err(|code| Error::Internal(format!("zstd: {}", zstd_error_name(code))))
    };
    CCTX.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            let cctx = match slot.as_mut() {
                Some(cctx) => cctx,
                None => slot.insert(new_cctx()?),
            };
            reset(cctx)?;
            work(cctx)
        }
        Err(_) => work(&mut new_cctx()?), // re-entered: a context of its own
    })
}

/// Runs `work` with this thread's decompression context.
fn with_dctx<T>(work: impl FnOnce(&mut DCtx<'static>) -> Result<T>) -> Result<T> {
    DCTX.with(|cell| match cell.try_borrow_mut() {
        Ok(mut slot) => {
            let dctx = match slot.as_mut() {
                Some(dctx) => dctx,
                None => slot.insert(new_dctx()?),
            };
            let result = work(dctx);
            if result.is_err() {
                // One-shot decoding starts afresh anyway; this is belt and braces.
                let _ = dctx.reset(ResetDirective::SessionAndParameters);
            }
            result
        }
        Err(_) => work(&mut new_dctx()?), // re-entered: a context of its own
    })
}

/// An empty `Vec` with room for `capacity` bytes, or `TooLarge` instead of
/// aborting the process when that much memory cannot be had.
pub(crate) fn buffer_with_capacity(capacity: usize, limit: u64) -> Result<Vec<u8>> {
    let mut buffer = Vec::new();
    buffer
        .try_reserve_exact(capacity)
        .map_err(|_| Error::TooLarge { limit })?;
    Ok(buffer)
}

/// Compresses `data` into one zstd frame that records its content size.
pub fn compress(data: &[u8], level: i32) -> Result<Vec<u8>> {
    validate_level(level)?;
    with_cctx(|cctx| {
        let set = |cctx: &mut CCtx<'static>, param: CParameter| {
            cctx.set_parameter(param)
                .map(drop)
                .map_err(|code| Error::Internal(format!("zstd: {}", zstd_error_name(code))))
        };
        set(cctx, CParameter::CompressionLevel(level))?;
        set(cctx, CParameter::ContentSizeFlag(true))?;
        let bound = zstd_safe::compress_bound(data.len());
        let mut out = buffer_with_capacity(bound, bound as u64)?;
        cctx.compress2(&mut out, data)
            .map_err(|code| Error::Internal(format!("zstd: {}", zstd_error_name(code))))?;
        Ok(out)
    })
}

/// Decompresses `data`, which must be exactly one zstd frame, producing at
/// most `max_size` bytes.
///
/// Errors: `TooLarge` when the output would exceed `max_size` (checked
/// against the frame's declared content size before any work, and enforced
/// while decoding frames that declare none); `Corrupt` for anything that is
/// not exactly one valid zstd frame.
pub fn decompress(data: &[u8], max_size: u64) -> Result<Vec<u8>> {
    // The declared size is checked first: it needs only the frame header.
    let declared = zstd_safe::get_frame_content_size(data)
        .map_err(|_| Error::corrupt("not a zstd frame (bad or truncated header)"))?;
    if declared.is_some_and(|size| size > max_size) {
        return Err(Error::TooLarge { limit: max_size });
    }
    let frame_size = zstd_safe::find_frame_compressed_size(data)
        .map_err(|code| Error::corrupt(format!("bad zstd frame: {}", zstd_error_name(code))))?;
    if frame_size != data.len() {
        return Err(Error::corrupt(format!(
            "{} bytes after the zstd frame",
            data.len().saturating_sub(frame_size)
        )));
    }
    match declared {
        Some(size) => {
            let size = usize::try_from(size).map_err(|_| Error::TooLarge { limit: max_size })?;
            decompress_exact(data, size, None, max_size)
        }
        None => decompress_streaming(data, max_size),
    }
}

/// One-shot decoding of a frame that declares `size` bytes of content, into
/// a buffer of exactly that size (zstd checks the declared size).
pub(crate) fn decompress_exact(
    data: &[u8],
    size: usize,
    dictionary: Option<&[u8]>,
    limit: u64,
) -> Result<Vec<u8>> {
    let mut out = buffer_with_capacity(size, limit)?;
    let written = with_dctx(|dctx| {
        match dictionary {
            Some(dict) => dctx.decompress_using_dict(&mut out, data, dict),
            None => dctx.decompress(&mut out, data),
        }
        .map_err(|code| Error::corrupt(format!("zstd: {}", zstd_error_name(code))))
    })?;
    if written != size {
        return Err(Error::corrupt(format!(
            "zstd frame decoded to {written} bytes, declared {size}"
        )));
    }
    Ok(out)
}

/// Streaming decoding of a frame without a declared size: the output grows
/// as needed and decoding stops as soon as it passes `max_size`.
fn decompress_streaming(data: &[u8], max_size: u64) -> Result<Vec<u8>> {
    let decoder = zstd::stream::read::Decoder::with_buffer(data)
        .map_err(|e| Error::corrupt(format!("zstd: {e}")))?
        .single_frame();
    let mut out = Vec::new();
    decoder
        .take(max_size.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::OutOfMemory => Error::TooLarge { limit: max_size },
            _ => Error::corrupt(format!("zstd: {e}")),
        })?;
    if out.len() as u64 > max_size {
        return Err(Error::TooLarge { limit: max_size });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> Vec<u8> {
        b"the agent decided to call the search tool because the user asked "
            .iter()
            .copied()
            .cycle()
            .take(len)
            .collect()
    }

    #[test]
    fn round_trip() {
        for len in [0, 1, 100, 10_000, 1 << 20] {
            let data = text(len);
            let packed = compress(&data, 3).expect("compress");
            assert_eq!(
                zstd_safe::get_frame_content_size(&packed).ok(),
                Some(Some(len as u64))
            );
            assert_eq!(decompress(&packed, len as u64).expect("decompress"), data);
        }
    }

    #[test]
    fn all_levels_in_range_work_and_others_are_refused() {
        let data = text(5000);
        for level in [-5, 0, 1, 3, 19, 22] {
            let packed = compress(&data, level).expect("valid level");
            assert_eq!(decompress(&packed, 5000).expect("decompress"), data);
        }
        for level in [23, 100, i32::MIN, i32::MAX] {
            assert!(matches!(
                compress(&data, level),
                Err(Error::InvalidInput(_))
            ));
        }
    }

    #[test]
    fn declared_size_above_limit_is_refused() {
        let data = text(10_000);
        let packed = compress(&data, 3).expect("compress");
        assert_eq!(
            decompress(&packed, 9_999),
            Err(Error::TooLarge { limit: 9_999 })
        );
        assert_eq!(decompress(&packed, 10_000).expect("fits"), data);
    }

    /// A frame that does not record its size (as streaming compressors
    /// write): 64 MiB of zeros in about 2 KiB.
    fn bomb() -> Vec<u8> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 19).expect("encoder");
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            std::io::Write::write_all(&mut encoder, &zeros).expect("write");
        }
        encoder.finish().expect("finish")
    }

    #[test]
    fn decompression_bomb_is_refused() {
        let bomb = bomb();
        assert!(bomb.len() < 64 * 1024, "{}", bomb.len());
        assert_eq!(zstd_safe::get_frame_content_size(&bomb).ok(), Some(None));
        assert_eq!(
            decompress(&bomb, 1 << 20),
            Err(Error::TooLarge { limit: 1 << 20 })
        );
        assert_eq!(
            decompress(&bomb, (64 << 20) - 1),
            Err(Error::TooLarge {
                limit: (64 << 20) - 1
            })
        );
        let out = decompress(&bomb, 64 << 20).expect("exactly at the limit");
        assert_eq!(out.len(), 64 << 20);
    }

    #[test]
    fn huge_declared_size_does_not_abort() {
        // A hand-made frame header declaring 2^62 bytes of content.
        let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0xE0];
        frame.extend_from_slice(&(1u64 << 62).to_le_bytes());
        frame.extend_from_slice(&[0x01, 0x00, 0x00]); // last, raw, empty block
        let result = decompress(&frame, u64::MAX);
        assert!(
            matches!(result, Err(Error::TooLarge { .. }) | Err(Error::Corrupt(_))),
            "{result:?}"
        );
    }

    #[test]
    fn malformed_input_is_corrupt() {
        let packed = compress(&text(5000), 3).expect("compress");
        let cases: Vec<Vec<u8>> = vec![
            vec![],
            b"not zstd at all".to_vec(),
            packed[..packed.len() - 1].to_vec(),
            packed[..10].to_vec(),
            [packed.clone(), vec![0]].concat(),
            [packed.clone(), packed.clone()].concat(),
        ];
        for case in cases {
            let result = decompress(&case, 1 << 20);
            assert!(matches!(result, Err(Error::Corrupt(_))), "{result:?}");
        }
        let mut flipped = packed.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xFF;
        assert!(decompress(&flipped, 1 << 20).is_err());
    }
}
