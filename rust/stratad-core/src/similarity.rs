//! Keyword tokens, Jaccard similarity and top-k matching.
//!
//! Crystals are matched to a new goal by the Jaccard similarity of their
//! keyword sets. The library of crystals must scale to a million entries, so
//! [`JaccardIndex`] interns tokens to `u32` ids and keeps an inverted index
//! (token -> entries holding it): a query only touches entries that share at
//! least one token with it, never the whole library.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError};

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

/// Eviction order: least effective first, then fewest reuses, then lowest
/// order (oldest), then slot. Unique per entry (it holds the slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EvictKey {
    /// The bits of the effectiveness: it is in [0, 1] and never -0.0, so its
    /// bits order as the numbers do.
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

/// One occurrence of a goal token: the slot holding it, and the slot's
/// generation when it was added (a slot's generation changes when its entry
/// is removed, which makes its old postings stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Posting {
    slot: u32,
    generation: u32,
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

/// Keeps `candidate` in `best` if it is among the `k` best so far.
fn push_best(best: &mut BinaryHeap<Ranked>, k: usize, candidate: Ranked) {
    if best.len() < k {
        best.push(candidate);
    } else if best.peek().is_some_and(|worst| candidate < *worst) {
        best.pop();
        best.push(candidate);
    }
}

/// The bit of goal token `id` in an entry's 64-bit signature (a one-hash
/// Bloom filter of its goal tokens).
fn signature_bit(id: u32) -> u64 {
    1u64 << (id.wrapping_mul(0x9E37_79B1) >> 26)
}

/// Default of [`CrystalIndex::set_skip_threshold`].
pub const DEFAULT_SKIP_MIN_POSTINGS: usize = 2048;

/// Shared-token counts of one search: `counts[slot]`, and the slots with a
/// non-zero count. Buffers are pooled so that a search on a large index does
/// not allocate (and fault in) a counter per slot every time.
#[derive(Debug, Default)]
struct Counts {
    counts: Vec<u32>,
    touched: Vec<u32>,
    /// Slots whose count reached `min_count` (each once); with `min_count`
    /// 1, `touched` is used instead.
    reached: Vec<u32>,
    min_count: u32,
}

impl Counts {
    /// The slots whose count reached `min_count`.
    fn candidates(&self) -> &[u32] {
        if self.min_count <= 1 {
            &self.touched
        } else {
            &self.reached
        }
    }
}

/// How many count buffers an index keeps for reuse (about one per
/// concurrent search).
const POOLED_COUNTS: usize = 4;

/// What searches read of a candidate, packed in one 32-byte record so that
/// a candidate costs one cache line, not one per field.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    /// One bit per goal token ([`signature_bit`]).
    signature: u64,
    effectiveness: f64,
    order: u64,
    goal_len: u32,
}

