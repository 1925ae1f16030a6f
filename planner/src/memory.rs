//! Per-GPU memory of one pipeline stage.
//!
//! Model state follows Megatron-LM's theoretical memory accounting
//! (`megatron/training/theoretical_memory_usage.py`): mixed-precision Adam keeps a
//! 2-byte weight, a 4-byte FP32 main gradient and 12 bytes of optimizer state (FP32
//! master weight, momentum, variance) per parameter, i.e. 18 bytes, or
//! `6 + 12 / dp` with the distributed optimizer. ZeRO-2 also shards the gradient,
//! ZeRO-3 the weight. Dense parameters shard over DP x CP, expert parameters over
//! the expert-data-parallel group.
//!
//! Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation
//! in Large Transformer Models", arXiv 2205.05198), section 4, generalised term by
//! term to grouped-query attention, gated MLPs, MLA and MoE. For GPT (MHA, 4h GeLU
//! MLP, dropout) the per-layer bytes reduce to the paper's `sbh(34 + 5as/h)` without
//! parallelism, `sbh(10 + 24/t + 5as/(ht))` with TP, `sbh/t (34 + 5as/h)` with TP+SP,
//! `34 sbh/t` with selective recomputation (and with flash attention, which never
//! stores the score matrix), and `2sbh/t` per layer with full recomputation.

use serde::{Deserialize, Serialize};

use crate::config::{ParallelConfig, Recompute, RecomputeModules, Workload, Zero};
use crate::cost::{Assumptions, Framework};
use crate::model::{MlpKind, ModelSpec};
use crate::schedule::Schedule;

/// Bytes per parameter kept for training (Megatron mixed precision with Adam).
pub const WEIGHT_BYTES: f64 = 2.0;
pub const GRAD_BYTES: f64 = 4.0;
pub const OPTIMIZER_BYTES: f64 = 12.0;
/// With Megatron's precision-aware optimizer and BF16 moments: FP32 master weight
/// (4) and two BF16 moments (2 + 2).
pub const OPTIMIZER_BYTES_BF16_MOMENTS: f64 = 8.0;

/// Memory of one GPU in one pipeline stage, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StageMemory {
    pub stage: u64,
    /// Parameters held (dense + expert), count.
    pub params: f64,
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    /// Stored activations of all in-flight micro-batches, plus the working set of
    /// the layer being recomputed or back-propagated.
    pub activations: f64,
    /// Logits and loss buffers on the last stage.
    pub logits: f64,
    /// A framework's buffers beside the model state ([`framework_buffers`]):
    /// PyTorch DDP's gradient buckets, FSDP2's unsharded parameters and gradients.
    pub buffers: f64,
    /// Allocator fragmentation on top of the activations, logits and buffers.
    pub fragmentation: f64,
    /// CUDA context, NCCL and library workspaces.
    pub reserve: f64,
    pub total: f64,
    /// Micro-batches whose activations are stored at the peak.
    pub in_flight: f64,
}

/// What a measured peak memory counts, as its source states it. Sources read one of
/// PyTorch's caching-allocator statistics (`torch.cuda.memory_stats()`):
/// `allocated_bytes.all.peak` (`max_memory_allocated`), `reserved_bytes.all.peak`
/// (`max_memory_reserved`) or `active_bytes.all.peak`. None of them sees the CUDA
/// context, NCCL's own buffers or anything else allocated outside PyTorch's
/// allocator, which is what [`StageMemory::reserve`] stands for; only the reserved
/// peak sees the cached but unused blocks that [`StageMemory::fragmentation`]
/// stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemKind {
    /// Peak of the bytes in allocated blocks (live tensors, each rounded up to the
    /// allocator's 512-byte granule).
    PeakAllocated,
    /// Peak of the bytes the allocator holds from CUDA: live tensors, the blocks
    /// cached for reuse and the rounding of every block.
    PeakReserved,
    /// Peak of the bytes in active blocks: the allocated ones, and blocks freed
    /// while another stream may still use them.
    PeakActive,
}

impl MemKind {
    pub const NAMES: &'static str = "peak_allocated, peak_reserved, peak_active";

    pub fn parse(s: &str) -> Option<MemKind> {
        match s {
            "peak_allocated" => Some(MemKind::PeakAllocated),
            "peak_reserved" => Some(MemKind::PeakReserved),
            "peak_active" => Some(MemKind::PeakActive),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MemKind::PeakAllocated => "peak_allocated",
            MemKind::PeakReserved => "peak_reserved",
            MemKind::PeakActive => "peak_active",
        }
    }

