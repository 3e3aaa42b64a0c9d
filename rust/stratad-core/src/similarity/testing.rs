//! Test helpers shared by the similarity tests: token lists from words and
//! a tiny deterministic generator.

pub(super) fn toks(words: &str) -> Vec<String> {
    words.split_whitespace().map(str::to_owned).collect()
}

/// A tiny deterministic generator for the randomized comparisons.
pub(super) struct Lcg(pub(super) u64);

impl Lcg {
    pub(super) fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }

    pub(super) fn tokens(&mut self, vocabulary: u64) -> Vec<String> {
        let n = self.next(6);
        (0..n)
            .map(|_| format!("t{}", self.next(vocabulary)))
            .collect()
    }
}
