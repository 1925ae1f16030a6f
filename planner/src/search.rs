//! Exhaustive search: enumerate -> check -> estimate -> rank.
//!
//! The space is every combination of TP (divisors of the GPU count up to the head
//! count), CP, PP (up to the layer count), DP (what is left), virtual stages (those
//! that give a stateable layout), EP (divisors of the expert count) and expert-TP
//! (1 or TP) for MoE models, SP (on/off with TP > 1), micro-batch size, ZeRO stage,
//! recomputation and the pipeline schedule (with PP > 1: interleaved 1F1B with
//! virtual stages; 1F1B, ZB-H1 and DualPipe without; GPipe only when asked for). Every point is counted; a rejected point is counted under its
//! reason. Only (step time, peak memory, configuration) is kept for valid points;
//! the leading ones are re-estimated in full.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::config::{
    divisors, Dispatcher, Layout, Overlap, ParallelConfig, Recompute, RecomputeModules, RejectKind,
    Workload, Zero,
};
use crate::cost::{estimate_with, Assumptions, Estimate};
use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::reach::{grad_reductions, RankBy, Ranker};
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

/// A valid configuration with its full estimate.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub config: ParallelConfig,
    pub estimate: Estimate,
}

/// Every valid configuration as a point (for scatter plots and Pareto fronts).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub step_secs: f64,
    pub peak_gib: f64,
    /// What the search ranks by: the step time or its band's upper end
    /// ([`crate::reach::Ranker::key`]).
    pub rank_secs: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SearchResult {
    pub enumerated: u64,
    pub valid: u64,
    pub rejected: BTreeMap<RejectKind, u64>,
    /// The best configurations, fastest first.
    pub top: Vec<Candidate>,
    pub points: Vec<Point>,
    /// For each searched dimension and each value it took among valid plans, the
    /// best plan with that dimension fixed there, picked by the screening's rank
    /// key; closed-form times until [`rescore_sensitivity`] prices them as the
    /// ranked plans are.
    pub sensitivity: Vec<Sensitivity>,
}

/// The best plan when one dimension is held at one value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sensitivity {
    pub dimension: &'static str,
    pub value: String,
    /// Step time (simulated after [`rescore_sensitivity`]).
    pub step_secs: f64,
    /// What the ranking sorts by ([`crate::reach::Ranker::key`]).
    pub rank_secs: f64,
    pub config: ParallelConfig,
}

/// Dimensions reported in the sensitivity table, and each one's value as text.
/// A dimension's value in a configuration, as text.
pub type ValueOf = fn(&ParallelConfig) -> String;

pub const DIMENSIONS: &[(&str, ValueOf)] = &[
    ("TP", |c| c.tp.to_string()),
    ("PP", |c| c.pp.to_string()),
    ("VPP", |c| c.vpp.to_string()),
    ("CP", |c| c.cp.to_string()),
    ("EP", |c| c.ep.to_string()),
    ("DP", |c| c.dp.to_string()),
    ("SP", |c| c.sp.to_string()),
    ("micro-batch", |c| c.mbs.to_string()),
    ("ZeRO", |c| c.zero.to_string()),
    ("recompute", |c| format!("{:?}", c.recompute).to_lowercase()),
    ("schedule", |c| c.schedule.name().to_string()),
];

fn sensitivity(sorted: &[(Point, ParallelConfig)]) -> Vec<Sensitivity> {
    let mut out = Vec::new();
    for (dim, value_of) in DIMENSIONS {
        // `sorted` is in rank order: the first config seen for a value is its best.
        let mut seen: Vec<String> = Vec::new();
        for (p, cfg) in sorted {
            let v = value_of(cfg);
            if !seen.contains(&v) {
                seen.push(v.clone());
                out.push(Sensitivity {
                    dimension: dim,
                    value: v,
                    step_secs: p.step_secs,
                    rank_secs: p.rank_secs,
                    config: cfg.clone(),
                });
            }
        }
    }
    out
}