    /// The part of a stage's predicted memory that a measurement of this kind
    /// counts: the tensors (weights, gradients, optimizer state, activations,
    /// logits, framework buffers) for the allocated and active peaks, plus the
    /// fragmentation for the
    /// reserved peak. The reserve (CUDA context, NCCL, library workspaces outside
    /// the allocator) is in no PyTorch statistic.
    pub fn comparable_bytes(self, m: &StageMemory) -> f64 {
        let tensors = m.weights + m.gradients + m.optimizer + m.activations + m.logits + m.buffers;
        match self {
            MemKind::PeakAllocated | MemKind::PeakActive => tensors,
            MemKind::PeakReserved => tensors + m.fragmentation,
        }
    }
}

/// Activation bytes of one layer for one micro-batch on one GPU, and the bytes of
/// the same layer when nothing is recomputed (the working set of a recomputed layer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerActivations {
    pub stored: f64,
    pub full: f64,
}

/// Which flavour of layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    Dense,
    Moe,
}

/// Activation bytes per layer per micro-batch on one GPU.
///
/// `tokens` is the micro-batch's tokens on this CP rank (mbs * seq / cp), before
/// sequence-parallel sharding. Selective recomputation drops the tensors of the
/// modules it replays ([`RecomputeModules`]), or under torchtitan keeps what its
/// op-level policy saves ([`op_sac_per_token`]); `full` is the same layer with
/// nothing dropped (the working set while a recomputed layer is back-propagated).
pub fn layer_activations(
    model: &ModelSpec,
    cfg: &ParallelConfig,
    w: &Workload,
    kind: LayerKind,
    a: Assumptions,
) -> LayerActivations {
    let tokens = (cfg.mbs * w.seq / cfg.cp) as f64;
    let full = per_token_activations(model, cfg, w, kind, a, |_| false) * tokens;
    let stored = match cfg.recompute {
        Recompute::Full => {
            2.0 * model.hidden as f64 / if cfg.sp { cfg.tp as f64 } else { 1.0 } * tokens
        }
        Recompute::None => full,
        Recompute::Selective if op_sac_applies(model, kind, a) => {
            op_sac_per_token(model, cfg) * tokens
        }
        Recompute::Selective => {
            per_token_activations(model, cfg, w, kind, a, |m| cfg.recomputes(m)) * tokens
        }
    };
    LayerActivations { stored, full }
}

/// Whether a layer's selective recomputation is torchtitan's op-level policy
/// ([`op_sac_per_token`]): torchtitan's dense layers without MLA. Its MoE and MLA
/// layers are priced as Megatron's module-level recomputation (no published run
/// measures them).
pub fn op_sac_applies(model: &ModelSpec, kind: LayerKind, a: Assumptions) -> bool {
    a.framework == Framework::Torchtitan && kind == LayerKind::Dense && model.mla.is_none()
}

/// The matrix multiplications of a dense layer's forward in the order torchtitan's
/// Llama runs them (torchtitan/models/llama/model.py: `wq`, `wk`, `wv`, `wo`, then
/// `w1`, `w3`, `w2` for a gated MLP or `w1`, `w2` for a plain one), each as the
/// width of its output on one GPU and its input width. The row-parallel `wo` and
/// `w2` produce full-width partial sums that TP then reduce-scatters.
pub fn torchtitan_mms(model: &ModelSpec, tp: u64) -> Vec<(f64, f64)> {
    let t = tp as f64;
    let h = model.hidden as f64;
    let f = model.ffn_hidden as f64 / t;
    let kv = kv_dim_per_rank(model, tp) as f64;
    let mut mms = vec![
        (model.q_dim() as f64 / t, h),
        (kv, h),
        (kv, h),
        (h, model.attn_out_dim() as f64 / t),
    ];
    match model.mlp {
        MlpKind::Gated => mms.extend([(f, h), (f, h), (h, f)]),
        MlpKind::Plain => mms.extend([(f, h), (h, f)]),
    }
    mms
}

/// Stored bytes per token of one dense layer under torchtitan's op-level
/// selective activation checkpointing (`selective_ac_option = "op"`,
/// torchtitan/parallelisms/parallelize_llama.py at 9dec370, `_save_list` and
/// `_custom_policy`): the checkpointed block's input; the outputs of the odd-numbered
/// `aten.mm` calls of the block's forward (the policy saves every mm but every
/// second one, [`torchtitan_mms`]); the attention kernel's output and log-sum-exp;
/// and with TP the reduce-scatters' outputs (after `wo` and `w2`). Everything else
/// is recomputed in the backward. Float8 linears run `_scaled_mm`, which the list
/// does not name; they are priced as `mm` (no published run isolates them).
pub fn op_sac_per_token(model: &ModelSpec, cfg: &ParallelConfig) -> f64 {
    let t = cfg.tp as f64;
    let h = model.hidden as f64;
    let sp_div = if cfg.sp { t } else { 1.0 };
    let saved_mms: f64 = torchtitan_mms(model, cfg.tp)
        .iter()
        .step_by(2)
        .map(|&(out, _)| 2.0 * out)
        .sum();
    let attention = 2.0 * model.attn_out_dim() as f64 / t + 4.0 * model.heads as f64 / t;
    let reduce_scatters = if cfg.tp > 1 { 2.0 * 2.0 * h / t } else { 0.0 };
    2.0 * h / sp_div + saved_mms + attention + reduce_scatters
}

