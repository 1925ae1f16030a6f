//! How far a plan reaches beyond what validation covers, and the risk-aware
//! ranking built on it.
//!
//! A search maximises, so every optimistic error of the cost model becomes a top
//! recommendation, and the errors grow where no measured run has been: deeper
//! virtual pipelines, ZeRO-3 over more data-parallel ranks, TP groups across
//! NVLink domains, more GPUs, fuller memory, schedules no published run used.
//!
//! - [`Reach`] places a plan on those axes.
//! - The validated region is, per axis, the largest value among the published
//!   runs the error bands come from (`hwprofiles/validation.json`, each sample
//!   with its reach), and the set of schedules they ran.
//! - [`axis_rates`] measures how fast the model's error drifts along an axis, from
//!   published sweeps that vary that axis alone (`tests/data/published_sweeps.csv`):
//!   per sweep, the change of log(predicted / measured) from the row nearest the
//!   validated region, per doubling of the axis; the rate is the root mean square
//!   over every row of every sweep of that axis. An axis no sweep measures gets
//!   the median of the measured axes' rates: a typical drift. (The largest would
//!   let one axis with a known, mechanism-specific gap, such as TP groups across
//!   nodes on AWS EFA, set the band of every unmeasured axis.)
//! - [`Ranker::band`] widens a plan's band by those rates times its doublings
//!   outside the region, added in quadrature (as independent errors) to the half
//!   width of the band in log space, at the band's own coverage.
//! - [`Ranker::key`] ranks by the chosen end: with [`RankBy::Upper`] an inside
//!   plan by its band's upper end, and an outside plan so that it ranks ahead of
//!   an inside plan only when its whole band, to its upper end, is faster than
//!   the inside plan's point estimate: an untested corner does not win on a point
//!   estimate alone.

use serde::{Deserialize, Serialize};

pub use crate::cost::band::Outside;

use crate::config::{ParallelConfig, Zero};
use crate::hardware::Cluster;
use crate::uncertainty::{Band, ValidationSet, COVERAGE};

/// The axes along which a plan can leave the validated region, in table order.
pub const AXES: [&str; 9] = [
    "virtual stages",
    "ZeRO-3 DP",
    "TP NVLink domains",
    "GPUs",
    "HBM fraction",
    "sharded-gradient reductions",
    "EP NVLink domains",
    "CP ranks",
    "schedule",
];

/// Numeric axes: every axis of [`AXES`] but the last, the schedule.
const NUMERIC: usize = AXES.len() - 1;
/// [`AXES`] index of the HBM fraction, whose distance counts halvings of the
/// free memory.
const HBM: usize = 4;
/// [`AXES`] index of the schedule.
const SCHEDULE: usize = NUMERIC;

/// Where a plan sits on each axis of [`AXES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reach {
    /// Virtual pipeline stages per rank (1: not interleaved).
    pub virtual_stages: f64,
    /// Data-parallel ranks that parameters are sharded over with ZeRO-3/FSDP
    /// (1 without parameter sharding).
    pub zero3_dp: f64,
    /// NVLink domains one TP group spans (1: inside one domain).
    pub tp_domains: f64,
    pub gpus: f64,
    /// Peak memory over the GPU's HBM.
    pub hbm_fraction: f64,
    /// Reductions per step of each stage's sharded gradients
    /// ([`grad_reductions`]). Files from before this axis read 1.
    #[serde(default = "one")]
    pub grad_reductions: f64,
    /// NVLink domains one expert-parallel group spans (1: inside one domain, or
    /// a dense model): the all-to-all's reach. Files from before this axis read 1.
    #[serde(default = "one")]
    pub ep_domains: f64,
    /// Context-parallel ranks: ring steps each attention block takes, over ever
    /// shorter chunks at a fixed sequence. Files from before this axis read 1.
    #[serde(default = "one")]
    pub cp: f64,
    pub schedule: String,
}

fn one() -> f64 {
    1.0
}

