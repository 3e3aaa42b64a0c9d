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

/// A BLAKE3 digest computed piece by piece, whose progress can be copied.
///
/// A growing state keeps its prefix from one save to the next: a copy taken
/// where that prefix ends lets the next save's digest hash only what follows
/// it (the SDK's chunked uploads and the daemon's check of them both do).
#[derive(Clone, Default)]
pub struct Digester(blake3::Hasher);

impl Digester {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// Bytes fed so far.
    pub fn count(&self) -> u64 {
        self.0.count()
    }

    /// The lowercase hex digest of everything fed so far (feeding may go on).
    pub fn hex(&self) -> String {
        to_hex(self.0.finalize().as_bytes())
    }
}

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix_len(a: &[u8], b: &[u8]) -> usize {
    // Whole blocks first: slice equality is a memcmp, far faster than bytes.
    const BLOCK: usize = 4096;
    let n = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= n && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    at + a[at..n]
        .iter()
        .zip(&b[at..n])
        .take_while(|(x, y)| x == y)
        .count()
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
    fn digester_in_pieces_equals_one_shot() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 7 % 253) as u8).collect();
        let mut d = Digester::new();
        d.update(&data[..1000]);
        let at_1000 = d.clone();
        d.update(&data[1000..]);
        assert_eq!(d.hex(), digest_hex(&data));
        let mut resumed = at_1000;
        assert_eq!(resumed.count(), 1000);
        resumed.update(&data[1000..40_000]);
        resumed.update(&data[40_000..]);
        assert_eq!(resumed.hex(), digest_hex(&data));
        assert_eq!(Digester::new().hex(), digest_hex(b""));
    }

    #[test]
    fn common_prefix_lengths() {
        let a: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(common_prefix_len(&a, &a), a.len());
        assert_eq!(common_prefix_len(&a, &a[..5000]), 5000);
        assert_eq!(common_prefix_len(&a, b""), 0);
        for at in [0, 1, 4095, 4096, 4097, 8191, 9999] {
            let mut b = a.clone();
            b[at] ^= 1;
            assert_eq!(common_prefix_len(&a, &b), at, "differing at {at}");
        }
    }

    #[test]
    fn hex_is_lowercase_and_complete() {
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(to_hex(&[]), "");
    }
}
