//! The host side of a transformer layer: the CPU issues every kernel, and the GPU
//! waits whenever issuing a layer takes longer than running it. A
//! mixture-of-experts forward blocks the host on the GPU once per layer
//! ([`host_wait`]); a dense layer's host runs ahead of the GPU, so only a layer
//! whose kernels are issued more slowly than they run holds it back
//! ([`dense_host_wait`]).

use crate::config::{Recompute, RecomputeModules};
use crate::model::Moe;

use super::kernel::Ctx;
use super::layer::LayerCost;
use super::Framework;

/// What the host issues for one mixture-of-experts transformer layer and one
/// micro-batch, (forward, backward), in Megatron-Core with Transformer Engine,
/// counted from the code (Megatron-LM d98e8a6: `transformer_layer.py`,
/// `moe/router.py`, `moe/token_dispatcher.py` with the all-to-all dispatcher and
/// permute fusion, `moe/experts.py`; Transformer Engine v2.8 `GroupedLinear`,
/// `cublaslt_gemm.cu`, `cast.cpp`). Operations issued from Python, each at the
/// profile's `efficiency.host_op_us`:
/// - the attention block (norm, QKV and output projections, QK norms, rotary,
///   fused attention, residual);
const ATTN_OPS: (f64, f64) = (12.0, 25.0);
/// - the router (norm, router GEMM and its FP32 cast, score function, top-k, the
///   auxiliary loss);
const ROUTER_OPS: (f64, f64) = (10.0, 15.0);
/// - the dispatcher's preprocess (per-expert counts, their all-gather, split
///   sizes, the host copies and the event the host waits on);
const PREPROCESS_OPS: (f64, f64) = (8.0, 2.0);
/// - the rest of the MoE block (permute, both all-to-alls, chunk sort, activation,
///   unsort, unpermute, residual);
const DISPATCH_OPS: (f64, f64) = (14.0, 35.0);
/// - shared experts: their MLP;
const SHARED_EXPERT_OPS: (f64, f64) = (4.0, 8.0);
/// - the `moe_act` recomputation: one checkpointed activation (and its probability
///   scaling) over all local experts' rows at once (`CheckpointWithoutOutput` in
///   `moe/experts.py`), replayed in the backward.
const MOE_ACT_REPLAY_OPS: f64 = 3.0;
/// Kernels issued from C++ per local expert, each at `efficiency.host_kernel_us`:
/// Transformer Engine's grouped GEMM makes one cuBLASLt call per expert (fc1 and
/// fc2: 2 forward, 4 backward with input and weight gradients) unless CUTLASS
/// grouped GEMM is switched on. FP8 recipes other than delayed scaling (current
/// scaling, blockwise, MXFP8) quantize each expert's GEMM inputs apart; Sextant's
/// FP8 precisions are the current-scaling and MXFP8 recipes Megatron-Bridge's
/// performance configurations run, so every FP8 plan pays them.
const EXPERT_GEMM_KERNELS: (f64, f64) = (2.0, 4.0);
const EXPERT_FP8_CAST_KERNELS: (f64, f64) = (2.0, 4.0);
/// Where the linear layers carry biases, `TEGroupedMLP._apply_bias` adds fc2's bias
/// per local expert in a Python loop of bare tensor ops (`b * p`, `t + ...`;
/// autograd's backward: both products' gradients and their reductions), each at
/// `efficiency.host_kernel_us` like one eager ATen op.
const EXPERT_BIAS_KERNELS: (f64, f64) = (2.0, 4.0);