/// Stored bytes per token of one layer; `dropped(m)` says whether module `m`'s
/// tensors are discarded for recomputation.
fn per_token_activations(
    model: &ModelSpec,
    cfg: &ParallelConfig,
    w: &Workload,
    kind: LayerKind,
    a: Assumptions,
    dropped: impl Fn(RecomputeModules) -> bool,
) -> f64 {
    let flash = a.flash_attention;
    let t = cfg.tp as f64;
    let h = model.hidden as f64;
    // Tensors outside the TP region are split by SP, replicated without it.
    let sp_div = if cfg.sp { t } else { 1.0 };
    let mask = if model.dropout { 1.0 } else { 0.0 };
    // Bytes per element of a GEMM input kept for the weight gradient: Transformer
    // Engine keeps the FP8 cast of an FP8 GEMM's input instead of the BF16 tensor.
    let gemm_in = if w.precision.is_fp8() { 1.0 } else { 2.0 };
    // The norms' outputs are the QKV and FC1 inputs; "layernorm" recomputes them.
    let norm_out = if dropped(RecomputeModules::LAYERNORM) {
        0.0
    } else {
        gemm_in * h
    };

    // Attention block: LayerNorm input, QKV input, the dropout mask after the
    // output projection (1 byte).
    let mut outside = 2.0 * h + norm_out + mask * h;
    let kv_rank = kv_dim_per_rank(model, cfg.tp) as f64;
    // Q, K, V kept for the attention backward (split by TP); MLA's come out of
    // its up-projections, which "mla_up_proj" recomputes.
    let qkv = match &model.mla {
        // MLA's values are v_head_dim wide, narrower than its keys.
        Some(_) => {
            2.0 * (model.q_dim() + model.kv_dim() + model.heads * model.v_head_dim()) as f64 / t
        }
        None => 2.0 * model.q_dim() as f64 / t + 2.0 * 2.0 * kv_rank,
    };
    let mut inside = if model.mla.is_some() && dropped(RecomputeModules::MLA_UP_PROJ) {
        0.0
    } else {
        qkv
    };
    // The attention output, input of the output projection.
    inside += gemm_in * model.attn_out_dim() as f64 / t;
    if let Some(m) = &model.mla {
        // Latent projections are replicated across TP: their inputs are kept.
        outside += 2.0 * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim) as f64;
    }
    // Softmax statistics (flash) or the score matrices (unfused: softmax output 2,
    // dropout mask 1, dropout output 2 bytes per score), which "core_attn" drops.
    let scores = if flash || dropped(RecomputeModules::CORE_ATTN) {
        4.0 * model.heads as f64 / t
    } else {
        let kv_len = w.seq as f64 / cfg.cp as f64;
        (2.0 + 3.0 * mask) * model.heads as f64 * kv_len / t
    };
    inside += scores;

    // MLP block: LayerNorm input, MLP input, dropout mask.
    outside += 2.0 * h + norm_out + mask * h;
    // Sandwich norms: the inputs of the norms after attention and after the MLP
    // (the output projections' outputs); their outputs feed only a residual add.
    if model.sandwich_norms {
        outside += 2.0 * 2.0 * h;
    }
    // First projection's output (both halves when gated) and the activation output
    // (the second projection's input); `act_dropped` for "moe_act". Megatron-Core's
    // fused SwiGLU (`bias_swiglu_impl`) keeps only its input and recomputes the
    // activation; a GLU run as separate ops (nanotron's `GLUActivation`,
    // torchtitan's `w2(silu(w1(x)) * w3(x))`) also keeps the activation's output
    // for the product's backward.
    let separate_glu = model.mlp == MlpKind::Gated && a.framework != Framework::MegatronCore;
    let mlp_inner = |ffn: f64, div: f64, act_dropped: bool| -> f64 {
        let first = model.mlp.matrices() as f64 - 1.0;
        let act_out = if separate_glu && !act_dropped {
            2.0 * ffn
        } else {
            0.0
        };
        (2.0 * first * ffn + if act_dropped { 0.0 } else { gemm_in * ffn } + act_out) / div
    };
    let moe_load = model
        .moe
        .as_ref()
        .map_or(1.0, |moe| w.moe_rank_load(moe, cfg.ep).factor);
    match (kind, &model.moe) {
        (LayerKind::Moe, Some(moe)) => {
            if dropped(RecomputeModules::MOE) {
                // Only the block's input (the norm output, counted above) is kept.
                return outside / sp_div + inside;
            }
            // Routed tokens on this rank: (tokens / tp) * top_k, gathered over expert
            // TP; each keeps its permuted input (the first grouped GEMM's input), the
            // expert's inner activations split by expert TP, and its routing
            // probability (fp32). Megatron-Core multiplies the probabilities inside
            // the activation function (`weighted_bias_swiglu_impl`,
            // megatron/core/transformer/moe/experts.py), so unpermuting stores
            // nothing but its index map.
            let etp = cfg.etp as f64;
            let routed = moe.top_k as f64 * moe_load / t * etp;
            let expert = routed
                * (gemm_in * h
                    + mlp_inner(
                        moe.expert_ffn_hidden as f64,
                        etp,
                        dropped(RecomputeModules::MOE_ACT),
                    )
                    + 4.0);
            let shared = if dropped(RecomputeModules::SHARED_EXPERTS) {
                0.0
            } else {
                mlp_inner(moe.shared_hidden() as f64, t, false)
            };
            // Router logits and probabilities (fp32) per token.
            let router = 8.0 * moe.experts as f64 / t;
            outside / sp_div + inside + expert + shared + router
        }
        _ => {
            let mlp = if dropped(RecomputeModules::MLP) {
                0.0
            } else {
                mlp_inner(model.ffn_hidden as f64, t, false)
            };
            outside / sp_div + inside + mlp
        }
    }
}

