//! The cost model: one configuration in, one [`Estimate`] (or a [`Rejection`]) out.
//!
//! Time of one training step = the pipeline (micro-batches through the slowest
//! stage, plus the fill/drain bubble), plus pipeline point-to-point time the
//! schedule cannot hide, plus the data-parallel synchronisation that backward and
//! forward cannot hide, plus the optimizer step, plus the slowdown overlapped
//! communication causes.
//!
//! Per layer and micro-batch, each GEMM costs
//! `max(flops / (peak * eff), bytes / (hbm * eff_hbm)) + overhead` (a roofline with
//! a launch cost); the backward pass runs two GEMMs per forward GEMM, each at its
//! own shape (input gradient and weight gradient). Core attention is a fused
//! (flash) kernel doing causal work, at its own efficiency; its backward does 2.5x
//! the forward FLOPs (FlashAttention-2 paper, section 3.2: five matmuls against two,
//! one recomputed). Element-wise kernels (norms, residual adds, activation
//! functions, rotary, FP8 casts, MoE token shuffles) are bound by HBM bandwidth.
//! Recomputation replays the forward (full) or the selected modules' forward
//! (selective; torchtitan's op-level policy replays the matmuls it did not save).
//!
//! Communication per layer is listed in [`CommKind`]; each kind is costed on the
//! placement of its group (see [`crate::comm`]) and split into what overlaps
//! compute and what is exposed, following what Megatron-LM overlaps: DP gradient
//! reduce-scatter with the backward of the last micro-batch, the distributed
//! optimizer's all-gather with the forward of the first, the CP ring exchange with
//! attention, TP collectives only with `--tp-comm-overlap`, the expert-parallel
//! all-to-all with another micro-batch's layer only with `--ep-comm-overlap` (or
//! DualPipe). Overlapped communication slows the compute it shares the GPU with by
//! `efficiency.overlap_slowdown` of its duration.
//!
//! The passes, one file each:
//!
//! - `kernel.rs`: `Ctx`, the shared inputs, and the roofline of one GEMM and its
//!   backward (`Pass`); collective groups placed by the rank order.
//! - `layer.rs`: one layer's compute for one micro-batch (projections, core
//!   attention, feed-forward or experts, element-wise traffic, recomputation,
//!   FLOPs).
//! - `layer_comm.rs`: one layer's TP, CP, EP and expert-TP communication and its
//!   overlap (the all-to-all's overlap windows), and the step's per-layer
//!   [`CommTerm`]s on the critical rank.
//! - `stage.rs`: what a stage holds and costs (the output layer, embedding and
//!   multi-token prediction beside the layers), the memory of each rank, and
//!   [`stage_problem`] for the partitioner.
//! - `pipeline.rs`: the closed-form bubble, the point-to-point transfers, and
//!   [`simulate`], which returns the estimate with the simulated schedule in
//!   place of the closed form.
//! - `dp_sync.rs`: data-parallel gradient reduction and parameter gathers per
//!   stage (ZeRO stages, buckets, the drain's slack), and the optimizer step.
//! - `assemble.rs`: [`evaluate`], which runs the passes and assembles the
//!   [`Estimate`].
//! - `assumptions.rs`: [`Assumptions`], the software choices that are not search
//!   knobs.
//! - `band.rs`: [`Band`], the error band an [`Estimate`] carries, as values. The
//!   cost model leaves it absent: [`crate::banded`] draws it on the estimate and
//!   rescales it with the simulated pipeline.

mod assemble;
mod assumptions;
pub mod band;
mod dp_sync;
mod host;
mod kernel;
mod layer;
mod layer_comm;
mod pipeline;
mod stage;
#[cfg(test)]
mod tests;
mod walked;

use crate::comm::{Collective, Placement, Tier};
use crate::config::{ParallelConfig, Rejection, Workload};
use crate::hardware::{Cluster, GIB};
use crate::memory::StageMemory;
use crate::model::ModelSpec;
use crate::ranks::GroupKind;

pub use assemble::evaluate;
pub use assumptions::{
    spelling_key, Assumptions, CudaGraphs, CudaGraphsError, EagerOps, Framework, LossKernel,
    RankOrder,
};
pub use band::{Attribution, Band, Outside};
pub use layer_comm::expected_remote_domains;
pub use pipeline::{simulate, MAX_SIMULATED_PASSES};
pub use stage::stage_problem;
pub use walked::Priced;

/// Version of the estimate JSON (part of the plan format).
pub const ESTIMATE_SCHEMA_VERSION: u32 = 1;

/// Megatron's gradient bucket size for overlapped reduction (40M parameters,
/// `--ddp-bucket-size` default): the last bucket cannot be hidden.
pub const BUCKET_PARAMS: f64 = 40e6;