/// GPU time lost per micro-batch to the host issuing one mixture-of-experts layer.
///
/// Megatron-Core's all-to-all dispatcher copies the per-expert token counts to the
/// host in every MoE layer's forward and blocks the host thread on them
/// (`_maybe_dtoh_and_synchronize`, token_dispatcher.py at d98e8a6: before the
/// all-to-all when EP or TP is above 1, at the end of the dispatch otherwise;
/// DeepEP waits for its received counts the same way). Only drop-and-pad routing
/// (a capacity factor with padding: fixed shapes) skips it, and is not priced here.
/// The host cannot run ahead across layers: the all-to-all, the expert GEMMs, the
/// combine and the next layer's attention are issued only after the GPU has caught
/// up, so a layer's forward takes the longer of its GPU time and the host's time to
/// issue it. The backward has no such sync (split sizes are host lists) but is
/// issued by the same host thread, so over a stage of identical layers it too takes
/// the longer of the two. Under the batch-level all-to-all overlap a forward and a
/// backward are issued together and hide each other's host time. A captured CUDA
/// graph scope costs the host one launch per pass instead of its operations; a
/// full-iteration graph leaves nothing to wait for.
///
/// The counts are Megatron-Core's: other frameworks' MoE layers (torchtitan's also
/// waits for its split sizes) are not priced. `efficiency.host_op_us` is an
/// effective figure fitted on measured steps, not a bare per-operation cost: it
/// also holds whatever else the GPU loses once a layer's queue has drained.
pub(super) fn host_wait(c: &Ctx, moe: &Moe, lc: &LayerCost) -> f64 {
    let e = &c.hw.efficiency;
    let graphs = c.a.cuda_graphs;
    let drop_and_pad = c.w.moe_capacity.is_some_and(|cap| cap.pad);
    if (e.host_op_us <= 0.0 && e.host_kernel_us <= 0.0)
        || graphs.full_iteration
        || drop_and_pad
        || c.a.framework != Framework::MegatronCore
    {
        return 0.0;
    }
    let cfg = c.cfg;
    let local = (moe.experts / cfg.ep) as f64;
    // Python-issued operations; a graphed scope is one launch per pass. The router's
    // graph holds the shared experts too (when they are not overlapped).
    let scope = |ops: (f64, f64), graphed: bool| if graphed { (1.0, 1.0) } else { ops };
    let router = if moe.shared_hidden() > 0 {
        (
            ROUTER_OPS.0 + SHARED_EXPERT_OPS.0,
            ROUTER_OPS.1 + SHARED_EXPERT_OPS.1,
        )
    } else {
        ROUTER_OPS
    };
    let python = [
        scope(ATTN_OPS, graphs.attn),
        scope(router, graphs.moe_router),
        scope(PREPROCESS_OPS, graphs.moe_preprocess),
        DISPATCH_OPS,
    ];
    let ops_f: f64 = python.iter().map(|o| o.0).sum();
    let ops_b: f64 = python.iter().map(|o| o.1).sum();
    let casts = if c.fp8 {
        EXPERT_FP8_CAST_KERNELS
    } else {
        (0.0, 0.0)
    };
    let bias = if c.model.bias {
        EXPERT_BIAS_KERNELS
    } else {
        (0.0, 0.0)
    };
    let kernels_f = local * (EXPERT_GEMM_KERNELS.0 + casts.0 + bias.0);
    let kernels_b = local * (EXPERT_GEMM_KERNELS.1 + casts.1 + bias.1);
    let host = |ops: f64, kernels: f64| (ops * e.host_op_us + kernels * e.host_kernel_us) * 1e-6;
    let host_f = host(ops_f, kernels_f);
    // Recomputation issues the replayed forward again inside the backward.
    let replay = if cfg.recompute == Recompute::Full || cfg.recomputes(RecomputeModules::MOE) {
        host_f
    } else if cfg.recomputes(RecomputeModules::MOE_ACT) {
        host(MOE_ACT_REPLAY_OPS, 0.0)
    } else {
        0.0
    };
    let host_b = host(ops_b, kernels_b) + replay;
    let (gpu_f, gpu_b) = gpu_passes(lc);
    let apart = (host_f - gpu_f).max(0.0) + (host_b - gpu_b).max(0.0);
    match cfg.ep_overlap(c.w) {
        Some(f) => (1.0 - f) * apart + f * (host_f + host_b - gpu_f - gpu_b).max(0.0),
        None => apart,
    }
}