/// The library of crystals of one tenant, as the daemon searches it.
///
/// Each entry (a *slot*, allocated by [`CrystalIndex::add`] and reused after
/// [`CrystalIndex::remove`]) holds the token ids of its goal template and of
/// its tool names, its effectiveness, reuse count and an `order` (the
/// caller's creation sequence number, used to break ties). Goal tokens have
/// an inverted index (token -> postings), so searches count shared tokens
/// by reading posting lists, never visiting entries that share nothing:
///
/// - [`top_k`](CrystalIndex::top_k) ranks by Jaccard similarity boosted by
///   effectiveness ([`effectiveness_boost`]), exactly. The longest posting
///   lists (at most half of the query's tokens) are skipped at first: each
///   entry found in the other lists gets an upper bound (its count so far,
///   plus the skipped tokens its 64-bit signature may hold), the entries
///   with the best bounds are scored exactly, and the rest only when their
///   bound reaches the k-th best score. An entry only in skipped lists
///   shares at most `L` of the `|A|` query tokens, so scores at most
///   `L / |A|`; unless that is below the k-th best score, the skipped lists
///   are counted after all and candidates are scored in decreasing order of
///   shared tokens (stopping once `shared / |A|` is below the k-th best).
/// - [`find_similar`](CrystalIndex::find_similar) (the novelty check) skips
///   the longest lists as long as their number `L` keeps `L / |A|` at or
///   below the threshold (prefix filtering), and checks the entries found in
///   the other lists against their signature, then exactly.
/// - [`least_effective`](CrystalIndex::least_effective) finds the entry to
///   evict in amortized O(n / 1024).
///
/// Removing an entry bumps its slot's generation, which makes its postings
/// stale (skipped by searches); a list is cleaned when more than a quarter
/// of it is stale.
#[derive(Debug)]
pub struct CrystalIndex {
    goal_vocabulary: HashMap<Box<str>, u32>,
    postings: Vec<Vec<Posting>>,
    stale: Vec<u32>,
    tool_vocabulary: HashMap<Box<str>, u32>,
    slots: Vec<Slot>,
    /// Per slot: changes when the slot's entry is removed, which makes its
    /// postings stale. Apart from `slots` because counting reads it for every
    /// posting of a list holding stale ones: 4 bytes per slot keep that read
    /// cheap.
    generation: Vec<u32>,
    reuse_count: Vec<u64>,
    /// Goal token ids then tool ids (each part sorted); `None` for a free slot.
    tokens: Vec<Option<Box<[u32]>>>,
    free_slots: Vec<u32>,
    len: usize,
    eviction: Eviction,
    pool: Mutex<Vec<Counts>>,
    skip_min_postings: usize,
    /// At least the effectiveness of every entry (it never decreases), so
    /// `effectiveness_boost(max_effectiveness)` bounds every boost.
    max_effectiveness: f64,
}

impl Default for CrystalIndex {
    fn default() -> Self {
        Self {
            goal_vocabulary: HashMap::new(),
            postings: Vec::new(),
            stale: Vec::new(),
            tool_vocabulary: HashMap::new(),
            slots: Vec::new(),
            generation: Vec::new(),
            reuse_count: Vec::new(),
            tokens: Vec::new(),
            free_slots: Vec::new(),
            len: 0,
            eviction: Eviction::default(),
            pool: Mutex::default(),
            skip_min_postings: DEFAULT_SKIP_MIN_POSTINGS,
            max_effectiveness: 0.0,
        }
    }
}

impl Clone for CrystalIndex {
    fn clone(&self) -> Self {
        Self {
            goal_vocabulary: self.goal_vocabulary.clone(),
            postings: self.postings.clone(),
            stale: self.stale.clone(),
            tool_vocabulary: self.tool_vocabulary.clone(),
            slots: self.slots.clone(),
            generation: self.generation.clone(),
            reuse_count: self.reuse_count.clone(),
            tokens: self.tokens.clone(),
            free_slots: self.free_slots.clone(),
            len: self.len,
            eviction: self.eviction.clone(),
            pool: Mutex::default(),
            skip_min_postings: self.skip_min_postings,
            max_effectiveness: self.max_effectiveness,
        }
    }
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

    /// Posting lists at least this long may be skipped by searches (default
    /// [`DEFAULT_SKIP_MIN_POSTINGS`]; results are the same either way, only
    /// the work differs). For tests and tuning.
    pub fn set_skip_threshold(&mut self, postings: usize) {
        self.skip_min_postings = postings.max(1);
    }

    /// Whether `slot` holds an entry.
    pub fn contains(&self, slot: u32) -> bool {
        self.entry_tokens(slot).is_some()
    }

    fn entry_tokens(&self, slot: u32) -> Option<&[u32]> {
        self.tokens.get(slot as usize)?.as_deref()
    }

    fn evict_key(&self, slot: u32) -> EvictKey {
        let at = slot as usize;
        EvictKey {
            effectiveness: self.slots[at].effectiveness.to_bits(),
            reuse_count: self.reuse_count[at],
            order: self.slots[at].order,
            slot,
        }
    }

