//! Jaccard similarity over plain token sets: [`jaccard`] of two sets, and
//! top-k keyed by the caller, [`top_k`] over a list (every entry scored) and
//! [`JaccardIndex`], an inverted index with interned tokens (only entries
//! sharing a token are scored). Results are sorted by score descending, then
//! key (or position) ascending. The crystal library has its own index
//! (`CrystalIndex`, in `crystal.rs`).

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

/// `|A ∩ B| / |A ∪ B|` of the two token sets; `0.0` when both are empty.
pub fn jaccard<S: AsRef<str>>(a: &[S], b: &[S]) -> f64 {
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

/// Score of two sets of sizes `a` and `b` sharing `intersection` elements.
fn score(intersection: usize, a: usize, b: usize) -> f64 {
    intersection as f64 / (a + b - intersection) as f64
}

/// Score descending, then key ascending.
fn ranking<K: Ord>(x: &(K, f64), y: &(K, f64)) -> Ordering {
    y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0))
}

/// Keeps the best `k` of `scored` in ranking order.
fn best<K: Ord>(mut scored: Vec<(K, f64)>, k: usize) -> Vec<(K, f64)> {
    if k == 0 {
        return Vec::new();
    }
    if scored.len() > k {
        scored.select_nth_unstable_by(k - 1, ranking);
        scored.truncate(k);
    }
    scored.sort_unstable_by(ranking);
    scored
}

/// The `k` entries of `corpus` most similar to `query`, as `(position,
/// score)`: only entries sharing at least one token (score > 0), sorted by
/// score descending then position ascending.
pub fn top_k<Q: AsRef<str>, C: AsRef<[T]>, T: AsRef<str>>(
    query: &[Q],
    corpus: &[C],
    k: usize,
) -> Vec<(usize, f64)> {
    let query: HashSet<&str> = query.iter().map(AsRef::as_ref).collect();
    if query.is_empty() || k == 0 {
        return Vec::new();
    }
    let mut scored = Vec::new();
    let mut entry: HashSet<&str> = HashSet::new();
    for (position, tokens) in corpus.iter().enumerate() {
        entry.clear();
        entry.extend(tokens.as_ref().iter().map(AsRef::as_ref));
        let shared = entry.iter().filter(|t| query.contains(*t)).count();
        if shared > 0 {
            scored.push((position, score(shared, query.len(), entry.len())));
        }
    }
    best(scored, k)
}

/// One indexed entry: its key and its sorted, unique token ids.
#[derive(Debug, Clone)]
struct Entry {
    key: i64,
    tokens: Box<[u32]>,
}

/// An inverted index for Jaccard top-k queries over many token sets.
///
/// Entries live in slots (reused after removal); `postings[token]` lists the
/// slots holding that token. Removing or replacing an entry updates the
/// postings, so queries never see stale entries.
#[derive(Debug, Clone, Default)]
pub struct JaccardIndex {
    token_ids: HashMap<String, u32>,
    postings: Vec<Vec<u32>>,
    slots: Vec<Option<Entry>>,
    free_slots: Vec<u32>,
    slot_of_key: HashMap<i64, u32>,
}

