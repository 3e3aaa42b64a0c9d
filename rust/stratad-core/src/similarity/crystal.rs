//! [`CrystalIndex`]: the library of crystals of one tenant as the daemon
//! keeps it in memory. This file owns its layout (slots, interned goal and
//! tool tokens, the goal tokens' posting lists and their generations) and
//! everything that changes it: adding, updating and removing entries, plus
//! eviction and the totals. Searches are in `search.rs`, the eviction order
//! in `eviction.rs`.

use std::collections::HashMap;

use super::counts::CountPool;
use super::eviction::{EvictKey, Eviction};
use crate::error::{Error, Result};

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

/// One occurrence of a goal token: the slot holding it, and the slot's
/// generation when it was added (a slot's generation changes when its entry
/// is removed, which makes its old postings stale).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Posting {
    pub(super) slot: u32,
    pub(super) generation: u32,
}

/// The bit of goal token `id` in an entry's 64-bit signature (a one-hash
/// Bloom filter of its goal tokens).
pub(super) fn signature_bit(id: u32) -> u64 {
    1u64 << (id.wrapping_mul(0x9E37_79B1) >> 26)
}

/// Default of [`CrystalIndex::set_skip_threshold`].
pub const DEFAULT_SKIP_MIN_POSTINGS: usize = 2048;

/// What searches read of a candidate, packed in one 32-byte record so that
/// a candidate costs one cache line, not one per field.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Slot {
    /// One bit per goal token ([`signature_bit`]).
    pub(super) signature: u64,
    pub(super) effectiveness: f64,
    pub(super) order: u64,
    pub(super) goal_len: u32,
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
///   effectiveness ([`effectiveness_boost`](super::effectiveness_boost)), exactly. The longest posting
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
#[derive(Debug, Clone)]
pub struct CrystalIndex {
    pub(super) goal_vocabulary: HashMap<Box<str>, u32>,
    pub(super) postings: Vec<Vec<Posting>>,
    pub(super) stale: Vec<u32>,
    pub(super) tool_vocabulary: HashMap<Box<str>, u32>,
    pub(super) slots: Vec<Slot>,
    /// Per slot: changes when the slot's entry is removed, which makes its
    /// postings stale. Apart from `slots` because counting reads it for every
    /// posting of a list holding stale ones: 4 bytes per slot keep that read
    /// cheap.
    pub(super) generation: Vec<u32>,
    reuse_count: Vec<u64>,
    /// Goal token ids then tool ids (each part sorted); `None` for a free slot.
    pub(super) tokens: Vec<Option<Box<[u32]>>>,
    free_slots: Vec<u32>,
    pub(super) len: usize,
    eviction: Eviction,
    pub(super) pool: CountPool,
    pub(super) skip_min_postings: usize,
    /// At least the effectiveness of every entry (it never decreases), so
    /// `effectiveness_boost(max_effectiveness)` bounds every boost.
    pub(super) max_effectiveness: f64,
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
            pool: CountPool::default(),
            skip_min_postings: DEFAULT_SKIP_MIN_POSTINGS,
            max_effectiveness: 0.0,
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

/// The eviction key of the entry in `slot`.
fn evict_key(slots: &[Slot], reuse_count: &[u64], slot: u32) -> EvictKey {
    let at = slot as usize;
    EvictKey::new(
        slots[at].effectiveness,
        reuse_count[at],
        slots[at].order,
        slot,
    )
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

    pub(super) fn entry_tokens(&self, slot: u32) -> Option<&[u32]> {
        self.tokens.get(slot as usize)?.as_deref()
    }

    fn evict_key(&self, slot: u32) -> EvictKey {
        evict_key(&self.slots, &self.reuse_count, slot)
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

    /// The entry to evict next, other than `exclude`: least effective, then
    /// fewest reuses, then lowest order, then lowest slot. `None` when there
    /// is no other entry.
    pub fn least_effective(&mut self, exclude: Option<u32>) -> Option<u32> {
        let Self {
            slots,
            reuse_count,
            tokens,
            eviction,
            len,
            ..
        } = self;
        let key_of = |slot: u32| {
            tokens.get(slot as usize)?.as_ref()?;
            Some(evict_key(slots, reuse_count, slot))
        };
        eviction.least(exclude, tokens.len() as u32, *len, key_of)
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
        vocabulary(&self.goal_vocabulary)
            + vocabulary(&self.tool_vocabulary)
            + per_slot
            + postings
            + vec_bytes(&self.stale)
            + vec_bytes(&self.free_slots)
            + self.eviction.heap_bytes()
            + self.pool.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::similarity::testing::toks;

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
}
