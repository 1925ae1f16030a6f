//! Built without the `cuda` feature: the CUDA backend's public functions with the
//! same signatures, each returning one error that says so (candle's dummy backend),
//! so that callers need no `cfg` of their own. "Compiled with CUDA" is answered
//! here; "a GPU is present" is the real backend's question, at run time.

/// The stand-in for [`crate::cuda`] (library loading, probe, NCCL id).
pub mod cuda {
    pub use crate::error::CudaError;

    /// Always the not-compiled error.
    pub fn probe(_ordinal: usize) -> Result<String, CudaError> {
        Err(CudaError::NotCompiled)
    }

    /// Always the not-compiled error.
    pub fn free_memory(_ordinal: usize) -> Result<(u64, u64), CudaError> {
        Err(CudaError::NotCompiled)
    }

    /// Always the not-compiled error.
    pub fn nccl_unique_id() -> Result<Vec<u8>, CudaError> {
        Err(CudaError::NotCompiled)
    }
}

/// The stand-ins for the benchmarks' functions; their types are
/// [`crate::bench`]'s, compiled in both builds.
pub mod bench {
    use std::path::PathBuf;

    use crate::bench::{
        CollOp, CollTimes, DeviceInfo, GemmShape, GemmTimes, MemOp, PeerTimes, Timing,
    };
    use crate::culibs::Lib;
    use crate::error::{BenchError, CudaError};

    /// Always the not-compiled error.
    pub fn device_info(_ordinal: usize) -> Result<DeviceInfo, BenchError> {
        Err(CudaError::NotCompiled.into())
    }

    /// Always the not-compiled error.
    pub fn library_files(_libs: &[Lib]) -> Result<Vec<(Lib, Option<PathBuf>)>, BenchError> {
        Err(CudaError::NotCompiled.into())
    }

    /// Always the not-compiled error.
    pub fn gemms(
        _ordinal: usize,
        _shapes: &[GemmShape],
        _t: Timing,
    ) -> Result<GemmTimes, BenchError> {
        Err(CudaError::NotCompiled.into())
    }

    /// Always the not-compiled error.
    pub fn memory(
        _ordinal: usize,
        _sizes: &[u64],
        _t: Timing,
    ) -> Result<Vec<(MemOp, u64, f64)>, BenchError> {
        Err(CudaError::NotCompiled.into())
    }

    /// Always the not-compiled error.
    pub fn collectives(
        _ordinals: &[usize],
        _ops: &[CollOp],
        _sizes: &[u64],
        _t: Timing,
    ) -> Result<CollTimes, BenchError> {
        Err(CudaError::NotCompiled.into())
    }

    /// Always the not-compiled error.
    pub fn peer_copies(
        _a: usize,
        _b: usize,
        _sizes: &[u64],
        _t: Timing,
    ) -> Result<PeerTimes, BenchError> {
        Err(CudaError::NotCompiled.into())
    }
}

/// The stand-in for [`crate::device`] (the device program's interpreter).
pub mod device {
    use std::sync::Mutex;

    use sextant_planner::ranks::RankMap;

    use crate::error::CudaError;
    pub use crate::error::DeviceError;
    use crate::record::RankStats;
    use crate::trace::Op;

    /// Longest program the backend records events for (one per op and one per gate
    /// batch); cut the step down with --micro-batches.
    pub const MAX_PROGRAM_OPS: usize = 4_000_000;

    /// What one rank's run needs besides its program (the same fields as the CUDA
    /// backend's, so a caller builds it the same way in either build).
    pub struct DeviceJob<'a> {
        pub ordinal: usize,
        pub unique_id: &'a [u8],
        pub rank: u64,
        pub map: &'a RankMap,
        pub program: &'a [Op],
        /// Model state bytes: (weights, gradients, optimizer).
        pub footprint: (u64, u64, u64),
        pub warmup: u64,
        pub steps: u64,
        /// What the rank is doing, for the watchdog's message.
        pub phase: &'a Mutex<String>,
    }

    /// Always the not-compiled error.
    pub fn run_device(_job: &DeviceJob) -> Result<RankStats, DeviceError> {
        Err(CudaError::NotCompiled.into())
    }
}
