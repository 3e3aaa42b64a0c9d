//! Keyword tokens and the crystal library's Jaccard top-k matching.
//!
//! Crystals are matched to a new goal by the Jaccard similarity of their
//! keyword sets. The library of crystals must scale to a million entries, so
//! its index interns tokens to `u32` ids and keeps an inverted index
//! (token -> entries holding it): a query only touches entries that share at
//! least one token with it, never the whole library.
//!
//! - `tokens.rs`: [`tokenize`], goal text to keyword tokens.
//! - `crystal.rs`: [`CrystalIndex`], a crystal library's entries and posting
//!   lists, and what changes them (add, update, remove, evict, totals).
//! - `search.rs`: its searches, [`CrystalIndex::top_k`] and
//!   [`CrystalIndex::find_similar`].
//! - `eviction.rs`: the eviction order behind
//!   [`CrystalIndex::least_effective`].
//! - `counts.rs`: the pooled shared-token counters searches use.

mod counts;
mod crystal;
mod eviction;
mod search;
mod tokens;

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;

pub use crystal::{CrystalIndex, CrystalStats, DEFAULT_SKIP_MIN_POSTINGS};
pub use search::{effectiveness_boost, CrystalMatch, SimilarCrystal};
pub use tokens::tokenize;
