//! The sensitivity table: for each searched dimension and each value it took, the
//! best plan with the dimension held there; priced as the ranked plans are on request.

use rayon::prelude::*;

use super::{Point, SearchResult, SearchSpace};
use crate::config::{ParallelConfig, Workload};
use crate::hardware::Cluster;
use crate::model::ModelSpec;
use crate::reach::{grad_reductions, Ranker};

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

pub(super) fn sensitivity(sorted: &[(Point, ParallelConfig)]) -> Vec<Sensitivity> {
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
    let ranker = Ranker::builtin(
        &cluster.profile.name,
        model.moe.is_some(),
        space.assumptions.framework,
        space.rank_by,
    );
    res.sensitivity.par_iter_mut().for_each(|s| {
        if let Ok(e) = crate::cost::estimate_with(model, cluster, w, &s.config, space.assumptions) {
            let e = crate::cost::simulate(&e, &s.config).unwrap_or(e);
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