    /// Adds a crystal; returns its slot (the most recently freed one, else a
    /// new one at the end).
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
            None => {
                let slot = u32::try_from(self.tokens.len())
                    .ok()
                    .filter(|&s| s < u32::MAX)
                    .ok_or_else(|| Error::InvalidInput("the index is full".into()))?;
                self.slots.push(Slot::default());
                self.generation.push(0);
                self.reuse_count.push(0);
                self.tokens.push(None);
                slot
            }
        };
        self.postings
            .resize_with(self.goal_vocabulary.len(), Vec::new);
        self.stale.resize(self.goal_vocabulary.len(), 0);
        let at = slot as usize;
        let posting = Posting {
            slot,
            generation: self.generation[at],
        };
        for &id in &goal {
            self.postings[id as usize].push(posting);
        }
        let record = &mut self.slots[at];
        record.order = order;
        record.effectiveness = effectiveness;
        self.max_effectiveness = self.max_effectiveness.max(effectiveness);
        record.goal_len = goal.len() as u32;
        record.signature = goal.iter().fold(0, |bits, &id| bits | signature_bit(id));
        self.reuse_count[at] = reuse_count;
        goal.extend_from_slice(&tool_ids);
        self.tokens[at] = Some(goal.into_boxed_slice());
        self.len += 1;
        let key = self.evict_key(slot);
        self.eviction.offer(key);
        Ok(slot)
    }

    /// Sets the effectiveness and reuse count of `slot`; returns whether it
    /// holds an entry.
    pub fn update(&mut self, slot: u32, effectiveness: f64, reuse_count: u64) -> Result<bool> {
        let effectiveness = check_effectiveness(effectiveness)?;
        if !self.contains(slot) {
            return Ok(false);
        }
        self.slots[slot as usize].effectiveness = effectiveness;
        self.reuse_count[slot as usize] = reuse_count;
        self.max_effectiveness = self.max_effectiveness.max(effectiveness);
        let key = self.evict_key(slot);
        self.eviction.offer(key);
        Ok(true)
    }

    /// Removes the entry of `slot`; returns whether there was one.
    pub fn remove(&mut self, slot: u32) -> bool {
        let at = slot as usize;
        let Some(tokens) = self.tokens.get_mut(at).and_then(Option::take) else {
            return false;
        };
        self.generation[at] = self.generation[at].wrapping_add(1);
        for &id in &tokens[..self.slots[at].goal_len as usize] {
            let id = id as usize;
            self.stale[id] += 1;
            // Cleaning costs the list's length; at a quarter stale it is paid
            // by that many removals, and lists stay mostly live.
            if 4 * self.stale[id] as usize > self.postings[id].len() {
                let generation = &self.generation;
                let posting = &mut self.postings[id];
                posting.retain(|p| generation[p.slot as usize] == p.generation);
                posting.shrink_to_fit();
                self.stale[id] = 0;
            }
        }
        self.free_slots.push(slot);
        self.len -= 1;
        true
    }

    /// A cleared count buffer (from the pool when there is one) that will
    /// list the slots whose count reaches `min_count`.
    fn take_counts(&self, min_count: u32) -> Counts {
        let mut counts = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        counts.counts.resize(self.tokens.len(), 0);
        counts.min_count = min_count;
        counts
    }

    /// Adds to `counts`, for every entry, how many of the goal tokens `ids`
    /// it holds.
    fn count_lists(&self, counts: &mut Counts, ids: &[u32]) {
        let Counts {
            counts,
            touched,
            reached,
            min_count,
        } = counts;
        for &id in ids {
            let postings = &self.postings[id as usize];
            // Most lists hold no stale posting: skip the generation checks.
            let check = self.stale[id as usize] > 0;
            for p in postings {
                let slot = p.slot as usize;
                if check && self.generation[slot] != p.generation {
                    continue;
                }
                let count = &mut counts[slot];
                *count += 1;
                if *count == 1 {
                    touched.push(p.slot);
                }
                if *count == *min_count && *min_count > 1 {
                    reached.push(p.slot);
                }
            }
        }
    }

    /// Clears `counts` and keeps it for the next search.
    fn recycle(&self, mut counts: Counts) {
        if counts.touched.len() > counts.counts.len() / 16 {
            counts.counts.fill(0);
        } else {
            for &slot in &counts.touched {
                counts.counts[slot as usize] = 0;
            }
        }
        counts.touched.clear();
        counts.reached.clear();
        let mut pool = self.pool.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < POOLED_COUNTS {
            pool.push(counts);
        }
    }

    /// Splits the query's token ids into the lists to count and at most
    /// `max_skip` of the longest lists to skip (those with at least
    /// `skip_min_postings` postings; at least one list is always counted).
    /// The skipped ids come back sorted.
    fn split(&self, ids: &[u32], max_skip: usize) -> (Vec<u32>, Vec<u32>) {
        let mut by_length = ids.to_vec();
        by_length.sort_by_key(|&id| self.postings[id as usize].len());
        let mut skip = 0;
        while skip < max_skip
            && skip + 1 < by_length.len()
            && self.postings[by_length[by_length.len() - 1 - skip] as usize].len()
                >= self.skip_min_postings
        {
            skip += 1;
        }
        let mut skipped = by_length.split_off(by_length.len() - skip);
        skipped.sort_unstable();
        (by_length, skipped)
    }

    /// Goal tokens of `slot` among the (sorted) `ids`: exact, from the entry.
    fn shared_with(&self, slot: u32, ids: &[u32]) -> usize {
        let goal_len = self.slots[slot as usize].goal_len as usize;
        self.entry_tokens(slot)
            .map_or(0, |tokens| intersection_count(ids, &tokens[..goal_len]))
    }

    /// At least every entry's boost.
    fn max_boost(&self) -> f64 {
        effectiveness_boost(self.max_effectiveness)
    }

    fn ranked(&self, slot: u32, shared: usize, query_len: usize) -> Ranked {
        let record = &self.slots[slot as usize];
        let similarity = set_score(shared, query_len, record.goal_len as usize);
        Ranked {
            score: similarity * effectiveness_boost(record.effectiveness),
            similarity,
            order: record.order,
            slot,
        }
    }

    /// The `k` best entries for the goal tokens `query`: Jaccard similarity
    /// times [`effectiveness_boost`], only entries sharing at least one
    /// token, best first (ties: lower order, then lower slot). Exact.
    pub fn top_k<S: AsRef<str>>(&self, query: &[S], k: usize) -> Vec<CrystalMatch> {
        let (ids, query_len) = lookup(&self.goal_vocabulary, query);
        if ids.is_empty() || k == 0 {
            return Vec::new();
        }
        let (counted, skipped) = self.split(&ids, query_len / 2);
        // Entries sharing one counted token are many and rarely rank: only
        // those sharing two are looked at first (when two are counted).
        let min_count = if !skipped.is_empty() && counted.len() >= 2 {
            2
        } else {
            1
        };
        let mut counts = self.take_counts(min_count);
        self.count_lists(&mut counts, &counted);
        let mut skipped = skipped;
        let mut found = None;
        while !skipped.is_empty() {
            found = self.top_k_skipping(&counts, &skipped, query_len, k);
            if found.is_some() {
                break;
            }
            // Count the shortest skipped list too: the bound on entries not
            // looked at drops by 1 / |A|.
            let shortest = skipped
                .iter()
                .enumerate()
                .min_by_key(|(_, &id)| self.postings[id as usize].len())
                .map_or(0, |(at, _)| at);
            let id = skipped.remove(shortest);
            self.count_lists(&mut counts, &[id]);
        }
        let best = found.unwrap_or_else(|| self.top_k_counted(&counts, ids.len(), query_len, k));
        self.recycle(counts);
        best.into_sorted_vec()
            .into_iter()
            .map(|r| CrystalMatch {
                slot: r.slot,
                score: r.score,
                similarity: r.similarity,
            })
            .collect()
    }

    /// Top k from exact counts: candidates in decreasing order of shared
    /// tokens, stopping once `shared / |A|` is below the k-th best score.
    fn top_k_counted(
        &self,
        counts: &Counts,
        most: usize,
        query_len: usize,
        k: usize,
    ) -> BinaryHeap<Ranked> {
        // Touched slots in decreasing order of shared tokens (counting sort).
        let mut start = vec![0usize; most + 2];
        for &slot in &counts.touched {
            start[most - counts.counts[slot as usize] as usize + 1] += 1;
        }
        for level in 1..start.len() {
            start[level] += start[level - 1];
        }
        let mut by_count = vec![0u32; counts.touched.len()];
        for &slot in &counts.touched {
            let bucket = &mut start[most - counts.counts[slot as usize] as usize];
            by_count[*bucket] = slot;
            *bucket += 1;
        }
        let mut best: BinaryHeap<Ranked> = BinaryHeap::with_capacity(k.min(self.len) + 1);
        let mut level = usize::MAX;
        for &slot in &by_count {
            let shared = counts.counts[slot as usize] as usize;
            if shared != level {
                level = shared;
                // Similarity is at most shared / |A| (|A ∪ B| >= |A|), and
                // every boost at most the largest: no entry from here on can rank.
                let bound = shared as f64 / query_len as f64 * self.max_boost();
                if best.len() == k && best.peek().is_some_and(|worst| bound < worst.score) {
                    break;
                }
            }
            push_best(&mut best, k, self.ranked(slot, shared, query_len));
        }
        best
    }

    /// Top k with the `skipped` lists not counted, looking only at the
    /// entries with at least `min_count` shared counted tokens; `None` when
    /// other entries could still rank (then everything must be counted).
    ///
    /// An entry sharing `p` counted tokens shares at most `p + L` in all
    /// (`L` skipped lists), so its similarity is at most `(p + L) / |A|`;
    /// its signature gives a tighter bound; only entries whose bound reaches
    /// the k-th best score are scored exactly. Entries below `min_count`
    /// share at most `min_count - 1 + L` tokens.
    fn top_k_skipping(
        &self,
        counts: &Counts,
        skipped: &[u32],
        query_len: usize,
        k: usize,
    ) -> Option<BinaryHeap<Ranked>> {
        let bits: Vec<u64> = skipped.iter().map(|&id| signature_bit(id)).collect();
        let skip = skipped.len();
        let candidates = counts.candidates();
        // Candidates in decreasing order of counted tokens.
        let mut by_count: Vec<(u32, u32)> = candidates
            .iter()
            .map(|&slot| (counts.counts[slot as usize], slot))
            .collect();
        by_count.sort_unstable_by_key(|&(shared, _)| Reverse(shared));
        let mut best: BinaryHeap<Ranked> = BinaryHeap::with_capacity(k.min(self.len) + 1);
        let beaten = |best: &BinaryHeap<Ranked>, bound: f64| {
            best.len() == k && best.peek().is_some_and(|worst| bound < worst.score)
        };
        let mut level = u32::MAX;
        for &(shared, slot) in &by_count {
            if shared != level {
                level = shared;
                let most = (shared as usize + skip) as f64 / query_len as f64;
                if beaten(&best, most * self.max_boost()) {
                    break;
                }
            }
            let record = &self.slots[slot as usize];
            let goal_len = record.goal_len as usize;
            let maybe = bits.iter().filter(|&&b| record.signature & b != 0).count();
            let most = (shared as usize + maybe).min(goal_len);
            let bound =
                set_score(most, query_len, goal_len) * effectiveness_boost(record.effectiveness);
            if beaten(&best, bound) {
                continue;
            }
            let shared = shared as usize + self.shared_with(slot, skipped);
            push_best(&mut best, k, self.ranked(slot, shared, query_len));
        }
        let below = (counts.min_count.max(1) as usize - 1 + skip) as f64 / query_len as f64;
        beaten(&best, below * self.max_boost()).then_some(best)
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
        if ids.is_empty() {
            return Ok(None);
        }
        let (tool_ids, tools_len) = lookup(&self.tool_vocabulary, tools);
        // An entry sharing f tokens has similarity at most f / |A|: with the
        // same division as the similarity itself, so that rounding agrees,
        // skip as many lists L as keep L / |A| <= the threshold.
        let ratio = |f: usize| f as f64 / query_len as f64;
        let max_skip = (0..ids.len())
            .take_while(|&l| ratio(l) <= goal_threshold)
            .last()
            .unwrap_or(0);
        // An entry must share `needed` tokens, so at least `needed - L` of
        // the counted ones: skip one list fewer when that lets only entries
        // sharing two counted tokens be looked at.
        let needed = (1..=ids.len())
            .find(|&f| ratio(f) > goal_threshold)
            .unwrap_or(ids.len() + 1);
        if needed > ids.len() {
            return Ok(None);
        }
        let max_skip = if needed >= 3 {
            max_skip.min(needed - 2)
        } else {
            max_skip
        };
        let (counted, skipped) = self.split(&ids, max_skip);
        let min_count = (needed - skipped.len()) as u32;
        let bits: Vec<u64> = skipped.iter().map(|&id| signature_bit(id)).collect();
        let mut counts = self.take_counts(min_count);
        self.count_lists(&mut counts, &counted);
        let mut found: Option<(SimilarCrystal, u64)> = None;
        for &slot in counts.candidates() {
            let record = &self.slots[slot as usize];
            let goal_len = record.goal_len as usize;
            let mut shared = counts.counts[slot as usize] as usize;
            if !skipped.is_empty() {
                let maybe = bits.iter().filter(|&&b| record.signature & b != 0).count();
                let most = (shared + maybe).min(goal_len);
                if set_score(most, query_len, goal_len) <= goal_threshold {
                    continue;
                }
                shared += self.shared_with(slot, &skipped);
            }
            let goal_similarity = set_score(shared, query_len, goal_len);
            if goal_similarity <= goal_threshold {
                continue;
            }
            let Some(tokens) = self.entry_tokens(slot) else {
                continue;
            };
            let entry_tools = &tokens[goal_len..];
            let tool_similarity = set_score(
                intersection_count(&tool_ids, entry_tools),
                tools_len,
                entry_tools.len(),
            );
            if tool_similarity <= tool_threshold {
                continue;
            }
            let order = record.order;
            let better = match &found {
                None => true,
                Some((f, f_order)) => goal_similarity
                    .total_cmp(&f.goal_similarity)
                    .then_with(|| tool_similarity.total_cmp(&f.tool_similarity))
                    .then_with(|| f_order.cmp(&order))
                    .then_with(|| f.slot.cmp(&slot))
                    .is_gt(),
            };
            if better {
                let similar = SimilarCrystal {
                    slot,
                    goal_similarity,
                    tool_similarity,
                };
                found = Some((similar, order));
            }
        }
        self.recycle(counts);
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
            let mut i = self.eviction.candidates.len();
            while i > 0 {
                i -= 1;
                let key = self.eviction.candidates[i];
                if !self.contains(key.slot) || self.evict_key(key.slot) != key {
                    self.eviction.candidates.remove(i);
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
        for slot in 0..self.tokens.len() as u32 {
            if !self.contains(slot) {
                continue;
            }
            let key = self.evict_key(slot);
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
        for (at, tokens) in self.tokens.iter().enumerate() {
            if tokens.is_none() {
                continue;
            }
            let effectiveness = self.slots[at].effectiveness;
            stats.count += 1;
            if effectiveness >= effective_threshold {
                stats.effective += 1;
            }
            stats.total_reuses = stats.total_reuses.saturating_add(self.reuse_count[at]);
            stats.effectiveness_sum += effectiveness;
        }
        stats
    }

    /// An estimate of the heap bytes the index holds (allocator overhead
    /// approximated as 16 bytes per allocation).
    pub fn memory_usage(&self) -> usize {
        const ALLOCATION: usize = 16;
        fn vec_bytes<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        let vocabulary = |v: &HashMap<Box<str>, u32>| {
            v.capacity() * (std::mem::size_of::<(Box<str>, u32)>() + 1)
                + v.keys().map(|k| k.len() + ALLOCATION).sum::<usize>()
        };
        let per_slot = vec_bytes(&self.slots)
            + vec_bytes(&self.generation)
            + vec_bytes(&self.reuse_count)
            + vec_bytes(&self.tokens)
            + self
                .tokens
                .iter()
                .flatten()
                .map(|t| t.len() * 4 + ALLOCATION)
                .sum::<usize>();
        let postings = vec_bytes(&self.postings)
            + self
                .postings
                .iter()
                .map(|p| vec_bytes(p) + ALLOCATION)
                .sum::<usize>();
        let pooled = self
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|c| vec_bytes(&c.counts) + vec_bytes(&c.touched))
            .sum::<usize>();
        vocabulary(&self.goal_vocabulary)
            + vocabulary(&self.tool_vocabulary)
            + per_slot
            + postings
            + vec_bytes(&self.stale)
            + vec_bytes(&self.free_slots)
            + vec_bytes(&self.eviction.candidates)
            + pooled
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
        // Threshold 1: searches skip lists whenever their bounds allow.
        for (seed, skip_threshold) in [(7, DEFAULT_SKIP_MIN_POSTINGS), (8, 1), (9, 3)] {
            churn(seed, skip_threshold);
        }
    }

    fn churn(seed: u64, skip_threshold: usize) {
        let mut rng = Lcg(seed);
        let mut index = CrystalIndex::new();
        index.set_skip_threshold(skip_threshold);
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

    #[test]
    fn crystal_index_skipping_agrees_with_brute_force_at_scale() {
        // Common tokens in long lists (skipped) and rarer ones (counted).
        let mut rng = Lcg(11);
        let mut index = CrystalIndex::new();
        let mut model: std::collections::BTreeMap<u32, ModelCrystal> = Default::default();
        let common = ["the", "to", "{file_path}", "{url}", "deploy"];
        let draw = |rng: &mut Lcg| -> Vec<String> {
            let mut goal: Vec<String> = common
                .iter()
                .filter(|_| rng.next(3) == 0)
                .map(|t| t.to_string())
                .collect();
            for _ in 0..rng.next(4) {
                goal.push(format!("w{}", rng.next(300)));
            }
            goal
        };
        for order in 0..8_000u64 {
            let goal = draw(&mut rng);
            let tools: Vec<String> = (0..rng.next(4))
                .map(|i| format!("t{}", rng.next(6) + i))
                .collect();
            let effectiveness = rng.next(9) as f64 / 8.0;
            let slot = index.add(order, &goal, &tools, effectiveness, 0).unwrap();
            model.insert(
                slot,
                ModelCrystal {
                    order,
                    goal,
                    tools,
                    effectiveness,
                    reuse_count: 0,
                },
            );
        }
        for step in 0..120 {
            let query = draw(&mut rng);
            let k = 1 + rng.next(5) as usize;
            assert_eq!(
                index.top_k(&query, k),
                model_top_k(&model, &query, k),
                "step {step}"
            );
            let tools: Vec<String> = (0..rng.next(4))
                .map(|i| format!("t{}", rng.next(6) + i))
                .collect();
            for (gt, tt) in [(0.7, 0.8), (0.5, 0.0), (0.0, 0.0)] {
                assert_eq!(
                    index.find_similar(&query, &tools, gt, tt).unwrap(),
                    model_similar(&model, &query, &tools, gt, tt),
                    "step {step}"
                );
            }
            // Churn: remove some, so that lists hold stale postings.
            for _ in 0..5 {
                let slot = rng.next(8_000) as u32;
                assert_eq!(index.remove(slot), model.remove(&slot).is_some());
            }
        }
    }
}
