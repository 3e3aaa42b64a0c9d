//! The shared-token counters of a search, and the pool that keeps them
//! between searches: a search on a large index then neither allocates nor
//! faults in a counter per slot every time.

use std::sync::{Mutex, PoisonError};

/// Shared-token counts of one search: `counts[slot]`, and the slots with a
/// non-zero count.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) counts: Vec<u32>,
    pub(super) touched: Vec<u32>,
    /// Slots whose count reached `min_count` (each once); with `min_count`
    /// 1, `touched` is used instead.
    pub(super) reached: Vec<u32>,
    pub(super) min_count: u32,
}

impl Counts {
    /// The slots whose count reached `min_count`.
    pub(super) fn candidates(&self) -> &[u32] {
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

/// Count buffers kept for reuse, shared by concurrent searches. A clone
/// starts empty: the buffers are a cache, not part of the index.
#[derive(Debug, Default)]
pub(super) struct CountPool(Mutex<Vec<Counts>>);

impl Clone for CountPool {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl CountPool {
    /// A cleared count buffer for `slots` slots (from the pool when there is
    /// one) that will list the slots whose count reaches `min_count`.
    pub(super) fn take(&self, slots: usize, min_count: u32) -> Counts {
        let mut counts = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        counts.counts.resize(slots, 0);
        counts.min_count = min_count;
        counts
    }

    /// Clears `counts` and keeps it for the next search.
    pub(super) fn recycle(&self, mut counts: Counts) {
        if counts.touched.len() > counts.counts.len() / 16 {
            counts.counts.fill(0);
        } else {
            for &slot in &counts.touched {
                counts.counts[slot as usize] = 0;
            }
        }
        counts.touched.clear();
        counts.reached.clear();
        let mut pool = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < POOLED_COUNTS {
            pool.push(counts);
        }
    }

    /// The heap bytes of the pooled counters and touched lists (for
    /// `memory_usage`).
    pub(super) fn heap_bytes(&self) -> usize {
        fn vec_bytes<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|c| vec_bytes(&c.counts) + vec_bytes(&c.touched))
            .sum::<usize>()
    }
}
