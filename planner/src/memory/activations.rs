//! Activation memory: bytes per layer per micro-batch (Korthikanti et al. 2022,
//! generalised; recomputation and torchtitan's op-level policy), and how many
//! micro-batches' activations a stage holds at its peak under each schedule.

use crate::config::{ParallelConfig, Recompute, RecomputeModules, Workload};
use crate::cost::{Assumptions, Framework};
use crate::model::{MlpKind, ModelSpec};
use crate::schedule::Schedule;

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
    // nanotron's multi-head (not grouped) attention takes Q, K and V as views of
    // one contiguous copy of the QKV output, then concatenates K and V into a
    // second copy for the rotary embedding (models/llama.py:469-474, 655-660 at
    // e24d2483); flash-attn keeps the query view, and so the whole first copy:
    // K and V are held twice.
    if a.framework == Framework::Nanotron && model.mla.is_none() && model.heads == model.kv_heads {
        inside += 2.0 * 2.0 * kv_rank;
    }
    // The attention output, input of the output projection.
    inside += gemm_in * model.attn_out_dim() as f64 / t;
    if let Some(m) = &model.mla {
        // Latent projections are replicated across TP: their inputs are kept.
        outside += 2.0 * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim) as f64;
    }
    // Softmax statistics (flash) or the score matrices (unfused: softmax output 2,
    // dropout mask 1, dropout output 2 bytes per score), which "core_attn" drops.
    // ScaleTorch's ring attention (its context parallelism, unfused) keeps only
    // q, k, v, the output and the log-sum-exp and recomputes the scores in the
    // backward (parallel/context_parallel/context_parallel.py RingAttentionFunc).
    let ring = cfg.cp > 1 && a.framework == crate::cost::Framework::ScaleTorch;
    let scores = if flash || ring || dropped(RecomputeModules::CORE_ATTN) {
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
    // torchtitan's `w2(silu(w1(x)) * w3(x))`, ScaleTorch's
    // `down_proj(silu(gate_proj(x)) * up_proj(x))`, models/llama.py:247-249 at
    // c4c08ac) also keeps the activation's output for the product's backward.
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