/// Width of K (or V) held by one TP rank: KV heads split when TP divides them,
/// replicated (one head per rank) when TP exceeds them.
pub fn kv_dim_per_rank(model: &ModelSpec, tp: u64) -> u64 {
    if model.mla.is_some() {
        return model.kv_dim() / tp;
    }
    let heads_per_rank = (model.kv_heads / tp).max(1);
    heads_per_rank * model.head_dim
}

/// Micro-batches (in units of one stage's worth of layers) whose activations stage
/// `stage` holds at its peak under the configuration's pipeline schedule.
///
/// Non-interleaved 1F1B: stage i warms up with p - i - 1 forwards, so it holds
/// min(m, p - i). Interleaved with v chunks: rank i runs `(p - i - 1) * 2 + (v - 1) * p`
/// warm-up chunks (Megatron `get_forward_backward_func` interleaved schedule), each a
/// 1/v share of the stage, so the first stage holds `p + (p - 1) / v` stage-worths —
/// Korthikanti et al.'s `L (1 + (p-1)/(p v))` for the whole model. ZB-H1 frees a
/// micro-batch at its W, which never runs later than 1F1B would have freed it in
/// the warm-up count, so it holds 1F1B's count (Qi et al. 2023). GPipe holds every
/// micro-batch. DualPipe holds p + 1 stage-worths on every rank, over its two
/// chunks (DeepSeek-V3 report, Table 2; the simulator's peak, see
/// `schedule::tests::dualpipe_memory_relation`).
pub fn in_flight(cfg: &ParallelConfig, micro_batches: u64, stage: u64) -> f64 {
    let p = cfg.pp;
    let v = cfg.vpp;
    let m = micro_batches;
    match cfg.schedule {
        Schedule::Gpipe => return m as f64,
        Schedule::DualPipe => return (p + 1).min(m) as f64,
        _ => {}
    }
    if v == 1 {
        return (p - stage).min(m) as f64;
    }
    let warmup = ((p - stage - 1) * 2 + (v - 1) * p).min(m * v);
    let chunks = (warmup + 1).min(m * v);
    chunks as f64 / v as f64
}

/// Bytes per main-gradient element.
pub fn grad_bytes(cfg: &ParallelConfig) -> f64 {
    if cfg.bf16_grads {
        2.0
    } else {
        GRAD_BYTES
    }
}

/// Optimizer bytes per parameter.
pub fn optimizer_bytes(cfg: &ParallelConfig) -> f64 {
    if cfg.bf16_moments {
        OPTIMIZER_BYTES_BF16_MOMENTS
    } else {
        OPTIMIZER_BYTES
    }
}

