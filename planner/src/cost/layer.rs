//! One layer's compute for one micro-batch on one GPU: the attention projections,
//! the core attention, the dense MLP or the routed experts, the element-wise
//! traffic, what recomputation replays, and the FLOPs for MFU and HFU. Its
//! communication is added by [`super::layer_comm`].

use crate::config::{Dispatcher, Recompute, RecomputeModules};
use crate::hardware::AttentionPass;
use crate::memory::{self, kv_dim_per_rank, LayerKind};
use crate::model::ModelSpec;

use super::kernel::{Ctx, Pass};
use super::OpClasses;
use super::{host, layer_comm};

/// Costs of one layer for one micro-batch on one GPU.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LayerCost {
    pub(super) fwd: OpClasses,
    pub(super) bwd: OpClasses,
    /// Extra forward time replayed by recomputation.
    pub(super) recompute: f64,
    pub(super) attn_core_fwd: f64,
    pub(super) attn_core_bwd: f64,
    /// GEMM time that TP overlap can hide communication behind.
    pub(super) gemm: f64,
    /// Weight-gradient GEMM time of the backward (the W pass of ZB-H1 and DualPipe).
    pub(super) wgrad: f64,
    /// Communication of this layer for one micro-batch: (total, exposed) per kind.
    pub(super) tp: (f64, f64),
    pub(super) cp: (f64, f64),
    pub(super) ep: (f64, f64),
    pub(super) etp: (f64, f64),
    pub(super) tp_calls: f64,
    pub(super) cp_calls: f64,
    /// Bytes of one CP ring step and of one ETP all-gather.
    pub(super) cp_bytes: f64,
    pub(super) etp_bytes: f64,
    pub(super) ep_calls: f64,
    pub(super) etp_calls: f64,
    /// Overlapped communication time (for the contention slowdown).
    pub(super) overlapped: f64,
    /// Model FLOPs (forward + backward, Megatron convention) of this layer.
    pub(super) model_flops: f64,
    /// Recomputed FLOPs.
    pub(super) recompute_flops: f64,
    /// Time the GPU waits for the host to issue this layer's kernels
    /// ([`super::host`]).
    pub(super) host_wait: f64,
}

