//! The cost model: one configuration in, one [`Estimate`] (or a [`Rejection`]) out.
//!
//! Time of one training step = the pipeline (micro-batches through the slowest
//! stage, plus the fill/drain bubble), plus pipeline point-to-point time the
//! schedule cannot hide, plus the data-parallel synchronisation that backward and
//! forward cannot hide, plus the optimizer step.
//!
//! Per layer and micro-batch, each GEMM costs
//! `max(flops / (peak * eff), bytes / (hbm * eff_hbm)) + overhead` (a roofline with
//! a launch cost); the backward pass runs two GEMMs of the same size per forward
//! GEMM (input gradient and weight gradient). Core attention is a fused
//! (flash) kernel doing causal work, at its own efficiency; its backward does 2.5x
//! the forward FLOPs (FlashAttention-2 paper, section 3.2: five matmuls against two,
//! one recomputed). Element-wise kernels (norms, residual adds, activation
//! functions, rotary, FP8 casts) are bound by HBM bandwidth. Recomputation replays
//! the forward (full) or the core attention (selective).
//!
//! Communication per layer is listed in [`CommKind`]; each kind is costed on the
//! placement of its group (see [`crate::comm`]) and split into what overlaps
//! compute and what is exposed, following what Megatron-LM overlaps: DP gradient
//! reduce-scatter with the backward of the last micro-batch, the distributed
//! optimizer's all-gather with the forward of the first, the CP ring exchange with
//! attention, TP collectives only with `--tp-comm-overlap`. Overlapped
//! communication slows the compute it shares the GPU with by
//! `efficiency.overlap_slowdown` of its duration.

use serde::{Deserialize, Serialize};

use crate::comm::{collective_secs, Collective, Placement, Tier};
use crate::config::{
    Dispatcher, ParallelConfig, Recompute, RecomputeModules, Rejection, Workload, Zero,
};
use crate::hardware::{AttentionPass, Cluster, HardwareProfile, GIB};
use crate::memory::{self, kv_dim_per_rank, LayerKind, StageMemory};
use crate::model::ModelSpec;
use crate::schedule::Schedule;

/// Version of the estimate JSON (part of the plan format).
pub const ESTIMATE_SCHEMA_VERSION: u32 = 1;

/// Megatron's gradient bucket size for overlapped reduction (40M parameters,
/// `--ddp-bucket-size` default): the last bucket cannot be hidden.
pub const BUCKET_PARAMS: f64 = 40e6;

/// Seconds per step by operation class, forward + backward, on the critical stage.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
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
}

/// Per pipeline stage: what it holds and how long one micro-batch takes on it.
/// Stage i runs on rank i (and, under DualPipe, also on rank p-1-i).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageSummary {
    pub stage: u64,
    pub layers: u64,
    pub moe_layers: u64,
    /// Multi-token-prediction layers (on the last stage), beside `layers`.
    #[serde(default)]
    pub mtp_layers: u64,
    /// Forward + backward (+ recompute, + exposed TP/CP/EP) of one micro-batch.
    pub secs_per_micro_batch: f64,
    /// The weight-gradient GEMMs within it (what zero-bubble schedules defer to a
    /// W pass), at most a third of it.
    #[serde(default)]
    pub weight_grad_secs: f64,
    /// Memory of the GPU running this stage. Under DualPipe, whose rank i runs
    /// stages i and p-1-i, the memory of rank i (both stages' parameters).
    pub memory: StageMemory,
}

/// The cost of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// published runs ([`crate::uncertainty`]); absent when there are none.
    #[serde(default)]
    pub band: Option<crate::uncertainty::Band>,
    /// Whether the pipeline time comes from the schedule simulator
    /// ([`apply_simulation`]) rather than the closed form.
    #[serde(default)]
    pub pipeline_simulated: bool,
    /// MoE routing as costed (absent for dense models).
    #[serde(default)]
    pub moe_routing: Option<MoeRouting>,
}

/// How expert routing was costed ([`crate::routing`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
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

/// Software assumptions that are not search knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assumptions {
    /// Fused (flash) attention; `false` models the unfused softmax of 2021-era Megatron.
    pub flash_attention: bool,
    /// The cross-entropy implementation behind the output layer.
    #[serde(default)]
    pub loss: LossKernel,
    /// How the framework lays ranks out, which decides which groups share an
    /// NVLink domain.
    #[serde(default)]
    pub rank_order: RankOrder,
    /// The framework whose memory layout the estimate follows (Megatron-Core unless
    /// a measured run says otherwise).
    #[serde(default, skip_serializing_if = "Framework::is_megatron_core")]
    pub framework: Framework,
}

impl Default for Assumptions {
    fn default() -> Self {
        Assumptions {
            flash_attention: true,
            loss: LossKernel::default(),
            rank_order: RankOrder::default(),
            framework: Framework::default(),
        }
    }
}

/// The training framework whose memory layout an estimate follows. The cost model
/// is Megatron-Core's; measured runs of other frameworks differ in what they keep
/// in memory, and [`crate::memory`] prices each as its code does (see
/// [`Framework::MegatronCore`] and the other variants for what differs and where it
/// is read from).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    /// Megatron-Core (Megatron-LM, NeMo, Megatron-Bridge): gradients live in the
    /// DDP buffer (no second copy), the SwiGLU is fused (it keeps its input and
    /// recomputes the activation), the loss keeps the BF16 logits and an FP32 copy,
    /// selective recomputation is by module (`--recompute-modules`).
    #[default]
    MegatronCore,
    /// Hugging Face nanotron (the Ultra-Scale Playbook's benchmark runs, at
    /// e24d2483): PyTorch DDP keeps its own BF16 gradient buckets beside the FP32
    /// accumulator, the GLU runs as separate ops (`GLUActivation`: the activation's
    /// output is kept beside the product), and the loss (`sharded_cross_entropy`)
    /// holds an FP32 copy of the logits and a shifted FP32 copy.
    Nanotron,
    /// PyTorch torchtitan (FSDP2, torch.distributed.pipelining): sharded FP32
    /// parameters, gradients and Adam moments; FSDP2's unsharded buffers; selective
    /// recomputation is op-level ("op" SAC: every other matmul's output is saved);
    /// the loss is `cross_entropy` over an FP32 copy of the logits.
    Torchtitan,
}

impl Framework {
    pub const NAMES: &'static str = "megatron-core, nanotron, torchtitan";

    pub fn name(self) -> &'static str {
        match self {
            Framework::MegatronCore => "megatron-core",
            Framework::Nanotron => "nanotron",
            Framework::Torchtitan => "torchtitan",
        }
    }

    pub fn parse(s: &str) -> Option<Framework> {
        [
            Framework::MegatronCore,
            Framework::Nanotron,
            Framework::Torchtitan,
        ]
        .into_iter()
        .find(|f| f.name() == s)
    }

    pub fn is_megatron_core(&self) -> bool {
        *self == Framework::MegatronCore
    }
}

/// The rank layouts the cost model places groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankOrder {
    /// Megatron-Core's default `tp-cp-ep-dp-pp` (parallel_state.py `order`): TP,
    /// then CP, then DP consecutive, PP slowest.
    #[default]
    Megatron,
    /// ScaleTorch's `ProcessGroupManager` grid `[DP, PP, CP, EP, TP]`
    /// (scaletorch/parallel/process_group.py): TP fastest, then EP, CP, PP, DP, so
    /// a pipeline sits inside each data-parallel replica.
    ScaleTorch,
}

impl RankOrder {
    /// The order as the rank-map and plan files spell it, fastest first.
    pub fn order(self) -> &'static str {
        match self {
            RankOrder::Megatron => crate::config::RANK_ORDER,
            RankOrder::ScaleTorch => crate::ranks::SCALETORCH_ORDER,
        }
    }
}

/// How the loss over the vocabulary-parallel logits runs. The three differ in how many
/// element-wise passes they make over the logits; [`LossKernel::bytes_per_logit`]
/// counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossKernel {
    /// Transformer Engine's Triton kernel (`cross_entropy_fusion_impl = "te"`), as of
    /// the 2026-04 containers: it reads the BF16 logits and writes the gradient in
    /// place.
    Te,
    /// Megatron's own fusion (`--cross-entropy-loss-fusion`, the `native` impl), the
    /// only one Megatron-LM allows since it disabled TE's in June 2026.
    #[default]
    Native,
    /// Without `--cross-entropy-loss-fusion` (Megatron-LM's default), and the only
    /// loss Megatron-LM had before June 2024.
    Unfused,
}

impl LossKernel {
    pub const NAMES: &'static str = "te, native, unfused";

    pub fn name(self) -> &'static str {
        match self {
            LossKernel::Te => "te",
            LossKernel::Native => "native",
            LossKernel::Unfused => "unfused",
        }
    }

    pub fn parse(s: &str) -> Option<LossKernel> {
        [LossKernel::Te, LossKernel::Native, LossKernel::Unfused]
            .into_iter()
            .find(|k| k.name() == s)
    }

    /// HBM bytes per logit (one token, one vocabulary entry on this rank) that the
    /// loss moves beyond the logits GEMM, forward and backward together.
    ///
    /// - `Te` (transformer_engine/pytorch/triton/cross_entropy.py): the online-softmax
    ///   pass reads the BF16 logits (2), the loss pass reads them again and writes the
    ///   gradient in place (2 + 2), the backward scales it by the loss gradient
    ///   (2 + 2): 10.
    /// - `Native` (megatron/core/fusions/fused_cross_entropy.py), one kernel per fused
    ///   function, the fuser's best case: the FP32 upcast with the row maximum
    ///   (2 + 4), the shifted `exp` with its row sum (4 + 4), the normalisation into the
    ///   saved softmax (4 + 4), and the backward's in-place gradient and BF16 cast
    ///   (4 + 4 + 2): 32.
    /// - `Unfused` (megatron/core/tensor_parallel/cross_entropy.py): `.float()` (2 + 4),
    ///   the max (4), the in-place subtraction (4 + 4), `exp` (4 + 4), the sum (4), the
    ///   in-place division (4 + 4); backward the in-place scaling (4 + 4) and the cast
    ///   back to BF16 (4 + 2): 52.
    pub fn bytes_per_logit(self) -> f64 {
        match self {
            LossKernel::Te => 2.0 + (2.0 + 2.0) + (2.0 + 2.0),
            LossKernel::Native => (2.0 + 4.0) + (4.0 + 4.0) + (4.0 + 4.0) + (4.0 + 4.0 + 2.0),
            LossKernel::Unfused => {
                (2.0 + 4.0)
                    + 4.0
                    + (4.0 + 4.0)
                    + (4.0 + 4.0)
                    + 4.0
                    + (4.0 + 4.0)
                    + (4.0 + 4.0)
                    + (4.0 + 2.0)
            }
        }
    }
}

/// Forward and backward time of one GEMM (or a sum of them).
#[derive(Debug, Clone, Copy, Default)]
struct Pass {
    fwd: f64,
    /// Input gradient plus weight gradient.
    bwd: f64,
    /// The weight-gradient part of `bwd` (what ZB-H1 and DualPipe defer as W).
    wgrad: f64,
}

impl std::ops::Add for Pass {
    type Output = Pass;
    fn add(self, o: Pass) -> Pass {
        Pass {
            fwd: self.fwd + o.fwd,
            bwd: self.bwd + o.bwd,
            wgrad: self.wgrad + o.wgrad,
        }
    }
}

impl std::ops::Mul<Pass> for f64 {
    type Output = Pass;
    fn mul(self, p: Pass) -> Pass {
        Pass {
            fwd: self * p.fwd,
            bwd: self * p.bwd,
            wgrad: self * p.wgrad,
        }
    }
}

/// Shared inputs of one estimate.
struct Ctx<'a> {
    model: &'a ModelSpec,
    hw: &'a HardwareProfile,
    w: &'a Workload,
    cfg: &'a ParallelConfig,
    a: Assumptions,
    /// Tokens of one micro-batch on one CP rank (before SP sharding).
    tokens: f64,
    fp8: bool,
    domain: u64,
}

impl Ctx<'_> {
    fn gemm(&self, m: f64, n: f64, k: f64, fp8: bool) -> f64 {
        if m <= 0.0 || n <= 0.0 || k <= 0.0 {
            return 0.0;
        }
        let e = &self.hw.efficiency;
        let (peak, eff, elem) = if fp8 && self.fp8 {
            (self.hw.peak_flops(true), e.gemm_fp8, 1.0)
        } else {
            (self.hw.peak_flops(false), e.gemm_bf16, 2.0)
        };
        // A measured curve gives the shape's efficiency relative to the best shape,
        // launch and fill/drain included; without one, a fixed cost per call.
        let (shape, overhead) = match self.hw.gemm_shape_factor(fp8 && self.fp8, m, n, k) {
            Some(s) => (s, 0.0),
            None => (1.0, e.gemm_overhead_us * 1e-6),
        };
        let compute = 2.0 * m * n * k / (peak * eff * shape);
        let bytes = elem * (m * k + k * n) + 2.0 * m * n;
        let memory = bytes / self.hbm_bw();
        compute.max(memory) + overhead
    }
    /// `Y[m,n] = X[m,k] W[k,n]` and its backward: the input gradient
    /// `dX[m,k] = dY W^T` and the weight gradient `dW[k,n] = X^T dY`, each at its own
    /// shape (with a measured curve, a short-`m` GEMM's weight gradient reduces over
    /// few rows and runs less efficiently than its forward).
    fn pass(&self, m: f64, n: f64, k: f64, fp8: bool) -> Pass {
        let wgrad = self.gemm(k, n, m, fp8);
        Pass {
            fwd: self.gemm(m, n, k, fp8),
            bwd: self.gemm(m, k, n, fp8) + wgrad,
            wgrad,
        }
    }
    fn hbm_bw(&self) -> f64 {
        self.hw.gpu.hbm_tbytes_per_s * 1e12 * self.hw.efficiency.hbm
    }
    fn mem(&self, bytes: f64) -> f64 {
        bytes / self.hbm_bw()
    }
    fn coll(&self, c: Collective, bytes: f64, p: Placement) -> f64 {
        collective_secs(self.hw, c, bytes, p)
    }
    fn tp_group(&self) -> Placement {
        Placement::new(self.cfg.tp, 1, self.domain)
    }
    fn cp_group(&self) -> Placement {
        Placement::new(self.cfg.cp, self.cfg.tp, self.domain)
    }
    /// DP x CP group of dense parameters (ranks with the same TP and PP index).
    /// Megatron's order keeps CP and DP adjacent (one stride); ScaleTorch's puts PP
    /// between them, so its DP members sit TP x CP x PP apart.
    fn dp_group(&self) -> Placement {
        let c = self.cfg;
        match self.a.rank_order {
            RankOrder::Megatron => Placement::new(c.dp * c.cp, c.tp, self.domain),
            RankOrder::ScaleTorch => Placement::nested(
                Placement::new(c.cp, c.tp, self.domain),
                Placement::new(c.dp, c.tp * c.ep * c.cp * c.pp, self.domain),
            ),
        }
    }
    /// Expert order is etp-ep-edp-pp: EP stride is ETP, EDP stride is ETP x EP.
    fn ep_group(&self) -> Placement {
        Placement::new(self.cfg.ep, self.cfg.etp, self.domain)
    }
    fn etp_group(&self) -> Placement {
        Placement::new(self.cfg.etp, 1, self.domain)
    }
    fn edp_group(&self) -> Placement {
        Placement::new(self.cfg.edp(), self.cfg.etp * self.cfg.ep, self.domain)
    }
    /// Neighbouring stages: PP's stride in the rank order.
    fn pp_group(&self) -> Placement {
        let c = self.cfg;
        let stride = match self.a.rank_order {
            RankOrder::Megatron => c.tp * c.cp * c.dp,
            RankOrder::ScaleTorch => c.tp * c.ep * c.cp,
        };
        Placement::new(2, stride, self.domain)
    }
}