/// Model state bytes (weights, gradients, optimizer) for `dense` and `expert`
/// parameters held by one GPU.
///
/// torchtitan's FSDP2 (`fully_shard` with `MixedPrecisionPolicy(param_dtype=bf16,
/// reduce_dtype=fp32)`, parallelize_llama.py) keeps the sharded parameter in FP32
/// as the optimizer's own, the sharded gradient in FP32 and Adam's two FP32
/// moments: 4 + 4 + 8 bytes per parameter over the shard group, with no BF16 copy
/// at rest (its all-gathered BF16 copies are [`framework_buffers`]).
pub fn model_state(
    cfg: &ParallelConfig,
    dense: f64,
    expert: f64,
    framework: Framework,
) -> (f64, f64, f64) {
    let dp_dense = (cfg.dp * cfg.cp) as f64;
    let dp_expert = cfg.edp() as f64;
    if framework == Framework::Torchtitan && cfg.zero == Zero::Zero3 {
        let sharded = dense / dp_dense + expert / dp_expert;
        let moments = if cfg.bf16_moments { 4.0 } else { 8.0 };
        return (4.0 * sharded, 4.0 * sharded, moments * sharded);
    }
    let shard = |params: f64, dp: f64, sharded: bool| if sharded { params / dp } else { params };
    let (w_shard, g_shard, o_shard) = match cfg.zero {
        Zero::None => (false, false, false),
        Zero::DistOpt => (false, false, true),
        Zero::Zero2 => (false, true, true),
        Zero::Zero3 => (true, true, true),
    };
    // FP8 weight casts are transient workspaces, as in Megatron's own accounting;
    // the BF16 weight stays the stored copy.
    let weights =
        WEIGHT_BYTES * (shard(dense, dp_dense, w_shard) + shard(expert, dp_expert, w_shard));
    let grads =
        grad_bytes(cfg) * (shard(dense, dp_dense, g_shard) + shard(expert, dp_expert, g_shard));
    let optim = optimizer_bytes(cfg)
        * (shard(dense, dp_dense, o_shard) + shard(expert, dp_expert, o_shard));
    (weights, grads, optim)
}

/// Bytes per logit (one token, one vocabulary entry on this rank) the loss holds
/// at its peak. Megatron-Core keeps the BF16 logits and an FP32 copy (its unfused
/// loss subtracts the maximum in place). nanotron returns the FP32 cast from the
/// model (the BF16 logits die with the forward) and `sharded_cross_entropy`
/// subtracts the maximum into a second FP32 tensor (nanotron/parallel/
/// tensor_parallel/functional.py): 8. torchtitan's `cross_entropy(pred.float())`
/// keeps the FP32 log-softmax for its backward; after `del pred` that backward
/// holds it with the incoming and the outgoing FP32 gradient (train.py at 9dec370):
/// 12.
pub fn logit_bytes(framework: Framework) -> f64 {
    match framework {
        Framework::MegatronCore => 2.0 + 4.0,
        Framework::Nanotron => 4.0 + 4.0,
        Framework::Torchtitan => 4.0 + 4.0 + 4.0,
    }
}

/// What a stage holds of its parameters, for [`framework_buffers`] (counts per
/// GPU, before data-parallel sharding).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HeldParams {
    /// Every parameter of the rank's stages.
    pub all: f64,
    /// The largest transformer layer.
    pub layer: f64,
    /// The embedding and output layer (FSDP2's root module).
    pub root: f64,
}