impl LayerCost {
    /// Critical-path seconds for one micro-batch through this layer.
    pub(super) fn secs(&self) -> f64 {
        self.fwd.total()
            + self.bwd.total()
            + self.recompute
            + self.tp.1
            + self.cp.1
            + self.ep.1
            + self.etp.1
            + self.host_wait
    }
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

/// The attention projections of one micro-batch.
pub(super) struct Projections {
    /// Their GEMMs, forward and backward.
    pub(super) pass: Pass,
    /// What "mla_up_proj" replays: (time, FLOPs) of one forward of MLA's
    /// up-projections; zero without MLA.
    pub(super) mla_up: (f64, f64),
    /// Query and key/value widths on this TP rank.
    pub(super) q_rank: f64,
    pub(super) kv_rank: f64,
    /// The output projection's input width on this TP rank.
    pub(super) out_in: f64,
    /// Bytes the rotary embedding moves per element of Q and K ([`rotary_bytes`]).
    rotary_bytes: f64,
}

impl Projections {
    /// Rotary on Q and K, bytes per token.
    fn rotary(&self) -> f64 {
        self.rotary_bytes * (self.q_rank + self.kv_rank)
    }
}

/// Bytes the rotary embedding moves per element of Q and K in one forward.
/// Transformer Engine's fused kernel reads and writes each once (4). With a YaRN
/// attention factor other than 1, Megatron-Core falls back to its unfused rotary,
/// since the fused kernel takes no such factor (`apply_rotary_pos_emb`,
/// `models/common/embeddings/rope_utils.py` L279-284 at core_r0.16.0 55ac70825;
/// Megatron-Bridge also turns `apply_rope_fusion` off for any `yarn` position
/// embedding, `utils/fusions.py` L65-74 at v0.3.1). `_apply_rotary_pos_emb_bshd`
/// then runs five eager passes over Q and K: the negated half, its concatenation
/// (`_rotate_half`), the products with the cosine and the sine, their sum, and the
/// final `torch.cat` with the (empty) unrotated part: 6.5 reads and 5.5 writes of
/// BF16 elements, 24 bytes ([`ModelSpec::rotary_unfused`]). A rotary embedding
/// run eager ([`crate::cost::EagerOps::rotary`]) as the complex product torchtitan
/// writes (`xq.float()`, the product with the complex frequencies, `type_as`:
/// torchtitan/models/llama/model.py:108-112 at 9dec370, the same at v0.2.2 in
/// `models/llama3/model/model.py` `apply_rotary_emb`) reads 2 and writes 4, reads 4
/// and writes 4, reads 4 and writes 2: 20 bytes. Aleph Alpha's `scaling` runs
/// `rotate_half` in BF16 by default (`core/nn/rotary.py`; the complex product is
/// its opt-in): the products with the cosine and the sine, the negated half and
/// its concatenation, the sum, also 20. The backward follows the layer's
/// element-wise convention (twice the forward).
fn rotary_bytes(m: &ModelSpec, eager: bool) -> f64 {
    if m.rotary_unfused() {
        24.0
    } else if eager {
        ROTARY_EAGER_BYTES
    } else {
        4.0
    }
}

/// Bytes per element of Q and K of the eager complex rotary embedding's forward
/// ([`rotary_bytes`]).
const ROTARY_EAGER_BYTES: f64 = 20.0;

/// Bytes per element of the hidden size one RMSNorm moves in its forward. Fused
/// (Transformer Engine, Apex, a compiled graph): the BF16 input read and the
/// output written once, 4. Eager ([`crate::cost::EagerOps`]), as each code writes
/// it, BF16 2 bytes and FP32 4:
/// - `norm`, upcast first, as torchtitan wrote it before PyTorch's own
///   (`RMSNorm.forward` in torchtitan/models/norms.py at 9dec370:
///   `_norm(x.float()).type_as(x) * weight`): the upcast (read 2, write 4), the
///   square (4, 4), the mean (read 4), the product with the reciprocal root
///   (4, 4), the downcast (4, 2), the product with the BF16 weight (2, 2): 36.
///   PyTorch's composite `rms_norm` is the same chain with the weight applied
///   before the downcast (aten/src/ATen/native/layer_norm.cpp `rms_norm_composite`
///   at 3de78edb, the path before CUDA's `_fused_rms_norm`): 40.
/// - `norm-bf16`, in the input's BF16, as Aleph Alpha's `scaling` writes it
///   (src/scaling/core/nn/norm/rms_norm.py `_standard_forward` @ 737f855, its
///   layers built in BF16: `x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`,
///   then `.float().type_as(x)`, then `* weight`): the square (2, 2), the mean
///   (read 2), the product (2, 2), the round trip (2, 4 and 4, 2), the weight
///   (2, 2): 26.
///
/// The backward follows the layer's element-wise convention (twice the forward;
/// autograd's gradients of the FP32 chain count about 84 bytes op by op). A
/// LayerNorm is one native kernel, eager or not.
fn norm_bytes(m: &ModelSpec, eager: crate::cost::EagerOps) -> f64 {
    if m.norm_kind() != crate::model::Norm::RmsNorm {
        4.0
    } else if eager.norm {
        NORM_EAGER_BYTES
    } else if eager.norm_bf16 {
        NORM_EAGER_BF16_BYTES
    } else {
        4.0
    }
}

/// Bytes per element of the hidden size of an eager RMSNorm's forward upcast
/// first, and in BF16 ([`norm_bytes`]).
const NORM_EAGER_BYTES: f64 = 36.0;
const NORM_EAGER_BF16_BYTES: f64 = 26.0;

/// Extra bytes per element of a gated MLP's hidden width when its activation runs
/// eager ([`crate::cost::EagerOps::glu`]) as `silu(gate) * up`: the SiLU reads and
/// writes the gate (4), the product reads both halves and writes one (6), against
/// the fused activation's one pass reading both and writing one (6).
const GLU_EAGER_EXTRA_BYTES: f64 = 4.0;

/// Core attention of one micro-batch (always BF16).
pub(super) struct CoreAttention {
    pub(super) fwd: f64,
    pub(super) bwd: f64,
    /// Forward FLOPs of the causal work.
    pub(super) fwd_flops: f64,
    /// QK plus V head widths of this TP rank's heads.
    pub(super) head_flops: f64,
    /// (query, key) pairs per sequence on this CP rank, non-causal convention.
    pub(super) dense_pairs: f64,
}

/// The feed-forward of one micro-batch: a dense MLP, or routed experts with the
/// router and shared experts.
pub(super) struct FeedForward {
    /// Dense MLP or shared experts, over every token.
    pub(super) ffn: Pass,
    pub(super) experts: Pass,
    pub(super) router: Pass,
    /// Matrices before the MLP's last one (2 when gated).
    first_mats: f64,
    /// The busiest expert-parallel rank's load over the balanced share (1 for a
    /// dense model).
    pub(super) moe_load: f64,
    /// Tokens each routed-expert rank processes for this micro-batch.
    pub(super) routed_tokens: f64,
    expert_ffn: f64,
    /// Shared experts' hidden width; zero without them.
    pub(super) shared_ffn: f64,
    /// Bytes each routed token moves in HBM to be shuffled into expert order and
    /// back (BF16 rows of h): the permutation into routed order and the
    /// un-permutation that merges the top-k outputs (each reads and writes a row:
    /// 8h). Megatron's all-to-all dispatcher also sorts the received chunks by local
    /// expert and restores the order before the return all-to-all
    /// (`sort_chunks_by_idxs`, run when a rank holds more than one expert): another
    /// 8h. DeepEP / HybridEP permute once on the receiving side.
    shuffle: f64,
    /// Bytes each routed row moves in HBM to add its expert's output bias, where
    /// the linear layers carry biases (GPT-OSS): Megatron-Core's `TEGroupedMLP`
    /// builds fc2 with `skip_bias_add=True` and adds the bias scaled by the routing
    /// probability in `_apply_bias`, per local expert in eager PyTorch (`b * p`,
    /// `t + ...`, then `torch.cat`: write h, read 2h and write h, read h and write h,
    /// BF16: 12h). Megatron-LM core_r0.16.0 (b0cc2706d, 55ac70825) and core_r0.18
    /// (251c6e9de, d0b3b7754) `moe/experts.py` `TEGroupedMLP._apply_bias`; only the
    /// Transformer Engine op-fuser path (`use_transformer_engine_op_fuser`, opt-in)
    /// skips it. Zero without biases.
    expert_bias: f64,
    /// Forward bytes each routed row moves for a clamped GLU's clamp (GPT-OSS's
    /// `swiglu_limit`): Megatron-Core's fused quick-GeGLU (`bias_activation_fusion`)
    /// runs the clamp eagerly before the fused kernel, `chunk`, a clamp of each half
    /// and a `torch.cat` (megatron/core/fusions/fused_bias_geglu.py:424-431 at
    /// d98e8a6, `weighted_bias_quick_geglu_impl`): read f and write f twice, then
    /// read 2f and write 2f, BF16: 16f per row (f the expert FFN width on this
    /// rank). Its backward is the two clamps' masked gradients (read the gradient
    /// and the input, write the gradient: 12f), [`GLU_CLAMP_BWD`] of the forward.
    /// Zero without a clamp.
    glu_clamp: f64,
}

/// A clamped GLU's backward bytes over its forward's (12f against 16f; see
/// `FeedForward::glu_clamp`).
const GLU_CLAMP_BWD: f64 = 12.0 / 16.0;

impl FeedForward {
    /// Activation function bytes per token of an MLP `ffn` wide split `div` ways
    /// (gated: read 2f, write f).
    fn act(&self, ffn: f64, div: f64) -> f64 {
        (2.0 * (self.first_mats + 1.0) * ffn) / div
    }
}

/// What one layer's recomputation, FLOPs and communication are priced from.
pub(super) struct Parts {
    pub(super) kind: LayerKind,
    pub(super) proj: Projections,
    pub(super) core: CoreAttention,
    pub(super) ff: FeedForward,
    /// torchtitan's op-level selective recomputation applies to this layer.
    pub(super) op_sac: bool,
    /// The (out, in) shapes of the matmuls it replays.
    op_sac_mms: Vec<(f64, f64)>,
}

pub(super) fn layer_cost(c: &Ctx, kind: LayerKind) -> LayerCost {
    let cfg = c.cfg;
    let mut lc = LayerCost::default();
    let proj = projections(c);
    let core = core_attention(c);
    let ff = feed_forward(c, kind);

    let mut fwd = OpClasses {
        attention_core: core.fwd,
        attention_proj: proj.pass.fwd,
        mlp: ff.ffn.fwd,
        moe_experts: ff.experts.fwd,
        router: ff.router.fwd,
        ..OpClasses::default()
    };
    lc.attn_core_fwd = core.fwd;
    lc.attn_core_bwd = core.bwd;
    fwd.elementwise = elementwise_secs(c, kind, &proj, &ff);

    // Backward: each GEMM's input and weight gradients; attention backward;
    // element-wise twice, but a clamped GLU's clamp at its own ratio.
    let mut bwd = fwd.scaled(2.0);
    bwd.elementwise -= c.mem(ff.routed_tokens * ff.glu_clamp * (2.0 - GLU_CLAMP_BWD));
    bwd.attention_core = core.bwd;
    bwd.attention_proj = proj.pass.bwd;
    bwd.mlp = ff.ffn.bwd;
    bwd.moe_experts = ff.experts.bwd;
    bwd.router = ff.router.bwd;
    lc.gemm = fwd.attention_proj + fwd.mlp + fwd.moe_experts;
    lc.wgrad = proj.pass.wgrad + ff.ffn.wgrad + ff.experts.wgrad + ff.router.wgrad;
    lc.fwd = fwd;
    lc.bwd = bwd;

    // torchtitan's op-level policy (`memory::op_sac_per_token`) replays every op of
    // the block it did not save: the even-numbered matmuls and every element-wise
    // pass; the attention kernel's output is saved.
    let op_sac =
        cfg.recompute == Recompute::Selective && memory::op_sac_applies(c.model, kind, c.a);
    let op_sac_mms: Vec<(f64, f64)> = if op_sac {
        memory::torchtitan_mms(c.model, cfg.tp)
            .into_iter()
            .skip(1)
            .step_by(2)
            .collect()
    } else {
        Vec::new()
    };
    let parts = Parts {
        kind,
        proj,
        core,
        ff,
        op_sac,
        op_sac_mms,
    };
    lc.recompute = recompute_secs(c, &parts, &lc.fwd);
    let fwd_flops_seq = forward_flops_per_sequence(c, &parts);
    // Per GPU: the micro-batch is spread over TP x CP ranks.
    lc.model_flops = 3.0 * fwd_flops_seq / (cfg.tp as f64 * cfg.cp as f64);
    lc.recompute_flops = recompute_flops(c, &parts, fwd_flops_seq);

    layer_comm::add_layer_comm(c, &parts, &mut lc);
    lc.host_wait = match (kind, &c.model.moe) {
        (LayerKind::Moe, Some(moe)) => host::host_wait(c, moe, &lc),
        _ => host::dense_host_wait(c, &lc),
    };
    lc
}

/// The attention projections (QKV, or MLA's latent and up-projections, and the
/// output projection).
fn projections(c: &Ctx) -> Projections {
    let m = c.model;
    let t = c.cfg.tp as f64;
    let h = m.hidden as f64;
    let tokens = c.tokens;
    // MLA's up-projections: (time, FLOPs) of one forward.
    let mut mla_up = (0.0, 0.0);
    let proj;
    let kv_rank = kv_dim_per_rank(m, c.cfg.tp) as f64;
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
    Projections {
        pass: proj,
        mla_up,
        q_rank,
        kv_rank,
        out_in,
        rotary_bytes: rotary_bytes(m, c.a.eager.rotary),
    }
}

/// The fused attention kernel, or the unfused score matrix through HBM.
fn core_attention(c: &Ctx) -> CoreAttention {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let e = &c.hw.efficiency;
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
    CoreAttention {
        fwd: core_fwd,
        bwd: core_bwd,
        fwd_flops: attn_fwd_flops,
        head_flops,
        dense_pairs,
    }
}

/// The dense MLP, or the routed experts (at the busiest rank's load), the router
/// and the shared experts.
fn feed_forward(c: &Ctx, kind: LayerKind) -> FeedForward {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = m.hidden as f64;
    let tokens = c.tokens;
    let ffn;
    let (mut experts, mut router) = (Pass::default(), Pass::default());
    let first_mats = m.mlp.matrices() as f64 - 1.0;
    let mlp = |ffn: f64, div: f64, rows: f64| -> Pass {
        if ffn <= 0.0 {
            return Pass::default();
        }
        c.pass(rows, first_mats * ffn / div, h, true) + c.pass(rows, h, ffn / div, true)
    };
    let moe_load = m
        .moe
        .as_ref()
        .map_or(1.0, |moe| c.w.moe_rank_load(moe, cfg.ep).factor);
    let mut routed_tokens = 0.0;
    let mut expert_ffn = 0.0;
    let mut shuffle = 0.0;
    let mut expert_bias = 0.0;
    let mut glu_clamp = 0.0;
    match (kind, &m.moe) {
        (LayerKind::Moe, Some(moe)) => {
            let etp = cfg.etp as f64;
            let local_experts = (moe.experts / cfg.ep) as f64;
            let sorts = cfg.moe_dispatcher == Dispatcher::AllToAll && local_experts > 1.0;
            shuffle = if sorts { 16.0 * h } else { 8.0 * h };
            if m.bias {
                expert_bias = 12.0 * h;
            }
            routed_tokens = tokens / t * moe.top_k as f64 * etp * moe_load;
            expert_ffn = moe.expert_ffn_hidden as f64;
            if m.glu_clamp.is_some() {
                glu_clamp = 16.0 * expert_ffn / etp;
            }
            let per_expert = routed_tokens / local_experts;
            experts = local_experts * mlp(expert_ffn, etp, per_expert);
            ffn = mlp(moe.shared_hidden() as f64, t, tokens);
            router = c.pass(tokens / t, moe.experts as f64, h, false);
        }
        _ => ffn = mlp(m.ffn_hidden as f64, t, tokens),
    }
    FeedForward {
        ffn,
        experts,
        router,
        first_mats,
        moe_load,
        routed_tokens,
        expert_ffn,
        shared_ffn: m.moe.map_or(0.0, |x| x.shared_hidden() as f64),
        shuffle,
        expert_bias,
        glu_clamp,
    }
}

/// Element-wise time of one forward.
fn elementwise_secs(c: &Ctx, kind: LayerKind, proj: &Projections, ff: &FeedForward) -> f64 {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = m.hidden as f64;
    let tokens = c.tokens;
    // Element-wise traffic, bytes per token: norms (read 2h, write 2h; two per layer,
    // four with sandwich norms) and residual adds (read 4h, write 2h, +1 mask byte
    // with dropout), twice per layer, split by SP; activation function (gated: read
    // 2f, write f); rotary on Q and K; FP8 casts of GEMM inputs (read 2, write 1).
    let sp_div = if cfg.sp { t } else { 1.0 };
    let mask = if m.dropout { 1.0 } else { 0.0 };
    let norms = if m.sandwich_norms { 4.0 } else { 2.0 };
    let norm = norm_bytes(m, c.a.eager);
    let outside = (norms * norm * h + 2.0 * (6.0 * h + mask * h)) / sp_div;
    // A gated activation run eager: its two kernels' extra bytes.
    let glu_extra = |ffn: f64, div: f64| {
        if c.a.eager.glu && ff.first_mats > 1.0 {
            GLU_EAGER_EXTRA_BYTES * ffn / div
        } else {
            0.0
        }
    };
    let inner = match kind {
        LayerKind::Moe => {
            let shared = m.moe.map(|x| x.shared_hidden()).unwrap_or(0) as f64;
            ff.routed_tokens / tokens
                * (ff.act(ff.expert_ffn, cfg.etp as f64)
                    + glu_extra(ff.expert_ffn, cfg.etp as f64)
                    + ff.shuffle
                    + ff.expert_bias
                    + ff.glu_clamp)
                + ff.act(shared, t)
                + glu_extra(shared, t)
        }
        LayerKind::Dense => ff.act(m.ffn_hidden as f64, t) + glu_extra(m.ffn_hidden as f64, t),
    };
    let rotary = proj.rotary();
    // GEMM inputs cast to FP8, elements per token: the QKV and output projections'
    // inputs, and the feed-forward's two inputs (dense MLP or shared experts over
    // every token; routed experts over their routed rows, cast after the BF16
    // dispatch). The router stays in BF16.
    let token_ffn_casts = |ffn: f64| if ffn > 0.0 { h / sp_div + ffn / t } else { 0.0 };
    let cast_elems = h / sp_div
        + proj.out_in
        + match kind {
            LayerKind::Dense => token_ffn_casts(m.ffn_hidden as f64),
            LayerKind::Moe => {
                token_ffn_casts(m.moe.map_or(0.0, |x| x.shared_hidden() as f64))
                    + ff.routed_tokens / tokens * (h + ff.expert_ffn / cfg.etp as f64)
            }
        };
    let casts = if c.fp8 { 3.0 * cast_elems } else { 0.0 };
    c.mem(tokens * (outside + inner + rotary + casts))
}

/// Recomputation replays work in the backward pass: the whole forward (full) or
/// the selected modules' forward (selective).
fn recompute_secs(c: &Ctx, parts: &Parts, fwd: &OpClasses) -> f64 {
    match c.cfg.recompute {
        Recompute::None => 0.0,
        Recompute::Selective if parts.op_sac => {
            parts
                .op_sac_mms
                .iter()
                .map(|&(out, inp)| c.gemm(c.tokens, out, inp, true))
                .sum::<f64>()
                + fwd.elementwise
        }
        Recompute::Selective => selective_secs(c, parts, fwd),
        Recompute::Full => fwd.total(),
    }
}

/// The forward time of the modules `--recompute-modules` replays.
fn selective_secs(c: &Ctx, parts: &Parts, fwd: &OpClasses) -> f64 {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = m.hidden as f64;
    let tokens = c.tokens;
    let (kind, ff) = (parts.kind, &parts.ff);
    let sp_div = if cfg.sp { t } else { 1.0 };
    let sel = |x: RecomputeModules| cfg.recomputes(x);
    let shared_ffn = ff.shared_ffn;
    let mut sel_secs = 0.0;
    if sel(RecomputeModules::CORE_ATTN) {
        sel_secs += parts.core.fwd;
    }
    if sel(RecomputeModules::LAYERNORM) {
        // Two norms: read 2h, write 2h (+ the FP8 cast of the output) per token.
        sel_secs += c.mem(tokens * 2.0 * (4.0 * h + if c.fp8 { 3.0 * h } else { 0.0 }) / sp_div);
    }
    if sel(RecomputeModules::MLA_UP_PROJ) {
        sel_secs += parts.proj.mla_up.0 + c.mem(tokens * parts.proj.rotary());
    }
    match kind {
        LayerKind::Dense if sel(RecomputeModules::MLP) => {
            sel_secs += fwd.mlp + c.mem(tokens * ff.act(m.ffn_hidden as f64, t))
        }
        LayerKind::Moe if sel(RecomputeModules::MOE) => {
            sel_secs += fwd.moe_experts
                + fwd.router
                + fwd.mlp
                + c.mem(
                    tokens
                        * (ff.routed_tokens / tokens
                            * (ff.act(ff.expert_ffn, cfg.etp as f64)
                                + ff.shuffle
                                + ff.expert_bias)
                            + ff.act(shared_ffn, t)),
                );
        }
        LayerKind::Moe => {
            if sel(RecomputeModules::MOE_ACT) {
                sel_secs += c
                    .mem(ff.routed_tokens * (ff.act(ff.expert_ffn, cfg.etp as f64) + ff.glu_clamp));
            }
            if sel(RecomputeModules::SHARED_EXPERTS) {
                sel_secs += fwd.mlp + c.mem(tokens * ff.act(shared_ffn, t));
            }
        }
        _ => {}
    }
    sel_secs
}

/// Forward FLOPs of one micro-batch's sequences through the layer, over the whole
/// TP x CP group, in Megatron's convention for MFU: GEMM FLOPs from the weight
/// shapes, attention counted as full s^2.
fn forward_flops_per_sequence(c: &Ctx, parts: &Parts) -> f64 {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = m.hidden as f64;
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
    let mlp_params = match (parts.kind, &m.moe) {
        // The routed copies a capacity drops skip their experts: not model FLOPs.
        (LayerKind::Moe, Some(moe)) => {
            let kept = 1.0 - c.w.moe_rank_load(moe, cfg.ep).dropped;
            m.mlp.matrices() as f64
                * h
                * ((moe.top_k * moe.expert_ffn_hidden) as f64 * kept + moe.shared_hidden() as f64)
                + h * moe.experts as f64
        }
        _ => m.mlp.matrices() as f64 * h * m.ffn_hidden as f64,
    };
    let seq_tokens = (cfg.mbs * c.w.seq) as f64;
    2.0 * (proj_params + mlp_params) * seq_tokens
        + 2.0 * cfg.mbs as f64 * parts.core.head_flops * t * parts.core.dense_pairs * cfg.cp as f64
}

/// FLOPs the recomputation replays on this GPU (for HFU).
fn recompute_flops(c: &Ctx, parts: &Parts, fwd_flops_seq: f64) -> f64 {
    let m = c.model;
    let cfg = c.cfg;
    let t = cfg.tp as f64;
    let h = m.hidden as f64;
    let tokens = c.tokens;
    let ff = &parts.ff;
    let sel = |x: RecomputeModules| cfg.recomputes(x);
    let mats = m.mlp.matrices() as f64;
    let mut sel_flops = 0.0;
    if sel(RecomputeModules::CORE_ATTN) {
        sel_flops += parts.core.fwd_flops;
    }
    if sel(RecomputeModules::MLA_UP_PROJ) {
        sel_flops += parts.proj.mla_up.1;
    }
    match (parts.kind, &m.moe) {
        (LayerKind::Dense, _) if sel(RecomputeModules::MLP) => {
            sel_flops += 2.0 * tokens * mats * h * m.ffn_hidden as f64 / t
        }
        (LayerKind::Moe, Some(moe)) => {
            let experts = 2.0 * ff.routed_tokens * mats * h * ff.expert_ffn / cfg.etp as f64;
            let shared = 2.0 * tokens * mats * h * ff.shared_ffn / t;
            if sel(RecomputeModules::MOE) {
                sel_flops += experts + shared + 2.0 * tokens / t * h * moe.experts as f64;
            } else if sel(RecomputeModules::SHARED_EXPERTS) {
                sel_flops += shared;
            }
        }
        _ => {}
    }
    match cfg.recompute {
        Recompute::None => 0.0,
        Recompute::Selective if parts.op_sac => parts
            .op_sac_mms
            .iter()
            .map(|&(out, inp)| 2.0 * tokens * out * inp)
            .sum(),
        Recompute::Selective => sel_flops,
        Recompute::Full => fwd_flops_seq / (t * cfg.cp as f64),
    }
}
