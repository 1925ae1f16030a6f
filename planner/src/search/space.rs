//! The space searched: which values each knob may take, normalised, and the
//! structural shapes (TP, CP, PP, DP, virtual stages, EP, expert-TP) it expands to.

use crate::config::{divisors, Dispatcher, Overlap, Recompute, RecomputeModules, Workload, Zero};
use crate::cost::Assumptions;
use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::reach::RankBy;
use crate::schedule::Schedule;

/// Which values each knob may take. `None` means "search all sensible values".
#[derive(Debug, Clone, PartialEq)]
pub struct SearchSpace {
    pub tp: Option<Vec<u64>>,
    pub pp: Option<Vec<u64>>,
    pub vpp: Option<Vec<u64>>,
    pub cp: Option<Vec<u64>>,
    pub ep: Option<Vec<u64>>,
    pub etp: Option<Vec<u64>>,
    pub sp: Option<Vec<bool>>,
    /// Pipeline schedules to try; `None`: every one that suits the shape except GPipe
    /// (which only costs memory over 1F1B). A shape none of them suits is skipped.
    pub schedule: Option<Vec<Schedule>>,
    pub mbs: Vec<u64>,
    pub zero: Vec<Zero>,
    pub recompute: Vec<Recompute>,
    /// Module sets tried with selective recomputation; `None`: Megatron's default
    /// and the model's fine-grained set ([`fine_grained_modules`]).
    pub recompute_modules: Option<Vec<RecomputeModules>>,
    pub overlap: Overlap,
    pub bf16_grads: bool,
    pub bf16_moments: bool,
    pub moe_dispatcher: Dispatcher,
    pub assumptions: Assumptions,
    /// Which end of each plan's error band ranks it ([`crate::reach`]).
    pub rank_by: RankBy,
    /// Only stages of equal layer counts, no re-partitioning: for frameworks that
    /// split layers evenly themselves (ScaleTorch).
    pub even_layers: bool,
    /// Plain data parallelism (ZeRO 0) only with no TP, PP or CP beside it: for
    /// frameworks whose unsharded data parallelism is one-dimensional DDP
    /// (torchtitan).
    pub plain_dp_alone: bool,
}

/// `list` without repeats, first occurrence kept (the order can matter: with
/// nobody to shard with, only the first ZeRO stage is tried). For the knobs'
/// short lists of variants: quadratic in the distinct values.
fn distinct<T: PartialEq + Clone>(list: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(list.len().min(64));
    for x in list {
        if !out.contains(x) {
            out.push(x.clone());
        }
    }
    out
}

impl SearchSpace {
    /// The space with every list free of repeats and of zero sizes. A repeated
    /// value would be searched once per copy: the CLI's lists and a plan file's
    /// recorded space are both user input, and a million copies must not cost a
    /// million searches. Values that are merely invalid stay, so their rejection
    /// reasons are still counted.
    pub fn normalized(&self) -> SearchSpace {
        let sizes = |v: &[u64]| {
            let mut v: Vec<u64> = v.iter().copied().filter(|&x| x > 0).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        SearchSpace {
            tp: self.tp.as_deref().map(sizes),
            pp: self.pp.as_deref().map(sizes),
            vpp: self.vpp.as_deref().map(sizes),
            cp: self.cp.as_deref().map(sizes),
            ep: self.ep.as_deref().map(sizes),
            etp: self.etp.as_deref().map(sizes),
            sp: self.sp.as_deref().map(distinct),
            schedule: self.schedule.as_deref().map(distinct),
            mbs: sizes(&self.mbs),
            zero: distinct(&self.zero),
            recompute: distinct(&self.recompute),
            recompute_modules: self.recompute_modules.as_deref().map(distinct),
            ..self.clone()
        }
    }
}

impl Default for SearchSpace {
    fn default() -> Self {
        SearchSpace {
            tp: None,
            pp: None,
            vpp: None,
            cp: None,
            ep: None,
            etp: None,
            sp: None,
            schedule: None,
            mbs: vec![1, 2, 4, 8],
            zero: vec![Zero::None, Zero::DistOpt, Zero::Zero2, Zero::Zero3],
            recompute: vec![Recompute::None, Recompute::Selective, Recompute::Full],
            recompute_modules: None,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            moe_dispatcher: Dispatcher::AllToAll,
            assumptions: Assumptions::default(),
            rank_by: RankBy::default(),
            even_layers: false,
            plain_dp_alone: false,
        }
    }
}

/// The output-discarding modules Megatron's performance recipes recompute, as they
/// apply to `model`: the norms; MoE's expert activation; MLA's up-projections; the
/// dense MLPs when the model mixes dense and MoE layers (DeepSeek-V3's leading
/// dense layers are its first stage's largest activations); core attention only
/// where attention is not fused. Megatron-Bridge's April-2026 performance configs
/// use subsets of it: `["layernorm", "moe_act"]` (GPT-OSS-120B on H100),
/// `["mla_up_proj", "mlp"]` (DeepSeek-V3 MXFP8 on B200).
pub fn fine_grained_modules(model: &ModelSpec, flash_attention: bool) -> RecomputeModules {
    let mut m = RecomputeModules::LAYERNORM;
    if model.moe.is_some() {
        m = m.union(RecomputeModules::MOE_ACT);
        if model.moe_layers() < model.layers {
            m = m.union(RecomputeModules::MLP);
        }
    }
    if model.mla.is_some() {
        m = m.union(RecomputeModules::MLA_UP_PROJ);
    }
    if !flash_attention {
        m = m.union(RecomputeModules::CORE_ATTN);
    }
    m
}

/// Structural part of a configuration (what fixes the group layout).
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub(super) tp: u64,
    pub(super) cp: u64,
    pub(super) pp: u64,
    pub(super) dp: u64,
    pub(super) vpp: u64,
    pub(super) ep: u64,
    pub(super) etp: u64,
}