impl JaccardIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.slot_of_key.len()
    }

    /// Whether the index has no entries.
    pub fn is_empty(&self) -> bool {
        self.slot_of_key.is_empty()
    }

    /// Whether `key` is indexed.
    pub fn contains(&self, key: i64) -> bool {
        self.slot_of_key.contains_key(&key)
    }

    /// Number of distinct tokens ever interned (a diagnostic).
    pub fn vocabulary_size(&self) -> usize {
        self.token_ids.len()
    }

    fn intern(&mut self, token: &str) -> u32 {
        if let Some(&id) = self.token_ids.get(token) {
            return id;
        }
        let id = u32::try_from(self.postings.len()).unwrap_or(u32::MAX);
        self.token_ids.insert(token.to_owned(), id);
        self.postings.push(Vec::new());
        id
    }

    /// Indexes `tokens` (as a set) under `key`, replacing what `key` had.
    pub fn add<S: AsRef<str>>(&mut self, key: i64, tokens: &[S]) {
        self.remove(key);
        let mut ids: Vec<u32> = tokens.iter().map(|t| self.intern(t.as_ref())).collect();
        ids.sort_unstable();
        ids.dedup();
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
            }
        };
        for &id in &ids {
            self.postings[id as usize].push(slot);
        }
        self.slots[slot as usize] = Some(Entry {
            key,
            tokens: ids.into_boxed_slice(),
        });
        self.slot_of_key.insert(key, slot);
    }

    /// Removes `key`; returns whether it was indexed.
    pub fn remove(&mut self, key: i64) -> bool {
        let Some(slot) = self.slot_of_key.remove(&key) else {
            return false;
        };
        if let Some(entry) = self.slots[slot as usize].take() {
            for &id in entry.tokens.iter() {
                let posting = &mut self.postings[id as usize];
                if let Some(at) = posting.iter().position(|&s| s == slot) {
                    posting.swap_remove(at);
                }
            }
        }
        self.free_slots.push(slot);
        true
    }

    /// The `k` keys most similar to `query`, as `(key, score)`: only keys
    /// sharing at least one token, sorted by score descending then key
    /// ascending. Query tokens the index has never seen still count in the
    /// query's set size.
    pub fn top_k<S: AsRef<str>>(&self, query: &[S], k: usize) -> Vec<(i64, f64)> {
        let query: HashSet<&str> = query.iter().map(AsRef::as_ref).collect();
        if query.is_empty() || k == 0 {
            return Vec::new();
        }
        let postings: Vec<&[u32]> = query
            .iter()
            .filter_map(|t| self.token_ids.get(*t))
            .map(|&id| self.postings[id as usize].as_slice())
            .filter(|p| !p.is_empty())
            .collect();
        let touched: usize = postings.iter().map(|p| p.len()).sum();
        let counts = if touched.saturating_mul(8) >= self.slots.len() {
            Self::count_dense(&postings, self.slots.len())
        } else {
            Self::count_sparse(&postings, touched)
        };
        let scored = counts
            .into_iter()
            .filter_map(|(slot, shared)| {
                let entry = self.slots.get(slot as usize)?.as_ref()?;
                Some((
                    entry.key,
                    score(shared as usize, query.len(), entry.tokens.len()),
                ))
            })
            .collect();
        best(scored, k)
    }

    /// Intersection counts with one counter per slot (many candidates).
    fn count_dense(postings: &[&[u32]], slots: usize) -> Vec<(u32, u32)> {
        let mut counts = vec![0u32; slots];
        let mut touched = Vec::new();
        for posting in postings {
            for &slot in posting.iter() {
                let count = &mut counts[slot as usize];
                if *count == 0 {
                    touched.push(slot);
                }
                *count += 1;
            }
        }
        touched
            .into_iter()
            .map(|slot| (slot, counts[slot as usize]))
            .collect()
    }

    /// Intersection counts by sorting the touched slots (few candidates).
    fn count_sparse(postings: &[&[u32]], touched: usize) -> Vec<(u32, u32)> {
        let mut all: Vec<u32> = Vec::with_capacity(touched);
        for posting in postings {
            all.extend_from_slice(posting);
        }
        all.sort_unstable();
        let mut counts: Vec<(u32, u32)> = Vec::new();
        for slot in all {
            match counts.last_mut() {
                Some((last, count)) if *last == slot => *count += 1,
                _ => counts.push((slot, 1)),
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::similarity::testing::{toks, Lcg};

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

    #[test]
    fn top_k_over_a_list() {
        let corpus = vec![
            toks("deploy app to prod"),
            toks("deploy app"),
            toks("unrelated words"),
            toks("deploy app"),
            toks(""),
            toks("app deploy to prod"),
        ];
        let query = toks("deploy app");
        assert_eq!(
            top_k(&query, &corpus, 10),
            vec![(1, 1.0), (3, 1.0), (0, 0.5), (5, 0.5)]
        );
        assert_eq!(top_k(&query, &corpus, 2), vec![(1, 1.0), (3, 1.0)]);
        assert_eq!(
            top_k(&query, &corpus, 3),
            vec![(1, 1.0), (3, 1.0), (0, 0.5)]
        );
        assert!(top_k(&query, &corpus, 0).is_empty());
        assert!(top_k(&toks(""), &corpus, 5).is_empty());
        assert!(top_k(&query, &Vec::<Vec<String>>::new(), 5).is_empty());
    }

    #[test]
    fn equal_fractions_tie_and_sort_by_key() {
        // 1/2 and 2/4 are the same f64: ties are broken by key.
        let corpus = vec![toks("a b c x"), toks("a")];
        let query = toks("a b");
        // entry 0: |A∩B| = 2, |A∪B| = 4 -> 0.5; entry 1: 1/2 -> 0.5
        assert_eq!(top_k(&query, &corpus, 5), vec![(0, 0.5), (1, 0.5)]);
    }

    #[test]
    fn index_add_remove_replace() {
        let mut index = JaccardIndex::new();
        assert!(index.is_empty());
        index.add(10, &toks("deploy app to prod"));
        index.add(3, &toks("deploy app"));
        index.add(-5, &toks("deploy app"));
        index.add(7, &toks("unrelated"));
        assert_eq!(index.len(), 4);
        assert!(index.contains(3) && !index.contains(4));
        let query = toks("deploy app");
        assert_eq!(
            index.top_k(&query, 10),
            vec![(-5, 1.0), (3, 1.0), (10, 0.5)]
        );
        // Replace key 3's tokens: it no longer matches.
        index.add(3, &toks("something else"));
        assert_eq!(index.len(), 4);
        assert_eq!(index.top_k(&query, 10), vec![(-5, 1.0), (10, 0.5)]);
        assert!(index.remove(-5));
        assert!(!index.remove(-5));
        assert_eq!(index.top_k(&query, 10), vec![(10, 0.5)]);
        // Slots are reused; the reused slot must not inherit old postings.
        index.add(99, &toks("prod"));
        assert_eq!(index.top_k(&query, 10), vec![(10, 0.5)]);
        assert_eq!(index.top_k(&toks("prod"), 10), vec![(99, 1.0), (10, 0.25)]);
        assert_eq!(index.len(), 4);
        assert!(index.top_k(&query, 0).is_empty());
        assert!(index.top_k(&toks("nothing known"), 3).is_empty());
        // Unknown query tokens still count in |A|.
        assert_eq!(index.top_k(&toks("prod zzz"), 1), vec![(99, 0.5)]);
        // Duplicates in the input are a set.
        index.add(1, &toks("x x y"));
        assert_eq!(index.top_k(&toks("x y y"), 1), vec![(1, 1.0)]);
        // An entry without tokens is indexed but never matches.
        index.add(2, &toks(""));
        assert!(index.contains(2));
        assert!(index.top_k(&toks("x"), 10).iter().all(|&(k, _)| k != 2));
    }

    #[test]
    fn index_agrees_with_brute_force_under_churn() {
        let mut rng = Lcg(42);
        let mut index = JaccardIndex::new();
        let mut model: std::collections::BTreeMap<i64, Vec<String>> = Default::default();
        for step in 0..3000 {
            let key = rng.next(200) as i64 - 100;
            match rng.next(10) {
                0..=5 => {
                    let tokens = rng.tokens(30);
                    index.add(key, &tokens);
                    model.insert(key, tokens);
                }
                6..=7 => {
                    assert_eq!(index.remove(key), model.remove(&key).is_some());
                }
                _ => {
                    let query = rng.tokens(30);
                    let k = rng.next(8) as usize;
                    let keys: Vec<i64> = model.keys().copied().collect();
                    let corpus: Vec<Vec<String>> = model.values().cloned().collect();
                    let expected: Vec<(i64, f64)> = top_k(&query, &corpus, k)
                        .into_iter()
                        .map(|(i, s)| (keys[i], s))
                        .collect();
                    assert_eq!(index.top_k(&query, k), expected, "step {step}");
                    let all = index.top_k(&query, usize::MAX);
                    for (key, score) in all {
                        assert_eq!(score, jaccard(&query, &model[&key]));
                    }
                }
            }
            assert_eq!(index.len(), model.len());
        }
    }

    #[test]
    fn dense_and_sparse_counting_agree() {
        let mut index = JaccardIndex::new();
        for key in 0..2000i64 {
            let tokens = vec![
                format!("w{}", key % 7),
                format!("u{key}"),
                "common".to_owned(),
            ];
            index.add(key, &tokens);
        }
        // "common" touches every entry (dense path); "u5" touches one
        // (sparse path).
        let dense = index.top_k(&["common", "w3"], 5);
        assert_eq!(dense.len(), 5);
        assert_eq!(dense[0].0, 3);
        assert_eq!(dense[0].1, 2.0 / 3.0);
        let sparse = index.top_k(&["u5", "u6"], 5);
        assert_eq!(sparse, vec![(5, 0.25), (6, 0.25)]);
    }
}
