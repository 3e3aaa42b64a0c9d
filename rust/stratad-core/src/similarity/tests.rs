//! Tests of the whole [`CrystalIndex`] (adding, updating, removing,
//! searching and evicting at once) against a brute-force model of the
//! library.

use super::testing::{jaccard, toks, Lcg};
use super::{
    effectiveness_boost, CrystalIndex, CrystalMatch, SimilarCrystal, DEFAULT_SKIP_MIN_POSTINGS,
};

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
                let exclude = (rng.next(2) == 0).then(|| rng.next(model.len() as u64 + 1) as u32);
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