/// GPU time of one layer's forward and backward (with what recomputation replays)
/// for one micro-batch, its exposed communication split between the passes: the
/// all-to-alls half and half (dispatch and combine each way), the rest in
/// proportion to the passes' compute.
fn gpu_passes(lc: &LayerCost) -> (f64, f64) {
    let exposed = lc.tp.1 + lc.cp.1 + lc.etp.1;
    let (gf, gb) = (lc.fwd.total(), lc.bwd.total() + lc.recompute);
    let share_f = if gf + gb > 0.0 { gf / (gf + gb) } else { 0.5 };
    (
        gf + share_f * exposed + 0.5 * lc.ep.1,
        gb + (1.0 - share_f) * exposed + 0.5 * lc.ep.1,
    )
}

/// Kernels one dense transformer layer issues for one micro-batch, not counting
/// its tensor- and context-parallel collectives (taken from the layer's own
/// communication, [`LayerCost::tp_calls`]), each block as (forward, backward).
struct DenseKernels {
    /// The attention block: norm, projections, core attention, residual.
    attn: (f64, f64),
    /// Of which the core attention (what `core_attn` recomputation replays).
    core: (f64, f64),
    /// The MLP block: norm, projections, activation, residual.
    mlp: (f64, f64),
    /// Per-parameter gradient additions the backward issues.
    grad_adds: GradAdds,
}

/// Which of a layer's parameter gradients the backward adds into an FP32 buffer
/// with one kernel each.
enum GradAdds {
    /// Every parameter: this many.
    Every(f64),
    /// Those the GEMMs do not accumulate themselves (Transformer Engine's weight
    /// GEMMs do): the norms' weights (and biases under LayerNorm) and the linear
    /// layers' biases.
    OutsideGemms,
}

impl GradAdds {
    fn count(&self, m: &crate::model::ModelSpec) -> f64 {
        match *self {
            GradAdds::Every(n) => n,
            GradAdds::OutsideGemms => {
                let norms = if m.norm_kind() == crate::model::Norm::LayerNorm {
                    4.0
                } else {
                    2.0
                };
                let biases = if m.bias {
                    4.0
                } else if m.qkv_bias {
                    1.0
                } else {
                    0.0
                };
                norms + biases
            }
        }
    }
}

