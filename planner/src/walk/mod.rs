//! One walk over a training step: the schedule's passes in one rank's order, the
//! layers of each pass, the ops of each layer, the pipeline transfers between
//! passes and the data-parallel reduction and optimizer at the end. The walk knows
//! sizes and order, not data; what it finds goes to a [`Sink`]:
//!
//! - the executor's device program collects the ops and issues them on a GPU
//!   (`sextant_executor::trace::program`), or pairs them up on the CPU first;
//! - [`Tally`] adds up FLOPs and bytes by class and pass (the tests' FLOP count,
//!   `exec --dry-run`'s summary);
//! - the executor's CPU program runs the same pass order ([`slots`]) with data.
//!
//! So a new collective, a new recomputation rule or a new schedule is written once,
//! here, and what the device runs, what the CPU checks and what the tests count
//! cannot drift apart.
//!
//! # What each layer issues
//!
//! Rows are the micro-batch's tokens on this CP rank, `t = mbs · seq / cp`
//! (`t / tp` outside the tensor-parallel region with sequence parallelism).
//! Activations are BF16 (2 bytes).
//!
//! - Attention: input norm; with SP an all-gather over TP; the QKV projection
//!   `[t, h] · [h, q + 2kv]`; rotary; the core over `cp` ring steps, each a
//!   batched `QKᵀ` and `PV` over half the chunk's keys (the causal average), with
//!   the K/V chunk passed to the next CP rank between steps; the output projection;
//!   a reduce-scatter (SP) or all-reduce over TP; the residual add.
//! - MLP: norm, the same TP entry/exit, `up` and `down` GEMMs, the activation.
//! - MoE: router; permute; all-to-all over EP (balanced routing, `top_k` rows per
//!   token); with expert TP an all-gather / reduce-scatter over ETP; with the
//!   all-to-all dispatcher and more than one local expert, the sort of the received
//!   rows by expert and its inverse; the local experts' GEMMs; the return
//!   all-to-all; un-permute.
//! - Backward: per forward GEMM `[m, k] · [k, n]` an input gradient `(m, k, n)` and
//!   a weight gradient `(k, n, m)` (deferred to the W pass under ZB-H1 and
//!   DualPipe); the core's five GEMMs (2.5x the forward); each TP collective's
//!   conjugate; each element-wise pass twice the forward's bytes; the CP ring
//!   passes K/V and, as a second exchange, their gradients.
//!
//! With fewer K/V heads than TP ranks each rank computes one K/V head
//! (Megatron-Core since f7dfb99, Dec 2025; older releases refuse TP above the
//! K/V heads). The cost model prices these same ops class by class
//! (`cost::walked`'s tests hold it).
//! - Recomputation replays the forward (full) or the selected modules, with the
//!   collectives inside them (the MLP's TP gather and scatter, the MoE block's
//!   all-to-alls).
//!
//! Pipeline transfers follow Megatron's p2p batching: a pass's outgoing send is
//! issued in one NCCL group with the next pass's incoming receive
//! (`send_forward_recv_backward` and kin), which is what keeps 1F1B from deadlocking
//! on blocking sends. The step ends with the DualPipe mirror sum, the data-parallel
//! gradient reduction per replica group (reduce-scatter with a sharded optimizer,
//! else all-reduce), the Adam update's HBM traffic and the parameter all-gather.
//!
//! Parts: [`Op`] and its sizes (`op`), one layer's ops (`layer`), the step around
//! them (`step`: [`walk_step`], [`slots`], [`held_params`]), and [`Tally`].

mod layer;
mod op;
mod step;
mod tally;

pub use op::{Coll, CommKind, GroupKind, Op, OpClass, B};
pub use step::{held_params, slots, walk_step, Slot};
pub use tally::Tally;

use crate::config::ParallelConfig;
use crate::model::ModelSpec;
use crate::schedule::Schedule;
use crate::Workload;

/// Where the walk's ops go, in issue order.
pub trait Sink {
    fn op(&mut self, op: Op);
}

impl Sink for Vec<Op> {
    fn op(&mut self, op: Op) {
        self.push(op);
    }
}

/// The sizes a step is walked at (the plan's, or the executor's scaled-down ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dims {
    pub hidden: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub ffn: u64,
    /// Routed experts (0: dense model), top-k and each expert's width.
    pub experts: u64,
    pub top_k: u64,
    pub expert_ffn: u64,
    pub seq: u64,
    pub mbs: u64,
}

/// One step to walk: the configuration, the sizes and the pipeline layout.
#[derive(Debug, Clone, Copy)]
pub struct Step<'a> {
    pub cfg: &'a ParallelConfig,
    /// The model whose activations are kept (for `Op::Keep`) and whose MLP is gated or not.
    pub model: &'a ModelSpec,
    pub workload: &'a Workload,
    pub dims: &'a Dims,
    /// Whether each layer is a mixture-of-experts layer.
    pub moe_layer: &'a [bool],
    pub schedule: Schedule,
    pub micro_batches: u64,
    /// Layers per virtual stage and the first layer of each.
    pub stage_layers: &'a [usize],
    pub first_layer: &'a [usize],
}

impl Step<'_> {
    /// Virtual stages per rank's chunk count: the interleaved schedule's `vpp`, else 1.
    pub fn vpp(&self) -> u64 {
        self.schedule.interleaving(self.cfg.vpp)
    }
}

#[cfg(test)]
mod tests;
