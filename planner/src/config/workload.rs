//! What is trained: the sequence length, the global batch, the GEMM precision and
//! the MoE routing assumptions ([`Workload`]), and the ranges they must lie in.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Numeric precision of the training GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Bf16,
    Fp16,
    /// FP8 GEMMs with per-tensor (delayed or current) scaling; attention, the output
    /// layer and the router stay in BF16 (Transformer Engine's default recipe).
    Fp8,
    /// FP8 GEMMs with MX block scaling (Blackwell).
    Mxfp8,
}

impl Precision {
    pub fn is_fp8(self) -> bool {
        matches!(self, Precision::Fp8 | Precision::Mxfp8)
    }
    pub fn parse(s: &str) -> Option<Precision> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" => Some(Precision::Bf16),
            "fp16" => Some(Precision::Fp16),
            "fp8" => Some(Precision::Fp8),
            "mxfp8" => Some(Precision::Mxfp8),
            _ => None,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8 => "fp8",
            Precision::Mxfp8 => "mxfp8",
        })
    }
}

/// What is trained: sequence length, global batch (sequences per step), precision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub seq: u64,
    pub global_batch: u64,
    pub precision: Precision,
    /// Busiest expert's load relative to the mean (1.0: perfectly balanced routing).
    #[serde(default = "one_f64")]
    pub moe_imbalance: f64,
    /// Expert capacity (tokens over it are dropped); `None` is dropless routing.
    #[serde(default)]
    pub moe_capacity: Option<crate::routing::Capacity>,
}

fn one_f64() -> f64 {
    1.0
}

/// Largest sequence length (tokens) and global batch (sequences) accepted.
pub const MAX_SEQ: u64 = 1 << 24;
pub const MAX_GLOBAL_BATCH: u64 = 1 << 32;

impl Workload {
    /// Tokens the busiest of `ep` expert-parallel ranks processes over the
    /// balanced share, and the fraction dropped ([`crate::routing::rank_load`]).
    pub fn moe_rank_load(&self, moe: &crate::model::Moe, ep: u64) -> crate::routing::RankLoad {
        crate::routing::rank_load(moe, ep, self.moe_imbalance, self.moe_capacity)
    }

    /// Checks the ranges; the message names the field and what would be right.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.seq < 2 || self.seq > MAX_SEQ {
            return Err(WorkloadError::Seq(self.seq));
        }
        if self.global_batch == 0 || self.global_batch > MAX_GLOBAL_BATCH {
            return Err(WorkloadError::GlobalBatch(self.global_batch));
        }
        if !(self.moe_imbalance.is_finite() && (1.0..=64.0).contains(&self.moe_imbalance)) {
            return Err(WorkloadError::Imbalance(self.moe_imbalance));
        }
        if let Some(c) = &self.moe_capacity {
            c.validate()?;
        }
        Ok(())
    }
}

/// A workload number out of its range ([`Workload::validate`]); the message names
/// the field and what would be right.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("sequence length {0} is out of range: use 2 to {MAX_SEQ} tokens")]
    Seq(u64),
    #[error("global batch {0} is out of range: use 1 to {MAX_GLOBAL_BATCH} sequences")]
    GlobalBatch(u64),
    #[error("MoE imbalance {} is out of range: use 1.0 (balanced) up to 64", crate::hardware::ranges::show(*.0))]
    Imbalance(f64),
    #[error("MoE capacity factor {} is out of range: use {min} up to {max} (1.0 to 1.25 is usual), or leave it out for dropless routing", crate::hardware::ranges::show(*.0), min = crate::routing::MIN_CAPACITY_FACTOR, max = crate::routing::MAX_CAPACITY_FACTOR)]
    CapacityFactor(f64),
}