/// How many times per step a stage reduces its gradients, for the reach axis
/// "sharded-gradient reductions": the micro-batches per step where the gradients
/// are sharded and so cannot accumulate locally (ZeRO-2/3 and FSDP: Megatron-FSDP
/// `optim_grads` "RS communication groups on all microbatches",
/// mcore_fsdp_adapter.py at d98e8a6; PyTorch FSDP2 syncs every backward unless
/// told not to), 1 otherwise: gradients accumulated whole and reduced once, no
/// group to reduce over (one data-parallel rank and, for an MoE model, one
/// expert-data-parallel rank), or a framework that defers the sync to the last
/// micro-batch ([`crate::cost::Framework::defers_sharded_grad_sync`]: torchtitan
/// with pipeline parallelism). The cost model prices the same counts
/// (cost/dp_sync.rs).
pub fn grad_reductions(
    moe: bool,
    cfg: &ParallelConfig,
    micro_batches: u64,
    framework: crate::cost::Framework,
) -> f64 {
    let expert_dp = if moe {
        (cfg.tp * cfg.cp * cfg.dp) / (cfg.ep * cfg.etp).max(1)
    } else {
        1
    };
    let sharded =
        matches!(cfg.zero, Zero::Zero2 | Zero::Zero3) && (cfg.dp * cfg.cp > 1 || expert_dp > 1);
    if sharded && !framework.defers_sharded_grad_sync(cfg.pp) {
        micro_batches.max(1) as f64
    } else {
        1.0
    }
}

impl Reach {
    /// `grad_reductions`: the plan's [`grad_reductions`].
    pub fn of(
        cluster: &Cluster,
        cfg: &ParallelConfig,
        grad_reductions: f64,
        peak_bytes: f64,
    ) -> Reach {
        let [v, z, t, g, h, r, e, c] = Reach::numeric_of(cluster, cfg, grad_reductions, peak_bytes);
        Reach {
            virtual_stages: v,
            zero3_dp: z,
            tp_domains: t,
            gpus: g,
            hbm_fraction: h,
            grad_reductions: r,
            ep_domains: e,
            cp: c,
            schedule: cfg.schedule.name().to_string(),
        }
    }

    /// The numeric axes' values, in [`AXES`] order, without allocating (the
    /// search's inner loop).
    fn numeric_of(
        cluster: &Cluster,
        cfg: &ParallelConfig,
        grad_reductions: f64,
        peak_bytes: f64,
    ) -> [f64; NUMERIC] {
        let domain = cluster.profile.node.nvlink_domain.max(1);
        [
            cfg.vpp.max(1) as f64,
            if cfg.zero == Zero::Zero3 {
                cfg.dp.max(1) as f64
            } else {
                1.0
            },
            cfg.tp.div_ceil(domain).max(1) as f64,
            cluster.gpus.max(1) as f64,
            (peak_bytes / cluster.profile.hbm_bytes()).clamp(0.0, 1.0),
            grad_reductions.max(1.0),
            // An EP group is ep consecutive blocks of etp ranks in the expert grid.
            (cfg.ep * cfg.etp).div_ceil(domain).max(1) as f64,
            cfg.cp.max(1) as f64,
        ]
    }

    /// The numeric axes' values, in [`AXES`] order.
    fn numeric(&self) -> [f64; NUMERIC] {
        [
            self.virtual_stages,
            self.zero3_dp,
            self.tp_domains,
            self.gpus,
            self.hbm_fraction,
            self.grad_reductions,
            self.ep_domains,
            self.cp,
        ]
    }
}

/// How fast the model's error drifts along one axis, per doubling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AxisRate {
    pub axis: String,
    /// Root mean square drift of log(predicted / measured) per doubling.
    pub per_doubling: f64,
    /// Sweep rows it was measured on (0: the median of the measured axes' rates).
    pub rows: usize,
    pub basis: String,
}

/// One priced row of a published sweep: its axis (one of [`AXES`]), the row's
/// value on it, predicted and measured step times.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    pub sweep: String,
    pub axis: String,
    pub value: f64,
    pub predicted_secs: f64,
    pub measured_secs: f64,
}

/// Fewest sweep rows (beyond each sweep's base) an axis's own rate needs.
pub const MIN_RATE_ROWS: usize = 3;

