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
//!
//! `space.rs` enumerates the structural shapes, `screen.rs` prices every point of
//! each shape in closed form, `rank.rs` re-prices the leaders (re-partitioned,
//! schedule simulated) and ranks them, `sensitivity.rs` builds the table of the
//! best plan per dimension value.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use crate::config::{ParallelConfig, RejectKind, Workload};
use crate::cost::Estimate;
use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::reach::{grad_reductions, Ranker};

mod rank;
mod screen;
mod sensitivity;
mod space;

pub use rank::repartition;
pub use sensitivity::{rescore_sensitivity, Sensitivity, ValueOf, DIMENSIONS};
pub use space::{fine_grained_modules, SearchSpace};

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
    let shapes = space::shapes(model, cluster, w, space);
    progress.plan(shapes.len());
    let inputs = Inputs {
        model,
        cluster,
        w,
        space,
        ranker: Ranker::builtin(
            &cluster.profile.name,
            model.moe.is_some(),
            space.assumptions.framework,
            space.rank_by,
        ),
    };
    let module_sets = screen::module_sets(&inputs);
    let results: Vec<_> = shapes
        .par_iter()
        .map(|s| {
            let r = screen::screen_shape(&inputs, &module_sets, s);
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
    let top = rank::leaders(&inputs, &all, top, progress);
    let sensitivity = sensitivity::sensitivity(&all);
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

/// What every pass of one search reads: the problem, the normalised space and
/// the ranking.
struct Inputs<'a> {
    model: &'a ModelSpec,
    cluster: &'a Cluster,
    w: &'a Workload,
    space: &'a SearchSpace,
    ranker: Ranker,
}

impl Inputs<'_> {
    /// Sharded-gradient reductions per step, the reach axis the ranking reads.
    #[inline]
    fn reductions(&self, cfg: &ParallelConfig, micro_batches: u64) -> f64 {
        grad_reductions(
            self.model.moe.is_some(),
            cfg,
            micro_batches,
            self.space.assumptions.framework,
        )
    }
}

#[cfg(test)]
mod tests;