/// Seconds per step by operation class, forward + backward, on the critical stage.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OpClasses {
    /// QKV and output projections (and MLA's latent projections).
    pub attention_proj: f64,
    /// Fused attention kernel (QK^T, softmax, PV).
    pub attention_core: f64,
    /// Dense MLP and shared experts.
    pub mlp: f64,
    /// Routed experts' GEMMs.
    pub moe_experts: f64,
    /// MoE router GEMM.
    pub router: f64,
    /// Output layer (logits) GEMM and cross-entropy; with multi-token prediction
    /// also its second pass and the MTP module's 2h -> h projection.
    pub output_layer: f64,
    /// Norms, residuals, activation functions, rotary, casts, embedding.
    pub elementwise: f64,
}

impl OpClasses {
    pub fn total(&self) -> f64 {
        self.attention_proj
            + self.attention_core
            + self.mlp
            + self.moe_experts
            + self.router
            + self.output_layer
            + self.elementwise
    }
    fn add_scaled(&mut self, o: &OpClasses, k: f64) {
        self.attention_proj += k * o.attention_proj;
        self.attention_core += k * o.attention_core;
        self.mlp += k * o.mlp;
        self.moe_experts += k * o.moe_experts;
        self.router += k * o.router;
        self.output_layer += k * o.output_layer;
        self.elementwise += k * o.elementwise;
    }
    fn scaled(&self, k: f64) -> OpClasses {
        let mut o = OpClasses::default();
        o.add_scaled(self, k);
        o
    }
}

/// Kinds of communication a step performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommKind {
    /// Tensor-parallel all-reduce, or all-gather + reduce-scatter with SP.
    Tp,
    /// Context-parallel ring exchange of K and V.
    Cp,
    /// Expert-parallel all-to-all dispatch and combine.
    Ep,
    /// Expert-tensor-parallel all-gather / reduce-scatter of routed tokens.
    Etp,
    /// Pipeline point-to-point sends of activations and gradients.
    Pp,
    /// Data-parallel gradient reduction (dense parameters).
    DpGrad,
    /// Distributed-optimizer / ZeRO parameter all-gather (dense parameters).
    DpParam,
    /// Expert-data-parallel gradient reduction.
    EdpGrad,
    /// Expert-data-parallel parameter all-gather.
    EdpParam,
}

impl CommKind {
    /// Every kind.
    pub const ALL: [CommKind; 9] = [
        CommKind::Tp,
        CommKind::Cp,
        CommKind::Ep,
        CommKind::Etp,
        CommKind::Pp,
        CommKind::DpGrad,
        CommKind::DpParam,
        CommKind::EdpGrad,
        CommKind::EdpParam,
    ];

    /// The name a measured run books this kind under (`MeasuredRun` components).
    pub fn key(self) -> &'static str {
        match self {
            CommKind::Tp => "tp",
            CommKind::Cp => "cp",
            CommKind::Ep => "ep",
            CommKind::Etp => "etp",
            CommKind::Pp => "pp",
            CommKind::DpGrad => "dp_grad",
            CommKind::DpParam => "dp_param",
            CommKind::EdpGrad => "edp_grad",
            CommKind::EdpParam => "edp_param",
        }
    }

    /// The rank map's group this kind communicates over: data-parallel reductions
    /// run over DP x CP, expert ones over EDP.
    pub fn group(self) -> GroupKind {
        match self {
            CommKind::Tp => GroupKind::Tp,
            CommKind::Cp => GroupKind::Cp,
            CommKind::Ep => GroupKind::Ep,
            CommKind::Etp => GroupKind::Etp,
            CommKind::Pp => GroupKind::Pp,
            CommKind::DpGrad | CommKind::DpParam => GroupKind::DpCp,
            CommKind::EdpGrad | CommKind::EdpParam => GroupKind::Edp,
        }
    }

    /// The kind a measured run books under `key` ([`CommKind::key`]).
    pub fn from_key(key: &str) -> Option<CommKind> {
        CommKind::ALL.into_iter().find(|k| k.key() == key)
    }

    pub fn label(self) -> &'static str {
        match self {
            CommKind::Tp => "TP",
            CommKind::Cp => "CP",
            CommKind::Ep => "EP",
            CommKind::Etp => "ETP",
            CommKind::Pp => "PP",
            CommKind::DpGrad => "DP grad",
            CommKind::DpParam => "DP param",
            CommKind::EdpGrad => "EDP grad",
            CommKind::EdpParam => "EDP param",
        }
    }
}

/// One kind of communication over a step, on the critical stage.
#[derive(Debug, Clone, PartialEq)]
pub struct CommTerm {
    pub kind: CommKind,
    pub collective: Collective,
    pub group: Placement,
    pub tier: Tier,
    /// Bytes of one call (nccl-tests convention for the collective).
    pub bytes_per_call: f64,
    pub calls_per_step: f64,
    pub total_secs: f64,
    pub exposed_secs: f64,
    pub overlapped_secs: f64,
}