/// The per-doubling error drift of every axis of [`AXES`] from published sweeps
/// (see the module documentation).
pub fn axis_rates(points: &[SweepPoint]) -> Vec<AxisRate> {
    let mut measured: Vec<(usize, f64, usize, usize)> = Vec::new(); // (axis, rate, rows, sweeps)
    for (i, axis) in AXES.iter().enumerate() {
        let mine: Vec<&SweepPoint> = points.iter().filter(|p| p.axis == *axis).collect();
        let mut sweeps: Vec<&str> = mine.iter().map(|p| p.sweep.as_str()).collect();
        sweeps.sort_unstable();
        sweeps.dedup();
        let (mut sum_sq, mut n) = (0.0, 0usize);
        for s in &sweeps {
            let rows: Vec<&&SweepPoint> = mine.iter().filter(|p| p.sweep == *s).collect();
            let Some(base) = rows.iter().min_by(|a, b| a.value.total_cmp(&b.value)) else {
                continue;
            };
            let base_err = (base.predicted_secs / base.measured_secs).ln();
            for r in &rows {
                let doublings = (r.value / base.value).log2();
                // Rows at the base value (or NaN) measure no drift.
                if doublings.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater) {
                    continue;
                }
                let drift = ((r.predicted_secs / r.measured_secs).ln() - base_err) / doublings;
                if drift.is_finite() {
                    sum_sq += drift * drift;
                    n += 1;
                }
            }
        }
        if n >= MIN_RATE_ROWS {
            measured.push((i, (sum_sq / n as f64).sqrt(), n, sweeps.len()));
        }
    }
    let typical: Option<f64> = {
        let mut r: Vec<f64> = measured.iter().map(|m| m.1).collect();
        r.sort_by(f64::total_cmp);
        match r.len() {
            0 => None,
            n if n % 2 == 1 => Some(r[n / 2]),
            n => Some(0.5 * (r[n / 2 - 1] + r[n / 2])),
        }
    };
    let names: Vec<&str> = measured.iter().map(|m| AXES[m.0]).collect();
    AXES.iter()
        .enumerate()
        .map(|(i, axis)| match measured.iter().find(|m| m.0 == i) {
            Some(&(_, rate, rows, sweeps)) => AxisRate {
                axis: axis.to_string(),
                per_doubling: rate,
                rows,
                basis: format!("{rows} rows of {sweeps} published sweeps of this axis"),
            },
            None => AxisRate {
                axis: axis.to_string(),
                per_doubling: typical.unwrap_or(0.0),
                rows: 0,
                basis: match typical {
                    Some(_) => format!(
                        "no published sweep varies it: the median of the measured rates ({})",
                        names.join(", ")
                    ),
                    None => "no published sweep measured any axis".into(),
                },
            },
        })
        .collect()
}

/// Which end of a plan's band ranks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RankBy {
    /// The point estimate.
    Point,
    /// The upper end of the band (see [`Ranker::key`]).
    #[default]
    Upper,
}

impl RankBy {
    pub fn parse(s: &str) -> Option<RankBy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "point" => Some(RankBy::Point),
            "upper" => Some(RankBy::Upper),
            _ => None,
        }
    }
}

/// The validated region, the rates and the unwidened band's ends relative to
/// the point, for one search (one profile and model kind): built once, used for
/// every candidate.
#[derive(Debug, Clone)]
pub struct Ranker {
    by: RankBy,
    /// Unwidened band ends over the point estimate, and the band's template.
    low: f64,
    high: f64,
    template: Option<Band>,
    /// Per numeric axis: (largest validated value, rate); `None` when no
    /// validated run carries a reach.
    region: Option<[(f64, f64); NUMERIC]>,
    schedules: Vec<String>,
    schedule_rate: f64,
    /// Standard normal quantile of the band's upper end at its own coverage.
    z: f64,
}

