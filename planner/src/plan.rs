//! The plan file in memory: what `sextant plan --out` and `sextant estimate --json`
//! write, and what the executor, the report and the exports read. Self-contained:
//! it carries the model and the full hardware profile, so a reader never needs to
//! resolve a name or call the search.
//!
//! Its estimates are the cost model's values; the file holds the records of
//! [`crate::format`], which owns the schema and its version. [`PlanFile::to_json`]
//! and [`PlanFile::from_json`] convert at that edge; the fields are documented in
//! `docs/plan-format.md`.

use crate::config::{ParallelConfig, Workload};
use crate::cost::{Assumptions, Estimate};
use crate::error::InputError;
use crate::format;
use crate::hardware::HardwareProfile;
use crate::model::ModelSpec;
use crate::search::SearchResult;

pub use crate::format::{SearchSummary, SpaceRecord, PLAN_SCHEMA_VERSION};

/// One ranked plan.
#[derive(Debug, Clone, PartialEq)]
pub struct RankedPlan {
    pub rank: usize,
    pub config: ParallelConfig,
    pub estimate: Estimate,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlanFile {
    pub schema_version: u32,
    /// "sextant X.Y.Z".
    pub generator: String,
    pub model: ModelSpec,
    pub hardware: HardwareProfile,
    pub gpus: u64,
    pub workload: Workload,
    /// The kernels the estimates priced (attention, cross-entropy); exports launch
    /// the same ones. Plan files written before it was recorded read the defaults.
    pub assumptions: Assumptions,
    /// Order in which parallel dimensions are laid over global ranks, innermost first.
    pub rank_order: String,
    /// Present when the plans came from a search.
    pub search: Option<SearchSummary>,
    /// The framework the search was restricted to (`plan --target`); absent when
    /// it searched everything the cost model prices (`--target any`), for
    /// `estimate`, and for files written before the field existed.
    pub target: Option<String>,
    /// Which end of the error band ranked the plans (`plan --rank-by`); absent in
    /// files from before risk-aware ranking and for a single estimate.
    pub rank_by: Option<crate::reach::RankBy>,
    /// Best first; `plans[0]` is the chosen plan.
    pub plans: Vec<RankedPlan>,
}

impl PlanFile {
    pub fn new(
        model: ModelSpec,
        hardware: HardwareProfile,
        gpus: u64,
        workload: Workload,
        assumptions: Assumptions,
        search: Option<&SearchResult>,
        plans: Vec<(ParallelConfig, Estimate)>,
    ) -> PlanFile {
        PlanFile {
            schema_version: PLAN_SCHEMA_VERSION,
            generator: format!("sextant {}", env!("CARGO_PKG_VERSION")),
            model,
            hardware,
            gpus,
            workload,
            assumptions,
            rank_order: assumptions.rank_order.order().to_string(),
            search: search.map(|r| SearchSummary {
                enumerated: r.enumerated,
                valid: r.valid,
                rejected: r.rejected.clone(),
                space: None,
            }),
            target: None,
            rank_by: None,
            plans: plans
                .into_iter()
                .enumerate()
                .map(|(i, (config, estimate))| RankedPlan {
                    rank: i + 1,
                    config,
                    estimate,
                })
                .collect(),
        }
    }

    /// Reads a plan file, checking its version and that its plans are coherent.
    pub fn from_json(text: &str) -> Result<PlanFile, InputError> {
        let p = PlanFile::from_record(format::read_plan(text)?);
        p.model.validate()?;
        p.hardware.validate()?;
        if p.plans.is_empty() {
            return Err(InputError::Workload("plan file holds no plan".into()));
        }
        crate::ranks::check_order(&p.rank_order)
            .map_err(|e| InputError::Workload(e.to_string()))?;
        // The order the plans were priced with and the order the exports build must
        // be one layout: ScaleTorch's grid, or one Megatron-Core builds.
        let priced = p.assumptions.rank_order;
        let consistent = match priced {
            crate::cost::RankOrder::ScaleTorch => p.rank_order == priced.order(),
            crate::cost::RankOrder::Megatron => p.rank_order != crate::ranks::SCALETORCH_ORDER,
        };
        if !consistent {
            return Err(InputError::Workload(format!(
                "rank_order {:?} contradicts the order the plans were priced with ({}, assumptions.rank_order); re-plan rather than edit it",
                p.rank_order,
                priced.order()
            )));
        }
        p.assumptions
            .check()
            .map_err(|e| InputError::Workload(e.to_string()))?;
        if p.assumptions.framework == crate::cost::Framework::Scaling {
            return Err(InputError::Workload(
                "framework scaling is priced for published runs only (validate); no plan is made for it: re-plan with a --target".into(),
            ));
        }
        p.workload
            .validate()
            .map_err(|e| InputError::Workload(e.to_string()))?;
        let mut cluster = crate::hardware::Cluster::new(p.hardware.clone(), p.gpus)?;
        // The plan may have been made with TP across nodes allowed.
        cluster.allow_tp_beyond_nvlink = true;
        for rp in &p.plans {
            rp.config
                .check(&p.model, &cluster, &p.workload)
                .map_err(|r| InputError::Workload(format!("plan {}: {r}", rp.rank)))?;
            p.assumptions
                .cuda_graphs
                .check_for(&p.model, rp.config.moe_dispatcher, p.workload.moe_capacity)
                .map_err(|e| InputError::Workload(format!("plan {}: {e}", rp.rank)))?;
            if p.assumptions.cuda_graphs.per_layer()
                && rp.config.recompute == crate::config::Recompute::Full
            {
                return Err(InputError::Workload(format!(
                    "plan {}: {}",
                    rp.rank,
                    crate::config::Rejection::GraphsWithFullRecompute
                )));
            }
            if rp.config.gpus() != p.gpus {
                return Err(InputError::Workload(format!(
                    "plan {} uses tp x pp x cp x dp = {} GPUs but the file is for {}",
                    rp.rank,
                    rp.config.gpus(),
                    p.gpus
                )));
            }
        }
        Ok(p)
    }

