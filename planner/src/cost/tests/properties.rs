use super::*;
use crate::model::{MlpKind, ModelSpec, Moe, MODEL_SCHEMA_VERSION};
use crate::search::{search, SearchSpace};
use proptest::prelude::*;

fn model() -> impl Strategy<Value = ModelSpec> {
    (
        1u64..=160,
        1u64..=8,
        prop::sample::select(vec![1u64, 2, 4, 8, 16, 32, 64, 128]),
        1u64..=6,
        1000u64..=260_000,
        prop::option::of((1u64..=7, 0u64..=3, 1u64..=3)),
        any::<bool>(),
    )
        .prop_map(|(layers, hd_mult, heads, kv_log, vocab, moe, gated)| {
            let head_dim = 32 * hd_mult;
            let kv = (heads >> kv_log.min(7)).max(1);
            let hidden = heads * head_dim;
            let moe = moe.map(|(e_log, k, dense)| Moe {
                experts: 1 << e_log,
                top_k: k.clamp(1, 1 << e_log),
                expert_ffn_hidden: hidden,
                shared_experts: 0,
                shared_ffn_hidden: None,
                dense_leading_layers: dense.min(layers - 1),
                layer_freq: 1,
                balancing: Default::default(),
            });
            ModelSpec {
                schema_version: MODEL_SCHEMA_VERSION,
                name: "random".into(),
                source: "proptest".into(),
                layers,
                hidden,
                ffn_hidden: 4 * hidden,
                heads,
                kv_heads: kv,
                head_dim,
                vocab,
                tied_embeddings: false,
                mlp: if gated {
                    MlpKind::Gated
                } else {
                    MlpKind::Plain
                },
                dropout: false,
                bias: false,
                qkv_bias: false,
                norm: None,
                mla: None,
                moe,
                sliding_window: None,
                sandwich_norms: false,
                glu_clamp: None,
                attention_sinks: false,
                qk_norm: false,
                yarn_attention_factor: None,
                mtp_layers: 0,
                hf_model_type: None,
            }
        })
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
    ];
    nums.iter().all(|x| x.is_finite() && *x >= 0.0)
        && e.comm.iter().all(|t| {
            t.total_secs.is_finite()
                && t.exposed_secs >= 0.0
                && t.exposed_secs <= t.total_secs * (1.0 + 1e-9)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Every reported plan is valid, fits, uses every GPU, and has finite numbers.
    #[test]
    fn reported_plans_satisfy_invariants(m in model(), nodes_log in 0u32..=12, seq_log in 7u32..=15, gbs_mult in 1u64..=64, gpu in prop::sample::select(vec!["h100-sxm", "a100-80g", "gb200-nvl72", "mi300x"])) {
        let profile = builtin_profile(gpu).unwrap();
        let gpus = profile.node.gpus_per_node << nodes_log;
        let c = Cluster::new(profile, gpus).unwrap();
        let w = Workload { seq: 1 << seq_log, global_batch: 8 * gbs_mult, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
        let r = search(&m, &c, &w, &SearchSpace::default(), 5);
        prop_assert_eq!(r.enumerated, r.valid + r.rejected.values().sum::<u64>());
        for cand in &r.top {
            prop_assert_eq!(cand.config.gpus(), gpus);
            prop_assert!(cand.config.check(&m, &c, &w).is_ok());
            prop_assert!(cand.estimate.memory.total <= c.profile.hbm_bytes());
            prop_assert!(finite(&cand.estimate), "non-finite number in {:?}", cand.estimate);
            prop_assert_eq!(cand.estimate.stages.iter().map(|s| s.layers).sum::<u64>(), m.layers);
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, .. ProptestConfig::default() })]

    /// No plan the search reports, nor its closed-form screening estimate,
    /// is faster than its physical floor ([`crate::floor`]), computed from
    /// the stage times alone. Small global batches reach the m < p corners.
    #[test]
    fn reported_plans_respect_their_floors(m in model(), nodes_log in 0u32..=3, seq_log in 8u32..=13, gbs in 1u64..=96, gpu in prop::sample::select(vec!["h100-sxm", "a100-80g", "gb200-nvl72", "h800"])) {
        let profile = builtin_profile(gpu).unwrap();
        let gpus = profile.node.gpus_per_node.min(8) << nodes_log;
        let c = Cluster::new(profile, gpus).unwrap();
        let w = Workload { seq: 1 << seq_log, global_batch: gbs, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
        let r = search(&m, &c, &w, &SearchSpace::default(), 5);
        let below = |e: &Estimate, cfg: &ParallelConfig| {
            let f = crate::floor::floor_of(e, cfg);
            (e.step_secs < f.step_secs() * (1.0 - 1e-9)).then(|| format!("{cfg:?}: step {} below its {} floor {}", e.step_secs, f.binding(), f.step_secs()))
        };
        for cand in &r.top {
            prop_assert!(below(&cand.estimate, &cand.config).is_none(), "{}", below(&cand.estimate, &cand.config).unwrap());
            let closed = estimate_with(&m, &c, &w, &cand.config, Assumptions::default()).unwrap();
            prop_assert!(below(&closed, &cand.config).is_none(), "closed form: {}", below(&closed, &cand.config).unwrap());
        }
        for s in &r.sensitivity {
            let e = estimate_with(&m, &c, &w, &s.config, Assumptions::default()).unwrap();
            prop_assert!(below(&e, &s.config).is_none(), "sensitivity: {}", below(&e, &s.config).unwrap());
        }
    }

}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// With `--rank-by upper`, a plan whose band was widened for leaving the
    /// validated runs is never ranked first while a plan inside them has its
    /// point estimate within that band. The inside plans are taken from an
    /// independent search ranked by point estimate.
    #[test]
    fn upper_ranking_never_lets_an_untested_corner_win_on_its_point(m in model(), nodes_log in 0u32..=3, seq_log in 10u32..=13, gbs in 8u64..=256, gpu in prop::sample::select(vec!["h100-sxm", "a100-80g", "h800"])) {
        use crate::reach::RankBy;
        let profile = builtin_profile(gpu).unwrap();
        let c = Cluster::new(profile, 8 << nodes_log).unwrap();
        let w = Workload { seq: 1 << seq_log, global_batch: gbs, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
        // As users run it: the CLI's default top 10.
        let up = search(&m, &c, &w, &SearchSpace { rank_by: RankBy::Upper, ..SearchSpace::default() }, 10);
        let pt = search(&m, &c, &w, &SearchSpace { rank_by: RankBy::Point, ..SearchSpace::default() }, 30);
        if let Some(first) = up.top.first() {
            let band = first.estimate.band.as_ref().expect("ranked plans carry a band");
            if !band.outside.is_empty() {
                for inside in pt.top.iter().filter(|p| p.estimate.band.as_ref().is_some_and(|b| b.outside.is_empty())) {
                    prop_assert!(inside.estimate.step_secs > band.high_secs * (1.0 - 1e-9),
                        "{:?} (outside: {:?}) ranked first with upper end {} although {:?} inside the validated runs takes {}",
                        first.config, band.outside, band.high_secs, inside.config, inside.estimate.step_secs);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// More HBM never removes a valid plan.
    #[test]
    fn more_memory_never_rejects_more(m in model(), seq_log in 9u32..=14) {
        let small = builtin_profile("h100-sxm").unwrap();
        let mut big = small.clone();
        big.gpu.hbm_gib *= 2.0;
        let w = Workload { seq: 1 << seq_log, global_batch: 64, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
        let a = search(&m, &Cluster::new(small, 64).unwrap(), &w, &SearchSpace::default(), 1);
        let b = search(&m, &Cluster::new(big, 64).unwrap(), &w, &SearchSpace::default(), 1);
        prop_assert!(b.valid >= a.valid);
    }
}
