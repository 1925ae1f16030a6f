use super::space::{shapes, vpp_candidates};
use super::*;
use crate::config::{Precision, Zero};
use crate::hardware::builtin_profile;
use crate::presets::resolve;
use crate::schedule::Schedule;

fn run(model: &str, gpus: u64, gbs: u64) -> (ModelSpec, Cluster, Workload, SearchResult) {
    let m = resolve(model).unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), gpus).unwrap();
    let w = Workload {
        seq: 4096,
        global_batch: gbs,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    };
    let r = search(&m, &c, &w, &SearchSpace::default(), 10);
    (m, c, w, r)
}

/// Llama 3 8B on 16 H100s, sequence 4096, global batch 64.
fn llama8b_on_16() -> (ModelSpec, Cluster, Workload) {
    let m = resolve("llama3-8b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 16).unwrap();
    let w = Workload {
        seq: 4096,
        global_batch: 64,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    };
    (m, c, w)
}

#[test]
fn progress_counts_every_shape_and_leader() {
    let (m, c, w) = llama8b_on_16();
    let space = SearchSpace::default();
    let p = Progress::default();
    let r = search_with_progress(&m, &c, &w, &space, 5, &p);
    let shapes = shapes(&m, &c, &w, &space).len() as u64;
    // Every shape screened and at least the leaders kept were simulated.
    assert!(
        p.done() >= shapes + r.top.len() as u64,
        "{} < {shapes}",
        p.done()
    );
    assert_eq!(p.done(), p.total());
}

#[test]
fn zero_stages_are_one_plan_when_nothing_shards() {
    // Llama 3 8B at TP 8 on 8 GPUs: DP 1, so ZeRO 0, 1, 2 and 3 price the same;
    // the ranked list must not repeat that plan once per stage.
    let m = resolve("llama3-8b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
    let w = Workload {
        seq: 4096,
        global_batch: 64,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    };
    let space = SearchSpace {
        tp: Some(vec![8]),
        pp: Some(vec![1]),
        cp: Some(vec![1]),
        ..SearchSpace::default()
    };
    let r = search(&m, &c, &w, &space, 10);
    assert!(!r.top.is_empty());
    let mut seen = std::collections::HashSet::new();
    for cand in &r.top {
        let mut k = cand.config.clone();
        k.zero = Zero::None;
        assert!(
            seen.insert(format!("{k:?}")),
            "{:?} repeated with another ZeRO stage",
            cand.config
        );
    }
}

/// A repeated value is searched once: a million copies of a micro-batch size
/// in a plan file's space cost what one does, and no plan is ranked twice.
#[test]
fn repeated_values_are_searched_once() {
    let (m, c, w) = llama8b_on_16();
    let once = SearchSpace {
        mbs: vec![1],
        tp: Some(vec![1, 2]),
        zero: vec![Zero::DistOpt],
        ..SearchSpace::default()
    };
    let many = SearchSpace {
        mbs: vec![1; 100_000],
        tp: Some(vec![2, 1, 2, 0, 1]),
        zero: vec![Zero::DistOpt; 1000],
        ..once.clone()
    };
    let (a, b) = (search(&m, &c, &w, &once, 5), search(&m, &c, &w, &many, 5));
    assert_eq!(a.enumerated, b.enumerated);
    let configs = |r: &SearchResult| r.top.iter().map(|c| c.config.clone()).collect::<Vec<_>>();
    assert_eq!(configs(&a), configs(&b));
    let top = configs(&b);
    assert!(top.iter().enumerate().all(|(i, x)| !top[..i].contains(x)));
}

#[test]
fn counts_add_up_and_top_plans_are_valid() {
    let (m, c, w, r) = run("llama3-70b", 128, 1024);
    assert!(r.valid > 0);
    let rejected: u64 = r.rejected.values().sum();
    assert_eq!(r.enumerated, r.valid + rejected);
    assert_eq!(r.points.len() as u64, r.valid);
    assert_eq!(r.top.len(), 10);
    for pair in r.top.windows(2) {
        assert!(pair[0].estimate.step_secs <= pair[1].estimate.step_secs);
    }
    for cand in &r.top {
        let cfg = &cand.config;
        assert_eq!(cfg.tp * cfg.pp * cfg.cp * cfg.dp, 128);
        assert!(cfg.check(&m, &c, &w).is_ok());
        assert!(cand.estimate.memory.total <= c.profile.hbm_bytes());
        // 70B (about 1.3 TB of model state) fits on 80 GB only with model
        // parallelism or with the weights sharded too (ZeRO-3 / FSDP).
        assert!(cfg.tp * cfg.pp > 1 || cfg.zero == Zero::Zero3, "{cfg:?}");
    }
    assert!(
        r.rejected
            .get(&RejectKind::OutOfMemory)
            .copied()
            .unwrap_or(0)
            > 0
    );
    // Pipelined leaders are re-scored by the schedule simulator.
    for cand in r.top.iter().filter(|c| c.config.pp > 1) {
        assert!(cand.estimate.pipeline_simulated, "{:?}", cand.config);
        let e = &cand.estimate;
        let t_max = e
            .stages
            .iter()
            .map(|s| s.secs_per_micro_batch)
            .fold(0.0, f64::max);
        assert!(e.step_secs >= e.micro_batches as f64 * t_max);
    }
    // Sensitivity (closed-form screening values): each dimension's first row is
    // the screening optimum by the ranking's key (the band's upper end by
    // default, so not always the fastest point).
    let best = r
        .points
        .iter()
        .map(|p| p.rank_secs)
        .fold(f64::INFINITY, f64::min);
    for (dim, value_of) in DIMENSIONS {
        let rows: Vec<_> = r
            .sensitivity
            .iter()
            .filter(|s| s.dimension == *dim)
            .collect();
        assert!(!rows.is_empty());
        assert!((rows[0].rank_secs - best).abs() < 1e-12);
        assert_eq!(
            rows.iter()
                .map(|s| &s.value)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            rows.len(),
            "values repeat"
        );
        let _ = value_of;
        assert!(rows.iter().all(|s| s.rank_secs >= best));
    }
}

#[test]
fn moe_search_uses_expert_parallelism() {
    let (_, _, _, r) = run("mixtral-8x7b", 64, 512);
    assert!(r.valid > 0);
    assert!(
        r.top.iter().any(|c| c.config.ep > 1),
        "no EP in the top plans"
    );
}

#[test]
fn vpp_candidates_give_stateable_layouts() {
    assert_eq!(vpp_candidates(80, 4), vec![1, 2, 4, 5, 10, 20]);
    // 126 layers on 8 stages: only with embedding and loss counted (128 / 8 = 16).
    assert_eq!(vpp_candidates(126, 8), vec![1, 2, 4, 8, 16]);
    assert_eq!(vpp_candidates(32, 1), vec![1]);
}

/// The schedule is a searched dimension: every suitable one appears among the
/// valid plans, and a restriction keeps only its own.
#[test]
fn schedules_are_searched_and_restrictable() {
    let m = resolve("llama3-8b").unwrap().spec;
    let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
    let w = Workload {
        seq: 4096,
        global_batch: 512,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    };
    let r = search(&m, &c, &w, &SearchSpace::default(), 5);
    let seen: Vec<&str> = r
        .sensitivity
        .iter()
        .filter(|s| s.dimension == "schedule")
        .map(|s| s.value.as_str())
        .collect();
    for s in ["1f1b", "interleaved", "zb-h1", "dualpipe"] {
        assert!(seen.contains(&s), "{s} not among the valid plans: {seen:?}");
    }
    assert!(!seen.contains(&"gpipe"));
    let only = SearchSpace {
        schedule: Some(vec![Schedule::DualPipe]),
        ..SearchSpace::default()
    };
    let r = search(&m, &c, &w, &only, 5);
    assert_eq!(r.enumerated, r.valid + r.rejected.values().sum::<u64>());
    assert!(!r.top.is_empty());
    for cand in &r.top {
        assert_eq!(cand.config.schedule, Schedule::DualPipe);
        assert!(
            cand.config.pp % 2 == 0 && cand.estimate.pipeline_simulated,
            "{:?}",
            cand.config
        );
    }
}

/// Megatron overlaps TP communication with GEMMs only under sequence
/// parallelism (validate_args asserts it): with `--tp-comm-overlap` the search
/// never tries a TP > 1 plan without it, and such a configuration given whole is
/// refused with the reason, not priced with an overlap that cannot run.
#[test]
fn tp_comm_overlap_is_searched_only_with_sequence_parallelism() {
    let (m, c, w) = llama8b_on_16();
    let mut space = SearchSpace {
        tp: Some(vec![2, 4]),
        ..SearchSpace::default()
    };
    space.overlap.tp_comm = true;
    let r = search(&m, &c, &w, &space, 50);
    assert!(!r.top.is_empty());
    assert!(
        r.top.iter().all(|p| p.config.sp),
        "an SP-off plan with TP comm overlap"
    );
    // Not enumerated at all (so not counted among the rejected either).
    assert_eq!(r.rejected.get(&RejectKind::Other), None, "{:?}", r.rejected);
    let mut off = r.top[0].config.clone();
    off.sp = false;
    let e = off.check(&m, &c, &w).unwrap_err();
    assert_eq!(e, crate::config::Rejection::TpCommNeedsSp { tp: off.tp });
    assert!(e.to_string().contains("needs sequence parallelism"), "{e}");
    off.overlap.tp_comm = false;
    assert!(off.check(&m, &c, &w).is_ok());
}

/// Megatron-Core runs per-layer CUDA graphs only without full recomputation:
/// the search does not try it, and such a configuration given whole is refused.
/// A full-iteration graph may recompute whole layers.
#[test]
fn per_layer_cuda_graphs_are_never_searched_with_full_recomputation() {
    use crate::config::{Recompute, Rejection};
    use crate::cost::CudaGraphs;
    let (m, c, w) = llama8b_on_16();
    let mut space = SearchSpace {
        recompute: vec![Recompute::Full, Recompute::None],
        ..SearchSpace::default()
    };
    space.assumptions.cuda_graphs = CudaGraphs::parse("attn").unwrap();
    let r = search(&m, &c, &w, &space, 50);
    assert!(!r.top.is_empty());
    assert!(r.top.iter().all(|p| p.config.recompute != Recompute::Full));
    assert_eq!(r.rejected.get(&RejectKind::Other), None, "{:?}", r.rejected);
    let mut full = r.top[0].config.clone();
    full.recompute = Recompute::Full;
    let e = crate::cost::estimate_with(&m, &c, &w, &full, space.assumptions).unwrap_err();
    assert_eq!(e, Rejection::GraphsWithFullRecompute);
    space.assumptions.cuda_graphs = CudaGraphs::parse("full_iteration").unwrap();
    assert!(crate::cost::estimate_with(&m, &c, &w, &full, space.assumptions).is_ok());
}

/// Context parallelism runs only on a fused attention kernel (Transformer Engine
/// disables its unfused attention under CP): without flash attention the search
/// does not try it, and such a configuration given whole is refused.
#[test]
fn context_parallelism_is_never_searched_without_fused_attention() {
    use crate::config::Rejection;
    let (m, c, w) = llama8b_on_16();
    let mut space = SearchSpace::default();
    space.assumptions.flash_attention = false;
    let r = search(&m, &c, &w, &space, 50);
    assert!(!r.top.is_empty());
    assert!(r.top.iter().all(|p| p.config.cp == 1));
    assert_eq!(r.rejected.get(&RejectKind::Other), None, "{:?}", r.rejected);
    let mut cp = r.top[0].config.clone();
    (cp.cp, cp.dp) = (2, cp.dp / 2);
    let e = crate::cost::estimate_with(&m, &c, &w, &cp, space.assumptions).unwrap_err();
    assert_eq!(e, Rejection::CpNeedsFusedAttention { cp: 2 });
    space.assumptions.flash_attention = true;
    assert!(crate::cost::estimate_with(&m, &c, &w, &cp, space.assumptions).is_ok());
}