impl Ranker {
    pub fn new(
        set: &ValidationSet,
        profile: &str,
        moe: bool,
        framework: crate::cost::Framework,
        by: RankBy,
    ) -> Ranker {
        let template = crate::uncertainty::band_from(set, profile, moe, framework, 1.0);
        let (low, high) = template
            .as_ref()
            .map_or((1.0, 1.0), |b| (b.low_secs, b.high_secs));
        // The validated region is that of the runs trained with the plan's framework
        // (torchtitan's own FSDP runs for a torchtitan plan); a framework with none
        // (ScaleTorch) takes Megatron-Core's, the runs the region was first drawn from.
        let of = |fw: crate::cost::Framework| -> Vec<&Reach> {
            set.samples
                .iter()
                .filter(|s| s.framework == fw)
                .filter_map(|s| s.reach.as_ref())
                .collect()
        };
        let own = of(framework);
        let reaches = if own.is_empty() {
            of(crate::cost::Framework::MegatronCore)
        } else {
            own
        };
        let rate = |axis: &str| {
            set.rates
                .iter()
                .find(|r| r.axis == axis)
                .map_or(0.0, |r| r.per_doubling)
        };
        let region = (!reaches.is_empty()).then(|| {
            let mut out = [(0.0, 0.0); NUMERIC];
            for (k, slot) in out.iter_mut().enumerate() {
                let max = reaches
                    .iter()
                    .map(|r| r.numeric()[k])
                    .fold(f64::NEG_INFINITY, f64::max);
                *slot = (max, rate(AXES[k]));
            }
            out
        });
        let mut schedules: Vec<String> = reaches.iter().map(|r| r.schedule.clone()).collect();
        schedules.sort_unstable();
        schedules.dedup();
        let z = upper_z(template.as_ref().map_or(COVERAGE, |b| b.coverage));
        Ranker {
            z,
            by,
            low,
            high,
            template,
            region,
            schedules,
            schedule_rate: rate(AXES[SCHEDULE]),
        }
    }

    /// The compiled-in validation set's ranker.
    pub fn builtin(
        profile: &str,
        moe: bool,
        framework: crate::cost::Framework,
        by: RankBy,
    ) -> Ranker {
        Ranker::new(
            crate::uncertainty::validation(),
            profile,
            moe,
            framework,
            by,
        )
    }

    /// Doublings of axis `k` beyond the validated region (0 inside).
    fn doublings(k: usize, value: f64, validated: f64) -> f64 {
        let d = if k == HBM {
            // Halvings of the free memory beyond the fullest validated run.
            ((1.0 - validated) / (1.0 - value).max(1e-6)).log2()
        } else {
            (value / validated).log2()
        };
        if d > 1e-9 {
            d
        } else {
            0.0
        }
    }

    fn schedule_outside(&self, schedule: &str) -> bool {
        !self.schedules.is_empty() && !self.schedules.iter().any(|s| s == schedule)
    }

    /// Each axis of [`AXES`] as (doublings beyond the validated region, drift per
    /// doubling): 0 doublings inside; a schedule no validated run used counts
    /// one. Allocates nothing (the search's inner loop).
    fn drifts(&self, values: [f64; NUMERIC], schedule: &str) -> [(f64, f64); NUMERIC + 1] {
        let mut out = [(0.0, 0.0); NUMERIC + 1];
        if let Some(region) = &self.region {
            for (k, value) in values.into_iter().enumerate() {
                out[k] = (Ranker::doublings(k, value, region[k].0), region[k].1);
            }
        }
        if self.schedule_outside(schedule) {
            out[SCHEDULE] = (1.0, self.schedule_rate);
        }
        out
    }

    /// The axes on which `reach` is outside the validated region.
    pub fn outside(&self, reach: &Reach) -> Vec<Outside> {
        let values = reach.numeric();
        let mut out = Vec::new();
        for (k, (doublings, per_doubling)) in
            self.drifts(values, &reach.schedule).into_iter().enumerate()
        {
            if doublings == 0.0 {
                continue;
            }
            out.push(if k < NUMERIC {
                Outside {
                    axis: AXES[k].to_string(),
                    value: values[k],
                    validated: self.region.as_ref().map_or(0.0, |r| r[k].0),
                    doublings,
                    per_doubling,
                }
            } else {
                Outside {
                    axis: format!("{} {}", AXES[SCHEDULE], reach.schedule),
                    value: 0.0,
                    validated: 0.0,
                    doublings,
                    per_doubling,
                }
            });
        }
        out
    }

