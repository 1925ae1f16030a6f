//! The microbenchmarks behind `sextant bench`: BF16 cuBLAS
//! GEMMs over shapes, device copies and memsets (HBM bandwidth), NCCL collectives
//! over local GPUs driven from one thread, and copies between two GPUs.
//!
//! Every point is timed the same way (`gpu::timed_calls`): `warmup` untimed calls,
//! then each timed call between its own pair of CUDA events, the calls queued
//! behind a host gate in batches of 64, so that the GPU runs a batch back to back
//! and the events time the device, not the host's launch gaps. A point's time is
//! the median over its calls of the slowest GPU's event time.
//!
//! As everywhere in [`crate::cuda`], nothing here panics: a missing library or
//! device, a failed allocation or call is one line (`cuda::guarded`). Arguments
//! are checked before any library is touched.
//!
//! One module per benchmark (`--features cuda`): `gemm`, `memory` (HBM),
//! `collective` (NCCL) and `peer` (copies between two GPUs); `gpu` holds what they
//! share. What they take and return is in `spec`, compiled in both builds: without
//! the feature the same functions come from `nocuda.rs` and each returns one error
//! (candle's dummy backend), so a caller needs no `cfg` of its own.

#[cfg(feature = "cuda")]
mod collective;
#[cfg(feature = "cuda")]
mod gemm;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
mod peer;
mod spec;

pub use spec::{
    check_timing, gemm_bytes, CollOp, CollTimes, DeviceInfo, GemmShape, GemmTimes, MemOp,
    PeerTimes, Timing, MAX_ITERS,
};

#[cfg(feature = "cuda")]
use gpu::timed_calls;
#[cfg(feature = "cuda")]
pub use {
    collective::collectives,
    gemm::gemms,
    gpu::{device_info, library_files},
    memory::memory,
    peer::peer_copies,
};

#[cfg(not(feature = "cuda"))]
pub use crate::nocuda::bench::{
    collectives, device_info, gemms, library_files, memory, peer_copies,
};