/// A framework's buffers beside the model state, bytes.
///
/// - nanotron wraps the model in PyTorch's `DistributedDataParallel` (trainer.py),
///   whose reducer keeps gradient buckets the size of the gradients in the
///   parameters' BF16 unless `gradient_as_bucket_view` is set (PyTorch DDP
///   documentation), which nanotron does not: 2 bytes per parameter with
///   data parallelism.
/// - torchtitan's FSDP2 all-gathers BF16 parameters. Without pipelining each
///   transformer block is its own unit: the block at work and the one prefetched
///   (2 x 2 bytes per block parameter), the block's unsharded gradient in BF16
///   and its FP32 upcast for the reduce-scatter (2 + 4), and the root module's
///   embedding and output layer, gathered again for the backward (2). With
///   pipelining torchtitan does not reshard after the forward
///   (`reshard_after_forward=False`), and torch.distributed.pipelining turns
///   gradient reduction off for all but the last micro-batch's backward
///   (`set_requires_gradient_sync(False)`), so FSDP2 accumulates unsharded
///   gradients in the FP32 reduce dtype: the stage's BF16 parameters (2) and,
///   with more than one micro-batch, its FP32 gradients (4).
pub fn framework_buffers(
    framework: Framework,
    cfg: &ParallelConfig,
    held: HeldParams,
    micro_batches: u64,
) -> f64 {
    match framework {
        Framework::MegatronCore => 0.0,
        Framework::Nanotron => {
            if cfg.dp * cfg.cp > 1 && matches!(cfg.zero, Zero::None | Zero::DistOpt) {
                2.0 * held.all
            } else {
                0.0
            }
        }
        Framework::Torchtitan if cfg.zero == Zero::Zero3 => {
            let block_grads = (2.0 + 4.0) * held.layer;
            if cfg.pp > 1 {
                2.0 * held.all
                    + if micro_batches > 1 {
                        4.0 * held.all
                    } else {
                        block_grads
                    }
            } else {
                2.0 * 2.0 * held.layer + block_grads + 2.0 * held.root
            }
        }
        Framework::Torchtitan => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dispatcher, Layout, Overlap, Precision};
    use crate::presets::gpt;

    fn cfg(tp: u64, sp: bool, recompute: Recompute) -> ParallelConfig {
        ParallelConfig {
            tp,
            pp: 1,
            vpp: 1,
            cp: 1,
            ep: 1,
            etp: 1,
            dp: 1,
            sp,
            mbs: 1,
            zero: Zero::None,
            recompute,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: Schedule::OneFOneB,
        }
    }

    fn assume(flash: bool) -> Assumptions {
        Assumptions {
            flash_attention: flash,
            ..Assumptions::default()
        }
    }

    fn w(seq: u64) -> Workload {
        Workload {
            seq,
            global_batch: 1,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        }
    }

    /// Korthikanti et al. 2022, Table 2, evaluated for GPT-3 175B (s=2048, h=12288,
    /// a=96, b=1, t=8): the per-layer activation bytes of each technique.
    #[test]
    fn korthikanti_table_2() {
        let m = gpt("gpt3-175b", "test", 96, 12288, 96);
        let (s, h, a, t) = (2048.0, 12288.0, 96.0, 8.0);
        let sbh = s * h;
        let cases = [
            // (tp, sp, recompute, flash, paper formula)
            (
                1,
                false,
                Recompute::None,
                false,
                sbh * (34.0 + 5.0 * a * s / h),
            ),
            (
                8,
                false,
                Recompute::None,
                false,
                sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t)),
            ),
            (
                8,
                true,
                Recompute::None,
                false,
                sbh / t * (34.0 + 5.0 * a * s / h),
            ),
            (
                8,
                false,
                Recompute::Selective,
                false,
                sbh * (10.0 + 24.0 / t),
            ),
            (8, true, Recompute::Selective, false, sbh / t * 34.0),
            (8, true, Recompute::Full, false, 2.0 * sbh / t),
            (8, false, Recompute::Full, false, 2.0 * sbh),
        ];
        for (tp, sp, rc, flash, expect) in cases {
            let got = layer_activations(
                &m,
                &cfg(tp, sp, rc),
                &w(2048),
                LayerKind::Dense,
                assume(flash),
            )
            .stored;
            // The flash-attention statistics (4 bytes per head per token) are
            // counted for selective and are below 0.1% of the total.
            let err = (got - expect).abs() / expect;
            assert!(
                err < 0.001,
                "tp{tp} sp{sp} {rc:?}: got {got}, paper {expect}, err {err}"
            );
        }
    }

    #[test]
    fn in_flight_matches_schedules() {
        let mut c = cfg(1, false, Recompute::None);
        c.pp = 4;
        assert_eq!(in_flight(&c, 16, 0), 4.0);
        assert_eq!(in_flight(&c, 16, 3), 1.0);
        assert_eq!(in_flight(&c, 2, 0), 2.0);
        c.schedule = Schedule::ZbH1;
        assert_eq!(in_flight(&c, 16, 0), 4.0);
        c.schedule = Schedule::DualPipe;
        assert_eq!((in_flight(&c, 16, 0), in_flight(&c, 16, 2)), (5.0, 5.0));
        c.schedule = Schedule::Gpipe;
        assert_eq!(in_flight(&c, 16, 3), 16.0);
        c.vpp = 2;
        c.schedule = Schedule::Interleaved;
        // p + (p-1)/v = 4 + 3/2 for the first stage.
        assert_eq!(in_flight(&c, 16, 0), 5.5);
    }

    /// Megatron's theoretical memory: 18 bytes per parameter, or 6 + 12/dp with the
    /// distributed optimizer.
    #[test]
    fn model_state_bytes_per_parameter() {
        let mut c = cfg(1, false, Recompute::None);
        c.dp = 8;
        let (wt, g, o) = model_state(&c, 1.0, 0.0, Framework::MegatronCore);
        assert_eq!(wt + g + o, 18.0);
        c.zero = Zero::DistOpt;
        let (wt, g, o) = model_state(&c, 1.0, 0.0, Framework::MegatronCore);
        assert_eq!(wt + g + o, 6.0 + 12.0 / 8.0);
        c.zero = Zero::Zero3;
        let (wt, g, o) = model_state(&c, 1.0, 0.0, Framework::MegatronCore);
        assert_eq!(wt + g + o, 18.0 / 8.0);
    }

    /// Each fine-grained recompute module drops exactly its tensors, by hand:
    /// "layernorm" the two norm outputs (2 bytes x h / t each with SP), MLA's
    /// "mla_up_proj" Q, K and V, "moe_act" each routed copy's activation output
    /// (2 x expert ffn), "mlp" the dense MLP's inner tensors; BF16 moments cost 8
    /// optimizer bytes per parameter instead of 12.
    /// Norms after attention and after the MLP keep their inputs (2 bytes x h
    /// each per token, split by SP) and nothing else; full recomputation keeps
    /// only the layer input either way.
    #[test]
    fn sandwich_norms_keep_their_inputs() {
        let plain = gpt("gpt", "test", 24, 4096, 32);
        let sandwich = ModelSpec {
            sandwich_norms: true,
            ..plain.clone()
        };
        for (tp, sp, rc) in [
            (1, false, Recompute::None),
            (8, true, Recompute::Selective),
            (8, false, Recompute::Selective),
            (8, true, Recompute::Full),
        ] {
            let c = cfg(tp, sp, rc);
            let per_token = |m: &ModelSpec| {
                layer_activations(m, &c, &w(4096), LayerKind::Dense, assume(true)).stored / 4096.0
            };
            let expect = match rc {
                Recompute::Full => 0.0,
                _ => 2.0 * 2.0 * 4096.0 / if sp { tp as f64 } else { 1.0 },
            };
            let got = per_token(&sandwich) - per_token(&plain);
            assert!((got - expect).abs() < 1e-9, "tp{tp} sp{sp} {rc:?}: {got}");
        }
    }

    #[test]
    fn recompute_modules_drop_their_tensors() {
        use crate::presets::resolve;
        let bytes = |model: &ModelSpec, c: &ParallelConfig, kind| {
            layer_activations(model, c, &w(4096), kind, assume(true)).stored / 4096.0
        };
        let sel = |base: &ParallelConfig, m: &str| ParallelConfig {
            recompute: Recompute::Selective,
            recompute_modules: RecomputeModules::parse(m).unwrap(),
            ..base.clone()
        };

        let g = gpt("gpt", "test", 24, 4096, 32);
        let base = cfg(8, true, Recompute::None);
        let (h, t) = (4096.0, 8.0);
        let none = bytes(&g, &base, LayerKind::Dense);
        assert!(
            (none - bytes(&g, &sel(&base, "layernorm"), LayerKind::Dense) - 2.0 * 2.0 * h / t)
                .abs()
                < 1e-9
        );
        // GeLU MLP: first output 2 x 4h and activation output 2 x 4h, over t.
        assert!(
            (none - bytes(&g, &sel(&base, "mlp"), LayerKind::Dense) - 2.0 * 2.0 * 4.0 * h / t)
                .abs()
                < 1e-9
        );
        // Megatron's default set changes nothing with flash attention.
        assert_eq!(none, bytes(&g, &sel(&base, "core_attn"), LayerKind::Dense));

        let ds = resolve("deepseek-v3").unwrap().spec;
        let mla = ParallelConfig {
            ep: 8,
            ..cfg(1, false, Recompute::None)
        };
        let none = bytes(&ds, &mla, LayerKind::Moe);
        let qkv = 2.0 * (128.0 * 192.0) + 2.0 * (128.0 * 192.0) + 2.0 * (128.0 * 128.0);
        assert!(
            (none - bytes(&ds, &sel(&mla, "mla_up_proj"), LayerKind::Moe) - qkv).abs() < 1e-6,
            "{}",
            none - bytes(&ds, &sel(&mla, "mla_up_proj"), LayerKind::Moe)
        );
        assert!(
            (none - bytes(&ds, &sel(&mla, "moe_act"), LayerKind::Moe) - 8.0 * 2.0 * 2048.0).abs()
                < 1e-6
        );
        // "moe" keeps only the block input: less than any of its parts alone.
        let moe = bytes(&ds, &sel(&mla, "moe"), LayerKind::Moe);
        assert!(moe < bytes(&ds, &sel(&mla, "moe_act"), LayerKind::Moe));
        // The working set of a recomputed layer is the unrecomputed layer.
        assert_eq!(
            layer_activations(
                &ds,
                &sel(&mla, "moe,mla_up_proj"),
                &w(4096),
                LayerKind::Moe,
                assume(true)
            )
            .full,
            none * 4096.0
        );

        let adam = ParallelConfig {
            bf16_moments: true,
            ..cfg(1, false, Recompute::None)
        };
        assert_eq!(model_state(&adam, 1.0, 0.0, Framework::MegatronCore).2, 8.0);
        assert_eq!(
            model_state(
                &cfg(1, false, Recompute::None),
                1.0,
                0.0,
                Framework::MegatronCore
            )
            .2,
            12.0
        );
    }

    /// The frameworks' memory layouts, by hand for Llama 3 8B (h 4096, FFN 14336,
    /// 32 heads, 8 KV heads of 128).
    #[test]
    fn framework_layouts_by_hand() {
        use crate::presets::resolve;
        let m = resolve("llama3-8b").unwrap().spec;
        let (h, f) = (4096.0, 14336.0);
        let fw = |framework| Assumptions {
            framework,
            ..Assumptions::default()
        };
        // torchtitan's op-level SAC at TP 1: the block input, wq's and wv's outputs
        // (mms 1 and 3), w1's and w2's (mms 5 and 7), the attention output and its
        // log-sum-exp.
        let c1 = cfg(1, false, Recompute::Selective);
        let by_hand = 2.0 * h + 2.0 * h + 2.0 * 1024.0 + 2.0 * f + 2.0 * h + 2.0 * h + 4.0 * 32.0;
        assert_eq!(op_sac_per_token(&m, &c1), by_hand);
        let sac = layer_activations(
            &m,
            &c1,
            &w(8192),
            LayerKind::Dense,
            fw(Framework::Torchtitan),
        );
        assert_eq!(sac.stored, by_hand * 8192.0);
        // At TP 8 with SP: the sharded outputs, w2's full-width partial sum, and
        // both reduce-scatters' outputs.
        let c8 = cfg(8, true, Recompute::Selective);
        let by_hand8 = 2.0 * h / 8.0
            + 2.0 * h / 8.0
            + 2.0 * 128.0
            + 2.0 * f / 8.0
            + 2.0 * h
            + 2.0 * h / 8.0
            + 4.0 * 32.0 / 8.0
            + 2.0 * 2.0 * h / 8.0;
        assert_eq!(op_sac_per_token(&m, &c8), by_hand8);
        // A GLU run as separate ops keeps the activation's output (2 bytes x FFN per
        // token) beside what Megatron-Core's fused SwiGLU keeps.
        let none = cfg(1, false, Recompute::None);
        let act = |framework| {
            layer_activations(&m, &none, &w(4096), LayerKind::Dense, fw(framework)).stored / 4096.0
        };
        assert_eq!(
            act(Framework::Nanotron) - act(Framework::MegatronCore),
            2.0 * f
        );
        assert_eq!(act(Framework::Torchtitan), act(Framework::Nanotron));
        // Loss buffers per logit.
        assert_eq!(
            [
                logit_bytes(Framework::MegatronCore),
                logit_bytes(Framework::Nanotron),
                logit_bytes(Framework::Torchtitan)
            ],
            [6.0, 8.0, 12.0]
        );
        // FSDP2's sharded state: FP32 parameter, gradient and two moments.
        let mut z3 = cfg(1, false, Recompute::None);
        z3.zero = Zero::Zero3;
        z3.dp = 8;
        let (wt, g, o) = model_state(&z3, 8.0, 0.0, Framework::Torchtitan);
        assert_eq!((wt, g, o), (4.0, 4.0, 8.0));
        // Buffers: DDP buckets with DP only; FSDP2 per block (two gathered, one
        // block's BF16 and FP32 gradients) and the root, or with PP the stage's
        // BF16 parameters and FP32 gradients.
        let held = HeldParams {
            all: 100.0,
            layer: 10.0,
            root: 5.0,
        };
        let mut ddp = cfg(1, false, Recompute::None);
        assert_eq!(framework_buffers(Framework::Nanotron, &ddp, held, 4), 0.0);
        ddp.dp = 2;
        assert_eq!(framework_buffers(Framework::Nanotron, &ddp, held, 4), 200.0);
        assert_eq!(
            framework_buffers(Framework::MegatronCore, &ddp, held, 4),
            0.0
        );
        assert_eq!(
            framework_buffers(Framework::Torchtitan, &z3, held, 4),
            40.0 + 60.0 + 10.0
        );
        z3.pp = 4;
        assert_eq!(
            framework_buffers(Framework::Torchtitan, &z3, held, 4),
            600.0
        );
        assert_eq!(
            framework_buffers(Framework::Torchtitan, &z3, held, 1),
            200.0 + 60.0
        );
    }
}