/// Counted from the code, BF16/FP16 without FP8 casts:
/// - Megatron-LM's own layer before Megatron-Core (`--transformer-impl local`, the
///   unfused-softmax stack of 2021-22 and of Megatron-DeepSpeed; Megatron-LM
///   de7dc40f88 `megatron/model/transformer.py`, `mpu/layers.py`): attention block
///   forward = layer norm, QKV GEMM with bias, `baddbmm`, fused scale-mask-softmax,
///   dropout, `bmm`, the context's `permute().contiguous()`, output GEMM, the
///   TorchScript bias-dropout-add (9; the core from `baddbmm` to the permute: 5);
///   backward = layer norm 2, QKV 3 (input, weight and bias gradients), core 7
///   (each `bmm` 2, softmax, dropout, permute), output GEMM 2, bias-dropout-add 3
///   (17). MLP block forward = norm, fc1, fused bias-GeLU, fc2, bias-dropout-add
///   (5); backward = norm 2, fc1 2, bias-GeLU and its bias gradient 2, fc2 2,
///   bias-dropout-add 3 (11). Each of the layer's 12 parameter gradients is added
///   into an FP32 buffer, by the local DDP's hooks (`main_grad`,
///   `megatron/model/distributed.py`) or, under Megatron-DeepSpeed, by DeepSpeed's
///   engine (12). The backward's smaller kernels (the scaling in `baddbmm`'s
///   gradient, the residual adds) are not counted; the fitted figure holds them.
const LEGACY_MEGATRON: DenseKernels = DenseKernels {
    attn: (9.0, 17.0),
    core: (5.0, 7.0),
    mlp: (5.0, 11.0),
    grad_adds: GradAdds::Every(12.0),
};
/// - Megatron-Core with Transformer Engine (Megatron-LM d98e8a6
///   `transformer_layer.py`, `attention.py`, `mlp.py` with the TE layer spec):
///   attention forward = `TELayerNormColumnParallelLinear` (norm and GEMM 2),
///   fused RoPE on query and key 2, fused attention 1, `TERowParallelLinear` 1,
///   fused bias-dropout-add 1 (7); backward = norm and GEMM gradients 4, RoPE 2,
///   the flash backward's three kernels, output GEMM 2, bias-dropout-add 1 (12).
///   MLP forward = norm and fc1 2, fused activation 1, fc2 1, bias-dropout-add 1
///   (5); backward 4 + 1 + 2 + 1 (8). Weight gradients accumulate inside the
///   GEMM (`--gradient-accumulation-fusion`, Megatron-LM's default); the DDP hook
///   adds the rest into `main_grad` (`distributed_data_parallel.py`): the norms'
///   weights and biases and the linear biases. These are kernels; the MoE term's
///   `ATTN_OPS` counts the same block's Python-issued operations, a different unit
///   fitted apart (`host_op_us`).
const MEGATRON_CORE_TE: DenseKernels = DenseKernels {
    attn: (7.0, 12.0),
    core: (1.0, 3.0),
    mlp: (5.0, 8.0),
    grad_adds: GradAdds::OutsideGemms,
};
/// - Hugging Face nanotron (e24d2483 `models/llama.py`, the training path):
///   attention forward = Triton RMSNorm, QKV GEMM, the grouped-query split's three
///   `transpose().contiguous()` copies, the key-value `cat` and its
///   `permute().contiguous()`, rotary on query and key 2, the sequence offsets
///   every layer rebuilds (two `zeros`, two `sum`, two `cumsum`), flash attention
///   1, output GEMM 1, residual add 1 (18); backward = norm 2, QKV 2, the copies
///   5, rotary 2, flash backward 3, output GEMM 2, residual 1 (17). MLP forward =
///   norm, gate-up GEMM, SiLU, product, down GEMM, residual (6); backward = norm 2,
///   gate-up 2, SiLU 1, product 2, down 2 (9). Its FP32 gradient accumulator adds
///   each of the layer's 6 parameter gradients, after the backward or in the DDP
///   bucket hook (`gradient_accumulator.py`) (6).
const NANOTRON: DenseKernels = DenseKernels {
    attn: (18.0, 17.0),
    core: (1.0, 3.0),
    mlp: (6.0, 9.0),
    grad_adds: GradAdds::Every(6.0),
};

/// Kernels an eager element-wise operation ([`crate::cost::EagerOps`]) issues
/// beyond its fused form, (forward, backward), counted from the operators
/// `cost::layer` prices: an RMSNorm in plain operators, eight (a cast, square,
/// mean, add, rsqrt, two products, a cast; either chain) against one fused
/// kernel, and autograd's thirteen backward kernels against two; the complex
/// rotary embedding, three operators (upcast, product, downcast) on each of the
/// query and the key, six against the fused kernel's one per tensor, two, each
/// way (`rotate_half`, the other eager form, issues five per tensor: counted as
/// the complex form); `silu(gate) * up`, two kernels against one, and three
/// backward against one. They are added to Megatron-Core's counts
/// ([`MEGATRON_CORE_TE`]), the stack whose fused kernels they replace; the
/// other stacks' counts are their own code's.
const EAGER_NORM_KERNELS: (f64, f64) = (7.0, 11.0);
const EAGER_ROTARY_KERNELS: (f64, f64) = (4.0, 4.0);
const EAGER_GLU_KERNELS: (f64, f64) = (1.0, 2.0);

