//! Keyword tokens, Jaccard similarity and top-k matching.
//!
//! Crystals are matched to a new goal by the Jaccard similarity of their
//! keyword sets. The library of crystals must scale to a million entries, so
//! [`JaccardIndex`] interns tokens to `u32` ids and keeps an inverted index
//! (token -> entries holding it): a query only touches entries that share at
//! least one token with it, never the whole library.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::error::{Error, Result};

/// Keyword tokens of `text`, unique, in order of first appearance.
///
/// ASCII `A-Z` are lowercased (nothing else is); then tokens are the
/// leftmost-first matches of `\{[a-z0-9_]+\}|[a-z0-9_]+`: placeholders such
/// as `{file_path}` stay one token with their braces, and any other
/// character separates tokens.
pub fn tokenize(text: &str) -> Vec<String> {
    let lowered = text.to_ascii_lowercase();
    let bytes = lowered.as_bytes();
    let is_word = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
    let run_end = |from: usize| {
        let mut end = from;
        while end < bytes.len() && is_word(bytes[end]) {
            end += 1;
        }
        end
    };
    let mut seen = HashSet::new();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let (start, end) = if bytes[i] == b'{' {
            let end = run_end(i + 1);
            if end > i + 1 && bytes.get(end) == Some(&b'}') {
                (i, end + 1)
            } else {
                i += 1;
                continue;
            }
        } else if is_word(bytes[i]) {
            (i, run_end(i))
        } else {
            i += 1;
            continue;
        };
        // Token boundaries are ASCII bytes, so this slice is on char
        // boundaries.
        let token = &lowered[start..end];
        if seen.insert(token) {
            tokens.push(token.to_owned());
        }
        i = end;
    }
    tokens
}

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

/// The boost a crystal's effectiveness gives its similarity when ranking:
/// `score = similarity * (0.5 + 0.5 * effectiveness)`, so a crystal that
/// never helped keeps half its similarity and one that always helped keeps
/// all of it.
pub fn effectiveness_boost(effectiveness: f64) -> f64 {
    0.5 + 0.5 * effectiveness
}

/// One match of [`CrystalIndex::top_k`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrystalMatch {
    pub slot: u32,
    /// `similarity * effectiveness_boost(effectiveness)`: what results are ranked by.
    pub score: f64,
    /// Jaccard similarity of the goal tokens.
    pub similarity: f64,
}

/// The crystal [`CrystalIndex::find_similar`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimilarCrystal {
    pub slot: u32,
    pub goal_similarity: f64,
    pub tool_similarity: f64,
}

/// Totals of [`CrystalIndex::stats`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CrystalStats {
    pub count: usize,
    /// Entries whose effectiveness is at least the given threshold.
    pub effective: usize,
    pub total_reuses: u64,
    /// Sum of the effectiveness of every entry (in slot order).
    pub effectiveness_sum: f64,
}

/// One indexed crystal.
#[derive(Debug, Clone)]
struct CrystalEntry {
    order: u64,
    effectiveness: f64,
    reuse_count: u64,
    /// `tokens[..goal_len]` are goal token ids, the rest tool ids; both sorted.
    goal_len: u32,
    tokens: Box<[u32]>,
}

impl CrystalEntry {
    fn goal(&self) -> &[u32] {
        &self.tokens[..self.goal_len as usize]
    }

    fn tools(&self) -> &[u32] {
        &self.tokens[self.goal_len as usize..]
    }

    fn evict_key(&self, slot: u32) -> EvictKey {
        EvictKey {
            // Effectiveness is in [0, 1] (and never -0.0): its bits order as
            // the numbers do.
            effectiveness: self.effectiveness.to_bits(),
            reuse_count: self.reuse_count,
            order: self.order,
            slot,
        }
    }
}

/// Eviction order: least effective first, then fewest reuses, then lowest
/// order (oldest), then slot. Unique per entry (it holds the slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EvictKey {
    effectiveness: u64,
    reuse_count: u64,
    order: u64,
    slot: u32,
}

impl EvictKey {
    const MAX: EvictKey = EvictKey {
        effectiveness: u64::MAX,
        reuse_count: u64::MAX,
        order: u64::MAX,
        slot: u32::MAX,
    };
}

/// How many eviction candidates one scan of the whole index collects.
const EVICTION_BATCH: usize = 1024;

