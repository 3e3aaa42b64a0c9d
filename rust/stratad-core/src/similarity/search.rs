//! Searching a [`CrystalIndex`]: [`top_k`](CrystalIndex::top_k) (Jaccard
//! similarity boosted by effectiveness) and
//! [`find_similar`](CrystalIndex::find_similar) (the novelty check), both
//! exact. They count shared goal tokens from posting lists, skip the longest
//! lists where bounds allow, and score candidates from their slot records;
//! the algorithms are described on [`CrystalIndex`].

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};

use super::counts::Counts;
use super::crystal::{signature_bit, CrystalIndex};
use crate::error::{Error, Result};

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
    /// A cleared count buffer (from the pool when there is one) that will
    /// list the slots whose count reaches `min_count`.
    fn take_counts(&self, min_count: u32) -> Counts {
        self.pool.take(self.tokens.len(), min_count)
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
    fn recycle(&self, counts: Counts) {
        self.pool.recycle(counts);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::similarity::testing::{jaccard, toks};

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
}