fn pick(fixed: &Option<Vec<u64>>, all: Vec<u64>) -> Vec<u64> {
    match fixed {
        Some(v) => v.clone(),
        None => all,
    }
}

/// Virtual-stage counts worth trying for `layers` on `pp` stages: 1, and every
/// v > 1 that splits layers (or layers + embedding + loss) evenly.
pub(super) fn vpp_candidates(layers: u64, pp: u64) -> Vec<u64> {
    if pp == 1 {
        return vec![1];
    }
    let mut v: Vec<u64> = vec![1];
    for total in [layers, layers + 2] {
        if total % pp == 0 {
            for d in divisors(total / pp) {
                if d > 1 && !v.contains(&d) && d * pp <= layers + 2 {
                    v.push(d);
                }
            }
        }
    }
    v.sort_unstable();
    v
}

/// Schedules searched for a shape: 1F1B without a pipeline; interleaved 1F1B
/// with virtual stages; 1F1B, ZB-H1 and DualPipe (and GPipe when asked for) with
/// one stage per rank; restricted to `fixed` when given.
pub(super) fn schedules_for(pp: u64, vpp: u64, fixed: &Option<Vec<Schedule>>) -> Vec<Schedule> {
    let suits: &[Schedule] = if pp == 1 {
        &[Schedule::OneFOneB]
    } else if vpp > 1 {
        &[Schedule::Interleaved]
    } else {
        &[
            Schedule::OneFOneB,
            Schedule::ZbH1,
            Schedule::DualPipe,
            Schedule::Gpipe,
        ]
    };
    match fixed {
        Some(list) => suits.iter().copied().filter(|s| list.contains(s)).collect(),
        None => suits
            .iter()
            .copied()
            .filter(|&s| s != Schedule::Gpipe)
            .collect(),
    }
}

pub(super) fn shapes(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    space: &SearchSpace,
) -> Vec<Shape> {
    let gpus = cluster.gpus;
    let mut out = Vec::new();
    let tps = pick(
        &space.tp,
        divisors(gpus)
            .into_iter()
            .filter(|&t| t <= model.heads)
            .collect(),
    );
    for &tp in &tps {
        if tp == 0 || !gpus.is_multiple_of(tp) {
            continue;
        }
        let rest = gpus / tp;
        let cps = pick(
            &space.cp,
            divisors(rest)
                .into_iter()
                .filter(|&c| c == 1 || 2 * c <= w.seq)
                .collect(),
        );
        for &cp in &cps {
            if cp == 0 || !rest.is_multiple_of(cp) {
                continue;
            }
            let rest2 = rest / cp;
            let pps = pick(
                &space.pp,
                divisors(rest2)
                    .into_iter()
                    .filter(|&p| p <= model.layers)
                    .collect(),
            );
            for &pp in &pps {
                if pp == 0 || !rest2.is_multiple_of(pp) {
                    continue;
                }
                let dp = rest2 / pp;
                let vpps = pick(&space.vpp, vpp_candidates(model.layers, pp));
                let (eps, etps) = match &model.moe {
                    Some(m) => {
                        let span = tp * cp * dp;
                        let eps = pick(
                            &space.ep,
                            divisors(m.experts)
                                .into_iter()
                                .filter(|&e| e <= span)
                                .collect(),
                        );
                        let mut etps = pick(&space.etp, vec![1, tp]);
                        etps.dedup();
                        (eps, etps)
                    }
                    None => (pick(&space.ep, vec![1]), pick(&space.etp, vec![1])),
                };
                for &vpp in &vpps {
                    for &ep in &eps {
                        for &etp in &etps {
                            out.push(Shape {
                                tp,
                                cp,
                                pp,
                                dp,
                                vpp,
                                ep,
                                etp,
                            });
                        }
                    }
                }
            }
        }
    }
    out
}