/// Structural part of a configuration (what fixes the group layout).
#[derive(Debug, Clone, Copy)]
struct Shape {
    tp: u64,
    cp: u64,
    pp: u64,
    dp: u64,
    vpp: u64,
    ep: u64,
    etp: u64,
}

fn pick(fixed: &Option<Vec<u64>>, all: Vec<u64>) -> Vec<u64> {
    match fixed {
        Some(v) => v.clone(),
        None => all,
    }
}

/// Virtual-stage counts worth trying for `layers` on `pp` stages: 1, and every
/// v > 1 that splits layers (or layers + embedding + loss) evenly.
fn vpp_candidates(layers: u64, pp: u64) -> Vec<u64> {
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
fn schedules_for(pp: u64, vpp: u64, fixed: &Option<Vec<Schedule>>) -> Vec<Schedule> {
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

fn shapes(model: &ModelSpec, cluster: &Cluster, w: &Workload, space: &SearchSpace) -> Vec<Shape> {
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

/// Re-partitions the layers of a non-interleaved pipeline with the integer program
/// ([`crate::partition`]) and keeps the uneven split when the cost model finds it
/// faster (by more than 0.1%) and it fits.
pub fn repartition(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
    current: &Estimate,
) -> Option<Candidate> {
    if cfg.pp < 2 || cfg.vpp != 1 || cfg.schedule == Schedule::DualPipe {
        return None;
    }
    let problem = crate::cost::stage_problem(model, cluster, w, cfg, a).ok()?;
    let part = crate::partition::solve(&problem)?;
    let layout = Layout::from_counts(&part.layers);
    if cfg.stage_layers(model.layers).ok()? == part.layers {
        return None;
    }
    let config = ParallelConfig {
        layout,
        ..cfg.clone()
    };
    let estimate = estimate_with(model, cluster, w, &config, a).ok()?;
    (estimate.step_secs < current.step_secs * 0.999).then_some(Candidate { config, estimate })
}

/// What one structural shape contributes: enumerated, valid, rejections by
/// reason, and the valid points with their configurations.
type Tally = (
    u64,
    u64,
    BTreeMap<RejectKind, u64>,
    Vec<(Point, ParallelConfig)>,
);

/// Prices the sensitivity table as the ranked plans are priced: each entry's step
/// time with the schedule simulated, and its rank key. The search leaves the
/// screening's closed-form times (simulating every entry would cost more than the
/// search itself); the report calls this before showing the table.
pub fn rescore_sensitivity(
    res: &mut SearchResult,
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    space: &SearchSpace,
) {
    let ranker = Ranker::builtin(&cluster.profile.name, model.moe.is_some(), space.rank_by);
    res.sensitivity.par_iter_mut().for_each(|s| {
        if let Ok(mut e) =
            crate::cost::estimate_unbanded(model, cluster, w, &s.config, space.assumptions)
        {
            crate::cost::apply_simulation(&mut e, &s.config);
            s.step_secs = e.step_secs;
            s.rank_secs = ranker.key(
                cluster,
                &s.config,
                grad_reductions(
                    model.moe.is_some(),
                    &s.config,
                    e.micro_batches,
                    space.assumptions.framework,
                ),
                e.step_secs,
                e.memory.total,
            );
        }
    });
}

/// How far a running search has got, for a caller that shows progress (the
/// planner itself never prints). Work is counted in units: one per parallel shape
/// screened and one per leader simulated; `total` grows when the leaders are known.
#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    /// Units finished so far.
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }
    /// Units known so far (never less than [`Progress::done`]).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed).max(self.done())
    }
    fn plan(&self, units: usize) {
        self.total.fetch_add(units as u64, Ordering::Relaxed);
    }
    fn tick(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs the search and keeps the `top` best valid configurations, ranked by
/// `space.rank_by`.
pub fn search(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    space: &SearchSpace,
    top: usize,
) -> SearchResult {
    search_with_progress(model, cluster, w, space, top, &Progress::default())
}

/// [`search`], counting its work in `progress` as it goes (another thread may read it).
pub fn search_with_progress(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    space: &SearchSpace,
    top: usize,
    progress: &Progress,
) -> SearchResult {
    let space = &space.normalized();
    let shapes = shapes(model, cluster, w, space);
    progress.plan(shapes.len());
    let ranker = Ranker::builtin(&cluster.profile.name, model.moe.is_some(), space.rank_by);
    let module_sets: Vec<RecomputeModules> = match &space.recompute_modules {
        Some(v) => v.clone(),
        None => {
            let mut v = vec![RecomputeModules::DEFAULT];
            let fine = fine_grained_modules(model, space.assumptions.flash_attention);
            if fine != RecomputeModules::DEFAULT {
                v.push(fine);
            }
            v
        }
    };
    // Sharded-gradient reductions per step, the reach axis the ranking reads.
    let reductions = |cfg: &ParallelConfig, micro_batches: u64| {
        grad_reductions(
            model.moe.is_some(),
            cfg,
            micro_batches,
            space.assumptions.framework,
        )
    };
    // Each shape expands into the product of the remaining knobs.
    let per_shape = |s: &Shape| -> Tally {
        let mut enumerated = 0;
        let mut valid = 0;
        let mut rejected: BTreeMap<RejectKind, u64> = BTreeMap::new();
        let mut kept = Vec::new();
        let sps: Vec<bool> = match &space.sp {
            Some(v) => v.clone(),
            None if s.tp > 1 => vec![true, false],
            None => vec![false],
        };
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
        let zeros: &[Zero] = if unsharded {
            &space.zero[..space.zero.len().min(1)]
        } else {
            &space.zero
        };
        let recomputes: Vec<(Recompute, RecomputeModules)> = space
            .recompute
            .iter()
            .flat_map(|&r| match r {
                Recompute::Selective => module_sets.iter().map(|&m| (r, m)).collect::<Vec<_>>(),
                _ => vec![(r, RecomputeModules::DEFAULT)],
            })
            .collect();
        for &sp in &sps {
            for &mbs in &space.mbs {
                for &zero in zeros {
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
                            match crate::cost::estimate_unbanded(
                                model,
                                cluster,
                                w,
                                &cfg,
                                space.assumptions,
                            ) {
                                Ok(e) => {
                                    valid += 1;
                                    kept.push((
                                        Point {
                                            step_secs: e.step_secs,
                                            peak_gib: e.memory.total / crate::hardware::GIB,
                                            rank_secs: ranker.key(
                                                cluster,
                                                &cfg,
                                                reductions(&cfg, e.micro_batches),
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
    };
    let results: Vec<_> = shapes
        .par_iter()
        .map(|s| {
            let r = per_shape(s);
            progress.tick();
            r
        })
        .collect();
    let mut enumerated = 0;
    let mut valid = 0;
    let mut rejected: BTreeMap<RejectKind, u64> = BTreeMap::new();
    let mut all: Vec<(Point, ParallelConfig)> = Vec::new();
    for (e, v, r, k) in results {
        enumerated += e;
        valid += v;
        for (kind, n) in r {
            *rejected.entry(kind).or_insert(0) += n;
        }
        all.extend(k);
    }
    all.sort_by(|a, b| {
        a.0.rank_secs
            .total_cmp(&b.0.rank_secs)
            .then(a.0.step_secs.total_cmp(&b.0.step_secs))
            .then(a.0.peak_gib.total_cmp(&b.0.peak_gib))
    });
    // The closed form screened everything; the leaders are re-partitioned and
    // re-scored with the schedule simulator, then ranked again.
    // The leaders: the first 3 x top by the screening's key and, when ranking by
    // the band's upper end, also the first 3 x top inside the validated runs, so
    // that an inside plan the re-partitioning and simulation would improve is
    // priced beside the outside plans it competes with.
    let depth = top.saturating_mul(3);
    let inside = |(p, cfg): &(Point, ParallelConfig)| {
        ranker.is_inside(
            cluster,
            cfg,
            reductions(cfg, cfg.micro_batches(w)),
            p.peak_gib * crate::hardware::GIB,
        )
    };
    let mut picked: Vec<usize> = (0..all.len().min(depth)).collect();
    if space.rank_by == RankBy::Upper {
        // As many inside plans as there are outside leaders (none when every
        // leader is inside: the simulations are the search's largest cost).
        let outside = picked.iter().filter(|&&i| !inside(&all[i])).count();
        picked.extend(
            (depth..all.len())
                .filter(|&i| inside(&all[i]))
                .take(outside),
        );
    }
    progress.plan(picked.len());
    let price = |i: usize| -> Candidate {
        let cfg = &all[i].1;
        let estimate = estimate_with(model, cluster, w, cfg, space.assumptions)
            .expect("configuration was valid a moment ago");
        let repartitioned = if space.even_layers {
            None
        } else {
            repartition(model, cluster, w, cfg, space.assumptions, &estimate)
        };
        let mut c = repartitioned.unwrap_or(Candidate {
            config: cfg.clone(),
            estimate,
        });
        crate::cost::apply_simulation(&mut c.estimate, &c.config);
        progress.tick();
        c
    };
    let mut leaders: Vec<Candidate> = picked.iter().map(|&i| price(i)).collect();
    let key = |c: &Candidate| {
        ranker.key(
            cluster,
            &c.config,
            reductions(&c.config, c.estimate.micro_batches),
            c.estimate.step_secs,
            c.estimate.memory.total,
        )
    };
    let rank = |leaders: &mut Vec<Candidate>| {
        leaders.sort_by(|a, b| {
            key(a)
                .total_cmp(&key(b))
                .then(a.estimate.step_secs.total_cmp(&b.estimate.step_secs))
        })
    };
    rank(&mut leaders);
    // An outside plan leads: before it wins, price more inside plans, since the
    // screening's order among them is the closed form's and the simulation or
    // the re-partitioning can lift one far down it. Only here does this cost
    // anything: when every leader is inside, or no plan is, nothing is added.
    let outside_leads = |l: &[Candidate]| {
        l.first().is_some_and(|c| {
            !ranker.is_inside(
                cluster,
                &c.config,
                reductions(&c.config, c.estimate.micro_batches),
                c.estimate.memory.total,
            )
        })
    };
    if space.rank_by == RankBy::Upper && outside_leads(&leaders) {
        let more: Vec<usize> = (0..all.len())
            .filter(|i| !picked.contains(i) && inside(&all[*i]))
            .take(depth.saturating_mul(3))
            .collect();
        progress.plan(more.len());
        leaders.extend(more.into_iter().map(price));
        rank(&mut leaders);
    }
    leaders.truncate(top);
    let top = leaders;
    let sensitivity = sensitivity(&all);
    let points = all.into_iter().map(|(p, _)| p).collect();
    debug_assert!(top.iter().all(|c| c.config.gpus() == cluster.gpus));
    SearchResult {
        enumerated,
        valid,
        rejected,
        top,
        points,
        sensitivity,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Precision;
    use crate::hardware::builtin_profile;
    use crate::presets::resolve;

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

    #[test]
    fn progress_counts_every_shape_and_leader() {
        let m = resolve("llama3-8b").unwrap().spec;
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 16).unwrap();
        let w = Workload {
            seq: 4096,
            global_batch: 64,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
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
        let m = resolve("llama3-8b").unwrap().spec;
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 16).unwrap();
        let w = Workload {
            seq: 4096,
            global_batch: 64,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
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
}
