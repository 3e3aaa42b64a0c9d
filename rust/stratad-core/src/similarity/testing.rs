//! Test helpers shared by the similarity tests: token lists from words, a
//! brute-force Jaccard similarity for models to hold the index to, and a
//! tiny deterministic generator.

use std::collections::HashSet;

pub(super) fn toks(words: &str) -> Vec<String> {
    words.split_whitespace().map(str::to_owned).collect()
}

/// `|A ∩ B| / |A ∪ B|` of the two token sets; `0.0` when both are empty.
pub(super) fn jaccard<S: AsRef<str>>(a: &[S], b: &[S]) -> f64 {
    let a: HashSet<&str> = a.iter().map(AsRef::as_ref).collect();
    let b: HashSet<&str> = b.iter().map(AsRef::as_ref).collect();
    let intersection = a.intersection(&b).count();
    let union = a.len() + b.len() - intersection;
    if union == 0 {
        0.0
    } else {
        intersection as f64 / union as f64
    }
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

#[test]
fn jaccard_values() {
    assert_eq!(jaccard::<&str>(&[], &[]), 0.0);
    assert_eq!(jaccard(&["a"], &[]), 0.0);
    assert_eq!(jaccard(&["a", "b"], &["a", "b"]), 1.0);
    assert_eq!(jaccard(&["a", "b"], &["b", "c"]), 1.0 / 3.0);
    assert_eq!(jaccard(&["a", "a", "b"], &["b", "b"]), 0.5);
    assert_eq!(
        jaccard(&["a", "b", "c", "d", "e", "f", "g"], &["a", "x", "y"]),
        1.0 / 9.0
    );
}
