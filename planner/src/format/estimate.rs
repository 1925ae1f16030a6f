//! `plans[].estimate`: what one configuration costs, as the plan file records it.
//! Times are seconds per optimizer step on the critical path unless a name says
//! otherwise; memory is bytes per GPU.

use serde::{Deserialize, Serialize};

/// The record of [`crate::cost::Estimate`] (estimate version
/// [`crate::cost::ESTIMATE_SCHEMA_VERSION`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub schema_version: u32,
    pub step_secs: f64,
    pub tokens_per_sec_per_gpu: f64,
    /// A fraction, not percent.
    pub mfu: f64,
    /// A fraction, not percent.
    pub hfu: f64,
    pub model_tflops_per_gpu: f64,
    pub micro_batches: u64,
    pub bubble_fraction: f64,
    pub exposed_comm_fraction: f64,
    pub time: TimeBreakdown,
    pub comm: Vec<CommTerm>,
    /// The stage with the highest peak.
    pub memory: StageMemory,
    pub hbm_bytes: f64,
    pub usable_bytes: f64,
    pub stages: Vec<StageSummary>,
    pub critical_stage: u64,
    /// `null` when no comparable published run exists.
    #[serde(default)]
    pub band: Option<Band>,
    #[serde(default)]
    pub pipeline_simulated: bool,
    /// `null` for dense models.
    #[serde(default)]
    pub moe_routing: Option<MoeRouting>,
}

/// `estimate.time`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    pub compute: OpClasses,
    pub recompute: f64,
    pub exposed_comm: f64,
    pub bubble: f64,
    pub optimizer: f64,
    pub overlap_slowdown: f64,
    /// 0 when absent.
    #[serde(default)]
    pub host_wait: f64,
}

/// `estimate.time.compute`: forward and backward, by operation class.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpClasses {
    pub attention_proj: f64,
    pub attention_core: f64,
    pub mlp: f64,
    pub moe_experts: f64,
    pub router: f64,
    pub output_layer: f64,
    pub elementwise: f64,
}

/// `estimate.comm[]`: one kind of communication over a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommTerm {
    pub kind: CommKind,
    pub collective: Collective,
    pub group: Placement,
    pub tier: Tier,
    pub bytes_per_call: f64,
    pub calls_per_step: f64,
    pub total_secs: f64,
    pub exposed_secs: f64,
    pub overlapped_secs: f64,
}

/// `comm[].kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommKind {
    Tp,
    Cp,
    Ep,
    Etp,
    Pp,
    DpGrad,
    DpParam,
    EdpGrad,
    EdpParam,
}

/// `comm[].collective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    SendRecv,
}

/// `comm[].group`: the group's members, those in one NVLink domain, the domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub size: u64,
    pub per_domain: u64,
    pub domains: u64,
}

/// `comm[].tier`: the link that limits the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Nvlink,
    Network,
    Local,
}

/// `estimate.memory` and `stages[].memory`: one GPU's memory, bytes (`params`
/// is a count).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StageMemory {
    pub stage: u64,
    pub params: f64,
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    pub logits: f64,
    /// 0 when absent.
    #[serde(default)]
    pub buffers: f64,
    pub fragmentation: f64,
    /// Reserved-only blocks (nanotron); absent when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached: f64,
    pub reserve: f64,
    pub total: f64,
    pub in_flight: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// `estimate.stages[]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSummary {
    pub stage: u64,
    pub layers: u64,
    pub moe_layers: u64,
    /// 0 when absent.
    #[serde(default)]
    pub mtp_layers: u64,
    pub secs_per_micro_batch: f64,
    /// 0 when absent.
    #[serde(default)]
    pub weight_grad_secs: f64,
    pub memory: StageMemory,
}

/// `estimate.band`: the interval on the step time that holds the measured time with
/// probability `coverage` (80%, or the nominal coverage of the range it was widened to).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Band {
    pub coverage: f64,
    pub low_secs: f64,
    pub high_secs: f64,
    pub basis: String,
    pub samples: usize,
    #[serde(default)]
    pub attribution: Option<Attribution>,
    #[serde(default)]
    pub outside: Vec<Outside>,
}

/// `band.attribution`: the term that dominates the uncertainty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attribution {
    pub dominant: String,
    /// `[term, fraction]` pairs, largest first.
    pub variance_shares: Vec<(String, f64)>,
    /// `[term, relative error]` pairs.
    pub term_sigmas: Vec<(String, f64)>,
}

/// `band.outside[]`: an axis on which the plan leaves the validated runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outside {
    pub axis: String,
    pub value: f64,
    pub validated: f64,
    pub doublings: f64,
    pub per_doubling: f64,
}

/// `estimate.moe_routing`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MoeRouting {
    pub imbalance: f64,
    /// `null`: dropless.
    pub capacity_factor: Option<f64>,
    pub pad_to_capacity: bool,
    pub busiest_rank_load: f64,
    pub dropped_fraction: f64,
}
