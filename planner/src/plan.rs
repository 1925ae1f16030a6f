//! The plan file: what `sextant plan --out` and `sextant estimate --json` write, and
//! what the executor, the report and the exports read. Self-contained: it carries
//! the model and the full hardware profile, so a reader never needs to resolve a
//! name or call the search. Versioned by `schema_version`; the fields are
//! documented in ARCHITECTURE.md.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{
    Dispatcher, Overlap, ParallelConfig, Recompute, RecomputeModules, RejectKind, Workload, Zero,
};
use crate::cost::{Assumptions, Estimate};
use crate::error::InputError;
use crate::hardware::HardwareProfile;
use crate::model::ModelSpec;
use crate::schedule::Schedule;
use crate::search::{SearchResult, SearchSpace};

/// Version 2 spells the schedule, ZeRO stage and MoE dispatcher as the command line
/// does (`1f1b`, `"1"`, `alltoall`); version 1 files (`one_f_one_b`, `dist_opt`,
/// `all_to_all`) are read and migrated.
pub const PLAN_SCHEMA_VERSION: u32 = 2;

/// Plan-file versions this build reads.
const READS: [u32; 2] = [1, 2];

/// Counts from the search that produced the plans.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchSummary {
    pub enumerated: u64,
    pub valid: u64,
    pub rejected: BTreeMap<RejectKind, u64>,
    /// The space searched, so that a reader (`report`) searches the same one again;
    /// absent in files written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<SpaceRecord>,
}

/// The values each knob of a search could take, as the plan file records them
/// (`null`: every sensible value), and the search options that are policy rather
/// than hardware.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpaceRecord {
    pub tp: Option<Vec<u64>>,
    pub pp: Option<Vec<u64>>,
    pub vpp: Option<Vec<u64>>,
    pub cp: Option<Vec<u64>>,
    pub ep: Option<Vec<u64>>,
    pub etp: Option<Vec<u64>>,
    pub sp: Option<Vec<bool>>,
    pub schedule: Option<Vec<Schedule>>,
    pub mbs: Vec<u64>,
    pub zero: Vec<Zero>,
    pub recompute: Vec<Recompute>,
    pub recompute_modules: Option<Vec<RecomputeModules>>,
    pub overlap: Overlap,
    pub bf16_grads: bool,
    pub bf16_moments: bool,
    pub moe_dispatcher: Dispatcher,
    /// Only stages of equal layer counts (ScaleTorch).
    pub even_layers: bool,
    /// `--allow-tp-across-nodes`: TP groups could span NVLink domains.
    pub allow_tp_across_nodes: bool,
}

impl SpaceRecord {
    /// The record of `space`, searched with TP across nodes allowed or not.
    pub fn of(space: &SearchSpace, allow_tp_across_nodes: bool) -> SpaceRecord {
        SpaceRecord {
            tp: space.tp.clone(),
            pp: space.pp.clone(),
            vpp: space.vpp.clone(),
            cp: space.cp.clone(),
            ep: space.ep.clone(),
            etp: space.etp.clone(),
            sp: space.sp.clone(),
            schedule: space.schedule.clone(),
            mbs: space.mbs.clone(),
            zero: space.zero.clone(),
            recompute: space.recompute.clone(),
            recompute_modules: space.recompute_modules.clone(),
            overlap: space.overlap,
            bf16_grads: space.bf16_grads,
            bf16_moments: space.bf16_moments,
            moe_dispatcher: space.moe_dispatcher,
            even_layers: space.even_layers,
            allow_tp_across_nodes,
        }
    }

    /// The search space again, priced with `assumptions` and ranked by `rank_by`.
    pub fn space(&self, assumptions: Assumptions, rank_by: crate::reach::RankBy) -> SearchSpace {
        SearchSpace {
            tp: self.tp.clone(),
            pp: self.pp.clone(),
            vpp: self.vpp.clone(),
            cp: self.cp.clone(),
            ep: self.ep.clone(),
            etp: self.etp.clone(),
            sp: self.sp.clone(),
            schedule: self.schedule.clone(),
            mbs: self.mbs.clone(),
            zero: self.zero.clone(),
            recompute: self.recompute.clone(),
            recompute_modules: self.recompute_modules.clone(),
            overlap: self.overlap,
            bf16_grads: self.bf16_grads,
            bf16_moments: self.bf16_moments,
            moe_dispatcher: self.moe_dispatcher,
            assumptions,
            rank_by,
            even_layers: self.even_layers,
        }
    }
}

/// One ranked plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankedPlan {
    pub rank: usize,
    pub config: ParallelConfig,
    pub estimate: Estimate,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    #[serde(default)]
    pub assumptions: Assumptions,
    /// Order in which parallel dimensions are laid over global ranks, innermost first.
    pub rank_order: String,
    /// Present when the plans came from a search.
    #[serde(default)]
    pub search: Option<SearchSummary>,
    /// The framework the search was restricted to (`plan --target`); absent when
    /// it searched everything the cost model prices (`--target any`), for
    /// `estimate`, and for files written before the field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Which end of the error band ranked the plans (`plan --rank-by`); absent in
    /// files from before risk-aware ranking and for a single estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
        // The version first, so a file from another version is refused by its
        // number rather than by whichever field changed.
        #[derive(Deserialize)]
        struct Version {
            schema_version: u32,
        }
        let v: Version = crate::json::from_str(text, "plan")?;
        if !READS.contains(&v.schema_version) {
            return Err(InputError::SchemaVersion {
                what: "plan".into(),
                found: v.schema_version,
                supported: PLAN_SCHEMA_VERSION,
            });
        }
        let mut p: PlanFile = crate::json::from_str(text, "plan")?;
        // Version 1 differs only in enum spellings, which the readers accept.
        p.schema_version = PLAN_SCHEMA_VERSION;
        p.model.validate()?;
        p.hardware.validate()?;
        if p.plans.is_empty() {
            return Err(InputError::Workload("plan file holds no plan".into()));
        }
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
        p.workload.validate().map_err(InputError::Workload)?;
        let mut cluster = crate::hardware::Cluster::new(p.hardware.clone(), p.gpus)?;
        // The plan may have been made with TP across nodes allowed.
        cluster.allow_tp_beyond_nvlink = true;
        for rp in &p.plans {
            rp.config
                .check(&p.model, &cluster, &p.workload)
                .map_err(|r| InputError::Workload(format!("plan {}: {r}", rp.rank)))?;
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
        serde_json::to_string_pretty(self).expect("plan serialises")
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
            let mut fresh = crate::cost::estimate_with(
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
            crate::cost::apply_simulation(&mut fresh, &rp.config);
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