/// The next entries to evict, without keeping every entry in a heap.
///
/// When `limit` is set, every live entry whose key is `<= limit` is in
/// `candidates` (sorted descending, so the least is last); `candidates` may
/// also hold stale keys (of removed entries, or from before an update), which
/// are dropped when met. A scan of the whole index refills it with the
/// `EVICTION_BATCH` least keys, so evicting costs O(n / EVICTION_BATCH)
/// amortized rather than O(n) per eviction.
#[derive(Debug, Clone, Default)]
struct Eviction {
    candidates: Vec<EvictKey>,
    limit: Option<EvictKey>,
}

impl Eviction {
    fn offer(&mut self, key: EvictKey) {
        let Some(limit) = self.limit else { return };
        if key > limit {
            return;
        }
        if self.candidates.len() >= 4 * EVICTION_BATCH {
            // Mostly stale keys from updates: rescan when next needed.
            self.candidates.clear();
            self.limit = None;
            return;
        }
        let at = self.candidates.partition_point(|c| *c > key);
        self.candidates.insert(at, key);
    }
}

/// Marks slots seen during one query.
struct SeenSlots(Vec<u64>);

impl SeenSlots {
    fn new(slots: usize) -> Self {
        Self(vec![0; slots.div_ceil(64)])
    }

    /// Marks `slot`; returns whether it was not marked before.
    fn insert(&mut self, slot: u32) -> bool {
        let (word, bit) = (slot as usize / 64, 1u64 << (slot % 64));
        match self.0.get_mut(word) {
            Some(w) if *w & bit == 0 => {
                *w |= bit;
                true
            }
            _ => false,
        }
    }
}

/// `|a ∩ b|` of two sorted, duplicate-free slices.
fn intersection_count(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut shared) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                shared += 1;
                i += 1;
                j += 1;
            }
        }
    }
    shared
}

/// Jaccard of sets of sizes `a` and `b` sharing `shared`; 0.0 for two empty sets.
fn set_score(shared: usize, a: usize, b: usize) -> f64 {
    let union = a + b - shared;
    if union == 0 {
        0.0
    } else {
        shared as f64 / union as f64
    }
}

/// A candidate of a top-k query. Orders best first: higher score, then
/// lower order, then lower slot.
#[derive(Debug, Clone, Copy)]
struct Ranked {
    score: f64,
    similarity: f64,
    order: u64,
    slot: u32,
}

impl Ranked {
    fn rank(&self, other: &Self) -> Ordering {
        other
            .score
            .total_cmp(&self.score)
            .then_with(|| self.order.cmp(&other.order))
            .then_with(|| self.slot.cmp(&other.slot))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.rank(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    /// Better is smaller, so a max-heap keeps the worst kept one on top.
    fn cmp(&self, other: &Self) -> Ordering {
        self.rank(other)
    }
}

/// The library of crystals of one tenant, as the daemon searches it.
///
/// Each entry (a *slot*, allocated by [`CrystalIndex::add`] and reused after
/// [`CrystalIndex::remove`]) holds the token ids of its goal template and of
/// its tool names, its effectiveness, reuse count and an `order` (the
/// caller's creation sequence number, used to break ties). Goal tokens have
/// an inverted index (token -> slots), so:
///
/// - [`top_k`](CrystalIndex::top_k) ranks by Jaccard similarity boosted by
///   effectiveness ([`effectiveness_boost`]) exactly, reading the posting
///   lists from the rarest token up and stopping as soon as no entry that was
///   not met yet can reach the k-th best score: an entry met first in the
///   list of the `i`-th rarest of `n` known query tokens shares at most
///   `n - i` tokens with a query of `|A|` tokens, so its score is at most
///   `(n - i) / |A|`;
/// - [`find_similar`](CrystalIndex::find_similar) (the novelty check) reads
///   only the lists that can hold a similar enough entry (prefix filtering:
///   `J > t` needs more than `t * |A|` shared tokens, and any entry sharing
///   `o` of the `n` known tokens appears in one of the `n - o + 1` rarest
///   lists);
/// - [`least_effective`](CrystalIndex::least_effective) finds the entry to
///   evict in amortized O(n / 1024).
///
/// Removal leaves stale slots in posting lists (queries check every
/// candidate against its entry's own tokens); a list is cleaned when more
/// than half of it is stale.
#[derive(Debug, Clone, Default)]
pub struct CrystalIndex {
    goal_vocabulary: HashMap<Box<str>, u32>,
    postings: Vec<Vec<u32>>,
    stale: Vec<u32>,
    tool_vocabulary: HashMap<Box<str>, u32>,
    slots: Vec<Option<CrystalEntry>>,
    free_slots: Vec<u32>,
    len: usize,
    eviction: Eviction,
}

fn intern(vocabulary: &mut HashMap<Box<str>, u32>, token: &str) -> Result<u32> {
    if let Some(&id) = vocabulary.get(token) {
        return Ok(id);
    }
    let id = u32::try_from(vocabulary.len())
        .map_err(|_| Error::InvalidInput("too many distinct tokens".into()))?;
    vocabulary.insert(token.into(), id);
    Ok(id)
}

/// The known ids of `tokens` (sorted, unique) and the size of their set.
fn lookup<S: AsRef<str>>(vocabulary: &HashMap<Box<str>, u32>, tokens: &[S]) -> (Vec<u32>, usize) {
    let set: HashSet<&str> = tokens.iter().map(AsRef::as_ref).collect();
    let mut ids: Vec<u32> = set
        .iter()
        .filter_map(|t| vocabulary.get(*t).copied())
        .collect();
    ids.sort_unstable();
    (ids, set.len())
}

fn check_effectiveness(effectiveness: f64) -> Result<f64> {
    if (0.0..=1.0).contains(&effectiveness) {
        // + 0.0 turns -0.0 into 0.0, so that bits order as numbers.
        Ok(effectiveness + 0.0)
    } else {
        Err(Error::InvalidInput(format!(
            "effectiveness must be in [0, 1], got {effectiveness}"
        )))
    }
}

fn check_threshold(name: &str, threshold: f64) -> Result<()> {
    if (0.0..=1.0).contains(&threshold) {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "{name} must be in [0, 1], got {threshold}"
        )))
    }
}