/// Costs of one layer for one micro-batch on one GPU.
#[derive(Debug, Clone, Copy, Default)]
struct LayerCost {
    fwd: OpClasses,
    bwd: OpClasses,
    /// Extra forward time replayed by recomputation.
    recompute: f64,
    attn_core_fwd: f64,
    attn_core_bwd: f64,
    /// GEMM time that TP overlap can hide communication behind.
    gemm: f64,
    /// Weight-gradient GEMM time of the backward (the W pass of ZB-H1 and DualPipe).
    wgrad: f64,
    /// Communication of this layer for one micro-batch: (total, exposed) per kind.
    tp: (f64, f64),
    cp: (f64, f64),
    ep: (f64, f64),
    etp: (f64, f64),
    tp_calls: f64,
    cp_calls: f64,
    /// Bytes of one CP ring step and of one ETP all-gather.
    cp_bytes: f64,
    etp_bytes: f64,
    ep_calls: f64,
    etp_calls: f64,
    /// Overlapped communication time (for the contention slowdown).
    overlapped: f64,
    /// Model FLOPs (forward + backward, Megatron convention) of this layer.
    model_flops: f64,
    /// Recomputed FLOPs.
    recompute_flops: f64,
}

/// Average causal (query, key) pairs per sequence on one CP rank, and the same in
/// the non-causal convention used for model FLOPs.
fn attention_pairs(model: &ModelSpec, seq: u64, cp: u64) -> (f64, f64) {
    let s = seq as f64;
    let full_causal = s * (s + 1.0) / 2.0;
    let (causal, dense) = match &model.sliding_window {
        Some(sw) if sw.window < seq => {
            let wdw = sw.window as f64;
            let windowed = s * wdw - wdw * (wdw - 1.0) / 2.0;
            let frac = sw.layers as f64 / model.layers as f64;
            (
                (1.0 - frac) * full_causal + frac * windowed,
                (1.0 - frac) * s * s + frac * 2.0 * windowed,
            )
        }
        _ => (full_causal, s * s),
    };
    (causal / cp as f64, dense / cp as f64)
}

fn layer_cost(c: &Ctx, kind: LayerKind) -> LayerCost {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = m.hidden as f64;
    let tokens = c.tokens;
    let e = &c.hw.efficiency;
    let mut lc = LayerCost::default();
    let mut fwd = OpClasses::default();
    // MLA's up-projections: (time, FLOPs) of one forward.
    let mut mla_up = (0.0, 0.0);
    // GEMM passes of the attention projections, dense MLP or shared experts, routed
    // experts and router.
    let proj;
    let ffn;
    let (mut experts, mut router) = (Pass::default(), Pass::default());

    // Attention projections.
    let kv_rank = kv_dim_per_rank(m, cfg.tp) as f64;
    let q_rank = m.q_dim() as f64 / t;
    let out_in = m.attn_out_dim() as f64 / t;
    match &m.mla {
        Some(mla) => {
            let q_lora = mla.q_lora_rank as f64;
            let kv_lora = mla.kv_lora_rank as f64;
            let q = if mla.q_lora_rank > 0 {
                c.pass(tokens, q_lora, h, true) + c.pass(tokens, q_rank, q_lora, true)
            } else {
                c.pass(tokens, q_rank, h, true)
            };
            let kv_up = m.heads as f64 * (mla.qk_nope_head_dim + mla.v_head_dim) as f64 / t;
            let kv = c.pass(tokens, kv_lora + mla.qk_rope_head_dim as f64, h, true)
                + c.pass(tokens, kv_up, kv_lora, true);
            proj = q + kv + c.pass(tokens, h, out_in, true);
            // What "mla_up_proj" replays: both up-projections and the rotary.
            let q_up = if mla.q_lora_rank > 0 {
                c.gemm(tokens, q_rank, q_lora, true)
            } else {
                0.0
            };
            mla_up = (
                q_up + c.gemm(tokens, kv_up, kv_lora, true),
                2.0 * tokens
                    * (if mla.q_lora_rank > 0 {
                        q_rank * q_lora
                    } else {
                        0.0
                    } + kv_up * kv_lora),
            );
        }
        None => {
            proj =
                c.pass(tokens, q_rank + 2.0 * kv_rank, h, true) + c.pass(tokens, h, out_in, true);
        }
    }

    // Core attention (always BF16).
    let (causal_pairs, dense_pairs) = attention_pairs(m, c.w.seq, cfg.cp);
    let head_flops = (m.qk_head_dim() + m.v_head_dim()) as f64 * m.heads as f64 / t;
    let attn_fwd_flops = 2.0 * cfg.mbs as f64 * head_flops * causal_pairs;
    let peak16 = c.hw.peak_flops(false);
    let (core_fwd, core_bwd) = if c.a.flash_attention {
        // The kernel's efficiency at this head width and per-rank sequence, where the
        // profile has a measured curve.
        let shape = |pass| {
            c.hw.attention_factor(pass, m.qk_head_dim() as f64, (c.w.seq / cfg.cp) as f64)
                .unwrap_or(1.0)
        };
        (
            attn_fwd_flops / (peak16 * e.attention_fwd * shape(AttentionPass::Fwd))
                + e.gemm_overhead_us * 1e-6,
            2.5 * attn_fwd_flops / (peak16 * e.attention_bwd * shape(AttentionPass::Bwd))
                + e.gemm_overhead_us * 1e-6,
        )
    } else {
        // Unfused: batched GEMMs over the full (masked) score matrix plus softmax
        // and dropout passes over it in HBM.
        let full_flops = 2.0 * cfg.mbs as f64 * head_flops * dense_pairs;
        let scores = cfg.mbs as f64 * m.heads as f64 / t * dense_pairs;
        let gemm = full_flops / (peak16 * e.gemm_bf16);
        (
            gemm + c.mem(scores * 2.0 * 5.0),
            2.0 * gemm + c.mem(scores * 2.0 * 8.0),
        )
    };
    fwd.attention_core = core_fwd;
    lc.attn_core_fwd = core_fwd;
    lc.attn_core_bwd = core_bwd;

    // Feed-forward.
    let first_mats = m.mlp.matrices() as f64 - 1.0;
    let mlp = |ffn: f64, div: f64, rows: f64| -> Pass {
        if ffn <= 0.0 {
            return Pass::default();
        }
        c.pass(rows, first_mats * ffn / div, h, true) + c.pass(rows, h, ffn / div, true)
    };
    // The busiest expert-parallel rank's load over the balanced share.
    let moe_load = m
        .moe
        .as_ref()
        .map_or(1.0, |moe| c.w.moe_rank_load(moe, cfg.ep).factor);
    // Tokens each routed-expert rank processes for this micro-batch.
    let mut routed_tokens = 0.0;
    let mut expert_ffn = 0.0;
    // Bytes each routed token moves in HBM to be shuffled into expert order and back
    // (BF16 rows of h): the permutation into routed order and the un-permutation
    // that merges the top-k outputs (each reads and writes a row: 8h). Megatron's
    // all-to-all dispatcher also sorts the received chunks by local expert and
    // restores the order before the return all-to-all (`sort_chunks_by_idxs`, run
    // when a rank holds more than one expert): another 8h. DeepEP / HybridEP permute
    // once on the receiving side.
    let mut shuffle = 0.0;
    match (kind, &m.moe) {
        (LayerKind::Moe, Some(moe)) => {
            let etp = cfg.etp as f64;
            let local_experts = (moe.experts / cfg.ep) as f64;
            let sorts = cfg.moe_dispatcher == Dispatcher::AllToAll && local_experts > 1.0;
            shuffle = if sorts { 16.0 * h } else { 8.0 * h };
            routed_tokens = tokens / t * moe.top_k as f64 * etp * moe_load;
            expert_ffn = moe.expert_ffn_hidden as f64;
            let per_expert = routed_tokens / local_experts;
            experts = local_experts * mlp(expert_ffn, etp, per_expert);
            ffn = mlp(moe.shared_hidden() as f64, t, tokens);
            router = c.pass(tokens / t, moe.experts as f64, h, false);
        }
        _ => ffn = mlp(m.ffn_hidden as f64, t, tokens),
    }
    fwd.attention_proj = proj.fwd;
    fwd.mlp = ffn.fwd;
    fwd.moe_experts = experts.fwd;
    fwd.router = router.fwd;

    // Element-wise traffic, bytes per token: norms (read 2h, write 2h; two per layer,
    // four with sandwich norms) and residual adds (read 4h, write 2h, +1 mask byte
    // with dropout), twice per layer, split by SP; activation function (gated: read
    // 2f, write f); rotary on Q and K; FP8 casts of GEMM inputs (read 2, write 1).
    let sp_div = if cfg.sp { t } else { 1.0 };
    let mask = if m.dropout { 1.0 } else { 0.0 };
    let norms = if m.sandwich_norms { 4.0 } else { 2.0 };
    let outside = (norms * 4.0 * h + 2.0 * (6.0 * h + mask * h)) / sp_div;
    let act = |ffn: f64, div: f64| (2.0 * (first_mats + 1.0) * ffn) / div;
    let inner = match kind {
        LayerKind::Moe => {
            routed_tokens / tokens * (act(expert_ffn, cfg.etp as f64) + shuffle)
                + act(m.moe.map(|x| x.shared_hidden()).unwrap_or(0) as f64, t)
        }
        LayerKind::Dense => act(m.ffn_hidden as f64, t),
    };
    let rotary = 4.0 * (q_rank + kv_rank);
    // GEMM inputs cast to FP8, elements per token: the QKV and output projections'
    // inputs, and the feed-forward's two inputs (dense MLP or shared experts over
    // every token; routed experts over their routed rows, cast after the BF16
    // dispatch). The router stays in BF16.
    let token_ffn_casts = |ffn: f64| if ffn > 0.0 { h / sp_div + ffn / t } else { 0.0 };
    let cast_elems = h / sp_div
        + out_in
        + match kind {
            LayerKind::Dense => token_ffn_casts(m.ffn_hidden as f64),
            LayerKind::Moe => {
                token_ffn_casts(m.moe.map_or(0.0, |x| x.shared_hidden() as f64))
                    + routed_tokens / tokens * (h + expert_ffn / cfg.etp as f64)
            }
        };
    let casts = if c.fp8 { 3.0 * cast_elems } else { 0.0 };
    fwd.elementwise = c.mem(tokens * (outside + inner + rotary + casts));

    // Backward: each GEMM's input and weight gradients; attention backward;
    // element-wise twice.
    let mut bwd = fwd.scaled(2.0);
    bwd.attention_core = core_bwd;
    bwd.attention_proj = proj.bwd;
    bwd.mlp = ffn.bwd;
    bwd.moe_experts = experts.bwd;
    bwd.router = router.bwd;
    lc.gemm = fwd.attention_proj + fwd.mlp + fwd.moe_experts;
    lc.wgrad = proj.wgrad + ffn.wgrad + experts.wgrad + router.wgrad;

    // Recomputation replays work in the backward pass: the whole forward (full) or
    // the selected modules' forward (selective).
    let sel = |x: RecomputeModules| cfg.recomputes(x);
    let shared_ffn = m.moe.map_or(0.0, |x| x.shared_hidden() as f64);
    let mut sel_secs = 0.0;
    if sel(RecomputeModules::CORE_ATTN) {
        sel_secs += core_fwd;
    }
    if sel(RecomputeModules::LAYERNORM) {
        // Two norms: read 2h, write 2h (+ the FP8 cast of the output) per token.
        sel_secs += c.mem(tokens * 2.0 * (4.0 * h + if c.fp8 { 3.0 * h } else { 0.0 }) / sp_div);
    }
    if sel(RecomputeModules::MLA_UP_PROJ) {
        sel_secs += mla_up.0 + c.mem(tokens * rotary);
    }
    match kind {
        LayerKind::Dense if sel(RecomputeModules::MLP) => {
            sel_secs += fwd.mlp + c.mem(tokens * act(m.ffn_hidden as f64, t))
        }
        LayerKind::Moe if sel(RecomputeModules::MOE) => {
            sel_secs += fwd.moe_experts
                + fwd.router
                + fwd.mlp
                + c.mem(
                    tokens
                        * (routed_tokens / tokens * (act(expert_ffn, cfg.etp as f64) + shuffle)
                            + act(shared_ffn, t)),
                );
        }
        LayerKind::Moe => {
            if sel(RecomputeModules::MOE_ACT) {
                sel_secs += c.mem(routed_tokens * act(expert_ffn, cfg.etp as f64));
            }
            if sel(RecomputeModules::SHARED_EXPERTS) {
                sel_secs += fwd.mlp + c.mem(tokens * act(shared_ffn, t));
            }
        }
        _ => {}
    }
    // torchtitan's op-level policy (`memory::op_sac_per_token`) replays every op of
    // the block it did not save: the even-numbered matmuls and every element-wise
    // pass; the attention kernel's output is saved.
    let op_sac = cfg.recompute == Recompute::Selective && memory::op_sac_applies(m, kind, c.a);
    let op_sac_mms: Vec<(f64, f64)> = if op_sac {
        memory::torchtitan_mms(m, cfg.tp)
            .into_iter()
            .skip(1)
            .step_by(2)
            .collect()
    } else {
        Vec::new()
    };
    lc.recompute = match cfg.recompute {
        Recompute::None => 0.0,
        Recompute::Selective if op_sac => {
            op_sac_mms
                .iter()
                .map(|&(out, inp)| c.gemm(tokens, out, inp, true))
                .sum::<f64>()
                + fwd.elementwise
        }
        Recompute::Selective => sel_secs,
        Recompute::Full => fwd.total(),
    };

    // FLOPs for MFU (model) and HFU (recompute). GEMM FLOPs per token from shapes.
    let proj_params = match &m.mla {
        Some(mla) => {
            let q = if mla.q_lora_rank > 0 {
                h * mla.q_lora_rank as f64 + mla.q_lora_rank as f64 * m.q_dim() as f64
            } else {
                h * m.q_dim() as f64
            };
            q + h * (mla.kv_lora_rank + mla.qk_rope_head_dim) as f64
                + mla.kv_lora_rank as f64
                    * m.heads as f64
                    * (mla.qk_nope_head_dim + mla.v_head_dim) as f64
                + m.attn_out_dim() as f64 * h
        }
        None => h * (m.q_dim() + 2 * m.kv_dim() + m.attn_out_dim()) as f64,
    };
    let mlp_params = match (kind, &m.moe) {
        (LayerKind::Moe, Some(moe)) => {
            m.mlp.matrices() as f64
                * h
                * (moe.top_k * moe.expert_ffn_hidden + moe.shared_hidden()) as f64
                + h * moe.experts as f64
        }
        _ => m.mlp.matrices() as f64 * h * m.ffn_hidden as f64,
    };
    let seq_tokens = (cfg.mbs * c.w.seq) as f64;
    let fwd_flops_seq = 2.0 * (proj_params + mlp_params) * seq_tokens
        + 2.0 * cfg.mbs as f64 * head_flops * t * dense_pairs * cfg.cp as f64;
    // Per GPU: the micro-batch is spread over TP x CP ranks.
    lc.model_flops = 3.0 * fwd_flops_seq / (t * cfg.cp as f64);
    let mats = m.mlp.matrices() as f64;
    let mut sel_flops = 0.0;
    if sel(RecomputeModules::CORE_ATTN) {
        sel_flops += attn_fwd_flops;
    }
    if sel(RecomputeModules::MLA_UP_PROJ) {
        sel_flops += mla_up.1;
    }
    match (kind, &m.moe) {
        (LayerKind::Dense, _) if sel(RecomputeModules::MLP) => {
            sel_flops += 2.0 * tokens * mats * h * m.ffn_hidden as f64 / t
        }
        (LayerKind::Moe, Some(moe)) => {
            let experts = 2.0 * routed_tokens * mats * h * expert_ffn / cfg.etp as f64;
            let shared = 2.0 * tokens * mats * h * shared_ffn / t;
            if sel(RecomputeModules::MOE) {
                sel_flops += experts + shared + 2.0 * tokens / t * h * moe.experts as f64;
            } else if sel(RecomputeModules::SHARED_EXPERTS) {
                sel_flops += shared;
            }
        }
        _ => {}
    }
    lc.recompute_flops = match cfg.recompute {
        Recompute::None => 0.0,
        Recompute::Selective if op_sac => op_sac_mms
            .iter()
            .map(|&(out, inp)| 2.0 * tokens * out * inp)
            .sum(),
        Recompute::Selective => sel_flops,
        Recompute::Full => fwd_flops_seq / (t * cfg.cp as f64),
    };

    // --- Communication of this layer, one micro-batch. ---
    let replays = if cfg.recompute == Recompute::Full {
        1.0
    } else {
        0.0
    };
    // Selective modules that replay a whole block replay its communication too:
    // "mlp" (dense layers) and "shared_experts" their TP collectives, "moe" its
    // TP collectives (shared experts), all-to-alls and expert-TP gathers.
    let moe_replay = if kind == LayerKind::Moe && sel(RecomputeModules::MOE) {
        1.0
    } else {
        0.0
    };
    let has_shared = shared_ffn > 0.0;
    let tp_block_replays = match kind {
        _ if cfg.recompute == Recompute::Full => 0.0,
        // torchtitan's op-level policy saves the reduce-scatters' outputs but not
        // the all-gathers': it replays the attention's and the MLP's all-gather
        // (about one block's AG + RS).
        LayerKind::Dense if op_sac => {
            if cfg.sp {
                1.0
            } else {
                0.0
            }
        }
        LayerKind::Dense => {
            if sel(RecomputeModules::MLP) {
                1.0
            } else {
                0.0
            }
        }
        LayerKind::Moe => {
            if has_shared && (moe_replay > 0.0 || sel(RecomputeModules::SHARED_EXPERTS)) {
                1.0
            } else {
                0.0
            }
        }
    };
    // TP: the activation is tokens x h in BF16. Per layer: attention and MLP each
    // need one all-reduce (or AG + RS with SP) forward and one backward. In an MoE
    // layer with SP, routed experts take their tokens through the all-to-all
    // instead; shared experts still use AG/RS.
    if cfg.tp > 1 {
        let act_bytes = tokens * h * 2.0;
        let blocks = match (kind, &m.moe) {
            (LayerKind::Moe, Some(moe)) => 1.0 + if moe.shared_hidden() > 0 { 1.0 } else { 0.0 },
            _ => 2.0,
        };
        let g = c.tp_group();
        let per_block = if cfg.sp {
            c.coll(Collective::AllGather, act_bytes, g)
                + c.coll(Collective::ReduceScatter, act_bytes, g)
        } else {
            c.coll(Collective::AllReduce, act_bytes, g)
        };
        let passes = 2.0 + replays;
        let block_passes = blocks * passes + tp_block_replays;
        let total = block_passes * per_block;
        lc.tp_calls = block_passes * if cfg.sp { 2.0 } else { 1.0 };
        // Transformer Engine's comm+GEMM overlap (Userbuffers) needs the TP group
        // inside one NVLink domain: it relies on CUDA multicast / IPC over NVLink
        // (TransformerEngine issue #1071, maintainer's answer; multi-node NVLink
        // domains since PR #1470). Across domains the collectives run exposed.
        let exposed = if cfg.overlap.tp_comm && g.domains == 1 {
            // Userbuffers split each collective into tp chunks pipelined with the
            // GEMM: the first chunk, and whatever outlasts the GEMMs, stays exposed.
            let hide = (lc.gemm * passes / 1.0).max(0.0);
            (total - hide).max(0.0) + total / t
        } else {
            total
        };
        lc.tp = (total, exposed.min(total));
        lc.overlapped += total - lc.tp.1;
    }
    // CP: ring of cp - 1 steps sending this rank's K and V; the backward sends K, V
    // and their gradients. Each step overlaps the attention on the previous chunk.
    if cfg.cp > 1 {
        let kv_bytes = tokens
            * 2.0
            * kv_rank.max(if m.mla.is_some() {
                m.kv_dim() as f64 / t
            } else {
                0.0
            })
            * 2.0;
        let step = c.coll(Collective::SendRecv, kv_bytes, c.cp_group());
        lc.cp_bytes = kv_bytes;
        let steps = (cfg.cp - 1) as f64;
        let fwd_comm = steps * step;
        let bwd_comm = 2.0 * steps * step;
        let per_step_attn_f = core_fwd / cfg.cp as f64;
        let per_step_attn_b = core_bwd / cfg.cp as f64;
        // Ring attention: transfer k runs while block k is computed on the chunk
        // already held; only what outlasts the block is exposed.
        let exp_f = steps * (step - per_step_attn_f).max(0.0);
        let exp_b = steps * (2.0 * step - per_step_attn_b).max(0.0);
        let total = fwd_comm * (1.0 + replays) + bwd_comm;
        let exposed = (exp_f * (1.0 + replays) + exp_b).min(total);
        lc.cp = (total, exposed);
        lc.cp_calls = steps * (3.0 + replays);
        lc.overlapped += total - exposed;
    }
    // EP: dispatch and combine forward, the same backward.
    if kind == LayerKind::Moe && cfg.ep > 1 {
        let moe = m.moe.as_ref().expect("MoE layer of an MoE model");
        let bytes = tokens / t * moe.top_k as f64 * h * 2.0 * moe_load;
        let g = c.ep_group();
        let one = match cfg.moe_dispatcher {
            Dispatcher::AllToAll => c.coll(Collective::AllToAll, bytes, g),
            Dispatcher::Deduplicated => dedup_dispatch_secs(
                c.hw,
                tokens / t * moe_load * h * 2.0,
                moe.experts,
                moe.top_k,
                g,
            ),
        };
        let calls = 2.0 * (2.0 + replays + moe_replay);
        let total = calls * one;
        // Paired passes: Megatron's batch-level overlap (`--overlap-moe-expert-parallel-comm`;
        // megatron/core/models/common/model_chunk_schedule_plan.py,
        // `TransformerLayerSchedulePlan.run`, Megatron-LM d98e8a6) runs one
        // micro-batch's layer forward beside another's layer backward in three
        // windows, each all-to-all hidden only behind the computation of its own:
        //   comm: combine bwd        | dispatch fwd, dispatch bwd       | combine fwd
        //   comp: pre-dispatch fwd   | MLP bwd (with wgrad), MLP fwd     | pre-dispatch bwd
        // (pre-dispatch: attention and router). DualPipe's F&B pairs overlap the
        // same four pieces (DeepSeek-V3 report, Figure 4). Element-wise passes are
        // left out of the windows: their split between the pieces is not priced.
        // Replayed all-to-alls (recomputation) are not paired.
        let exposed = match cfg.ep_overlap(c.w) {
            Some(f) => {
                let pre_f = fwd.attention_proj + fwd.attention_core + fwd.router;
                let pre_b = bwd.attention_proj + bwd.attention_core + bwd.router;
                let mlp = fwd.moe_experts + fwd.mlp + bwd.moe_experts + bwd.mlp;
                let paired = (one - pre_f).max(0.0)
                    + (2.0 * one - mlp).max(0.0)
                    + (one - pre_b).max(0.0)
                    + (total - 4.0 * one).max(0.0);
                (1.0 - f) * total + f * paired.min(total)
            }
            None => total,
        };
        lc.ep = (total, exposed);
        lc.overlapped += total - exposed;
        lc.ep_calls = calls;
    }
    if kind == LayerKind::Moe && cfg.etp > 1 {
        let bytes = routed_tokens * h * 2.0;
        lc.etp_bytes = bytes;
        let g = c.etp_group();
        let one =
            c.coll(Collective::AllGather, bytes, g) + c.coll(Collective::ReduceScatter, bytes, g);
        let calls = 2.0 + replays + moe_replay;
        lc.etp = (calls * one, calls * one);
        lc.etp_calls = 2.0 * calls;
    }
    lc.fwd = fwd;
    lc.bwd = bwd;
    lc
}

