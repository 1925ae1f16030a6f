//! The host side of a mixture-of-experts layer: the CPU issues every kernel, and a
//! forward that blocks the host on the GPU once per layer leaves the GPU waiting
//! whenever issuing the layer takes longer than running it.

use crate::config::{Recompute, RecomputeModules};
use crate::model::Moe;

use super::kernel::Ctx;
use super::layer::LayerCost;

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
/// - shared experts: their MLP.
const SHARED_EXPERT_OPS: (f64, f64) = (4.0, 8.0);
/// Kernels issued from C++ per local expert, each at `efficiency.host_kernel_us`:
/// Transformer Engine's grouped GEMM makes one cuBLASLt call per expert (fc1 and
/// fc2: 2 forward, 4 backward with input and weight gradients) unless CUTLASS
/// grouped GEMM is switched on; FP8 recipes other than delayed scaling (current
/// scaling, blockwise, MXFP8) quantize each expert's GEMM inputs apart.
const EXPERT_GEMM_KERNELS: (f64, f64) = (2.0, 4.0);
const EXPERT_FP8_CAST_KERNELS: (f64, f64) = (2.0, 4.0);

/// GPU time lost per micro-batch to the host issuing one mixture-of-experts layer.
///
/// Megatron-Core's dropless all-to-all dispatcher copies the per-expert token counts
/// to the host in every MoE layer's forward and blocks the host thread on them
/// (`_maybe_dtoh_and_synchronize`, token_dispatcher.py at d98e8a6, once per layer
/// when EP or TP is above 1; DeepEP waits for its received counts the same way).
/// The host cannot run ahead across layers: the all-to-all, the expert GEMMs, the
/// combine and the next layer's attention are issued only after the GPU has caught
/// up, so a layer's forward takes the longer of its GPU time and the host's time to
/// issue it. The backward has no such sync (split sizes are host lists) but is
/// issued by the same host thread, so over a stage of identical layers it too takes
/// the longer of the two. Under the batch-level all-to-all overlap a forward and a
/// backward are issued together and hide each other's host time. A captured CUDA
/// graph scope costs the host one launch per pass instead of its operations; a
/// full-iteration graph leaves nothing to wait for.
pub(super) fn host_wait(c: &Ctx, moe: &Moe, lc: &LayerCost) -> f64 {
    let (fwd, bwd) = (&lc.fwd, &lc.bwd);
    let e = &c.hw.efficiency;
    let graphs = c.a.cuda_graphs;
    if (e.host_op_us <= 0.0 && e.host_kernel_us <= 0.0) || graphs.full_iteration {
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
    let kernels_f = local * (EXPERT_GEMM_KERNELS.0 + casts.0);
    let kernels_b = local * (EXPERT_GEMM_KERNELS.1 + casts.1);
    let host = |ops: f64, kernels: f64| (ops * e.host_op_us + kernels * e.host_kernel_us) * 1e-6;
    let host_f = host(ops_f, kernels_f);
    // Recomputation issues the replayed forward again inside the backward.
    let replay = if cfg.recompute == Recompute::Full || cfg.recomputes(RecomputeModules::MOE) {
        host_f
    } else if cfg.recomputes(RecomputeModules::MOE_ACT) {
        host(local, 0.0)
    } else {
        0.0
    };
    let host_b = host(ops_b, kernels_b) + replay;
    // GPU time of the layer, with its exposed communication split between the
    // passes in proportion to their compute.
    let exposed = lc.tp.1 + lc.cp.1 + lc.ep.1 + lc.etp.1;
    let (gf, gb) = (fwd.total(), bwd.total() + lc.recompute);
    let share_f = if gf + gb > 0.0 { gf / (gf + gb) } else { 0.5 };
    let (gpu_f, gpu_b) = (gf + share_f * exposed, gb + (1.0 - share_f) * exposed);
    let apart = (host_f - gpu_f).max(0.0) + (host_b - gpu_b).max(0.0);
    match cfg.ep_overlap(c.w) {
        Some(f) => (1.0 - f) * apart + f * (host_f + host_b - gpu_f - gpu_b).max(0.0),
        None => apart,
    }
}
