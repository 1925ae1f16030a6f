//! What a benchmark is asked and what it returns, in both builds: the argument
//! checks, the shapes and operations, the result types. The timing itself is in the
//! benchmark modules (`--features cuda`) or, without the feature, the stand-ins of
//! `nocuda.rs`, which take and return these same types.

use crate::error::BenchError;

/// Warm-up and timed calls per point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub warmup: u32,
    pub iters: u32,
}

/// The most timed calls per point (two events each).
pub const MAX_ITERS: u32 = 10_000;

pub fn check_timing(t: Timing) -> Result<(), BenchError> {
    if t.iters == 0 || t.iters > MAX_ITERS || t.warmup > MAX_ITERS {
        return Err(BenchError::Timing {
            iters: t.iters,
            warmup: t.warmup,
        });
    }
    Ok(())
}

/// What the driver says about one device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub name: String,
    pub memory_bytes: u64,
    pub sms: u64,
    pub compute_capability: (i32, i32),
    /// Devices this process sees.
    pub visible: u64,
    /// `cuDriverGetVersion`: the CUDA version the driver supports, e.g. 13000.
    pub cuda_version: i32,
}

/// One GEMM shape: row-major `C[m,n] = A[m,k] · B[k,n]`, `batch` products per call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GemmShape {
    pub class: String,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
}

impl GemmShape {
    /// Elements of A, B and C over the batch, or None on overflow.
    pub fn elems(&self) -> Option<(u64, u64, u64)> {
        let b = self.batch;
        Some((
            self.m.checked_mul(self.k)?.checked_mul(b)?,
            self.k.checked_mul(self.n)?.checked_mul(b)?,
            self.m.checked_mul(self.n)?.checked_mul(b)?,
        ))
    }
}

/// Bytes of A, B and C for one BF16 GEMM, or None on overflow.
pub fn gemm_bytes(m: u64, n: u64, k: u64) -> Option<u64> {
    let e = m
        .checked_mul(k)?
        .checked_add(k.checked_mul(n)?)?
        .checked_add(m.checked_mul(n)?)?;
    let b = e.checked_mul(2)?;
    usize::try_from(b).ok()?;
    Some(b)
}

/// The GEMM benchmark's results: per shape, the median seconds of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmTimes {
    pub points: Vec<(GemmShape, f64)>,
    /// `cublasGetVersion`.
    pub cublas_version: i32,
}

/// A device-memory operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemOp {
    /// `cuMemcpyDtoDAsync` within one device: reads and writes the bytes.
    Copy,
    /// `cuMemsetD8Async`: writes them.
    Memset,
}

impl MemOp {
    pub fn label(self) -> &'static str {
        match self {
            MemOp::Copy => "copy",
            MemOp::Memset => "memset",
        }
    }
}

/// An NCCL collective, BF16, summed where it reduces, out of place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollOp {
    AllReduce,
    AllGather,
    ReduceScatter,
}

impl CollOp {
    pub fn label(self) -> &'static str {
        match self {
            CollOp::AllReduce => "all_reduce",
            CollOp::AllGather => "all_gather",
            CollOp::ReduceScatter => "reduce_scatter",
        }
    }

    /// Bytes each rank sends and receives for a collective of `bytes` in nccl-tests'
    /// convention (the all-reduce's buffer, the all-gather's output, the
    /// reduce-scatter's input) over `n` ranks.
    pub fn sides(self, bytes: u64, n: u64) -> (u64, u64) {
        match self {
            CollOp::AllReduce => (bytes, bytes),
            CollOp::AllGather => (bytes / n, bytes),
            CollOp::ReduceScatter => (bytes, bytes / n),
        }
    }
}

/// The collective benchmark's results: (op, bytes, median seconds of the slowest
/// rank) and NCCL's version code.
#[derive(Debug, Clone, PartialEq)]
pub struct CollTimes {
    pub points: Vec<(CollOp, u64, f64)>,
    pub nccl_version: i32,
}

/// The peer-copy benchmark's results: whether peer access was on each way, and
/// (source, destination, bytes, median seconds) for each direction and size.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerTimes {
    pub peer_access: [bool; 2],
    pub points: Vec<(usize, usize, u64, f64)>,
}