/// Expected number of other NVLink domains a token is sent to when its top-k
/// experts are drawn uniformly (balanced routing) from `experts` spread evenly over
/// `domains` domains: each other domain is missed with probability
/// C(E - E/N, k) / C(E, k).
pub fn expected_remote_domains(experts: u64, top_k: u64, domains: u64) -> f64 {
    if domains <= 1 {
        return 0.0;
    }
    let e = experts as f64;
    let per = e / domains as f64;
    let mut miss = 1.0;
    for i in 0..top_k.min(experts) {
        miss *= ((e - per - i as f64) / (e - i as f64)).max(0.0);
    }
    (domains - 1) as f64 * (1.0 - miss)
}

/// One dispatch (or combine) through a node-deduplicating dispatcher (DeepEP,
/// HybridEP): each token crosses the network once per destination domain, then is
/// copied to that domain's experts over NVLink. `token_bytes` is this rank's
/// tokens x h x 2 (before top-k fan-out).
fn dedup_dispatch_secs(
    hw: &HardwareProfile,
    token_bytes: f64,
    experts: u64,
    top_k: u64,
    g: Placement,
) -> f64 {
    let e = &hw.efficiency;
    let nvl = hw.node.nvlink_gbytes_per_s * 1e9 * e.nvlink_busbw;
    let copies_local = top_k as f64 * (g.per_domain as f64 - 1.0) / g.size as f64;
    if g.domains <= 1 {
        return collective_secs(hw, Collective::AllToAll, token_bytes * top_k as f64, g);
    }
    let remote = expected_remote_domains(experts, top_k, g.domains);
    let net = token_bytes * remote / (hw.network.nic_gbytes_per_s * 1e9 * e.network_busbw);
    // NVLink carries the local copies and the fan-out of tokens arriving from
    // other domains to this domain's other GPUs.
    let fan_out =
        token_bytes * (copies_local + top_k as f64 * (g.domains as f64 - 1.0) / g.domains as f64);
    net.max(fan_out / nvl) + hw.network.latency_us * 1e-6 * 2.0
}

impl LayerCost {
    /// Critical-path seconds for one micro-batch through this layer.
    fn secs(&self) -> f64 {
        self.fwd.total()
            + self.bwd.total()
            + self.recompute
            + self.tp.1
            + self.cp.1
            + self.ep.1
            + self.etp.1
    }
}

/// The per-layer and per-stage ingredients of an estimate.
struct Pieces {
    dense: LayerCost,
    moe: LayerCost,
    vocab_rank: f64,
    output_secs: f64,
    /// The logits GEMM's weight-gradient time.
    output_wgrad: f64,
    output_flops: f64,
    embed_secs: f64,
    out_tp: f64,
    dense_layer_params: f64,
    moe_dense_params: f64,
    moe_expert_params: f64,
    embed_params: f64,
    tied_single: bool,
    act_dense: memory::LayerActivations,
    act_moe: memory::LayerActivations,
    mtp: MtpCost,
}

/// One multi-token-prediction layer per micro-batch, beside its transformer layer
/// and its pass through the output layer and loss.
#[derive(Debug, Clone, Copy, Default)]
struct MtpCost {
    /// The 2h -> h projection: forward and both backward GEMMs.
    proj_secs: f64,
    /// Its weight-gradient GEMM.
    proj_wgrad: f64,
    /// Embedding lookup of the shifted tokens and the embedding and hidden norms.
    elementwise_secs: f64,
    proj_flops: f64,
    /// Projection and norms per GPU (the embedding copy is counted apart).
    params: f64,
    /// Activations kept for the backward: both norms' inputs and the 2h-wide
    /// projection input.
    stored: f64,
}

impl Pieces {
    /// One MTP layer's work per micro-batch beside its transformer layer: the
    /// projection, norms and embedding lookup, and its pass through the output
    /// layer (with that layer's TP communication).
    fn mtp_extra_secs(&self) -> f64 {
        self.output_secs + 2.0 * self.out_tp + self.mtp.proj_secs + self.mtp.elementwise_secs
    }

    /// The embedding copy MTP looks the shifted tokens up in, on the last of `p`
    /// stages: none without MTP, when the first stage is the last, or when the
    /// output weight already is that copy (tied embeddings).
    fn mtp_embedding_copy(&self, model: &ModelSpec, p: u64) -> f64 {
        if model.mtp_layers > 0 && p > 1 && !model.tied_embeddings {
            self.embed_params
        } else {
            0.0
        }
    }
}

fn pieces(c: &Ctx) -> Pieces {
    let model = c.model;
    let cfg = c.cfg;
    let w = c.w;
    let t = cfg.tp as f64;
    let h = model.hidden as f64;
    let tokens = c.tokens;
    let p = cfg.pp;
    let a = c.a;
    let dense = layer_cost(c, LayerKind::Dense);
    let moe = if model.moe.is_some() {
        layer_cost(c, LayerKind::Moe)
    } else {
        dense
    };

    // Output layer on the last stage: logits GEMM (BF16), then the cross-entropy's
    // element-wise passes over the FP32 logits (fused or not).
    let vocab_rank = model.vocab as f64 / t;
    let logits = c.pass(tokens, vocab_rank, h, false);
    let ce = c.mem(tokens * vocab_rank * c.a.loss.bytes_per_logit());
    let output_secs = logits.fwd + logits.bwd + ce;
    let output_flops =
        3.0 * 2.0 * (cfg.mbs * w.seq) as f64 * h * model.vocab as f64 / (t * cfg.cp as f64);
    // Embedding lookup on the first stage (gather, and a scatter-add in backward).
    let embed_secs = c.mem(tokens * h * 2.0 * 3.0 / if cfg.sp { t } else { 1.0 });
    // The output layer's TP communication (gather the hidden state or all-reduce
    // its input gradient) is one block's worth.
    let out_tp = if cfg.tp > 1 {
        let act = tokens * h * 2.0;
        let g = c.tp_group();
        if cfg.sp {
            c.coll(Collective::AllGather, act, g) + c.coll(Collective::ReduceScatter, act, g)
        } else {
            c.coll(Collective::AllReduce, act, g)
        }
    } else {
        0.0
    };

    // Parameters per GPU of each stage.
    let params = model.params();
    let router_and_shared = params.moe_non_expert as f64;
    let dense_layer_params = (params.attention + params.dense_mlp) as f64 / t;
    let moe_dense_params = params.attention as f64 / t + router_and_shared / t;
    let moe_expert_params = params.routed_experts as f64 / (cfg.ep * cfg.etp) as f64;
    let embed_params = (model.vocab * model.hidden) as f64 / t;
    let tied_single = model.tied_embeddings && p == 1;

    let act_dense = memory::layer_activations(model, cfg, w, LayerKind::Dense, a);
    let act_moe = memory::layer_activations(model, cfg, w, LayerKind::Moe, a);

    // Multi-token prediction (Megatron's MultiTokenPredictionLayer): the shifted
    // tokens' embedding and the previous hidden state are each normed, concatenated
    // and projected 2h -> h (column-parallel over TP, kept in BF16), then pass one
    // transformer layer and the shared output layer.
    let sp_div = if cfg.sp { t } else { 1.0 };
    let mtp = if model.mtp_layers > 0 {
        let proj = c.pass(tokens, h / t, 2.0 * h, false);
        let norm_bytes = 2.0 * tokens * h * (2.0 + 2.0) / sp_div;
        MtpCost {
            proj_secs: proj.fwd + proj.bwd,
            proj_wgrad: proj.wgrad,
            elementwise_secs: embed_secs + c.mem(3.0 * norm_bytes),
            proj_flops: 3.0 * 2.0 * tokens * 2.0 * h * h / t,
            params: (2.0 * h * h + 2.0 * h) / t + h,
            stored: tokens * h * 2.0 * (1.0 + 1.0 + 2.0) / sp_div,
        }
    } else {
        MtpCost::default()
    };

    Pieces {
        dense,
        moe,
        vocab_rank,
        output_secs,
        output_wgrad: logits.wgrad,
        output_flops,
        embed_secs,
        out_tp,
        dense_layer_params,
        moe_dense_params,
        moe_expert_params,
        embed_params,
        tied_single,
        act_dense,
        act_moe,
        mtp,
    }
}

