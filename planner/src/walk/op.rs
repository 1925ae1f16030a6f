//! The ops of a device program and their sizes.

pub use crate::cost::CommKind;
pub use crate::ranks::GroupKind;

/// What a GEMM or an element-wise pass computes: the classes the cost model prices
/// and a measured run books its seconds under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    AttentionProj,
    AttentionCore,
    Mlp,
    MoeExperts,
    Router,
    Elementwise,
    Optimizer,
}

impl OpClass {
    /// The name a measured run books this class under.
    pub fn key(self) -> &'static str {
        match self {
            OpClass::AttentionProj => "attention_proj",
            OpClass::AttentionCore => "attention_core",
            OpClass::Mlp => "mlp",
            OpClass::MoeExperts => "moe_experts",
            OpClass::Router => "router",
            OpClass::Elementwise => "elementwise",
            OpClass::Optimizer => "optimizer",
        }
    }
}

impl std::fmt::Display for OpClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

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
        class: OpClass,
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        count: u64,
        recompute: bool,
    },
    /// Element-wise work: `bytes` read and written in HBM in all.
    Memory {
        class: OpClass,
        bytes: u64,
        recompute: bool,
    },
    /// A collective over this rank's group of kind `group`. `bytes`
    /// follows nccl-tests: the all-gather's output, the reduce-scatter's input,
    /// the all-reduce's buffer, everything an all-to-all sends.
    Coll {
        kind: CommKind,
        group: GroupKind,
        op: Coll,
        bytes: u64,
    },
    /// One NCCL group of sends and receives: `(peer rank, bytes)`.
    P2p {
        kind: CommKind,
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
