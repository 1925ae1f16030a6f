//! The device program: what one rank issues in one training step at the plan's real
//! sizes, as a flat list of [`Op`]s in issue order. The CUDA backend runs it on one
//! stream (GEMMs through cuBLAS, collectives and sends through NCCL); [`check()`] runs
//! every rank's list against the others on the CPU, the way NCCL would pair them,
//! and finds what would hang on the GPUs (a send nobody receives, a collective the
//! members reach in different orders or with different sizes) before any GPU time
//! is spent.
//!
//! It is built from the same plan and schedule as the CPU program
//! ([`crate::program`]), which checks the numbers; this one carries no data, only
//! sizes and order, so it can describe a 70B model's step in a few thousand ops.
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
//!   token); with expert TP an all-gather / reduce-scatter over ETP; the local
//!   experts' GEMMs; the return all-to-all; un-permute.
//! - Backward: per forward GEMM `[m, k] · [k, n]` an input gradient `(m, k, n)` and
//!   a weight gradient `(k, n, m)` (deferred to the W pass under ZB-H1 and
//!   DualPipe); the core's five GEMMs (2.5x the forward); each TP collective's
//!   conjugate; the CP ring carries K/V and their gradients.
//! - Recomputation replays the forward (full) or the selected modules.
//!
//! Pipeline transfers follow Megatron's p2p batching: a pass's outgoing send is
//! issued in one NCCL group with the next pass's incoming receive
//! (`send_forward_recv_backward` and kin), which is what keeps 1F1B from deadlocking
//! on blocking sends. The step ends with the DualPipe mirror sum, the data-parallel
//! gradient reduction per replica group (reduce-scatter with a sharded optimizer,
//! else all-reduce), the Adam update's HBM traffic and the parameter all-gather.
//!
//! The module's parts: [`Op`] and its sizes (`op`), the builder that walks one
//! rank's step (`build`: [`program`], [`footprint`]), the pairing check ([`check()`]),
//! device scratch sizes ([`Scratch`]) and the booking of measured op times into a
//! rank's statistics ([`book()`], [`peaks`]).

mod book;
mod build;
mod check;
mod op;
mod scratch;

pub use book::{book, peaks};
pub use build::{footprint, program, programs};
pub use check::{check, Checked};
pub use op::{Coll, Op};
pub use scratch::{coll_sides, Scratch, COPY_PIECE};