    pub fn to_json(&self) -> String {
        format::write_plan(&self.to_record())
    }

    /// The file's records of this plan.
    pub fn to_record(&self) -> format::PlanFile {
        format::PlanFile {
            schema_version: self.schema_version,
            generator: self.generator.clone(),
            model: self.model.clone(),
            hardware: self.hardware.clone(),
            gpus: self.gpus,
            workload: self.workload.clone(),
            assumptions: self.assumptions.into(),
            rank_order: self.rank_order.clone(),
            search: self.search.clone(),
            target: self.target.clone(),
            rank_by: self.rank_by.map(Into::into),
            plans: self
                .plans
                .iter()
                .map(|rp| format::RankedPlan {
                    rank: rp.rank,
                    config: rp.config.clone(),
                    estimate: (&rp.estimate).into(),
                })
                .collect(),
        }
    }

    /// The plan a file's records state, unchecked ([`PlanFile::from_json`] checks).
    pub fn from_record(r: format::PlanFile) -> PlanFile {
        PlanFile {
            schema_version: r.schema_version,
            generator: r.generator,
            model: r.model,
            hardware: r.hardware,
            gpus: r.gpus,
            workload: r.workload,
            assumptions: r.assumptions.into(),
            rank_order: r.rank_order,
            search: r.search,
            target: r.target,
            rank_by: r.rank_by.map(Into::into),
            plans: r
                .plans
                .into_iter()
                .map(|rp| RankedPlan {
                    rank: rp.rank,
                    config: rp.config,
                    estimate: (&rp.estimate).into(),
                })
                .collect(),
        }
    }

    /// Prices every plan again with this build's cost model, as `plan` and
    /// `estimate` priced it (closed form, then the pipeline simulation), and puts
    /// the fresh estimate in place of the stored one: a file is data, and what it
    /// says of its own numbers (edited, or written by another version) is not
    /// trusted. Returns one line per plan whose stored step time, MFU or peak
    /// memory differed by more than 0.5%, with both numbers; a configuration this
    /// model rejects is the `Err`.
    pub fn rederive(&mut self) -> Result<Vec<String>, InputError> {
        let mut cluster = crate::hardware::Cluster::new(self.hardware.clone(), self.gpus)?;
        cluster.allow_tp_beyond_nvlink = true;
        let mut notes = Vec::new();
        for rp in &mut self.plans {
            let fresh = crate::banded::estimate_with(
                &self.model,
                &cluster,
                &self.workload,
                &rp.config,
                self.assumptions,
            )
            .map_err(|r| {
                InputError::Workload(format!(
                    "plan {}: this build's cost model rejects its configuration: {r}",
                    rp.rank
                ))
            })?;
            let fresh = crate::banded::simulated(fresh, &rp.config);
            let old = &rp.estimate;
            // NaN or inf in the file is apart from any fresh (finite) number.
            let apart = |a: f64, b: f64| {
                (a - b).abs().partial_cmp(&(0.005 * b.abs().max(1e-12)))
                    != Some(std::cmp::Ordering::Less)
                    && a != b
            };
            if apart(old.step_secs, fresh.step_secs)
                || apart(old.mfu, fresh.mfu)
                || apart(old.memory.total, fresh.memory.total)
            {
                let gib = crate::hardware::GIB;
                notes.push(format!(
                    "plan {}: the file says step {} s, MFU {}%, peak {} GiB; this build's cost model gives {:.3} s, MFU {:.1}%, peak {:.1} GiB, which is what follows",
                    rp.rank,
                    shown(old.step_secs, 1.0),
                    shown(old.mfu, 100.0),
                    shown(old.memory.total, 1.0 / gib),
                    fresh.step_secs,
                    100.0 * fresh.mfu,
                    fresh.memory.total / gib
                ));
            }
            rp.estimate = fresh;
        }
        Ok(notes)
    }
}

/// A stored number for a message: finite ones to three decimals, others as they
/// are (NaN, inf).
fn shown(x: f64, scale: f64) -> String {
    let v = x * scale;
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        format!("{v}")
    }
}
