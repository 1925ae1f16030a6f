//! The ops of a device program and their sizes.

/// Bytes of a BF16 element.
pub const B: u64 = 2;

/// A collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Coll {
    AllGather,
    ReduceScatter,
    AllReduce,
    AllToAll,
}

impl Coll {
    pub fn label(self) -> &'static str {
        match self {
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::AllReduce => "all_reduce",
            Coll::AllToAll => "all_to_all",
        }
    }
}

/// One thing a rank issues, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Row-major `C[m, n] = A[m, k] · B[k, n]`, `batch` independent products
    /// (strided), issued `count` times in a row (one per local expert).
    Gemm {
        class: &'static str,
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        count: u64,
        recompute: bool,
    },
    /// Element-wise work: `bytes` read and written in HBM in all.
    Memory {
        class: &'static str,
        bytes: u64,
        recompute: bool,
    },
    /// A collective over this rank's group of kind `GROUP_KINDS[group]`. `bytes`
    /// follows nccl-tests: the all-gather's output, the reduce-scatter's input,
    /// the all-reduce's buffer, everything an all-to-all sends.
    Coll {
        kind: &'static str,
        group: usize,
        op: Coll,
        bytes: u64,
    },
    /// One NCCL group of sends and receives: `(peer rank, bytes)`.
    P2p {
        kind: &'static str,
        sends: Vec<(u64, u64)>,
        recvs: Vec<(u64, u64)>,
    },
    /// Activations of (chunk, micro-batch) kept until its backward.
    Keep { key: (u64, u64), bytes: u64 },
    /// Their release after the backward.
    Free { key: (u64, u64) },
    /// Every rank: the step's start.
    Barrier,
}

impl Op {
    /// FLOPs of a GEMM (0 for anything else).
    pub fn flops(&self) -> f64 {
        match *self {
            Op::Gemm {
                m,
                n,
                k,
                batch,
                count,
                ..
            } => 2.0 * m as f64 * n as f64 * k as f64 * batch as f64 * count as f64,
            _ => 0.0,
        }
    }
}
