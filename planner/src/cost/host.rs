//! The host side of a mixture-of-experts layer: the CPU issues every kernel, and a
//! forward that blocks the host on the GPU once per layer leaves the GPU waiting
//! whenever issuing the layer takes longer than running it.

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
    let (fwd, bwd) = (&lc.fwd, &lc.bwd);
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
    // GPU time of the layer, with its exposed communication split between the
    // passes: the all-to-alls half and half (dispatch and combine each way), the
    // rest in proportion to the passes' compute.
    let exposed = lc.tp.1 + lc.cp.1 + lc.etp.1;
    let (gf, gb) = (fwd.total(), bwd.total() + lc.recompute);
    let share_f = if gf + gb > 0.0 { gf / (gf + gb) } else { 0.5 };
    let (gpu_f, gpu_b) = (
        gf + share_f * exposed + 0.5 * lc.ep.1,
        gb + (1.0 - share_f) * exposed + 0.5 * lc.ep.1,
    );
    let apart = (host_f - gpu_f).max(0.0) + (host_b - gpu_b).max(0.0);
    match cfg.ep_overlap(c.w) {
        Some(f) => (1.0 - f) * apart + f * (host_f + host_b - gpu_f - gpu_b).max(0.0),
        None => apart,
    }
}
