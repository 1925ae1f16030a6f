//! The screening: every point of one structural shape (SP, micro-batch, ZeRO
//! stage, recomputation, schedule) priced in closed form, counted as valid or
//! under its rejection reason.

use std::collections::BTreeMap;

use super::space::{schedules_for, Shape};
use super::{fine_grained_modules, Inputs, Point};
use crate::config::{Layout, ParallelConfig, Recompute, RecomputeModules, RejectKind, Zero};

/// What one structural shape contributes: enumerated, valid, rejections by
/// reason, and the valid points with their configurations.
pub(super) type Tally = (
    u64,
    u64,
    BTreeMap<RejectKind, u64>,
    Vec<(Point, ParallelConfig)>,
);

/// The module sets tried with selective recomputation: the space's, or
/// Megatron's default and the model's fine-grained set when they differ.
pub(super) fn module_sets(inputs: &Inputs) -> Vec<RecomputeModules> {
    let space = inputs.space;
    match &space.recompute_modules {
        Some(v) => v.clone(),
        None => {
            let mut v = vec![RecomputeModules::DEFAULT];
            let fine = fine_grained_modules(inputs.model, space.assumptions.flash_attention);
            if fine != RecomputeModules::DEFAULT {
                v.push(fine);
            }
            v
        }
    }
}

/// Each shape expands into the product of the remaining knobs.
pub(super) fn screen_shape(inputs: &Inputs, module_sets: &[RecomputeModules], s: &Shape) -> Tally {
    let Inputs {
        model,
        cluster,
        w,
        space,
        ref ranker,
    } = *inputs;
    let mut enumerated = 0;
    let mut valid = 0;
    let mut rejected: BTreeMap<RejectKind, u64> = BTreeMap::new();
    let mut kept = Vec::new();
    let sps: Vec<bool> = match &space.sp {
        // Sequence parallelism splits over TP: at TP 1 there is none to ask for
        // (Megatron turns the flag off), whatever the space's list says.
        Some(_) if s.tp == 1 => vec![false],
        Some(v) => v.clone(),
        // TP communication overlap runs only with sequence parallelism.
        None if s.tp > 1 && space.overlap.tp_comm => vec![true],
        None if s.tp > 1 => vec![true, false],
        None => vec![false],
    };
    // Context parallelism needs a fused attention kernel (Transformer Engine turns
    // its unfused attention off under CP; evaluate refuses the pair), except in
    // ScaleTorch, whose ring attention is unfused.
    if s.cp > 1
        && !space.assumptions.flash_attention
        && space.assumptions.framework != crate::cost::Framework::ScaleTorch
    {
        return (0, 0, BTreeMap::new(), Vec::new());
    }
    let layout = Layout::balanced(model.layers, s.pp, s.vpp);
    if space.even_layers && layout != Layout::Even {
        return (0, 0, BTreeMap::new(), Vec::new());
    }
    let schedules = schedules_for(s.pp, s.vpp, &space.schedule);
    // With nobody to shard with, every ZeRO stage is the same plan: keep one.
    // Dense state shards over DP x CP; an MoE model's expert state also over the
    // expert-data-parallel group, (TP x CP x DP) / (EP x ETP).
    let expert_dp = if model.moe.is_some() {
        (s.tp * s.cp * s.dp) / (s.ep * s.etp).max(1)
    } else {
        1
    };
    let unsharded = s.dp * s.cp == 1 && expert_dp <= 1;
    // Plain data parallelism beside TP, PP or CP where the framework has none.
    let plain_ok = !(space.plain_dp_alone && (s.tp > 1 || s.pp > 1 || s.cp > 1));
    let zeros = || {
        space
            .zero
            .iter()
            .copied()
            .filter(move |z| plain_ok || *z != Zero::None)
            .take(if unsharded { 1 } else { usize::MAX })
    };
    // Megatron-Core runs per-layer CUDA graphs only without full recomputation.
    let graphed = space.assumptions.cuda_graphs.per_layer();
    let recomputes: Vec<(Recompute, RecomputeModules)> = space
        .recompute
        .iter()
        .filter(|&&r| !(graphed && r == Recompute::Full))
        .flat_map(|&r| match r {
            Recompute::Selective => module_sets.iter().map(|&m| (r, m)).collect::<Vec<_>>(),
            _ => vec![(r, RecomputeModules::DEFAULT)],
        })
        .collect();
    for &sp in &sps {
        for &mbs in &space.mbs {
            for zero in zeros() {
                for &(recompute, recompute_modules) in &recomputes {
                    for &schedule in &schedules {
                        enumerated += 1;
                        let cfg = ParallelConfig {
                            tp: s.tp,
                            pp: s.pp,
                            vpp: s.vpp,
                            cp: s.cp,
                            ep: s.ep,
                            etp: s.etp,
                            dp: s.dp,
                            sp,
                            mbs,
                            zero,
                            recompute,
                            layout: layout.clone(),
                            overlap: space.overlap,
                            bf16_grads: space.bf16_grads,
                            bf16_moments: space.bf16_moments,
                            recompute_modules,
                            moe_dispatcher: space.moe_dispatcher,
                            schedule,
                        };
                        match crate::cost::estimate_with(model, cluster, w, &cfg, space.assumptions)
                        {
                            Ok(e) => {
                                valid += 1;
                                kept.push((
                                    Point {
                                        step_secs: e.step_secs,
                                        peak_gib: e.memory.total / crate::hardware::GIB,
                                        rank_secs: ranker.key(
                                            cluster,
                                            &cfg,
                                            inputs.reductions(&cfg, e.micro_batches),
                                            e.step_secs,
                                            e.memory.total,
                                        ),
                                    },
                                    cfg,
                                ));
                            }
                            Err(r) => *rejected.entry(r.kind()).or_insert(0) += 1,
                        }
                    }
                }
            }
        }
    }
    (enumerated, valid, rejected, kept)
}
