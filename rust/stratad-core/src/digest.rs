//! BLAKE3 digests: objects are named by the digest of their uncompressed
//! bytes, so this is the identity function of the whole store.

/// Size of a digest in bytes.
pub const DIGEST_SIZE: usize = 32;

/// The 32-byte BLAKE3 digest of `data`.
pub fn digest(data: &[u8]) -> [u8; DIGEST_SIZE] {
    *blake3::hash(data).as_bytes()
}

/// The lowercase hex BLAKE3 digest of `data` (64 characters).
pub fn digest_hex(data: &[u8]) -> String {
    to_hex(&digest(data))
}

/// Lowercase hex of any byte string.
pub fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        // BLAKE3 of the empty input and of "abc" (from the BLAKE3 spec).
        assert_eq!(
            digest_hex(b""),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
        assert_eq!(
            digest_hex(b"abc"),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
    }

    #[test]
    fn digest_and_hex_agree() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let raw = digest(&data);
        assert_eq!(raw.len(), DIGEST_SIZE);
        assert_eq!(to_hex(&raw), digest_hex(&data));
        assert_eq!(digest_hex(&data).len(), 64);
        assert_ne!(digest(&data[1..]), raw);
    }

    #[test]
    fn hex_is_lowercase_and_complete() {
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(to_hex(&[]), "");
    }
}
