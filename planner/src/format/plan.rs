//! The plan file's top level: what `sextant plan --out` and `sextant estimate
//! --json` write. Self-contained: it carries the model and the full hardware
//! profile, so a reader never needs to resolve a name or call the search.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Assumptions, Estimate};
use crate::config::{
    Dispatcher, Overlap, ParallelConfig, Recompute, RecomputeModules, RejectKind, Workload, Zero,
};
use crate::hardware::HardwareProfile;
use crate::model::ModelSpec;
use crate::schedule::Schedule;

/// The plan file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(expecting = "a JSON object (a Sextant plan file)")]
pub struct PlanFile {
    pub schema_version: u32,
    /// "sextant X.Y.Z".
    pub generator: String,
    pub model: ModelSpec,
    pub hardware: HardwareProfile,
    pub gpus: u64,
    pub workload: Workload,
    /// The kernels the estimates priced; the defaults when absent.
    #[serde(default)]
    pub assumptions: Assumptions,
    /// Order in which parallel dimensions are laid over global ranks, innermost
    /// first.
    pub rank_order: String,
    /// `null` unless the plans came from a search.
    #[serde(default)]
    pub search: Option<SearchSummary>,
    /// The framework `plan --target` restricted the search to; absent for `--target
    /// any`, for `estimate` and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Which end of the error band ranked the plans; absent for a single estimate
    /// and in older files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_by: Option<RankBy>,
    /// Best first; `plans[0]` is the chosen plan.
    pub plans: Vec<RankedPlan>,
}

/// `plans[]`: one ranked plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankedPlan {
    pub rank: usize,
    pub config: ParallelConfig,
    pub estimate: Estimate,
}

/// `rank_by`: `point` or `upper`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankBy {
    Point,
    Upper,
}

/// `search`: counts from the search that produced the plans.
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

/// `search.space`: the values each knob of a search could take (`null`: every
/// sensible value), and the search options that are policy rather than hardware.
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
    /// ZeRO 0 only without TP, PP or CP (torchtitan's one-dimensional DDP); false
    /// when absent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain_dp_alone: bool,
    /// `--allow-tp-across-nodes`: TP groups could span NVLink domains.
    pub allow_tp_across_nodes: bool,
}