/// The partition problem ([`crate::partition`]) of a non-interleaved pipeline:
/// per-layer time and memory from this cost model, the embedding and the output
/// layer as first- and last-stage extras, 1F1B in-flight counts per stage. The
/// model's dominant layer type (dense or MoE) stands for every layer. The
/// configuration's own recomputation applies to every layer.
pub fn stage_problem(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<crate::partition::StageProblem, Rejection> {
    cfg.check(model, cluster, w)?;
    if cfg.vpp != 1 || cfg.pp < 2 || cfg.schedule == Schedule::DualPipe {
        return Err(Rejection::Layout { detail: "re-partitioning needs a non-interleaved pipeline of at least 2 stages, one per rank (not DualPipe)".into() });
    }
    let hw = &cluster.profile;
    let c = Ctx {
        model,
        hw,
        w,
        cfg,
        a,
        tokens: (cfg.mbs * w.seq / cfg.cp) as f64,
        fp8: w.precision.is_fp8() && hw.gpu.peak_tflops.fp8 > 0.0,
        domain: hw.node.nvlink_domain,
    };
    let pc = pieces(&c);
    let p = cfg.pp as usize;
    let m = cfg.micro_batches(w);
    let h = model.hidden as f64;
    let t = cfg.tp as f64;
    let frag = 1.0 + hw.memory.fragmentation;
    let moe_dominant = 2 * model.moe_layers() > model.layers;
    let (layer, act, dense_p, expert_p) = if moe_dominant {
        (
            pc.moe,
            pc.act_moe,
            pc.moe_dense_params,
            pc.moe_expert_params,
        )
    } else {
        (pc.dense, pc.act_dense, pc.dense_layer_params, 0.0)
    };
    // The partition prices Megatron-Core's own buffers only (none beyond the
    // model state); the search partitions no other framework's plans.
    let state = |d: f64, e: f64| {
        let (wt, g, o) = memory::model_state(cfg, d, e, a.framework);
        wt + g + o
    };
    let working = if cfg.recompute == Recompute::Full {
        (act.full - act.stored).max(0.0) * frag
    } else {
        0.0
    };
    let reserve = hw.memory.reserve_gib * GIB;
    let mut extra_secs = vec![0.0; p];
    let mut extra_bytes = vec![reserve + working; p];
    let flight: Vec<f64> = (0..cfg.pp).map(|i| memory::in_flight(cfg, m, i)).collect();
    extra_secs[0] += pc.embed_secs;
    extra_bytes[0] += state(pc.embed_params, 0.0)
        + flight[0] * c.tokens * h * (2.0 + if model.dropout { 1.0 } else { 0.0 })
            / if cfg.sp { t } else { 1.0 }
            * frag;
    extra_secs[p - 1] += pc.output_secs + 2.0 * pc.out_tp;
    let out_params = if pc.tied_single { 0.0 } else { pc.embed_params } + h;
    extra_bytes[p - 1] +=
        state(out_params, 0.0) + c.tokens * pc.vocab_rank * memory::logit_bytes(a.framework) * frag;
    // Multi-token prediction on the last stage: its layers (of the last layer's
    // kind), projections, second output pass and embedding copy.
    let mtp = model.mtp_layers as f64;
    if mtp > 0.0 {
        let (m_layer, m_act, m_dense, m_expert) = if model.mtp_is_moe() {
            (
                pc.moe,
                pc.act_moe,
                pc.moe_dense_params,
                pc.moe_expert_params,
            )
        } else {
            (pc.dense, pc.act_dense, pc.dense_layer_params, 0.0)
        };
        extra_secs[p - 1] += mtp * (m_layer.secs() + pc.mtp_extra_secs());
        extra_bytes[p - 1] += state(
            mtp * (m_dense + pc.mtp.params) + pc.mtp_embedding_copy(model, cfg.pp),
            mtp * m_expert,
        ) + flight[p - 1] * mtp * (m_act.stored + pc.mtp.stored) * frag
            + mtp * c.tokens * pc.vocab_rank * 6.0 * frag;
    }
    Ok(crate::partition::StageProblem {
        layers: model.layers,
        layer_secs: layer.secs(),
        recompute_secs: 0.0,
        stage_extra_secs: extra_secs,
        layer_state_bytes: state(dense_p, expert_p),
        layer_act_bytes: act.stored * frag,
        layer_act_recomputed_bytes: act.stored * frag,
        in_flight: flight,
        stage_extra_bytes: extra_bytes,
        classes: vec![crate::partition::GpuClass {
            name: hw.name.clone(),
            slowdown: 1.0,
            capacity_bytes: hw.capacity_bytes(),
            stages: p,
        }],
        allow_recompute: false,
    })
}

/// Largest task graph the search simulates (passes of one step).
pub const MAX_SIMULATED_PASSES: u64 = 200_000;

/// Replaces the closed-form pipeline time of `e` with the simulated schedule of
/// `cfg` on the estimate's own per-stage times and point-to-point cost: F a third
/// of a stage's micro-batch time, the backward two thirds, of which the stage's
/// weight-gradient GEMMs are split off as W where the schedule defers them (ZB-H1,
/// DualPipe). Returns false (and leaves `e` alone) when there is no pipeline, the
/// schedule cannot run this shape, or the graph would be too large.
pub fn apply_simulation(e: &mut Estimate, cfg: &ParallelConfig) -> bool {
    use crate::schedule::{simulate_schedule, PassCosts};
    let schedule = cfg.schedule;
    let v = if schedule == Schedule::Interleaved {
        cfg.vpp
    } else {
        1
    };
    let (p, m) = (cfg.pp, e.micro_batches);
    let kinds = if schedule.splits_weight_grad() { 3 } else { 2 };
    if p < 2
        || e.pipeline_simulated
        || e.stages.len() as u64 != p
        || kinds * p * v * m > MAX_SIMULATED_PASSES
    {
        return false;
    }
    let secs: Vec<f64> = e.stages.iter().map(|s| s.secs_per_micro_batch).collect();
    let split = schedule.splits_weight_grad();
    let weight: Vec<f64> = e
        .stages
        .iter()
        .map(|s| {
            if split {
                s.weight_grad_secs.clamp(0.0, s.secs_per_micro_batch / 3.0) / v as f64
            } else {
                0.0
            }
        })
        .collect();
    let costs = PassCosts {
        forward: secs.iter().map(|s| s / 3.0 / v as f64).collect(),
        backward: secs
            .iter()
            .zip(&weight)
            .map(|(s, w)| 2.0 * s / 3.0 / v as f64 - w)
            .collect(),
        weight,
    };
    let pp = e.comm.iter().find(|t| t.kind == CommKind::Pp);
    let one_p2p = pp
        .map(|t| t.total_secs / t.calls_per_step.max(1.0))
        .unwrap_or(0.0);
    let p2p_exposed = pp.map(|t| t.exposed_secs).unwrap_or(0.0);
    // A transfer overlapped with compute still delays the pass that needs its data:
    // every cross-rank edge carries the transfer time, overlapped or not. What
    // overlap saves is the sender's time, which the graph does not charge anyway.
    // The closed form's exposed transfers are replaced by what lands on the
    // simulated critical path (for interleaving, the chunk boundaries of the fill
    // and the drain).
    let edge = one_p2p;
    let Some(tl) = simulate_schedule(schedule, p, v, m, &costs, edge) else {
        return false;
    };
    // The closed form's pace: the slowest rank (under DualPipe the mean of the two
    // stages a rank runs).
    let rank_secs = |r: usize| {
        if schedule == Schedule::DualPipe {
            0.5 * (secs[r] + secs[p as usize - 1 - r])
        } else {
            secs[r]
        }
    };
    let t_max = (0..p as usize).map(rank_secs).fold(0.0, f64::max);
    let closed = m as f64 * t_max + e.time.bubble + p2p_exposed;
    let new_step = e.step_secs - closed + tl.makespan;
    if !(new_step.is_finite() && new_step > 0.0) {
        return false;
    }
    let ratio = e.step_secs / new_step;
    e.time.bubble = (tl.makespan - m as f64 * t_max - p2p_exposed).max(0.0);
    e.step_secs = new_step;
    e.tokens_per_sec_per_gpu *= ratio;
    e.mfu *= ratio;
    e.hfu *= ratio;
    e.model_tflops_per_gpu *= ratio;
    // Bands are relative errors of the step time: they scale with it.
    if let Some(b) = &mut e.band {
        b.low_secs /= ratio;
        b.high_secs /= ratio;
    }
    e.bubble_fraction = e.time.bubble / new_step;
    e.exposed_comm_fraction = e.time.exposed_comm / new_step;
    e.pipeline_simulated = true;
    if e.band.is_some() {
        let moe = e.stages.iter().any(|s| s.moe_layers > 0);
        let attribution = crate::uncertainty::attribution_of(e, moe);
        if let Some(b) = &mut e.band {
            b.attribution = attribution;
        }
    }
    true
}

/// Evaluates one configuration: validity, memory, time.
pub fn estimate(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
) -> Result<Estimate, Rejection> {
    estimate_with(model, cluster, w, cfg, Assumptions::default())
}

pub fn estimate_with(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<Estimate, Rejection> {
    let mut e = estimate_unbanded(model, cluster, w, cfg, a)?;
    e.band = crate::uncertainty::band_for(cluster, cfg, model.moe.is_some(), &e);
    Ok(e)
}

/// [`estimate_with`] without the error band: the search's inner loop, where only
/// the ranked plans need one.
pub fn estimate_unbanded(
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

/// Like [`estimate_with`] but returns the estimate even when it does not fit in
/// memory (so that the caller can show why); structural rules still apply.
pub fn evaluate(
    model: &ModelSpec,
    cluster: &Cluster,
    w: &Workload,
    cfg: &ParallelConfig,
    a: Assumptions,
) -> Result<Estimate, Rejection> {
    cfg.check(model, cluster, w)?;
    let hw = &cluster.profile;
    let c = Ctx {
        model,
        hw,
        w,
        cfg,
        a,
        tokens: (cfg.mbs * w.seq / cfg.cp) as f64,
        fp8: w.precision.is_fp8() && hw.gpu.peak_tflops.fp8 > 0.0,
        domain: hw.node.nvlink_domain,
    };
    let m = cfg.micro_batches(w);
    let p = cfg.pp;
    let v = cfg.vpp;
    let t = cfg.tp as f64;
    let h = model.hidden as f64;
    let tokens = c.tokens;

    let pc = pieces(&c);
    let (mtp_extra_secs, mtp_copy) = (pc.mtp_extra_secs(), pc.mtp_embedding_copy(model, p));
    let Pieces {
        dense,
        moe,
        vocab_rank,
        output_secs,
        output_wgrad,
        output_flops,
        embed_secs,
        out_tp,
        dense_layer_params,
        moe_dense_params,
        moe_expert_params,
        embed_params,
        tied_single,
        act_dense,
        act_moe,
        mtp: mtp_cost,
    } = pc;
    // Multi-token-prediction layers run on the last virtual stage (Megatron's
    // layout rules put them there), which the last rank holds; each is a layer of
    // the last decoder layer's kind.
    let mtp = model.mtp_layers as f64;
    let (mtp_dense, mtp_moe) = if model.mtp_is_moe() {
        (0.0, mtp)
    } else {
        (mtp, 0.0)
    };

    // Layers of each physical stage (sum over its virtual chunks). Under DualPipe
    // (one chunk per stage, vpp 1) entry i is model stage i, which runs on rank i
    // for half of the micro-batches and on rank p-1-i for the other half.
    let schedule = cfg.schedule;
    let dual = schedule == Schedule::DualPipe;
    let chunks = cfg.stage_layers(model.layers)?;
    let mut stage_layers = vec![0u64; p as usize];
    let mut stage_moe = vec![0u64; p as usize];
    let mut start = 0u64;
    for (idx, &n) in chunks.iter().enumerate() {
        let stage = idx % p as usize;
        stage_layers[stage] += n;
        stage_moe[stage] += model.moe_layers_in(start, start + n);
        start += n;
    }
    // The stages each rank runs, with the share of its micro-batches that pass each.
    let hosts = |rank: u64| -> Vec<(u64, f64)> {
        if dual {
            vec![(rank, 0.5), (p - 1 - rank, 0.5)]
        } else {
            vec![(rank, 1.0)]
        }
    };

    // Per stage: time of one micro-batch, its weight-gradient part, the parameters
    // it holds and the activations one micro-batch leaves on it.
    struct StageCost {
        secs: f64,
        weight_secs: f64,
        dense_p: f64,
        expert_p: f64,
        stored: f64,
        working: f64,
        dispatch: f64,
    }
    let stage_cost = |i: u64| -> StageCost {
        let iu = i as usize;
        let first = i == 0;
        let last = i == p - 1;
        let (extra_dense, extra_moe, extra_mtp) = if last {
            (mtp_dense, mtp_moe, mtp)
        } else {
            (0.0, 0.0, 0.0)
        };
        let n_moe = stage_moe[iu] as f64 + extra_moe;
        let n_dense = (stage_layers[iu] - stage_moe[iu]) as f64 + extra_dense;
        let mut secs = n_dense * dense.secs() + n_moe * moe.secs();
        let mut weight_secs = n_dense * dense.wgrad + n_moe * moe.wgrad;
        if first {
            secs += embed_secs;
        }
        if last {
            secs += output_secs + 2.0 * out_tp + extra_mtp * mtp_extra_secs;
            weight_secs += (1.0 + extra_mtp) * output_wgrad + extra_mtp * mtp_cost.proj_wgrad;
        }
        let mut dense_p = n_dense * dense_layer_params + n_moe * moe_dense_params;
        let expert_p = n_moe * moe_expert_params;
        if first {
            dense_p += embed_params;
        }
        if last && !tied_single {
            dense_p += embed_params;
        }
        if last {
            dense_p += h; // final norm
            dense_p += extra_mtp * mtp_cost.params + mtp_copy;
        }
        let stored =
            n_dense * act_dense.stored + n_moe * act_moe.stored + extra_mtp * mtp_cost.stored;
        let held = n_dense + n_moe;
        let per_layer_stored = if held > 0.0 { stored / held } else { 0.0 };
        // Working set: with full recomputation (and torchtitan's op-level selective
        // one, which replays the rest of the block from what it saved), one layer
        // is rebuilt in full for the micro-batch being back-propagated.
        let rebuilt = match cfg.recompute {
            Recompute::Full => true,
            Recompute::Selective => memory::op_sac_applies(model, LayerKind::Dense, a),
            Recompute::None => false,
        };
        let working = if rebuilt {
            act_dense
                .full
                .max(if n_moe > 0.0 { act_moe.full } else { 0.0 })
                - per_layer_stored
        } else {
            0.0
        };
        // MoE token dispatch: send and receive buffers of the layer in flight
        // (routed tokens x h in BF16, each way).
        let dispatch = match &model.moe {
            Some(mo) if n_moe > 0.0 => {
                2.0 * tokens / t * mo.top_k as f64 * w.moe_rank_load(mo, cfg.ep).factor * h * 2.0
            }
            _ => 0.0,
        };
        // A backward holds its input gradient and weight gradient GEMMs; the weight
        // part is at most half of it.
        StageCost {
            secs,
            weight_secs: weight_secs.min(secs / 3.0),
            dense_p,
            expert_p,
            stored,
            working: working.max(0.0),
            dispatch,
        }
    };
    let costs: Vec<StageCost> = (0..p).map(stage_cost).collect();
    // Time of one micro-batch on each rank (the mean over the stages it runs).
    let rank_secs: Vec<f64> = (0..p)
        .map(|r| {
            hosts(r)
                .iter()
                .map(|&(s, k)| k * costs[s as usize].secs)
                .sum()
        })
        .collect();

    let mut stages = Vec::with_capacity(p as usize);
    let mut worst_mem = StageMemory::default();
    let mut rank_expert_params = Vec::with_capacity(p as usize);
    for i in 0..p {
        let iu = i as usize;
        let here = hosts(i);
        // Memory of rank i: every stage it runs keeps its parameters (DualPipe
        // holds two stages, so twice the parameters); activations are the rank's
        // in-flight count of its stages' micro-batches.
        let dense_p: f64 = here.iter().map(|&(s, _)| costs[s as usize].dense_p).sum();
        let expert_p: f64 = here.iter().map(|&(s, _)| costs[s as usize].expert_p).sum();
        let (weights, gradients, optimizer) =
            memory::model_state(cfg, dense_p, expert_p, a.framework);
        let flight = memory::in_flight(cfg, m, i);
        let stored: f64 = here
            .iter()
            .map(|&(s, k)| k * costs[s as usize].stored)
            .sum();
        let working = here
            .iter()
            .map(|&(s, _)| costs[s as usize].working)
            .fold(0.0, f64::max);
        let dispatch = here
            .iter()
            .map(|&(s, _)| costs[s as usize].dispatch)
            .fold(0.0, f64::max);
        let mut activations = stored * flight + working + dispatch;
        if let Some(&(_, k)) = here.iter().find(|&&(s, _)| s == 0) {
            // Embedding output kept for its backward (and dropout mask).
            activations += k * flight * tokens * h * (2.0 + if model.dropout { 1.0 } else { 0.0 })
                / if cfg.sp { t } else { 1.0 };
        }
        // The loss's logits buffers (`memory::logit_bytes`), once for the loss and
        // once per MTP layer.
        let logits = if here.iter().any(|&(s, _)| s == p - 1) {
            (1.0 + mtp) * tokens * vocab_rank * memory::logit_bytes(a.framework)
        } else {
            0.0
        };
        let holds = |s: u64| here.iter().any(|&(x, _)| x == s);
        let held = memory::HeldParams {
            all: dense_p + expert_p,
            layer: dense_layer_params.max(if model.moe.is_some() {
                moe_dense_params + moe_expert_params
            } else {
                0.0
            }),
            root: if holds(0) { embed_params } else { 0.0 }
                + if holds(p - 1) && !tied_single {
                    embed_params
                } else {
                    0.0
                },
        };
        let buffers = memory::framework_buffers(a.framework, cfg, held, m);
        let fragmentation = hw.memory.fragmentation * (activations + logits + buffers);
        let reserve = hw.memory.reserve_gib * GIB;
        let total = weights
            + gradients
            + optimizer
            + activations
            + logits
            + buffers
            + fragmentation
            + reserve;
        let mem = StageMemory {
            stage: i,
            params: dense_p + expert_p,
            weights,
            gradients,
            optimizer,
            activations,
            logits,
            buffers,
            fragmentation,
            reserve,
            total,
            in_flight: flight,
        };
        if mem.total > worst_mem.total {
            worst_mem = mem;
        }
        rank_expert_params.push(expert_p);
        stages.push(StageSummary {
            stage: i,
            layers: stage_layers[iu],
            moe_layers: stage_moe[iu],
            mtp_layers: if i == p - 1 { model.mtp_layers } else { 0 },
            secs_per_micro_batch: costs[iu].secs,
            weight_grad_secs: costs[iu].weight_secs,
            memory: mem,
        });
    }

    // Pipeline: m micro-batches through the slowest rank, plus fill and drain. The
    // bubble is each schedule's closed form on the mean stage, with F = t/3, the
    // full backward 2t/3 and W its weight-gradient GEMMs: (p-1) t for 1F1B and
    // GPipe, (p-1) t / v interleaved, (p-1)(F + B - W) = (p-1)(t - 2W) for ZB-H1
    // (Qi et al. 2023), (p/2-1)(F&B + B - 3W) = (p/2-1)(5t/3 - 3W) for DualPipe
    // (DeepSeek-V3 Table 2, with F&B = F + B: the pair is not credited any overlap).
    // They are exact for identical stages with the ratios the papers draw;
    // `apply_simulation` replaces them with the simulated schedule for the leaders.
    let (critical, t_max) =
        rank_secs
            .iter()
            .copied()
            .enumerate()
            .fold(
                (0u64, 0.0f64),
                |acc, (i, x)| if x > acc.1 { (i as u64, x) } else { acc },
            );
    let t_mean = rank_secs.iter().sum::<f64>() / p as f64;
    let w_mean = costs.iter().map(|c| c.weight_secs).sum::<f64>() / p as f64;
    let pm1 = (p - 1) as f64;
    let bubble = match schedule {
        Schedule::Gpipe | Schedule::OneFOneB => pm1 * t_mean,
        Schedule::Interleaved => pm1 / v as f64 * t_mean,
        Schedule::ZbH1 => pm1 * (t_mean - 2.0 * w_mean),
        Schedule::DualPipe => (p as f64 / 2.0 - 1.0) * (5.0 / 3.0 * t_mean - 3.0 * w_mean),
    }
    .max(0.0);
    let pipe = m as f64 * t_max + bubble;

    // Pipeline point-to-point: activation forward, gradient backward, per
    // micro-batch and virtual chunk. Sharded over TP (SP, or Megatron's
    // scatter-gather of the pipeline tensor without SP).
    let mut comm: Vec<CommTerm> = Vec::new();
    // The critical rank's stages, with the share of its micro-batches on each.
    let crit_hosts = hosts(critical);
    let crit_first: f64 = crit_hosts
        .iter()
        .filter(|&&(s, _)| s == 0)
        .map(|&(_, k)| k)
        .sum();
    let crit_last: f64 = crit_hosts
        .iter()
        .filter(|&&(s, _)| s == p - 1)
        .map(|&(_, k)| k)
        .sum();
    let crit_dense: f64 = crit_hosts
        .iter()
        .map(|&(s, k)| k * (stage_layers[s as usize] - stage_moe[s as usize]) as f64)
        .sum::<f64>()
        + crit_last * mtp_dense;
    let crit_moe: f64 = crit_hosts
        .iter()
        .map(|&(s, k)| k * stage_moe[s as usize] as f64)
        .sum::<f64>()
        + crit_last * mtp_moe;
    let mb = m as f64;
    let mut push_layer_comm = |kind: CommKind,
                               coll: Collective,
                               group: Placement,
                               bytes: f64,
                               d: (f64, f64),
                               mo: (f64, f64),
                               calls_d: f64,
                               calls_m: f64| {
        let total = mb * (crit_dense * d.0 + crit_moe * mo.0);
        if total <= 0.0 {
            return;
        }
        let exposed = mb * (crit_dense * d.1 + crit_moe * mo.1);
        comm.push(CommTerm {
            kind,
            collective: coll,
            group,
            tier: group.tier(),
            bytes_per_call: bytes,
            calls_per_step: mb * (crit_dense * calls_d + crit_moe * calls_m),
            total_secs: total,
            exposed_secs: exposed,
            overlapped_secs: total - exposed,
        });
    };
    let act_bytes = tokens * h * 2.0;
    push_layer_comm(
        CommKind::Tp,
        if cfg.sp {
            Collective::AllGather
        } else {
            Collective::AllReduce
        },
        c.tp_group(),
        act_bytes,
        dense.tp,
        moe.tp,
        dense.tp_calls,
        moe.tp_calls,
    );
    push_layer_comm(
        CommKind::Cp,
        Collective::SendRecv,
        c.cp_group(),
        dense.cp_bytes,
        dense.cp,
        moe.cp,
        dense.cp_calls,
        moe.cp_calls,
    );
    if let Some(mo) = &model.moe {
        push_layer_comm(
            CommKind::Ep,
            Collective::AllToAll,
            c.ep_group(),
            tokens / t * mo.top_k as f64 * h * 2.0,
            (0.0, 0.0),
            moe.ep,
            0.0,
            moe.ep_calls,
        );
        push_layer_comm(
            CommKind::Etp,
            Collective::AllGather,
            c.etp_group(),
            moe.etp_bytes,
            (0.0, 0.0),
            moe.etp,
            0.0,
            moe.etp_calls,
        );
    }

    let mut p2p_exposed = 0.0;
    if p > 1 {
        let bytes = act_bytes / t;
        let g = c.pp_group();
        let one = c.coll(Collective::SendRecv, bytes, g);
        let transfers = 2.0 * (mb * v as f64 + (p - 1) as f64);
        let total = transfers * one;
        // The interleaved schedule overlaps its transfers with compute (with
        // --overlap-p2p-communication), and DualPipe overlaps them inside its
        // forward-backward pairs; what stays exposed is the path of the first
        // micro-batch forward and the last one backward: with v chunks per rank
        // that path crosses 2(pv - 1) chunk boundaries, each waiting for its
        // transfer (the simulator's critical path on even stages). Every virtual
        // stage adds two.
        let boundaries = if dual { p - 1 } else { p * v - 1 };
        p2p_exposed = if (v > 1 || dual) && cfg.overlap.p2p {
            2.0 * boundaries as f64 * one
        } else {
            total
        };
        comm.push(CommTerm {
            kind: CommKind::Pp,
            collective: Collective::SendRecv,
            group: g,
            tier: g.tier(),
            bytes_per_call: bytes,
            calls_per_step: transfers,
            total_secs: total,
            exposed_secs: p2p_exposed,
            overlapped_secs: total - p2p_exposed,
        });
    }

    // Data-parallel synchronisation, per stage; the step waits for the slowest.
    // Stage i finishes its last backward i micro-batch-backwards before stage 0
    // (the drain of 1F1B), which hides that much of its reduction. Under ZB-H1 and
    // DualPipe the deferred W's fill the drain, so every rank computes weight
    // gradients until the end of the step and nothing is hidden that way.
    let drains = !schedule.splits_weight_grad();
    let mut dp_exposed_max = 0.0f64;
    let mut dp_terms: Vec<CommTerm> = Vec::new();
    let mut overlapped_total = mb * (crit_dense * dense.overlapped + crit_moe * moe.overlapped);
    let mut optimizer_secs = 0.0f64;
    for s in &stages {
        let mem = &s.memory;
        let expert_p = rank_expert_params[s.stage as usize];
        let dense_p = mem.params - expert_p;
        let t_b = rank_secs[s.stage as usize] * 2.0 / 3.0;
        let t_f = rank_secs[s.stage as usize] / 3.0;
        let slack = if drains { s.stage as f64 * t_b } else { 0.0 };
        let mut terms: Vec<CommTerm> = Vec::new();
        let mut exposed = 0.0;
        let mut overlapped = 0.0;
        for (params_local, group, grad_kind, param_kind) in [
            (dense_p, c.dp_group(), CommKind::DpGrad, CommKind::DpParam),
            (
                expert_p,
                c.edp_group(),
                CommKind::EdpGrad,
                CommKind::EdpParam,
            ),
        ] {
            if params_local <= 0.0 || group.size <= 1 {
                continue;
            }
            let grad_bytes = params_local * memory::grad_bytes(cfg);
            let param_bytes = params_local * memory::WEIGHT_BYTES;
            let (grad_coll, grad_calls, gather_calls) = match cfg.zero {
                Zero::None => (Collective::AllReduce, 1.0, 0.0),
                Zero::DistOpt => (Collective::ReduceScatter, 1.0, 1.0),
                // Sharded gradients cannot accumulate locally: reduce-scatter after
                // every micro-batch's backward.
                Zero::Zero2 => (Collective::ReduceScatter, mb, 1.0),
                // FSDP: gather before each forward and backward, reduce after each backward.
                Zero::Zero3 => (Collective::ReduceScatter, mb, 2.0 * mb),
            };
            if cfg.zero == Zero::Zero3 {
                // ZeRO-3 / FSDP shards by layer: before each layer's forward and again
                // before its backward (parameters are freed after the forward, the
                // default of PyTorch FSDP2's reshard_after_forward and Megatron-FSDP)
                // the layer's parameters are all-gathered, and after its backward its
                // gradient is reduce-scattered, for every micro-batch. With one layer
                // prefetched (FSDP2's default), a gather hides behind the previous
                // layer's pass only; in the backward the gather and the reduce-scatter
                // share the rank's links. The first gather of each pass and the last
                // reduce-scatter wait in the open. Latency counts once per layer, so
                // it grows with DP (see collective_secs).
                let units = (s.layers + s.mtp_layers).max(1) as f64;
                let ag = c.coll(Collective::AllGather, param_bytes / units, group);
                let rs = c.coll(Collective::ReduceScatter, grad_bytes / units, group);
                let (f_u, b_u) = (t_f / units, t_b / units);
                let fwd = ag + (units - 1.0) * (ag - f_u).max(0.0);
                let bwd = ag + (units - 1.0) * (ag + rs - b_u).max(0.0) + rs;
                let gather_total = 2.0 * mb * units * ag;
                let grad_total = mb * units * rs;
                let busy = fwd + bwd;
                // Split the exposed time between the two terms by their share of the traffic.
                let share = gather_total / (gather_total + grad_total).max(f64::MIN_POSITIVE);
                let gather_exposed = (mb * busy * share).min(gather_total);
                let grad_exposed = (mb * busy * (1.0 - share)).min(grad_total);
                exposed += grad_exposed + gather_exposed;
                overlapped += grad_total - grad_exposed + gather_total - gather_exposed;
                terms.push(CommTerm {
                    kind: grad_kind,
                    collective: grad_coll,
                    group,
                    tier: group.tier(),
                    bytes_per_call: grad_bytes / units,
                    calls_per_step: mb * units,
                    total_secs: grad_total,
                    exposed_secs: grad_exposed,
                    overlapped_secs: grad_total - grad_exposed,
                });
                terms.push(CommTerm {
                    kind: param_kind,
                    collective: Collective::AllGather,
                    group,
                    tier: group.tier(),
                    bytes_per_call: param_bytes / units,
                    calls_per_step: 2.0 * mb * units,
                    total_secs: gather_total,
                    exposed_secs: gather_exposed,
                    overlapped_secs: gather_total - gather_exposed,
                });
                continue;
            }
            let buckets = (params_local / BUCKET_PARAMS).ceil().max(1.0);
            let grad_one = c.coll(grad_coll, grad_bytes / buckets, group) * buckets;
            let grad_total = grad_one * grad_calls;
            let last_bucket = grad_one / buckets;
            let grad_exposed = if matches!(cfg.zero, Zero::Zero2 | Zero::Zero3) {
                // Per micro-batch reduction overlaps that micro-batch's backward.
                ((grad_one - t_b).max(last_bucket) * mb).min(grad_total)
            } else if cfg.overlap.grad_reduce {
                (grad_total - t_b).max(last_bucket).min(grad_total)
            } else {
                grad_total
            };
            let gather_one = if gather_calls > 0.0 {
                c.coll(Collective::AllGather, param_bytes / buckets, group) * buckets
            } else {
                0.0
            };
            let gather_total = gather_one * gather_calls;
            let gather_exposed = if gather_calls == 0.0 {
                0.0
            } else if cfg.zero == Zero::Zero3 {
                ((gather_one - t_f).max(gather_one / buckets) * gather_calls).min(gather_total)
            } else if cfg.overlap.param_gather {
                (gather_total - t_f)
                    .max(gather_one / buckets)
                    .min(gather_total)
            } else {
                gather_total
            };
            exposed += grad_exposed + gather_exposed;
            overlapped += grad_total - grad_exposed + gather_total - gather_exposed;
            terms.push(CommTerm {
                kind: grad_kind,
                collective: grad_coll,
                group,
                tier: group.tier(),
                bytes_per_call: grad_bytes / buckets,
                calls_per_step: grad_calls * buckets,
                total_secs: grad_total,
                exposed_secs: grad_exposed,
                overlapped_secs: grad_total - grad_exposed,
            });
            if gather_calls > 0.0 {
                terms.push(CommTerm {
                    kind: param_kind,
                    collective: Collective::AllGather,
                    group,
                    tier: group.tier(),
                    bytes_per_call: param_bytes / buckets,
                    calls_per_step: gather_calls * buckets,
                    total_secs: gather_total,
                    exposed_secs: gather_exposed,
                    overlapped_secs: gather_total - gather_exposed,
                });
            }
        }
        // DualPipe: the two copies of each stage (on ranks i and p-1-i) sum their
        // gradients, an all-reduce between the pair of the gradient shard each rank
        // keeps, after the backward.
        if dual {
            let shard = if cfg.zero == Zero::None {
                1.0
            } else {
                (cfg.dp * cfg.cp) as f64
            };
            let bytes = mem.params * memory::grad_bytes(cfg) / shard;
            let g = c.pp_group();
            let secs = c.coll(Collective::AllReduce, bytes, g);
            exposed += secs;
            terms.push(CommTerm {
                kind: CommKind::DpGrad,
                collective: Collective::AllReduce,
                group: g,
                tier: g.tier(),
                bytes_per_call: bytes,
                calls_per_step: 1.0,
                total_secs: secs,
                exposed_secs: secs,
                overlapped_secs: 0.0,
            });
        }
        // Exposure beyond this stage's drain slack delays the step.
        let stage_exposed = (exposed - slack).max(0.0);
        if stage_exposed >= dp_exposed_max && (!terms.is_empty() || dp_terms.is_empty()) {
            dp_exposed_max = stage_exposed;
            for term in &mut terms {
                // Attribute the slack proportionally so the terms add up.
                if exposed > 0.0 {
                    let kept = stage_exposed / exposed;
                    let hidden = term.exposed_secs * (1.0 - kept);
                    term.exposed_secs -= hidden;
                    term.overlapped_secs += hidden;
                }
            }
            dp_terms = terms;
            overlapped_total += overlapped;
        }
        // Optimizer: Adam reads and writes the FP32 master weight, momentum and
        // variance, reads the FP32 gradient and writes the BF16 weight (~30 bytes
        // per parameter), plus the gradient-norm pass (4 bytes): on the shard this
        // rank owns. BF16 moments move 8 bytes fewer.
        let (_, _, opt_bytes) =
            memory::model_state(cfg, dense_p, expert_p, Framework::MegatronCore);
        let owned = opt_bytes / memory::optimizer_bytes(cfg);
        let per_param = if cfg.bf16_moments { 26.0 } else { 34.0 };
        optimizer_secs = optimizer_secs.max(c.mem(owned * per_param));
    }
    comm.extend(dp_terms);

    let slowdown = hw.efficiency.overlap_slowdown * overlapped_total;
    let step = pipe + p2p_exposed + dp_exposed_max + optimizer_secs + slowdown;

    // Breakdown on the critical stage.
    let mut compute = OpClasses::default();
    compute.add_scaled(&dense.fwd, mb * crit_dense);
    compute.add_scaled(&dense.bwd, mb * crit_dense);
    compute.add_scaled(&moe.fwd, mb * crit_moe);
    compute.add_scaled(&moe.bwd, mb * crit_moe);
    compute.elementwise += crit_first * mb * embed_secs;
    compute.output_layer += crit_last * mb * ((1.0 + mtp) * output_secs + mtp * mtp_cost.proj_secs);
    compute.elementwise += crit_last * mb * mtp * mtp_cost.elementwise_secs;
    let recompute = mb * (crit_dense * dense.recompute + crit_moe * moe.recompute);
    let out_tp_secs = crit_last * mb * 2.0 * out_tp * (1.0 + mtp);
    let exposed_layer_comm: f64 = comm
        .iter()
        .filter(|t| {
            matches!(
                t.kind,
                CommKind::Tp | CommKind::Cp | CommKind::Ep | CommKind::Etp
            )
        })
        .map(|t| t.exposed_secs)
        .sum::<f64>()
        + out_tp_secs;
    if out_tp_secs > 0.0 {
        if let Some(tp) = comm.iter_mut().find(|t| t.kind == CommKind::Tp) {
            tp.total_secs += out_tp_secs;
            tp.exposed_secs += out_tp_secs;
        }
    }
    let exposed_comm = exposed_layer_comm + p2p_exposed + dp_exposed_max;

    // FLOPs of the whole model per step, per GPU.
    let moe_layers = model.moe_layers() as f64;
    let dense_layers = model.layers as f64 - moe_layers;
    // Layer FLOPs are already per GPU of a TP x CP group; every micro-batch of the
    // step passes all layers once, spread over the PP stages and the DP replicas.
    let per_gpu_div = (p * cfg.dp) as f64;
    let total_micro = (w.global_batch / cfg.mbs) as f64;
    // Megatron's FLOP count includes the MTP layers, their projections and their
    // second output-layer pass (num_floating_point_operations, megatron/training).
    let (dense_layers, moe_layers) = (dense_layers + mtp_dense, moe_layers + mtp_moe);
    let model_flops = total_micro
        * (dense_layers * dense.model_flops
            + moe_layers * moe.model_flops
            + (1.0 + mtp) * output_flops
            + mtp * mtp_cost.proj_flops)
        / per_gpu_div;
    let recompute_flops = total_micro
        * (dense_layers * dense.recompute_flops + moe_layers * moe.recompute_flops)
        / per_gpu_div;
    let peak = hw.peak_flops(false);
    let mfu = model_flops / (step * peak);
    let hfu = (model_flops + recompute_flops) / (step * peak);
    let tokens_per_step = (w.global_batch * w.seq) as f64;

    Ok(Estimate {
        schema_version: ESTIMATE_SCHEMA_VERSION,
        step_secs: step,
        tokens_per_sec_per_gpu: tokens_per_step / step / cluster.gpus as f64,
        mfu,
        hfu,
        model_tflops_per_gpu: model_flops / step / 1e12,
        micro_batches: m,
        bubble_fraction: bubble / step,
        exposed_comm_fraction: exposed_comm / step,
        time: TimeBreakdown {
            compute,
            recompute,
            exposed_comm,
            bubble,
            optimizer: optimizer_secs,
            overlap_slowdown: slowdown,
        },
        comm,
        memory: worst_mem,
        hbm_bytes: hw.hbm_bytes(),
        usable_bytes: hw.usable_bytes(),
        stages,
        critical_stage: critical,
        band: None,
        pipeline_simulated: false,
        moe_routing: model.moe.as_ref().map(|moe| {
            let load = w.moe_rank_load(moe, cfg.ep);
            MoeRouting {
                imbalance: w.moe_imbalance,
                capacity_factor: w.moe_capacity.map(|c| c.factor),
                pad_to_capacity: w.moe_capacity.is_some_and(|c| c.pad),
                busiest_rank_load: load.factor,
                dropped_fraction: load.dropped,
            }
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Tier;
    use crate::config::{Dispatcher, Layout, Overlap, Precision};
    use crate::hardware::builtin_profile;
    use crate::presets::{gpt, resolve};

    fn cfg(tp: u64, pp: u64, cp: u64, dp: u64) -> ParallelConfig {
        ParallelConfig {
            tp,
            pp,
            vpp: 1,
            cp,
            ep: 1,
            etp: 1,
            dp,
            sp: false,
            mbs: 1,
            zero: Zero::None,
            recompute: Recompute::None,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: Schedule::OneFOneB,
        }
    }

    fn wl(seq: u64, gbs: u64) -> Workload {
        Workload {
            seq,
            global_batch: gbs,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        }
    }

    fn term(e: &Estimate, kind: CommKind) -> &CommTerm {
        e.comm.iter().find(|t| t.kind == kind).unwrap_or_else(|| {
            panic!(
                "no {kind:?} term in {:?}",
                e.comm.iter().map(|t| t.kind).collect::<Vec<_>>()
            )
        })
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-30)
    }

    /// The backward prices its two GEMMs at their own shapes. Without a curve that is
    /// twice the forward; with one, the weight gradient of a short-row GEMM reduces
    /// over few rows and costs more than its forward.
    #[test]
    fn backward_gemms_at_their_own_shapes() {
        let model = gpt("t", "test", 2, 4096, 32);
        let (k, w) = (cfg(1, 1, 1, 8), wl(4096, 64));
        let ctx = |hw| Ctx {
            model: &model,
            hw,
            w: &w,
            cfg: &k,
            a: Assumptions::default(),
            tokens: 4096.0,
            fp8: false,
            domain: 8,
        };
        let a100 = builtin_profile("a100-80g").unwrap();
        let p = ctx(&a100).pass(4096.0, 12288.0, 4096.0, false);
        assert!((p.bwd / p.fwd - 2.0).abs() < 0.01, "{p:?}");
        let h100 = builtin_profile("h100-sxm").unwrap();
        let c = ctx(&h100);
        // 1024 routed rows through a 2880 -> 5760 expert GEMM (GPT-OSS-120B, EP 8).
        let p = c.pass(1024.0, 5760.0, 2880.0, false);
        assert!(p.bwd > 2.03 * p.fwd, "{p:?}");
        assert!(close(
            p.bwd,
            c.gemm(1024.0, 2880.0, 5760.0, false) + c.gemm(2880.0, 5760.0, 1024.0, false)
        ));
        assert!(close(p.wgrad, c.gemm(2880.0, 5760.0, 1024.0, false)));
    }

    /// With a measured attention curve the core's time follows the kernel's
    /// efficiency at the head width and the per-rank sequence: the same FLOPs in
    /// 64-wide heads take 518/363 as long as in 128-wide ones at 4096 tokens, and CP 2
    /// runs its 2048-token shards at the 2048-token point.
    #[test]
    fn attention_core_follows_the_measured_curve() {
        let h100 = builtin_profile("h100-sxm").unwrap();
        let w = wl(4096, 64);
        let core = |heads: u64, cp: u64| {
            let model = gpt("t", "test", 2, 4096, heads);
            let k = cfg(1, 1, cp, 8 / cp);
            let lc = layer_cost(
                &Ctx {
                    model: &model,
                    hw: &h100,
                    w: &w,
                    cfg: &k,
                    a: Assumptions::default(),
                    tokens: 4096.0 / cp as f64,
                    fp8: false,
                    domain: 8,
                },
                LayerKind::Dense,
            );
            let launch = h100.efficiency.gemm_overhead_us * 1e-6;
            (lc.attn_core_fwd - launch, lc.attn_core_bwd - launch)
        };
        let ((f128, b128), (f64_, b64)) = (core(32, 1), core(64, 1));
        assert!(
            (f64_ / f128 - 518.0 / 363.0).abs() < 1e-9 && (b64 / b128 - 499.0 / 417.0).abs() < 1e-9
        );
        // CP 2: half of the causal (query, key) pairs on each rank, at the 2048-token point.
        let (f_cp, _) = core(32, 2);
        assert!(
            (f_cp / f128 - 0.5 * 518.0 / 484.0).abs() < 1e-3,
            "{}",
            f_cp / f128
        );
    }

    /// The loss kernels differ only in the bytes they move over the logits: the
    /// unfused loss 20 more per logit than Megatron's fused one, on the last stage.
    #[test]
    fn loss_kernels_differ_by_their_passes_over_the_logits() {
        let bytes = [LossKernel::Te, LossKernel::Native, LossKernel::Unfused]
            .map(LossKernel::bytes_per_logit);
        assert_eq!(bytes, [10.0, 32.0, 52.0]);
        let model = resolve("llama3-8b").unwrap().spec;
        let h100 = builtin_profile("h100-sxm").unwrap();
        let (k, w) = (
            ParallelConfig {
                zero: Zero::DistOpt,
                ..cfg(2, 1, 1, 4)
            },
            wl(4096, 64),
        );
        let ctx = |loss| Ctx {
            model: &model,
            hw: &h100,
            w: &w,
            cfg: &k,
            a: Assumptions {
                loss,
                ..Assumptions::default()
            },
            tokens: 4096.0,
            fp8: false,
            domain: 8,
        };
        let output = |loss| pieces(&ctx(loss)).output_secs;
        // 4096 tokens x half of the 128256-entry vocabulary on each TP rank.
        let c = ctx(LossKernel::Native);
        assert!(close(
            output(LossKernel::Unfused) - output(LossKernel::Native),
            c.mem(4096.0 * 64128.0 * 20.0)
        ));
        assert!(close(
            output(LossKernel::Native) - output(LossKernel::Te),
            c.mem(4096.0 * 64128.0 * 22.0)
        ));
        let cluster = Cluster::new(h100.clone(), 8).unwrap();
        let step = |loss| {
            estimate_with(
                &model,
                &cluster,
                &w,
                &k,
                Assumptions {
                    loss,
                    ..Assumptions::default()
                },
            )
            .unwrap()
            .step_secs
        };
        assert!(
            step(LossKernel::Unfused) > step(LossKernel::Native)
                && step(LossKernel::Native) > step(LossKernel::Te)
        );
    }

    /// ScaleTorch's grid `[DP, PP, CP, EP, TP]` puts a pipeline inside each
    /// data-parallel replica: with TP 2, PP 4, DP 8 on 8-GPU nodes its stages are
    /// neighbours on NVLink and its DP group has one member per node, the reverse
    /// of Megatron's `tp-cp-ep-dp-pp`.
    #[test]
    fn scaletorch_order_places_pp_inside_and_dp_across_nodes() {
        let model = resolve("8b").unwrap().spec;
        let h100 = builtin_profile("h100-sxm").unwrap();
        let w = wl(4096, 256);
        let k = cfg(2, 4, 1, 8);
        let ctx = |rank_order| Ctx {
            model: &model,
            hw: &h100,
            w: &w,
            cfg: &k,
            a: Assumptions {
                rank_order,
                ..Assumptions::default()
            },
            tokens: 4096.0,
            fp8: false,
            domain: 8,
        };
        let (mega, st) = (ctx(RankOrder::Megatron), ctx(RankOrder::ScaleTorch));
        assert_eq!(mega.pp_group().tier(), Tier::Network);
        assert_eq!(st.pp_group().tier(), Tier::Nvlink);
        assert_eq!(
            (mega.dp_group().per_domain, mega.dp_group().domains),
            (4, 2)
        );
        assert_eq!((st.dp_group().per_domain, st.dp_group().domains), (1, 8));
        // Same groups for TP and CP.
        assert_eq!(mega.tp_group(), st.tp_group());
        assert_eq!(mega.cp_group(), st.cp_group());
    }

    /// Megatron's all-to-all dispatcher sorts the received tokens by local expert and
    /// back (8h bytes per routed token beyond the permute and un-permute); with one
    /// expert per rank, or DeepEP-style dispatch, it does not.
    #[test]
    fn all_to_all_dispatch_sorts_chunks_by_local_expert() {
        let model = resolve("gpt-oss-120b").unwrap().spec;
        let h100 = builtin_profile("h100-sxm").unwrap();
        let w = wl(4096, 64);
        let elementwise = |ep: u64, d: Dispatcher| {
            let k = ParallelConfig {
                ep,
                moe_dispatcher: d,
                ..cfg(1, 1, 1, 8)
            };
            layer_cost(
                &Ctx {
                    model: &model,
                    hw: &h100,
                    w: &w,
                    cfg: &k,
                    a: Assumptions::default(),
                    tokens: 4096.0,
                    fp8: false,
                    domain: 8,
                },
                LayerKind::Moe,
            )
            .fwd
            .elementwise
        };
        let c = Ctx {
            model: &model,
            hw: &h100,
            w: &w,
            cfg: &cfg(1, 1, 1, 8),
            a: Assumptions::default(),
            tokens: 4096.0,
            fp8: false,
            domain: 8,
        };
        // 4096 tokens x top-4 routed rows of 2880 BF16 values.
        let sort = c.mem(4096.0 * 4.0 * 8.0 * 2880.0);
        assert!(close(
            elementwise(8, Dispatcher::AllToAll) - elementwise(8, Dispatcher::Deduplicated),
            sort
        ));
        // 128 experts on 128 ranks: one local expert, nothing to sort.
        assert!(close(
            elementwise(128, Dispatcher::AllToAll),
            elementwise(128, Dispatcher::Deduplicated)
        ));
    }

    /// Sandwich norms (Gemma 2 and 3, GLM-4-0414) add two norm passes per layer
    /// (read 2h, write 2h per token, split by SP), forward and, twice over,
    /// backward; nothing else moves.
    #[test]
    fn sandwich_norms_add_two_norm_passes() {
        let plain = resolve("llama3-8b").unwrap().spec;
        let sandwich = ModelSpec {
            sandwich_norms: true,
            ..plain.clone()
        };
        let h100 = builtin_profile("h100-sxm").unwrap();
        let w = wl(4096, 64);
        let k = ParallelConfig {
            sp: true,
            ..cfg(4, 1, 1, 2)
        };
        let ctx = |model| Ctx {
            model,
            hw: &h100,
            w: &w,
            cfg: &k,
            a: Assumptions::default(),
            tokens: 4096.0,
            fp8: false,
            domain: 8,
        };
        let (a, b) = (
            layer_cost(&ctx(&sandwich), LayerKind::Dense),
            layer_cost(&ctx(&plain), LayerKind::Dense),
        );
        let two_norms = ctx(&plain).mem(4096.0 * 2.0 * 4.0 * plain.hidden as f64 / 4.0);
        assert!(close(a.fwd.elementwise - b.fwd.elementwise, two_norms));
        assert!(close(
            a.bwd.elementwise - b.bwd.elementwise,
            2.0 * two_norms
        ));
        assert_eq!(a.fwd.mlp, b.fwd.mlp);
        assert_eq!(a.fwd.attention_proj, b.fwd.attention_proj);
    }

    /// FP8 casts every GEMM input: in an MoE layer the routed experts' inputs over
    /// their routed rows (h into FC1, the expert FFN width into FC2), not a dense
    /// MLP's.
    #[test]
    fn fp8_casts_routed_expert_inputs() {
        let model = resolve("qwen3-235b-a22b").unwrap().spec;
        let moe = model.moe.unwrap();
        assert_eq!(moe.shared_hidden(), 0);
        let h100 = builtin_profile("h100-sxm").unwrap();
        let w = wl(4096, 64);
        let k = ParallelConfig {
            ep: 8,
            ..cfg(1, 1, 1, 8)
        };
        let ctx = |fp8| Ctx {
            model: &model,
            hw: &h100,
            w: &w,
            cfg: &k,
            a: Assumptions::default(),
            tokens: 4096.0,
            fp8,
            domain: 8,
        };
        let extra = layer_cost(&ctx(true), LayerKind::Moe).fwd.elementwise
            - layer_cost(&ctx(false), LayerKind::Moe).fwd.elementwise;
        let (h, routed) = (model.hidden as f64, 4096.0 * moe.top_k as f64);
        let elems = 4096.0 * (h + model.attn_out_dim() as f64)
            + routed * (h + moe.expert_ffn_hidden as f64);
        assert!(
            close(extra, ctx(true).mem(3.0 * elems)),
            "{extra} vs {}",
            ctx(true).mem(3.0 * elems)
        );
    }

    /// ZB-H1 and DualPipe defer each stage's weight-gradient GEMMs as the W pass:
    /// a middle stage's W time is its layers' `X^T dY` GEMMs at their own shapes,
    /// not the forward GEMMs' time.
    #[test]
    fn weight_grad_pass_is_the_weight_gradient_gemms() {
        let model = gpt("t", "test", 8, 2048, 16);
        let h100 = builtin_profile("h100-sxm").unwrap();
        let c = Cluster::new(h100.clone(), 8).unwrap();
        let k = ParallelConfig {
            schedule: Schedule::ZbH1,
            ..cfg(2, 4, 1, 1)
        };
        let w = wl(4096, 16);
        let e = evaluate(&model, &c, &w, &k, Assumptions::default()).unwrap();
        let ctx = Ctx {
            model: &model,
            hw: &h100,
            w: &w,
            cfg: &k,
            a: Assumptions::default(),
            tokens: 4096.0,
            fp8: false,
            domain: 8,
        };
        let (h, f, t) = (2048.0, model.ffn_hidden as f64, 2.0);
        // QKV (MHA: 3h), output projection, and the MLP's two matrices.
        let wgrad = ctx.gemm(h, 3.0 * h / t, 4096.0, false)
            + ctx.gemm(h / t, h, 4096.0, false)
            + ctx.gemm(h, f / t, 4096.0, false)
            + ctx.gemm(f / t, h, 4096.0, false);
        let fwd = ctx.gemm(4096.0, 3.0 * h / t, h, false)
            + ctx.gemm(4096.0, h, h / t, false)
            + ctx.gemm(4096.0, f / t, h, false)
            + ctx.gemm(4096.0, h, f / t, false);
        assert_eq!(model.mlp.matrices(), 2);
        assert!(
            close(e.stages[1].weight_grad_secs, 2.0 * wgrad),
            "{} vs {}",
            e.stages[1].weight_grad_secs,
            2.0 * wgrad
        );
        assert!(
            (wgrad / fwd - 1.0).abs() > 1e-3,
            "the shapes should differ in efficiency: {wgrad} vs {fwd}"
        );
    }

    /// Multi-token prediction loads only the last stage: one more layer of the
    /// last layer's kind, a second output pass, the projection and a copy of the
    /// embedding; Megatron's FLOP count grows by the same layer and pass.
    #[test]
    fn mtp_layers_load_the_last_stage() {
        let with = resolve("deepseek-v3").unwrap().spec;
        assert!(with.mtp_layers == 1 && with.mtp_is_moe());
        let without = ModelSpec {
            mtp_layers: 0,
            ..with.clone()
        };
        let c = Cluster::new(builtin_profile("b200").unwrap(), 256).unwrap();
        let w = wl(4096, 512);
        let layout = Layout::from_megatron("Et*7|(t*8|)*6t*6mL", 8).unwrap();
        let k = ParallelConfig {
            ep: 32,
            zero: Zero::DistOpt,
            layout: layout.layout,
            ..cfg(1, 8, 1, 32)
        };
        let (a, b) = (
            evaluate(&without, &c, &w, &k, Assumptions::default()).unwrap(),
            evaluate(&with, &c, &w, &k, Assumptions::default()).unwrap(),
        );
        for i in 0..7 {
            assert!(
                close(
                    a.stages[i].secs_per_micro_batch,
                    b.stages[i].secs_per_micro_batch
                ) && close(a.stages[i].memory.total, b.stages[i].memory.total),
                "stage {i} changed"
            );
            assert_eq!(b.stages[i].mtp_layers, 0);
        }
        let (sa, sb) = (&a.stages[7], &b.stages[7]);
        assert_eq!((sb.layers, sb.mtp_layers), (6, 1));
        // Time: at least one more MoE layer (a full middle stage has eight).
        let moe_layer = a.stages[1].secs_per_micro_batch / 8.0;
        assert!(
            sb.secs_per_micro_batch - sa.secs_per_micro_batch > moe_layer,
            "{} vs {}",
            sb.secs_per_micro_batch,
            sa.secs_per_micro_batch
        );
        // Parameters: the MTP module (experts sharded over EP) and the embedding copy.
        let p = with.params();
        let added = (with.mtp_params() - p.routed_experts) as f64
            + p.routed_experts as f64 / 32.0
            + p.embedding as f64;
        assert!(
            (sb.memory.params - sa.memory.params - added).abs() < 1.0,
            "{} vs {added}",
            sb.memory.params - sa.memory.params
        );
        // Model FLOPs: Megatron's count with one more MoE layer (about 1/60 of
        // the layers' FLOPs) and one more logits pass (6 x 0.93B FLOPs per token,
        // about 2% of DeepSeek-V3's): 3 to 5 percent more.
        let flops = |e: &Estimate| e.model_tflops_per_gpu * e.step_secs;
        let ratio = flops(&b) / flops(&a);
        assert!(ratio > 1.03 && ratio < 1.05, "{ratio}");
    }

    /// EP all-to-all overlap: hidden behind the partner pass's compute where
    /// Megatron allows it (interleaved or no pipeline, no full recomputation) and
    /// under DualPipe by construction; never elsewhere.
    #[test]
    fn ep_all_to_all_overlap_follows_megatrons_rules() {
        let m = resolve("qwen3-235b-a22b").unwrap().spec;
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 256).unwrap();
        let w = wl(4096, 1024);
        let base = ParallelConfig {
            tp: 2,
            pp: 8,
            vpp: 4,
            ep: 32,
            dp: 16,
            sp: true,
            zero: Zero::DistOpt,
            schedule: Schedule::Interleaved,
            moe_dispatcher: Dispatcher::Deduplicated,
            layout: Layout::AccountEmbeddingLoss,
            ..cfg(2, 8, 1, 16)
        };
        let on = |k: &ParallelConfig| ParallelConfig {
            overlap: Overlap {
                ep_comm: true,
                ..k.overlap
            },
            ..k.clone()
        };
        let run = |k: &ParallelConfig| evaluate(&m, &c, &w, k, Assumptions::default()).unwrap();
        let (off_e, on_e) = (run(&base), run(&on(&base)));
        let (t_off, t_on) = (term(&off_e, CommKind::Ep), term(&on_e, CommKind::Ep));
        assert!(
            close(t_off.total_secs, t_on.total_secs),
            "the bytes do not change"
        );
        assert!(close(t_off.exposed_secs, t_off.total_secs));
        assert!(
            t_on.exposed_secs < 0.5 * t_off.exposed_secs && t_on.overlapped_secs > 0.0,
            "{t_on:?}"
        );
        assert!(on_e.step_secs < off_e.step_secs);
        // Paired fraction: 64 micro-batches x 4 chunks less the warm-up 7 + 3 x 8.
        assert_eq!(base.micro_batches(&w), 64);
        let f = on(&base).ep_overlap(&w).unwrap();
        assert!(close(f, (256.0 - 31.0) / 256.0), "{f}");
        // Megatron refuses the overlap with full recomputation and with a
        // non-interleaved pipeline: nothing changes there.
        for k in [
            ParallelConfig {
                recompute: Recompute::Full,
                ..on(&base)
            },
            ParallelConfig {
                vpp: 1,
                schedule: Schedule::OneFOneB,
                layout: Layout::Even,
                ..on(&base)
            },
        ] {
            assert_eq!(k.ep_overlap(&w), None);
        }
        // Without a pipeline every micro-batch but the first forward has a partner.
        let flat = ParallelConfig {
            pp: 1,
            vpp: 1,
            dp: 128,
            schedule: Schedule::OneFOneB,
            layout: Layout::Even,
            ..on(&base)
        };
        let mb = flat.micro_batches(&w) as f64;
        assert!(close(flat.ep_overlap(&w).unwrap(), (mb - 1.0) / mb));
        // DualPipe overlaps without the flag.
        let dual = ParallelConfig {
            vpp: 1,
            schedule: Schedule::DualPipe,
            layout: Layout::Even,
            ..base.clone()
        };
        assert!(dual.ep_overlap(&w).is_some() && base.ep_overlap(&w).is_none());
    }

    /// Megatron-LM `theoretical_memory_usage.py` for Llama 2 7B at TP 2, PP 2 on 8
    /// GPUs (DP 2) with the distributed optimizer: the most loaded shard holds
    /// (transformer / pp + embedding) / tp parameters at 6 + 12/dp bytes each.
    #[test]
    fn llama2_7b_tp2_pp2_distributed_optimizer_matches_megatron() {
        let m = resolve("llama2-7b").unwrap().spec;
        let (h, l, f, v) = (4096.0f64, 32.0, 11008.0, 32000.0);
        // Megatron's formula: 2 L h^2 (attention (1 + kv/heads) + mlp ffn/h * 3/2 + norms 2/h + final norm 1/(L h)).
        let transformer = 2.0 * l * h * h * ((1.0 + 1.0) + (f / h) * 1.5 + 2.0 / h + 1.0 / (l * h));
        let shard = (transformer / 2.0 + h * v) / 2.0;
        let megatron_bytes = shard * (6.0 + 12.0 / 2.0);
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
        let mut k = cfg(2, 2, 1, 2);
        k.zero = Zero::DistOpt;
        let e = estimate(&m, &c, &wl(4096, 64), &k).unwrap();
        let s0 = &e.stages[0].memory;
        let ours = s0.weights + s0.gradients + s0.optimizer;
        // Megatron counts the final norm on every shard; we put it on the last stage.
        assert!(
            (ours - megatron_bytes).abs() / megatron_bytes < 1e-4,
            "ours {ours} vs Megatron {megatron_bytes}"
        );
        assert!((s0.params - shard).abs() / shard < 1e-4);
    }

    #[test]
    fn tp_all_reduce_and_sp_collectives_per_layer() {
        let m = gpt("g", "test", 4, 4096, 32);
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 8).unwrap();
        let w = wl(2048, 4);
        let e = estimate(&m, &c, &w, &cfg(8, 1, 1, 1)).unwrap();
        let bytes = 2048.0 * 4096.0 * 2.0;
        let g = Placement::new(8, 1, 8);
        let ar = collective_secs(&c.profile, Collective::AllReduce, bytes, g);
        // 4 micro-batches x (4 layers x 4 all-reduces + 2 for the output layer).
        let t = term(&e, CommKind::Tp);
        assert!(
            close(t.total_secs, 4.0 * (4.0 * 4.0 + 2.0) * ar),
            "{} vs {}",
            t.total_secs,
            4.0 * 18.0 * ar
        );
        assert!(
            close(t.exposed_secs, t.total_secs),
            "TP is exposed without --tp-comm-overlap"
        );
        // With SP: an all-gather and a reduce-scatter in place of each all-reduce.
        let mut k = cfg(8, 1, 1, 1);
        k.sp = true;
        let e = estimate(&m, &c, &w, &k).unwrap();
        let agrs = collective_secs(&c.profile, Collective::AllGather, bytes, g)
            + collective_secs(&c.profile, Collective::ReduceScatter, bytes, g);
        assert!(close(term(&e, CommKind::Tp).total_secs, 4.0 * 18.0 * agrs));
        // Overlap hides some of it.
        k.overlap.tp_comm = true;
        let e2 = estimate(&m, &c, &w, &k).unwrap();
        assert!(term(&e2, CommKind::Tp).exposed_secs < term(&e, CommKind::Tp).exposed_secs);
    }

    #[test]
    fn dp_pp_cp_and_ep_terms_are_hand_computable() {
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 16).unwrap();
        let hw = &c.profile;
        // DP all-reduce of FP32 gradients, in 40M-parameter buckets, over 16 GPUs.
        let m = resolve("llama3-8b").unwrap().spec;
        let mut k = cfg(1, 1, 1, 16);
        k.overlap.grad_reduce = false;
        let w = wl(4096, 32);
        let e = evaluate(&m, &c, &w, &k, Assumptions::default()).unwrap();
        let params = e.stages[0].memory.params;
        let buckets = (params / BUCKET_PARAMS).ceil();
        let g = Placement::new(16, 1, 8);
        let expect =
            buckets * collective_secs(hw, Collective::AllReduce, params * 4.0 / buckets, g);
        let t = term(&e, CommKind::DpGrad);
        assert!(close(t.total_secs, expect), "{} vs {expect}", t.total_secs);
        assert!(close(t.exposed_secs, expect), "no overlap requested");

        // PP: 2 (m v + p - 1) transfers of tokens x h x 2 / tp bytes between nodes.
        let k = cfg(8, 2, 1, 1);
        let e = estimate(&m, &c, &wl(4096, 8), &k).unwrap();
        let bytes = 4096.0 * 4096.0 * 2.0 / 8.0;
        let one = collective_secs(hw, Collective::SendRecv, bytes, Placement::new(2, 8, 8));
        let t = term(&e, CommKind::Pp);
        assert!(close(t.total_secs, 2.0 * (8.0 + 1.0) * one));
        assert_eq!(t.tier, Tier::Network);

        // CP: (cp - 1) ring steps of this rank's K and V, 3 passes (fwd, and K/V +
        // their gradients in bwd), per layer and micro-batch.
        let k = cfg(1, 1, 2, 8);
        let e = evaluate(&m, &c, &wl(8192, 8), &k, Assumptions::default()).unwrap();
        let kv = 4096.0 * 2.0 * (8.0 * 128.0) * 2.0;
        let step = collective_secs(hw, Collective::SendRecv, kv, Placement::new(2, 1, 8));
        let t = term(&e, CommKind::Cp);
        assert!(
            close(t.total_secs, 1.0 * 32.0 * 3.0 * step),
            "{} vs {}",
            t.total_secs,
            96.0 * step
        );

        // EP: dispatch + combine, forward and backward, of tokens/tp x top-k x h x 2.
        let m = resolve("mixtral-8x7b").unwrap().spec;
        let mut k = cfg(1, 1, 1, 16);
        k.ep = 8;
        k.zero = Zero::DistOpt;
        // Communication only: whether it fits does not matter here.
        let e = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
        let bytes = 4096.0 * 2.0 * 4096.0 * 2.0;
        let a2a = collective_secs(hw, Collective::AllToAll, bytes, Placement::new(8, 1, 8));
        let t = term(&e, CommKind::Ep);
        assert!(close(t.total_secs, 1.0 * 32.0 * 4.0 * a2a));
        assert_eq!(t.tier, Tier::Nvlink);
        // Expert gradients reduce over the expert-DP group: 16 / 8 = 2 ranks.
        assert_eq!(term(&e, CommKind::EdpGrad).group.size, 2);

        // A deduplicating dispatcher sends fewer bytes over the network when the
        // EP group spans nodes: Qwen3-30B-A3B (128 experts, top-8) over 16 ranks
        // on 2 nodes.
        let m = resolve("qwen3-30b-a3b").unwrap().spec;
        k.ep = 16;
        k.dp = 16;
        let a2a = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
        k.moe_dispatcher = Dispatcher::Deduplicated;
        let dedup = evaluate(&m, &c, &wl(4096, 16), &k, Assumptions::default()).unwrap();
        let (ta, td) = (
            term(&a2a, CommKind::Ep).total_secs,
            term(&dedup, CommKind::Ep).total_secs,
        );
        assert!(td < ta, "dedup {td} vs all-to-all {ta}");
    }

    #[test]
    fn expected_remote_domains_by_hand() {
        // 8 experts on 2 domains, top-2: the other domain is missed with
        // probability C(4,2)/C(8,2) = 6/28.
        assert!((expected_remote_domains(8, 2, 2) - (1.0 - 6.0 / 28.0)).abs() < 1e-12);
        // One domain: nothing crosses the network.
        assert_eq!(expected_remote_domains(256, 8, 1), 0.0);
        // Top-k of all experts reaches every domain.
        assert!((expected_remote_domains(8, 8, 4) - 3.0).abs() < 1e-12);
    }

    #[test]
    fn uniform_pipeline_bubble_is_the_closed_form() {
        let m = gpt("g", "test", 32, 4096, 32);
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
        for (pp, vpp, gbs) in [(4u64, 1u64, 16u64), (4, 2, 16), (8, 4, 64)] {
            let mut k = cfg(8, pp, 1, 64 / (8 * pp));
            k.vpp = vpp;
            k.schedule = Schedule::default_for(vpp);
            let e = estimate(&m, &c, &wl(2048, gbs), &k).unwrap();
            // Stages are equal except the first (embedding) and last (output layer):
            // the bubble is (p-1)/v passes of the mean stage.
            let mean = e.stages.iter().map(|s| s.secs_per_micro_batch).sum::<f64>() / pp as f64;
            assert!(close(e.time.bubble, (pp - 1) as f64 / vpp as f64 * mean));
        }
    }

    /// The schedule changes the bubble and the memory, not the work: ZB-H1 keeps
    /// 1F1B's memory with the bubble (p-1)(F + B - 2W) (full B); DualPipe holds
    /// stages i and p-1-i on rank i (twice the parameters, p+1 micro-batches of
    /// activations; DeepSeek-V3 Table 2) with (p/2-1)(F&B + B - 3W), F&B = F + B.
    /// The simulator re-scores each, and the zero-bubble schedules come out with
    /// less bubble than 1F1B.
    #[test]
    fn schedules_change_bubble_and_memory() {
        let m = gpt("g", "test", 32, 4096, 32);
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
        let w = wl(2048, 64);
        let base = cfg(8, 4, 1, 2);
        let run = |s: Schedule| {
            let k = ParallelConfig {
                schedule: s,
                ..base.clone()
            };
            (evaluate(&m, &c, &w, &k, Assumptions::default()).unwrap(), k)
        };
        let ((fb, _), (zb, kz), (dp, kd)) = (
            run(Schedule::OneFOneB),
            run(Schedule::ZbH1),
            run(Schedule::DualPipe),
        );
        let mean =
            |e: &Estimate, f: fn(&StageSummary) -> f64| e.stages.iter().map(f).sum::<f64>() / 4.0;
        let (t, wg) = (
            mean(&fb, |s| s.secs_per_micro_batch),
            mean(&fb, |s| s.weight_grad_secs),
        );
        assert!(
            wg > 0.1 * t && wg <= t / 3.0,
            "weight-gradient share {}",
            wg / t
        );
        assert!(close(fb.time.bubble, 3.0 * t));
        assert!(close(zb.time.bubble, 3.0 * (t - 2.0 * wg)));
        assert!(close(
            dp.time.bubble,
            (4.0 / 2.0 - 1.0) * (5.0 / 3.0 * t - 3.0 * wg)
        ));
        for i in 0..4 {
            let (f, z, d) = (
                &fb.stages[i].memory,
                &zb.stages[i].memory,
                &dp.stages[i].memory,
            );
            assert_eq!((z.params, z.activations), (f.params, f.activations));
            assert!(close(d.params, f.params + fb.stages[3 - i].memory.params));
            assert!(close(
                d.weights,
                f.weights + fb.stages[3 - i].memory.weights
            ));
            assert_eq!(d.in_flight, 5.0);
            // Work per rank is unchanged: the mean of the two stages it runs.
            assert_eq!(
                dp.stages[i].secs_per_micro_batch,
                fb.stages[i].secs_per_micro_batch
            );
        }
        // The middle ranks hold 5 micro-batches of one (embedding-free) stage.
        let per_stage = fb.stages[1].memory.activations / fb.stages[1].memory.in_flight;
        assert!(close(dp.stages[1].memory.activations, 5.0 * per_stage));
        // DualPipe sums the two copies' gradients: one all-reduce between mirror ranks.
        assert!(dp
            .comm
            .iter()
            .any(|t| t.kind == CommKind::DpGrad && t.group.size == 2));
        for (mut e, k) in [(zb, kz), (dp, kd)] {
            assert!(apply_simulation(&mut e, &k), "{:?}", k.schedule);
            assert!(
                e.pipeline_simulated && e.time.bubble < fb.time.bubble,
                "{:?}: {} vs 1F1B {}",
                k.schedule,
                e.time.bubble,
                fb.time.bubble
            );
        }
    }

    #[test]
    fn recompute_ordering_and_fp8_speed() {
        let m = resolve("llama3-70b").unwrap().spec;
        let c = Cluster::new(builtin_profile("h100-sxm").unwrap(), 64).unwrap();
        let w = wl(4096, 128);
        let mut k = cfg(8, 4, 1, 2);
        k.sp = true;
        let t = |rc: Recompute, w: &Workload| {
            evaluate(
                &m,
                &c,
                w,
                &ParallelConfig {
                    recompute: rc,
                    ..k.clone()
                },
                Assumptions::default(),
            )
            .unwrap()
        };
        let none = t(Recompute::None, &w);
        let sel = t(Recompute::Selective, &w);
        let full = t(Recompute::Full, &w);
        assert!(none.step_secs < sel.step_secs && sel.step_secs < full.step_secs);
        assert!(
            none.memory.activations > sel.memory.activations * 0.99
                && sel.memory.activations > full.memory.activations
        );
        assert!(full.hfu > full.mfu);
        let fp8 = t(
            Recompute::None,
            &Workload {
                precision: Precision::Fp8,
                ..w.clone()
            },
        );
        assert!(fp8.step_secs < none.step_secs);
        assert!(fp8.memory.activations < none.memory.activations);
        // MFU is about model FLOPs / time: 6 N tokens dominates for a 70B model.
        let tokens = (w.global_batch * w.seq) as f64;
        let six_n = 6.0 * m.params().total as f64 * tokens
            / 64.0
            / none.step_secs
            / c.profile.peak_flops(false);
        assert!(
            none.mfu > six_n && none.mfu < 1.3 * six_n,
            "mfu {} vs 6N {}",
            none.mfu,
            six_n
        );
    }

    mod properties {
        use super::*;
        use crate::model::{MlpKind, ModelSpec, Moe, MODEL_SCHEMA_VERSION};
        use crate::search::{search, SearchSpace};
        use proptest::prelude::*;

        fn model() -> impl Strategy<Value = ModelSpec> {
            (
                1u64..=160,
                1u64..=8,
                prop::sample::select(vec![1u64, 2, 4, 8, 16, 32, 64, 128]),
                1u64..=6,
                1000u64..=260_000,
                prop::option::of((1u64..=7, 0u64..=3, 1u64..=3)),
                any::<bool>(),
            )
                .prop_map(|(layers, hd_mult, heads, kv_log, vocab, moe, gated)| {
                    let head_dim = 32 * hd_mult;
                    let kv = (heads >> kv_log.min(7)).max(1);
                    let hidden = heads * head_dim;
                    let moe = moe.map(|(e_log, k, dense)| Moe {
                        experts: 1 << e_log,
                        top_k: k.clamp(1, 1 << e_log),
                        expert_ffn_hidden: hidden,
                        shared_experts: 0,
                        shared_ffn_hidden: None,
                        dense_leading_layers: dense.min(layers - 1),
                        layer_freq: 1,
                        balancing: Default::default(),
                    });
                    ModelSpec {
                        schema_version: MODEL_SCHEMA_VERSION,
                        name: "random".into(),
                        source: "proptest".into(),
                        layers,
                        hidden,
                        ffn_hidden: 4 * hidden,
                        heads,
                        kv_heads: kv,
                        head_dim,
                        vocab,
                        tied_embeddings: false,
                        mlp: if gated {
                            MlpKind::Gated
                        } else {
                            MlpKind::Plain
                        },
                        dropout: false,
                        bias: false,
                        qkv_bias: false,
                        norm: None,
                        mla: None,
                        moe,
                        sliding_window: None,
                        sandwich_norms: false,
                        glu_clamp: None,
                        attention_sinks: false,
                        mtp_layers: 0,
                    }
                })
        }

        fn finite(e: &Estimate) -> bool {
            let nums = [
                e.step_secs,
                e.tokens_per_sec_per_gpu,
                e.mfu,
                e.hfu,
                e.bubble_fraction,
                e.exposed_comm_fraction,
                e.memory.total,
                e.time.compute.total(),
                e.time.bubble,
                e.time.exposed_comm,
            ];
            nums.iter().all(|x| x.is_finite() && *x >= 0.0)
                && e.comm.iter().all(|t| {
                    t.total_secs.is_finite()
                        && t.exposed_secs >= 0.0
                        && t.exposed_secs <= t.total_secs * (1.0 + 1e-9)
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

            /// Every reported plan is valid, fits, uses every GPU, and has finite numbers.
            #[test]
            fn reported_plans_satisfy_invariants(m in model(), nodes_log in 0u32..=12, seq_log in 7u32..=15, gbs_mult in 1u64..=64, gpu in prop::sample::select(vec!["h100-sxm", "a100-80g", "gb200-nvl72", "mi300x"])) {
                let profile = builtin_profile(gpu).unwrap();
                let gpus = profile.node.gpus_per_node << nodes_log;
                let c = Cluster::new(profile, gpus).unwrap();
                let w = Workload { seq: 1 << seq_log, global_batch: 8 * gbs_mult, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
                let r = search(&m, &c, &w, &SearchSpace::default(), 5);
                prop_assert_eq!(r.enumerated, r.valid + r.rejected.values().sum::<u64>());
                for cand in &r.top {
                    prop_assert_eq!(cand.config.gpus(), gpus);
                    prop_assert!(cand.config.check(&m, &c, &w).is_ok());
                    prop_assert!(cand.estimate.memory.total <= c.profile.hbm_bytes());
                    prop_assert!(finite(&cand.estimate), "non-finite number in {:?}", cand.estimate);
                    prop_assert_eq!(cand.estimate.stages.iter().map(|s| s.layers).sum::<u64>(), m.layers);
                }
            }

        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 1000, .. ProptestConfig::default() })]

            /// No plan the search reports, nor its closed-form screening estimate,
            /// is faster than its physical floor ([`crate::floor`]), computed from
            /// the stage times alone. Small global batches reach the m < p corners.
            #[test]
            fn reported_plans_respect_their_floors(m in model(), nodes_log in 0u32..=3, seq_log in 8u32..=13, gbs in 1u64..=96, gpu in prop::sample::select(vec!["h100-sxm", "a100-80g", "gb200-nvl72", "h800"])) {
                let profile = builtin_profile(gpu).unwrap();
                let gpus = profile.node.gpus_per_node.min(8) << nodes_log;
                let c = Cluster::new(profile, gpus).unwrap();
                let w = Workload { seq: 1 << seq_log, global_batch: gbs, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
                let r = search(&m, &c, &w, &SearchSpace::default(), 5);
                let below = |e: &Estimate, cfg: &ParallelConfig| {
                    let f = crate::floor::floor_of(e, cfg);
                    (e.step_secs < f.step_secs() * (1.0 - 1e-9)).then(|| format!("{cfg:?}: step {} below its {} floor {}", e.step_secs, f.binding(), f.step_secs()))
                };
                for cand in &r.top {
                    prop_assert!(below(&cand.estimate, &cand.config).is_none(), "{}", below(&cand.estimate, &cand.config).unwrap());
                    let closed = estimate_unbanded(&m, &c, &w, &cand.config, Assumptions::default()).unwrap();
                    prop_assert!(below(&closed, &cand.config).is_none(), "closed form: {}", below(&closed, &cand.config).unwrap());
                }
                for s in &r.sensitivity {
                    let e = estimate_unbanded(&m, &c, &w, &s.config, Assumptions::default()).unwrap();
                    prop_assert!(below(&e, &s.config).is_none(), "sensitivity: {}", below(&e, &s.config).unwrap());
                }
            }

        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

            /// With `--rank-by upper`, a plan whose band was widened for leaving the
            /// validated runs is never ranked first while a plan inside them has its
            /// point estimate within that band. The inside plans are taken from an
            /// independent search ranked by point estimate.
            #[test]
            fn upper_ranking_never_lets_an_untested_corner_win_on_its_point(m in model(), nodes_log in 0u32..=3, seq_log in 10u32..=13, gbs in 8u64..=256, gpu in prop::sample::select(vec!["h100-sxm", "a100-80g", "h800"])) {
                use crate::reach::RankBy;
                let profile = builtin_profile(gpu).unwrap();
                let c = Cluster::new(profile, 8 << nodes_log).unwrap();
                let w = Workload { seq: 1 << seq_log, global_batch: gbs, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
                // As users run it: the CLI's default top 10.
                let up = search(&m, &c, &w, &SearchSpace { rank_by: RankBy::Upper, ..SearchSpace::default() }, 10);
                let pt = search(&m, &c, &w, &SearchSpace { rank_by: RankBy::Point, ..SearchSpace::default() }, 30);
                if let Some(first) = up.top.first() {
                    let band = first.estimate.band.as_ref().expect("ranked plans carry a band");
                    if !band.outside.is_empty() {
                        for inside in pt.top.iter().filter(|p| p.estimate.band.as_ref().is_some_and(|b| b.outside.is_empty())) {
                            prop_assert!(inside.estimate.step_secs > band.high_secs * (1.0 - 1e-9),
                                "{:?} (outside: {:?}) ranked first with upper end {} although {:?} inside the validated runs takes {}",
                                first.config, band.outside, band.high_secs, inside.config, inside.estimate.step_secs);
                        }
                    }
                }
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

            /// More HBM never removes a valid plan.
            #[test]
            fn more_memory_never_rejects_more(m in model(), seq_log in 9u32..=14) {
                let small = builtin_profile("h100-sxm").unwrap();
                let mut big = small.clone();
                big.gpu.hbm_gib *= 2.0;
                let w = Workload { seq: 1 << seq_log, global_batch: 64, precision: Precision::Bf16, moe_imbalance: 1.0, moe_capacity: None };
                let a = search(&m, &Cluster::new(small, 64).unwrap(), &w, &SearchSpace::default(), 1);
                let b = search(&m, &Cluster::new(big, 64).unwrap(), &w, &SearchSpace::default(), 1);
                prop_assert!(b.valid >= a.valid);
            }
        }
    }
}
