//! Property checks over random models and cluster sizes from 1 to 1,000,000 GPUs
//! (issue 8). Run by the reliability summary, which reports how many cases ran.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRng, TestRunner};
use sextant_planner::config::{Precision, Workload};
use sextant_planner::cost::{estimate, Estimate};
use sextant_planner::hardware::{builtin_profile, Cluster};
use sextant_planner::model::{MlpKind, ModelSpec, Moe};
use sextant_planner::search::{search, SearchSpace};

/// Random transformer shapes: dense or MoE, any head grouping, tiny to huge vocabularies.
pub fn model() -> impl Strategy<Value = ModelSpec> {
    (
        1u64..=160,
        1u64..=32,
        prop::sample::select(vec![1u64, 2, 4, 8]),
        prop::sample::select(vec![64u64, 128]),
        1u64..=300_000,
        any::<bool>(),
        prop::option::of((2u64..=256, 1u64..=8, 0u64..=3)),
    )
        .prop_map(|(layers, kv, group, head_dim, vocab, gated, moe)| {
            let heads = kv * group;
            let hidden = heads * head_dim;
            let mut m = sextant_planner::presets::resolve("8b")
                .expect("preset")
                .spec;
            m.name = "random".into();
            m.source = "property test".into();
            (
                m.layers,
                m.hidden,
                m.ffn_hidden,
                m.heads,
                m.kv_heads,
                m.head_dim,
                m.vocab,
            ) = (layers, hidden, 4 * hidden, heads, kv, head_dim, vocab);
            m.mlp = if gated {
                MlpKind::Gated
            } else {
                MlpKind::Plain
            };
            m.moe = moe.map(|(experts, top_k, dense)| Moe {
                experts,
                top_k: top_k.min(experts),
                expert_ffn_hidden: hidden,
                shared_experts: 0,
                shared_ffn_hidden: None,
                dense_leading_layers: dense.min(layers.saturating_sub(1)),
                layer_freq: 1,
                balancing: Default::default(),
            });
            m
        })
        .prop_filter("valid model", |m| m.validate().is_ok())
}

/// A GPU count from 1 to 1,000,000, log-uniform, rounded to what the profile accepts.
fn gpus() -> impl Strategy<Value = u64> {
    (0.0f64..=6.0).prop_map(|e| {
        let g = 10f64.powf(e).round() as u64;
        if g < 8 {
            [1, 2, 4][(g as usize).min(7) / 3]
        } else {
            g / 8 * 8
        }
    })
}

/// A fixed seed, so that the counts the summary prints are reproducible.
fn runner(cases: u32) -> TestRunner {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::deterministic_rng(config.rng_algorithm);
    TestRunner::new_with_rng(config, rng)
}

fn finite(e: &Estimate) -> bool {
    let nums = [
        e.step_secs,
        e.tokens_per_sec_per_gpu,
        e.mfu,
        e.hfu,
        e.bubble_fraction,
        e.exposed_comm_fraction,
        e.memory.total,
        e.time.compute.total(),
        e.time.bubble,
        e.time.exposed_comm,
        e.time.optimizer,
    ];
    nums.iter().all(|x| x.is_finite() && *x >= 0.0)
}

/// No panic, no NaN or infinity, every reported plan valid and within memory, at any size.
/// Returns (cases run, cases with at least one plan).
pub fn any_model_any_cluster(cases: u32) -> (u32, u32) {
    let planned = std::sync::atomic::AtomicU32::new(0);
    let mut runner = runner(cases);
    runner
        .run(
            &(model(), gpus(), 7u32..=17, 1u64..=4096),
            |(m, gpus, seq_log, gbs)| {
                let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), gpus)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let w = Workload {
                    seq: 1 << seq_log,
                    global_batch: gbs,
                    precision: Precision::Bf16,
                    moe_imbalance: 1.0,
                    moe_capacity: None,
                };
                let r = search(&m, &c, &w, &SearchSpace::default(), 3);
                prop_assert_eq!(r.enumerated, r.valid + r.rejected.values().sum::<u64>());
                if !r.top.is_empty() {
                    planned.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                for cand in &r.top {
                    prop_assert_eq!(cand.config.gpus(), gpus);
                    prop_assert!(cand.config.check(&m, &c, &w).is_ok());
                    prop_assert!(cand.estimate.memory.total <= c.profile.hbm_bytes());
                    prop_assert!(
                        finite(&cand.estimate),
                        "non-finite number: {:?}",
                        cand.estimate
                    );
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    (cases, planned.into_inner())
}

/// A larger global batch never lowers the MFU of the same plan by more than the
/// change of its bubble fraction.
/// Returns (cases run, plans compared).
pub fn larger_batch_never_costs_more_than_the_bubble(cases: u32) -> (u32, u32) {
    let compared = std::sync::atomic::AtomicU32::new(0);
    let mut runner = runner(cases);
    runner
        .run(
            &(model(), 0u32..=9, 9u32..=14, 2u64..=8),
            |(m, nodes_log, seq_log, factor)| {
                let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8 << nodes_log).unwrap();
                let w = Workload {
                    seq: 1 << seq_log,
                    global_batch: 256,
                    precision: Precision::Bf16,
                    moe_imbalance: 1.0,
                    moe_capacity: None,
                };
                let r = search(&m, &c, &w, &SearchSpace::default(), 3);
                for cand in &r.top {
                    let big = Workload {
                        global_batch: w.global_batch * factor,
                        ..w.clone()
                    };
                    let (Ok(a), Ok(e)) = (
                        estimate(&m, &c, &w, &cand.config),
                        estimate(&m, &c, &big, &cand.config),
                    ) else {
                        continue;
                    };
                    compared.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let slack = (a.bubble_fraction - e.bubble_fraction).abs() + 1e-9;
                    prop_assert!(
                        e.mfu >= a.mfu - slack,
                        "{:?}: MFU {} at batch {} but {} at {}",
                        cand.config,
                        a.mfu,
                        w.global_batch,
                        e.mfu,
                        big.global_batch
                    );
                }
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    (cases, compared.into_inner())
}
