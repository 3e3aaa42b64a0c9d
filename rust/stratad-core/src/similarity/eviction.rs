//! The eviction order of a crystal library: which entry goes first when the
//! library is full ([`CrystalIndex::least_effective`]), found in amortized
//! O(n / `EVICTION_BATCH`) without keeping every entry in a heap.
//!
//! This module knows nothing of the index's layout: the index hands it each
//! live entry's [`EvictKey`] through a lookup function.
//!
//! [`CrystalIndex::least_effective`]: super::CrystalIndex::least_effective

use std::collections::BinaryHeap;

/// Eviction order: least effective first, then fewest reuses, then lowest
/// order (oldest), then slot. Unique per entry (it holds the slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct EvictKey {
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

    /// The key of the entry in `slot`; `effectiveness` is in [0, 1] and not
    /// -0.0 (as the index keeps it).
    pub(super) fn new(effectiveness: f64, reuse_count: u64, order: u64, slot: u32) -> Self {
        EvictKey {
            effectiveness: effectiveness.to_bits(),
            reuse_count,
            order,
            slot,
        }
    }
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
pub(super) struct Eviction {
    candidates: Vec<EvictKey>,
    limit: Option<EvictKey>,
}

impl Eviction {
    /// Takes note of an entry's new key (added, or updated).
    pub(super) fn offer(&mut self, key: EvictKey) {
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

    /// The slot to evict next, other than `exclude`: the least key. `slots`
    /// is the number of slots, `live` the number of entries, `key_of` the
    /// current key of a slot's entry (`None` for a free slot). `None` when
    /// there is no other entry.
    pub(super) fn least(
        &mut self,
        exclude: Option<u32>,
        slots: u32,
        live: usize,
        key_of: impl Fn(u32) -> Option<EvictKey>,
    ) -> Option<u32> {
        for attempt in 0..2 {
            if attempt == 1 || self.limit.is_none() {
                self.refill(slots, live, &key_of);
            }
            let mut i = self.candidates.len();
            while i > 0 {
                i -= 1;
                let key = self.candidates[i];
                if key_of(key.slot) != Some(key) {
                    self.candidates.remove(i);
                    continue;
                }
                if Some(key.slot) != exclude {
                    return Some(key.slot);
                }
            }
            if self.limit == Some(EvictKey::MAX) {
                return None; // the candidates are every entry
            }
        }
        None
    }

    /// Collects the `EVICTION_BATCH` least keys of the whole index.
    fn refill(&mut self, slots: u32, live: usize, key_of: &impl Fn(u32) -> Option<EvictKey>) {
        let mut heap: BinaryHeap<EvictKey> = BinaryHeap::with_capacity(EVICTION_BATCH + 1);
        for slot in 0..slots {
            let Some(key) = key_of(slot) else {
                continue;
            };
            if heap.len() < EVICTION_BATCH {
                heap.push(key);
            } else if heap.peek().is_some_and(|top| key < *top) {
                heap.pop();
                heap.push(key);
            }
        }
        let limit = if live <= EVICTION_BATCH {
            EvictKey::MAX
        } else {
            heap.peek().copied().unwrap_or(EvictKey::MAX)
        };
        let mut candidates = heap.into_vec();
        candidates.sort_unstable_by(|a, b| b.cmp(a));
        *self = Eviction {
            candidates,
            limit: Some(limit),
        };
    }

    /// The heap bytes of the candidates (for `memory_usage`).
    pub(super) fn heap_bytes(&self) -> usize {
        self.candidates.capacity() * std::mem::size_of::<EvictKey>()
    }
}