/// The extra kernels of the layer's eager operations, for the attention block
/// (its norm and the rotary embedding) and the MLP block (its norm and a gated
/// activation), each (forward, backward).
fn eager_kernels(c: &Ctx) -> ((f64, f64), (f64, f64)) {
    let e = c.a.eager;
    let m = c.model;
    let add = |a: (f64, f64), b: (f64, f64), on: bool| {
        if on {
            (a.0 + b.0, a.1 + b.1)
        } else {
            a
        }
    };
    let norm = e.any_norm() && m.norm_kind() == crate::model::Norm::RmsNorm;
    let gated = m.mlp.matrices() > 2;
    let attn = add(
        add((0.0, 0.0), EAGER_NORM_KERNELS, norm),
        EAGER_ROTARY_KERNELS,
        e.rotary && !m.rotary_unfused(),
    );
    let mlp = add(
        add((0.0, 0.0), EAGER_NORM_KERNELS, norm),
        EAGER_GLU_KERNELS,
        e.glu && gated,
    );
    (attn, mlp)
}

/// GPU time lost per micro-batch to the host issuing one dense transformer layer.
///
/// Nothing in a dense layer blocks the host (no host copy of a routing count), so
/// the host runs ahead of the GPU and the layer costs the longer of the two: the
/// GPU's time, or the host's time to issue its kernels, each pass apart (the
/// backward also issues what recomputation replays). The host time is the kernels
/// counted from each stack's code ([`DenseKernels`]) and its collectives, at the
/// profile's `efficiency.host_layer_kernel_us`: an effective figure fitted on
/// measured steps of layers too small to keep the GPU busy, not a bare launch
/// cost. A captured CUDA graph of the attention block costs one launch per pass; a
/// full-iteration graph leaves nothing to wait for. torchtitan and ScaleTorch
/// layers are not counted (0: not priced).
pub(super) fn dense_host_wait(c: &Ctx, lc: &LayerCost) -> f64 {
    let us = c.hw.efficiency.host_layer_kernel_us;
    let graphs = c.a.cuda_graphs;
    if us <= 0.0 || graphs.full_iteration || !c.a.framework.counts_dense_kernels() {
        return 0.0;
    }
    let k = match (c.a.framework, c.a.flash_attention) {
        (Framework::MegatronCore, false) => &LEGACY_MEGATRON,
        (Framework::Nanotron, _) => &NANOTRON,
        _ => &MEGATRON_CORE_TE,
    };
    let cfg = c.cfg;
    // Collectives: the forward issues one per block (an all-reduce), two under
    // sequence parallelism (all-gather and reduce-scatter), and half the
    // context-parallel ring steps; the backward the rest of what the layer's
    // communication counts (its own, and what recomputation replays).
    let per_pass: f64 = if cfg.tp > 1 {
        2.0 * if cfg.sp { 2.0 } else { 1.0 }
    } else {
        0.0
    };
    let comm_f = per_pass.min(lc.tp_calls) + 0.5 * lc.cp_calls;
    let comm_b = lc.tp_calls + lc.cp_calls - comm_f;
    let (attn_eager, mlp_eager) = if std::ptr::eq(k, &MEGATRON_CORE_TE) {
        eager_kernels(c)
    } else {
        ((0.0, 0.0), (0.0, 0.0))
    };
    let attn = if graphs.attn {
        (1.0, 1.0)
    } else {
        (k.attn.0 + attn_eager.0, k.attn.1 + attn_eager.1)
    };
    let mlp = (k.mlp.0 + mlp_eager.0, k.mlp.1 + mlp_eager.1);
    let fwd = attn.0 + mlp.0;
    let replay = match cfg.recompute {
        Recompute::Full => fwd,
        Recompute::None => 0.0,
        Recompute::Selective => {
            let mut r = 0.0;
            if cfg.recomputes(RecomputeModules::CORE_ATTN) && !graphs.attn {
                r += k.core.0;
            }
            if cfg.recomputes(RecomputeModules::MLP) {
                r += mlp.0;
            }
            if cfg.recomputes(RecomputeModules::LAYERNORM) {
                r += 2.0;
            }
            r
        }
    };
    let bwd = attn.1 + mlp.1 + k.grad_adds.count(c.model) + replay;
    let host_f = (fwd + comm_f) * us * 1e-6;
    let host_b = (bwd + comm_b) * us * 1e-6;
    let (gpu_f, gpu_b) = gpu_passes(lc);
    (host_f - gpu_f).max(0.0) + (host_b - gpu_b).max(0.0)
}
