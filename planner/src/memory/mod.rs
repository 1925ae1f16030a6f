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

mod activations;
mod framework;
mod model_state;

pub use activations::{
    in_flight, kv_dim_per_rank, layer_activations, op_sac_applies, op_sac_per_token,
    torchtitan_mms, LayerActivations, LayerKind,
};
pub use framework::{
    cached_blocks, framework_buffers, logit_bytes, step_buffers, token_buffers, HeldParams,
    SCALING_BUCKET_ELEMENTS,
};
pub use model_state::{
    grad_bytes, model_state, optimizer_bytes, scaletorch_bytes, sharded_state_floor,
};

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
    /// Blocks the caching allocator holds free at the peak for reasons a
    /// framework's code sets ([`framework::cached_blocks`]): freed while a
    /// collective on NCCL's stream may still read them, or too small for the
    /// next request. Reserved, not allocated; PyTorch's allocator synchronizes
    /// its pending frees and releases cached blocks before it reports out of
    /// memory (`release_cached_blocks` in `CUDACachingAllocator.cpp`), so they
    /// count in a reserved peak but not in [`StageMemory::total`], and never
    /// beyond the HBM the rest leaves.
    pub cached: f64,
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
    /// fragmentation and the cached blocks for the reserved peak. The reserve
    /// (CUDA context, NCCL, library workspaces outside the allocator) is in no
    /// PyTorch statistic.
    pub fn comparable_bytes(self, m: &StageMemory) -> f64 {
        let tensors = m.weights + m.gradients + m.optimizer + m.activations + m.logits + m.buffers;
        match self {
            MemKind::PeakAllocated | MemKind::PeakActive => tensors,
            MemKind::PeakReserved => tensors + m.fragmentation + m.cached,
        }
    }
}

#[cfg(test)]
mod tests;