    /// Added log-space half width at the band's coverage: the z-score of the
    /// band's upper end times the drifts added in quadrature.
    fn extra(&self, outside: &[Outside]) -> f64 {
        let var: f64 = outside
            .iter()
            .map(|o| (o.per_doubling * o.doublings).powi(2))
            .sum();
        self.z * var.sqrt()
    }

    /// The (possibly widened) band's ends for a point estimate, given the added
    /// half width.
    fn ends(&self, point: f64, extra: f64) -> (f64, f64) {
        let (lo, hi) = (self.low.ln(), self.high.ln());
        let (center, half) = ((lo + hi) / 2.0, (hi - lo) / 2.0);
        let half = (half * half + extra * extra).sqrt();
        (point * (center - half).exp(), point * (center + half).exp())
    }

    /// The band of a plan with step time `point` at `reach`, widened where it is
    /// outside the validated region; `None` without validation data.
    pub fn band(&self, point: f64, reach: &Reach) -> Option<Band> {
        let mut b = self.template.clone()?;
        let outside = self.outside(reach);
        let (low, high) = self.ends(point, self.extra(&outside));
        b.low_secs = low;
        b.high_secs = high;
        if !outside.is_empty() {
            b.basis = format!(
                "{}, widened for {} outside the validated runs",
                b.basis,
                outside
                    .iter()
                    .map(|o| o.axis.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        b.outside = outside;
        Some(b)
    }

    /// The number the search sorts by (smaller first), for a plan with step time
    /// `point`, [`grad_reductions`] per step and peak memory `peak_bytes`.
    /// Allocates nothing.
    pub fn key(
        &self,
        cluster: &Cluster,
        cfg: &ParallelConfig,
        grad_reductions: f64,
        point: f64,
        peak_bytes: f64,
    ) -> f64 {
        if self.by == RankBy::Point {
            return point;
        }
        self.key_from(
            point,
            Reach::numeric_of(cluster, cfg, grad_reductions, peak_bytes),
            cfg.schedule.name(),
        )
    }

    /// Whether a plan is inside the validated region on every axis.
    pub fn is_inside(
        &self,
        cluster: &Cluster,
        cfg: &ParallelConfig,
        grad_reductions: f64,
        peak_bytes: f64,
    ) -> bool {
        self.drifts(
            Reach::numeric_of(cluster, cfg, grad_reductions, peak_bytes),
            cfg.schedule.name(),
        )
        .iter()
        .all(|&(d, _)| d == 0.0)
    }

    fn key_from(&self, point: f64, values: [f64; NUMERIC], schedule: &str) -> f64 {
        if self.by == RankBy::Point {
            return point;
        }
        let drifts = self.drifts(values, schedule);
        let outside = drifts.iter().any(|&(d, _)| d > 0.0);
        let var: f64 = drifts.iter().map(|&(d, r)| (r * d).powi(2)).sum();
        let (_, high) = self.ends(point, self.z * var.sqrt());
        if outside {
            // Ahead of an inside plan I (key p_I x high/point) exactly when this
            // upper end is below p_I.
            high * self.high
        } else {
            high
        }
    }
}

/// Standard normal quantile of a central band's upper end, at probability
/// (1 + `coverage`) / 2: 1.2816 for the 80% band, 1.88 for a band widened to the
/// range of 35 errors (94%). Abramowitz and Stegun's rational approximation
/// 26.2.23 (Handbook of Mathematical Functions, 1964), absolute error below
/// 4.5e-4, far inside what the drift rates carry.
pub(crate) fn upper_z(coverage: f64) -> f64 {
    let q = ((1.0 - coverage) / 2.0).clamp(1e-12, 0.5);
    let t = (-2.0 * q.ln()).sqrt();
    let z = t
        - (2.515_517 + 0.802_853 * t + 0.010_328 * t * t)
            / (1.0 + 1.432_788 * t + 0.189_269 * t * t + 0.001_308 * t * t * t);
    // At zero coverage the approximation's error would make it negative.
    z.max(0.0)
}

#[cfg(test)]
mod tests;