/// Where the step time goes, seconds, on the critical path.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TimeBreakdown {
    /// Forward + backward compute of all micro-batches on the slowest stage.
    pub compute: OpClasses,
    /// Extra forward work replayed by activation recomputation.
    pub recompute: f64,
    /// Communication not hidden behind compute (sum of the comm terms' exposed time).
    pub exposed_comm: f64,
    /// Pipeline fill and drain.
    pub bubble: f64,
    pub optimizer: f64,
    /// Compute slowed by overlapped communication.
    pub overlap_slowdown: f64,
    /// The GPU idle while the host issues the kernels of mixture-of-experts layers
    /// (their forward blocks the host once per layer; [`host`]).
    pub host_wait: f64,
}

/// Per pipeline stage: what it holds and how long one micro-batch takes on it.
/// Stage i runs on rank i (and, under DualPipe, also on rank p-1-i).
#[derive(Debug, Clone, PartialEq)]
pub struct StageSummary {
    pub stage: u64,
    pub layers: u64,
    pub moe_layers: u64,
    /// Multi-token-prediction layers (on the last stage), beside `layers`.
    pub mtp_layers: u64,
    /// Forward + backward (+ recompute, + exposed TP/CP/EP) of one micro-batch.
    pub secs_per_micro_batch: f64,
    /// The weight-gradient GEMMs within it (what zero-bubble schedules defer to a
    /// W pass), at most a third of it.
    pub weight_grad_secs: f64,
    /// Memory of the GPU running this stage. Under DualPipe, whose rank i runs
    /// stages i and p-1-i, the memory of rank i (both stages' parameters).
    pub memory: StageMemory,
}

/// The cost of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    pub schema_version: u32,
    pub step_secs: f64,
    pub tokens_per_sec_per_gpu: f64,
    /// Model FLOPs utilisation against the BF16 dense peak (Megatron convention:
    /// forward + backward FLOPs of the model, attention counted as full s^2, no
    /// recomputation).
    pub mfu: f64,
    /// Hardware FLOPs utilisation: MFU plus recomputed FLOPs.
    pub hfu: f64,
    pub model_tflops_per_gpu: f64,
    pub micro_batches: u64,
    pub bubble_fraction: f64,
    pub exposed_comm_fraction: f64,
    pub time: TimeBreakdown,
    pub comm: Vec<CommTerm>,
    /// Memory of the stage with the highest peak.
    pub memory: StageMemory,
    pub hbm_bytes: f64,
    pub usable_bytes: f64,
    pub stages: Vec<StageSummary>,
    /// The stage whose per-micro-batch time sets the pipeline's pace.
    pub critical_stage: u64,
    /// 80% interval on the step time from the model's errors on comparable
    /// published runs; absent when there are none. The cost model never draws it
    /// (its estimates leave it absent): [`crate::banded`] does.
    pub band: Option<Band>,
    /// Whether the pipeline time comes from the schedule simulator
    /// ([`simulate`]) rather than the closed form.
    pub pipeline_simulated: bool,
    /// MoE routing as costed (absent for dense models).
    pub moe_routing: Option<MoeRouting>,
}

/// How expert routing was costed ([`crate::routing`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeRouting {
    /// Busiest expert's load over the mean, as assumed.
    pub imbalance: f64,
    /// Capacity factor; absent: dropless.
    pub capacity_factor: Option<f64>,
    pub pad_to_capacity: bool,
    /// Tokens the busiest expert-parallel rank processes over the balanced share.
    pub busiest_rank_load: f64,
    /// Fraction of routed token copies dropped by the capacity.
    pub dropped_fraction: f64,
}

/// Evaluates one configuration: validity, memory, time. The estimate has no
/// band ([`crate::banded::estimate`] prices with one).
pub fn estimate(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
) -> Result<Estimate, Rejection> {
    estimate_with(model, cluster, w, cfg, Assumptions::default())
}

/// [`estimate`] under assumptions `a`: the closed-form pipeline, no band (the
/// search's inner loop, where only the ranked plans need one;
/// [`crate::banded::estimate_with`] draws it).
pub fn estimate_with(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<Estimate, Rejection> {
    let e = evaluate(model, cluster, w, cfg, a)?;
    if e.memory.total > cluster.profile.capacity_bytes() {
        return Err(Rejection::OutOfMemory {
            stage: e.memory.stage,
            needed_gib: e.memory.total / GIB,
            usable_gib: cluster.profile.capacity_bytes() / GIB,
            reserve_gib: cluster.profile.memory.reserve_gib,
        });
    }
    Ok(e)
}