impl CrystalIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the index has no entries.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `slot` holds an entry.
    pub fn contains(&self, slot: u32) -> bool {
        self.entry(slot).is_some()
    }

    fn entry(&self, slot: u32) -> Option<&CrystalEntry> {
        self.slots.get(slot as usize)?.as_ref()
    }

    /// Adds a crystal; returns its slot (the lowest-cost free one: the most
    /// recently freed, else a new one at the end).
    pub fn add<S: AsRef<str>, T: AsRef<str>>(
        &mut self,
        order: u64,
        goal_tokens: &[S],
        tools: &[T],
        effectiveness: f64,
        reuse_count: u64,
    ) -> Result<u32> {
        let effectiveness = check_effectiveness(effectiveness)?;
        let mut goal = Vec::with_capacity(goal_tokens.len());
        for token in goal_tokens {
            goal.push(intern(&mut self.goal_vocabulary, token.as_ref())?);
        }
        goal.sort_unstable();
        goal.dedup();
        let mut tool_ids = Vec::with_capacity(tools.len());
        for tool in tools {
            tool_ids.push(intern(&mut self.tool_vocabulary, tool.as_ref())?);
        }
        tool_ids.sort_unstable();
        tool_ids.dedup();
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => u32::try_from(self.slots.len())
                .ok()
                .filter(|&s| s < u32::MAX)
                .ok_or_else(|| Error::InvalidInput("the index is full".into()))?,
        };
        if slot as usize == self.slots.len() {
            self.slots.push(None);
        }
        self.postings
            .resize_with(self.goal_vocabulary.len(), Vec::new);
        self.stale.resize(self.goal_vocabulary.len(), 0);
        for &id in &goal {
            self.postings[id as usize].push(slot);
        }
        let goal_len = goal.len() as u32;
        goal.extend_from_slice(&tool_ids);
        let entry = CrystalEntry {
            order,
            effectiveness,
            reuse_count,
            goal_len,
            tokens: goal.into_boxed_slice(),
        };
        self.eviction.offer(entry.evict_key(slot));
        self.slots[slot as usize] = Some(entry);
        self.len += 1;
        Ok(slot)
    }

    /// Sets the effectiveness and reuse count of `slot`; returns whether it
    /// holds an entry.
    pub fn update(&mut self, slot: u32, effectiveness: f64, reuse_count: u64) -> Result<bool> {
        let effectiveness = check_effectiveness(effectiveness)?;
        let Some(Some(entry)) = self.slots.get_mut(slot as usize) else {
            return Ok(false);
        };
        entry.effectiveness = effectiveness;
        entry.reuse_count = reuse_count;
        let key = entry.evict_key(slot);
        self.eviction.offer(key);
        Ok(true)
    }

    /// Removes the entry of `slot`; returns whether there was one.
    pub fn remove(&mut self, slot: u32) -> bool {
        let Some(entry) = self.slots.get_mut(slot as usize).and_then(Option::take) else {
            return false;
        };
        for &id in entry.goal() {
            let id = id as usize;
            self.stale[id] += 1;
            if 2 * self.stale[id] as usize > self.postings[id].len() {
                self.clean_posting(id);
            }
        }
        self.free_slots.push(slot);
        self.len -= 1;
        true
    }

    /// Drops stale and repeated slots from the posting list of token `id`.
    fn clean_posting(&mut self, id: usize) {
        let mut posting = std::mem::take(&mut self.postings[id]);
        posting.sort_unstable();
        posting.dedup();
        posting.retain(|&slot| {
            self.entry(slot)
                .is_some_and(|e| e.goal().binary_search(&(id as u32)).is_ok())
        });
        posting.shrink_to_fit();
        self.postings[id] = posting;
        self.stale[id] = 0;
    }

    /// The `k` best entries for the goal tokens `query`: Jaccard similarity
    /// times [`effectiveness_boost`], only entries sharing at least one
    /// token, best first (ties: lower order, then lower slot). Exact: the
    /// early stop never drops an entry that would rank among the `k`.
    pub fn top_k<S: AsRef<str>>(&self, query: &[S], k: usize) -> Vec<CrystalMatch> {
        let (ids, query_len) = lookup(&self.goal_vocabulary, query);
        if ids.is_empty() || k == 0 {
            return Vec::new();
        }
        let mut lists: Vec<&[u32]> = ids
            .iter()
            .map(|&id| self.postings[id as usize].as_slice())
            .collect();
        lists.sort_by_key(|list| list.len());
        let known = lists.len();
        let mut seen = SeenSlots::new(self.slots.len());
        let mut best: BinaryHeap<Ranked> = BinaryHeap::with_capacity(k.min(self.len) + 1);
        for (i, list) in lists.iter().enumerate() {
            let bound = (known - i) as f64 / query_len as f64;
            if best.len() == k && best.peek().is_some_and(|worst| bound < worst.score) {
                break;
            }
            for &slot in list.iter() {
                if !seen.insert(slot) {
                    continue;
                }
                let Some(entry) = self.entry(slot) else {
                    continue;
                };
                let shared = intersection_count(&ids, entry.goal());
                if shared == 0 {
                    continue;
                }
                let similarity = set_score(shared, query_len, entry.goal().len());
                let candidate = Ranked {
                    score: similarity * effectiveness_boost(entry.effectiveness),
                    similarity,
                    order: entry.order,
                    slot,
                };
                if best.len() < k {
                    best.push(candidate);
                } else if best.peek().is_some_and(|worst| candidate < *worst) {
                    best.pop();
                    best.push(candidate);
                }
            }
        }
        best.into_sorted_vec()
            .into_iter()
            .map(|r| CrystalMatch {
                slot: r.slot,
                score: r.score,
                similarity: r.similarity,
            })
            .collect()
    }

    /// The most similar entry whose goal-token Jaccard is above
    /// `goal_threshold` *and* whose tool-set Jaccard is above
    /// `tool_threshold` (both strictly), or `None`. Most similar: highest
    /// goal similarity, then highest tool similarity, then lowest order,
    /// then lowest slot. Thresholds must be in [0, 1].
    pub fn find_similar<S: AsRef<str>, T: AsRef<str>>(
        &self,
        goal_tokens: &[S],
        tools: &[T],
        goal_threshold: f64,
        tool_threshold: f64,
    ) -> Result<Option<SimilarCrystal>> {
        check_threshold("goal_threshold", goal_threshold)?;
        check_threshold("tool_threshold", tool_threshold)?;
        let (ids, query_len) = lookup(&self.goal_vocabulary, goal_tokens);
        let (tool_ids, tools_len) = lookup(&self.tool_vocabulary, tools);
        // J > t needs more than t * |A| shared tokens (|A ∪ B| >= |A|).
        // Rounding can only make `needed` smaller than the exact bound,
        // which reads more lists, never fewer.
        let needed = ((goal_threshold * query_len as f64).floor() as usize + 1).max(1);
        if ids.len() < needed {
            return Ok(None);
        }
        let mut lists: Vec<&[u32]> = ids
            .iter()
            .map(|&id| self.postings[id as usize].as_slice())
            .collect();
        lists.sort_by_key(|list| list.len());
        let prefix = ids.len() - needed + 1;
        let mut seen = SeenSlots::new(self.slots.len());
        let mut found: Option<(SimilarCrystal, u64)> = None;
        for list in &lists[..prefix] {
            for &slot in list.iter() {
                if !seen.insert(slot) {
                    continue;
                }
                let Some(entry) = self.entry(slot) else {
                    continue;
                };
                let goal_similarity = set_score(
                    intersection_count(&ids, entry.goal()),
                    query_len,
                    entry.goal().len(),
                );
                if goal_similarity <= goal_threshold {
                    continue;
                }
                let tool_similarity = set_score(
                    intersection_count(&tool_ids, entry.tools()),
                    tools_len,
                    entry.tools().len(),
                );
                if tool_similarity <= tool_threshold {
                    continue;
                }
                let better = match &found {
                    None => true,
                    Some((f, order)) => goal_similarity
                        .total_cmp(&f.goal_similarity)
                        .then_with(|| tool_similarity.total_cmp(&f.tool_similarity))
                        .then_with(|| order.cmp(&entry.order))
                        .then_with(|| f.slot.cmp(&slot))
                        .is_gt(),
                };
                if better {
                    let similar = SimilarCrystal {
                        slot,
                        goal_similarity,
                        tool_similarity,
                    };
                    found = Some((similar, entry.order));
                }
            }
        }
        Ok(found.map(|(similar, _)| similar))
    }

    /// The entry to evict next, other than `exclude`: least effective, then
    /// fewest reuses, then lowest order, then lowest slot. `None` when there
    /// is no other entry.
    pub fn least_effective(&mut self, exclude: Option<u32>) -> Option<u32> {
        for attempt in 0..2 {
            if attempt == 1 || self.eviction.limit.is_none() {
                self.refill_eviction();
            }
            let candidates = &mut self.eviction.candidates;
            let mut i = candidates.len();
            while i > 0 {
                i -= 1;
                let key = candidates[i];
                let live = self.slots.get(key.slot as usize).and_then(Option::as_ref);
                if !live.is_some_and(|e| e.evict_key(key.slot) == key) {
                    candidates.remove(i);
                    continue;
                }
                if Some(key.slot) != exclude {
                    return Some(key.slot);
                }
            }
            if self.eviction.limit == Some(EvictKey::MAX) {
                return None; // the candidates are every entry
            }
        }
        None
    }

    /// Collects the `EVICTION_BATCH` least keys of the whole index.
    fn refill_eviction(&mut self) {
        let mut heap: BinaryHeap<EvictKey> = BinaryHeap::with_capacity(EVICTION_BATCH + 1);
        for (slot, entry) in self.slots.iter().enumerate() {
            let Some(entry) = entry else { continue };
            let key = entry.evict_key(slot as u32);
            if heap.len() < EVICTION_BATCH {
                heap.push(key);
            } else if heap.peek().is_some_and(|top| key < *top) {
                heap.pop();
                heap.push(key);
            }
        }
        let limit = if self.len <= EVICTION_BATCH {
            EvictKey::MAX
        } else {
            heap.peek().copied().unwrap_or(EvictKey::MAX)
        };
        let mut candidates = heap.into_vec();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        self.eviction = Eviction {
            candidates,
            limit: Some(limit),
        };
    }

    /// Count, entries with effectiveness >= `effective_threshold`, total
    /// reuses and the sum of effectiveness.
    pub fn stats(&self, effective_threshold: f64) -> CrystalStats {
        let mut stats = CrystalStats {
            count: 0,
            effective: 0,
            total_reuses: 0,
            effectiveness_sum: 0.0,
        };
        for entry in self.slots.iter().flatten() {
            stats.count += 1;
            if entry.effectiveness >= effective_threshold {
                stats.effective += 1;
            }
            stats.total_reuses = stats.total_reuses.saturating_add(entry.reuse_count);
            stats.effectiveness_sum += entry.effectiveness;
        }
        stats
    }

    /// An estimate of the heap bytes the index holds (allocator overhead
    /// approximated as 16 bytes per allocation).
    pub fn memory_usage(&self) -> usize {
        const ALLOCATION: usize = 16;
        let vocabulary = |v: &HashMap<Box<str>, u32>| {
            v.capacity() * (std::mem::size_of::<(Box<str>, u32)>() + 1)
                + v.keys().map(|k| k.len() + ALLOCATION).sum::<usize>()
        };
        let slots = self.slots.capacity() * std::mem::size_of::<Option<CrystalEntry>>()
            + self
                .slots
                .iter()
                .flatten()
                .map(|e| e.tokens.len() * 4 + ALLOCATION)
                .sum::<usize>();
        let postings = self.postings.capacity() * std::mem::size_of::<Vec<u32>>()
            + self
                .postings
                .iter()
                .map(|p| p.capacity() * 4 + ALLOCATION)
                .sum::<usize>();
        vocabulary(&self.goal_vocabulary)
            + vocabulary(&self.tool_vocabulary)
            + slots
            + postings
            + self.stale.capacity() * 4
            + self.free_slots.capacity() * 4
            + self.eviction.candidates.capacity() * std::mem::size_of::<EvictKey>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(words: &str) -> Vec<String> {
        words.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn tokenize_rules() {
        assert_eq!(
            tokenize("Deploy {file_path} to {url}"),
            ["deploy", "{file_path}", "to", "{url}"]
        );
        assert_eq!(
            tokenize("Process {N} records"),
            ["process", "{n}", "records"]
        );
        assert_eq!(tokenize("the THE The tHe"), ["the"]);
        assert_eq!(
            tokenize("snake_case and kebab-case"),
            ["snake_case", "and", "kebab", "case"]
        );
        assert_eq!(tokenize("py311 utf-8 3.5"), ["py311", "utf", "8", "3", "5"]);
        assert_eq!(tokenize("{} {a b} {ab"), ["a", "b", "ab"]);
        assert_eq!(tokenize("{{x}} x"), ["{x}", "x"]);
        assert_eq!(tokenize("ab{cd}ef"), ["ab", "{cd}", "ef"]);
        assert_eq!(tokenize("{A-B}"), ["a", "b"]);
        assert_eq!(tokenize(""), Vec::<String>::new());
        assert_eq!(tokenize("  \t\n!!"), Vec::<String>::new());
    }

    #[test]
    fn tokenize_is_ascii_only() {
        // Non-ASCII characters separate tokens and are never lowercased
        // (not even the KELVIN SIGN, which str.lower() maps to 'k').
        assert_eq!(tokenize("Straße café"), ["stra", "e", "caf"]);
        assert_eq!(tokenize("\u{212A}elvin"), ["elvin"]);
        assert_eq!(tokenize("ÀB"), ["b"]);
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

    /// A tiny deterministic generator for the randomized comparison.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, bound: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (self.0 >> 33) % bound
        }
        fn tokens(&mut self, vocabulary: u64) -> Vec<String> {
            let n = self.next(6);
            (0..n)
                .map(|_| format!("t{}", self.next(vocabulary)))
                .collect()
        }
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

    /// What a brute-force library says, to hold `CrystalIndex` to.
    #[derive(Clone)]
    struct ModelCrystal {
        order: u64,
        goal: Vec<String>,
        tools: Vec<String>,
        effectiveness: f64,
        reuse_count: u64,
    }

    fn model_top_k(
        model: &std::collections::BTreeMap<u32, ModelCrystal>,
        query: &[String],
        k: usize,
    ) -> Vec<CrystalMatch> {
        let mut all: Vec<(CrystalMatch, u64)> = model
            .iter()
            .filter_map(|(&slot, c)| {
                let similarity = jaccard(query, &c.goal);
                (similarity > 0.0).then(|| {
                    let score = similarity * effectiveness_boost(c.effectiveness);
                    (
                        CrystalMatch {
                            slot,
                            score,
                            similarity,
                        },
                        c.order,
                    )
                })
            })
            .collect();
        all.sort_by(|(a, ao), (b, bo)| {
            b.score
                .total_cmp(&a.score)
                .then(ao.cmp(bo))
                .then(a.slot.cmp(&b.slot))
        });
        all.into_iter().take(k).map(|(m, _)| m).collect()
    }

    fn model_similar(
        model: &std::collections::BTreeMap<u32, ModelCrystal>,
        goal: &[String],
        tools: &[String],
        goal_threshold: f64,
        tool_threshold: f64,
    ) -> Option<SimilarCrystal> {
        let mut found: Vec<(SimilarCrystal, u64)> = model
            .iter()
            .filter_map(|(&slot, c)| {
                let goal_similarity = jaccard(goal, &c.goal);
                let tool_similarity = jaccard(tools, &c.tools);
                (goal_similarity > goal_threshold && tool_similarity > tool_threshold).then_some((
                    SimilarCrystal {
                        slot,
                        goal_similarity,
                        tool_similarity,
                    },
                    c.order,
                ))
            })
            .collect();
        found.sort_by(|(a, ao), (b, bo)| {
            b.goal_similarity
                .total_cmp(&a.goal_similarity)
                .then(b.tool_similarity.total_cmp(&a.tool_similarity))
                .then(ao.cmp(bo))
                .then(a.slot.cmp(&b.slot))
        });
        found.first().map(|(s, _)| *s)
    }

    fn model_least(
        model: &std::collections::BTreeMap<u32, ModelCrystal>,
        exclude: Option<u32>,
    ) -> Option<u32> {
        model
            .iter()
            .filter(|(&slot, _)| Some(slot) != exclude)
            .min_by(|(sa, a), (sb, b)| {
                a.effectiveness
                    .total_cmp(&b.effectiveness)
                    .then(a.reuse_count.cmp(&b.reuse_count))
                    .then(a.order.cmp(&b.order))
                    .then(sa.cmp(sb))
            })
            .map(|(&slot, _)| slot)
    }

    #[test]
    fn crystal_index_basics() {
        let mut index = CrystalIndex::new();
        let deploy = index
            .add(
                0,
                &toks("deploy {file_path} to {url}"),
                &toks("file_read shell"),
                0.9,
                0,
            )
            .unwrap();
        let process = index
            .add(1, &toks("process {n} records"), &toks("python"), 0.5, 0)
            .unwrap();
        assert_eq!((deploy, process), (0, 1));
        assert_eq!(index.len(), 2);
        let hits = index.top_k(&toks("deploy {file_path} to staging"), 3);
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].slot, deploy);
        assert_eq!(hits[0].similarity, 0.6);
        assert_eq!(hits[0].score, 0.6 * 0.95);
        assert!(index.top_k(&toks("nothing shared"), 3).is_empty());
        assert!(index.top_k(&toks(""), 3).is_empty());
        assert!(index.top_k(&toks("deploy"), 0).is_empty());
        // Novelty: strictly above both thresholds.
        let same_goal = toks("deploy {file_path} to {url}");
        let found = index
            .find_similar(&same_goal, &toks("shell file_read"), 0.7, 0.8)
            .unwrap()
            .unwrap();
        assert_eq!(found.slot, deploy);
        assert_eq!((found.goal_similarity, found.tool_similarity), (1.0, 1.0));
        assert!(index
            .find_similar(&same_goal, &toks("shell"), 0.7, 0.8)
            .unwrap()
            .is_none());
        assert!(index
            .find_similar(&toks(""), &toks(""), 0.7, 0.8)
            .unwrap()
            .is_none());
        assert!(index.find_similar(&same_goal, &toks(""), 1.5, 0.8).is_err());
        assert!(index.add(2, &same_goal, &toks(""), f64::NAN, 0).is_err());
        assert!(index.add(2, &same_goal, &toks(""), 1.01, 0).is_err());
        // Eviction: least effective first, the excluded one skipped.
        assert_eq!(index.least_effective(None), Some(process));
        assert_eq!(index.least_effective(Some(process)), Some(deploy));
        assert!(index.update(process, 1.0, 4).unwrap());
        assert!(!index.update(99, 1.0, 4).unwrap());
        assert_eq!(index.least_effective(None), Some(deploy));
        let stats = index.stats(0.5);
        assert_eq!(
            (stats.count, stats.effective, stats.total_reuses),
            (2, 2, 4)
        );
        assert_eq!(stats.effectiveness_sum, 1.9);
        assert!(index.remove(deploy));
        assert!(!index.remove(deploy));
        assert!(!index.contains(deploy) && index.contains(process));
        assert_eq!(index.least_effective(Some(process)), None);
        assert!(index
            .top_k(&toks("deploy {file_path} to staging"), 3)
            .is_empty());
        // The freed slot is reused; its old postings do not leak.
        let again = index.add(5, &toks("other"), &toks(""), 0.7, 0).unwrap();
        assert_eq!(again, deploy);
        assert!(index.top_k(&toks("deploy"), 3).is_empty());
        assert_eq!(index.top_k(&toks("other"), 3)[0].slot, again);
        assert!(index.memory_usage() > 0);
    }

    #[test]
    fn crystal_index_thresholds_are_strict() {
        let mut index = CrystalIndex::new();
        // goal: 7 of 10 shared -> exactly 0.7; tools: 4 of 5 -> exactly 0.8.
        let goal: Vec<String> = (0..10).map(|i| format!("g{i}")).collect();
        let tools: Vec<String> = (0..5).map(|i| format!("t{i}")).collect();
        index.add(0, &goal, &tools, 0.8, 0).unwrap();
        let goal_07: Vec<String> = (0..7).map(|i| format!("g{i}")).collect();
        let goal_08: Vec<String> = (0..8).map(|i| format!("g{i}")).collect();
        let tools_08: Vec<String> = (0..4).map(|i| format!("t{i}")).collect();
        assert_eq!(jaccard(&goal, &goal_07), 0.7);
        assert_eq!(jaccard(&tools, &tools_08), 0.8);
        let similar = |g: &[String], t: &[String]| index.find_similar(g, t, 0.7, 0.8).unwrap();
        assert!(similar(&goal_07, &tools).is_none());
        assert!(similar(&goal, &tools_08).is_none());
        assert!(similar(&goal_08, &tools).is_some());
        assert!(similar(&goal_07, &tools_08).is_none());
        // Thresholds 0: any shared goal token and any shared tool.
        assert!(index
            .find_similar(&toks("g3"), &toks("t1"), 0.0, 0.0)
            .unwrap()
            .is_some());
    }

    #[test]
    fn crystal_index_agrees_with_brute_force_under_churn() {
        let mut rng = Lcg(7);
        let mut index = CrystalIndex::new();
        let mut model: std::collections::BTreeMap<u32, ModelCrystal> = Default::default();
        let mut order = 0u64;
        for step in 0..6000 {
            match rng.next(12) {
                0..=4 => {
                    let goal = rng.tokens(12);
                    let tools = rng.tokens(6);
                    // Few distinct values, so that ties are common.
                    let effectiveness = rng.next(5) as f64 / 4.0;
                    let reuse_count = rng.next(3);
                    order += 1 + rng.next(2);
                    let slot = index
                        .add(order, &goal, &tools, effectiveness, reuse_count)
                        .unwrap();
                    assert!(!model.contains_key(&slot), "step {step}");
                    model.insert(
                        slot,
                        ModelCrystal {
                            order,
                            goal,
                            tools,
                            effectiveness,
                            reuse_count,
                        },
                    );
                }
                5..=6 => {
                    let slot = rng.next(model.len() as u64 + 2) as u32;
                    assert_eq!(index.remove(slot), model.remove(&slot).is_some());
                }
                7 => {
                    let slot = rng.next(model.len() as u64 + 2) as u32;
                    let effectiveness = rng.next(5) as f64 / 4.0;
                    let reuse_count = rng.next(4);
                    let known = model.get_mut(&slot).map(|c| {
                        c.effectiveness = effectiveness;
                        c.reuse_count = reuse_count;
                    });
                    assert_eq!(
                        index.update(slot, effectiveness, reuse_count).unwrap(),
                        known.is_some()
                    );
                }
                8..=9 => {
                    let query = rng.tokens(12);
                    let k = rng.next(6) as usize;
                    assert_eq!(
                        index.top_k(&query, k),
                        model_top_k(&model, &query, k),
                        "step {step}"
                    );
                }
                10 => {
                    let goal = rng.tokens(12);
                    let tools = rng.tokens(6);
                    let (gt, tt) = (rng.next(4) as f64 / 4.0, rng.next(4) as f64 / 4.0);
                    assert_eq!(
                        index.find_similar(&goal, &tools, gt, tt).unwrap(),
                        model_similar(&model, &goal, &tools, gt, tt),
                        "step {step}"
                    );
                }
                _ => {
                    let exclude =
                        (rng.next(2) == 0).then(|| rng.next(model.len() as u64 + 1) as u32);
                    let least = index.least_effective(exclude);
                    assert_eq!(least, model_least(&model, exclude), "step {step}");
                    // Evict it half of the time, as the library does.
                    if let Some(slot) = least.filter(|_| rng.next(2) == 0) {
                        assert!(index.remove(slot));
                        model.remove(&slot);
                    }
                }
            }
            assert_eq!(index.len(), model.len());
        }
        let stats = index.stats(0.5);
        assert_eq!(stats.count, model.len());
        assert_eq!(
            stats.effective,
            model.values().filter(|c| c.effectiveness >= 0.5).count()
        );
    }

    #[test]
    fn crystal_eviction_beyond_one_batch() {
        // More entries than one eviction scan collects, with updates that
        // move entries below and above the scan's limit.
        let mut rng = Lcg(3);
        let mut index = CrystalIndex::new();
        let mut model: std::collections::BTreeMap<u32, ModelCrystal> = Default::default();
        for order in 0..3000u64 {
            let effectiveness = rng.next(1000) as f64 / 999.0;
            let slot = index
                .add(order, &toks("a b"), &toks("t"), effectiveness, 0)
                .unwrap();
            model.insert(
                slot,
                ModelCrystal {
                    order,
                    goal: toks("a b"),
                    tools: toks("t"),
                    effectiveness,
                    reuse_count: 0,
                },
            );
        }
        for step in 0..2500 {
            if rng.next(3) == 0 {
                let slot = rng.next(3000) as u32;
                if let Some(c) = model.get_mut(&slot) {
                    c.effectiveness = rng.next(1000) as f64 / 999.0;
                    c.reuse_count += 1;
                    assert!(index.update(slot, c.effectiveness, c.reuse_count).unwrap());
                }
            }
            let least = index.least_effective(None);
            assert_eq!(least, model_least(&model, None), "step {step}");
            let slot = least.unwrap();
            assert!(index.remove(slot));
            model.remove(&slot);
        }
    }
}
