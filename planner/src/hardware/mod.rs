//! Hardware profiles: what one GPU, one node and the network can do, with the
//! efficiency constants the cost model uses and the source of each.
//!
//! Profiles are JSON (schema in ARCHITECTURE.md); the built-in ones live in
//! `hwprofiles/` and are compiled in. A user-written profile goes through the same
//! [`HardwareProfile::from_json`] and is rejected with the offending field named.
//!
//! This file holds the profile's types and what the cost model asks of a profile;
//! `profile.rs` reads and checks one, `ranges.rs` the physical range of every
//! number, `curves.rs` the measured GEMM and attention curves, `builtin.rs` the
//! compiled-in profiles, `cluster.rs` the [`Cluster`].

mod builtin;
mod cluster;
mod curves;
mod profile;
pub mod ranges;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use builtin::{builtin_profile, builtin_profiles, DEFAULT_PROFILE, SOURCED_FIELDS};
pub use cluster::{Cluster, MAX_GPUS};
pub use curves::{AttentionCurve, AttentionPass, CurveError, GemmCurve, GemmDtype};
pub use ranges::{show, OutOfRange, Range};

pub const PROFILE_SCHEMA_VERSION: u32 = 1;

/// Dense (non-sparse) peak throughput per data type, TFLOP/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PeakTflops {
    pub bf16: f64,
    pub fp16: f64,
    /// 0 when the GPU has no FP8 tensor cores (A100).
    #[serde(default)]
    pub fp8: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub name: String,
    pub peak_tflops: PeakTflops,
    /// Block-scaled FP8 (MXFP8) in the tensor cores: Blackwell and newer.
    /// Transformer Engine's MXFP8 recipe needs compute capability 10.0 to 11.x
    /// (TransformerEngine d0067d0 `transformer_engine/pytorch/quantization.py:162-168`,
    /// `_compute_mxfp8_support`); Hopper runs FP8 with per-tensor or blockwise
    /// scales only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mxfp8: bool,
    /// Usable HBM as the driver reports it, GiB.
    pub hbm_gib: f64,
    pub hbm_tbytes_per_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub gpus_per_node: u64,
    /// GPUs that share one NVLink (or Infinity Fabric) domain. Equal to
    /// `gpus_per_node` for DGX-style nodes, 72 for a GB200 NVL72 rack.
    pub nvlink_domain: u64,
    /// NVLink bandwidth per GPU, one direction, GB/s.
    pub nvlink_gbytes_per_s: f64,
    /// NVLink SHARP (in-switch reduction) available for all-reduce.
    #[serde(default)]
    pub nvls: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Network {
    /// Scale-out (InfiniBand / RoCE / EFA) bandwidth per GPU, one direction, GB/s.
    pub nic_gbytes_per_s: f64,
    /// One-hop latency across the network, microseconds.
    pub latency_us: f64,
    /// All-reduce, all-gather and reduce-scatter across nodes as measured at several
    /// node counts, for a network whose collectives slow down as they span more
    /// nodes (AWS EFA). Empty: `efficiency.network_busbw` and `latency_us` hold at
    /// every node count. See [`HardwareProfile::network_collective`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_domains: Vec<NetworkPoint>,
}

/// The network's figures for ring and tree collectives whose group spans `domains`
/// NVLink domains (nodes, where a node is one domain).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NetworkPoint {
    /// NVLink domains the group spans, 2 or more.
    pub domains: u64,
    /// Bus bandwidth as a fraction of the NIC's rate (what
    /// `efficiency.network_busbw` is at every node count without points).
    pub busbw: f64,
    /// Latency per step of the collective, microseconds (what `network.latency_us`
    /// is at every node count without points).
    pub latency_us: f64,
}

/// Achieved fractions of peak. Each one is named in `sources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Fraction of BF16/FP16 peak that large training GEMMs sustain.
    pub gemm_bf16: f64,
    /// Fraction of BF16 peak that a bare cuBLAS (hipBLASLt) GEMM reaches at its best
    /// shape on this GPU: the reference that the executor's and `sextant bench`'s
    /// measurements are compared with before they move `gemm_bf16` (see
    /// [`HardwareProfile::bare_gemm_bf16`]). 0: the BF16 curve's best point (and not
    /// written).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gemm_bf16_bare: f64,
    /// Fraction of FP8 peak that large FP8 training GEMMs sustain.
    #[serde(default)]
    pub gemm_fp8: f64,
    /// Fixed cost per GEMM launch (fill/drain of the tile pipeline), microseconds.
    pub gemm_overhead_us: f64,
    /// Fraction of BF16 peak that the fused attention kernel reaches, forward.
    pub attention_fwd: f64,
    /// Fraction of BF16 peak that the fused attention kernel reaches, backward.
    pub attention_bwd: f64,
    /// Fraction of HBM bandwidth reached by element-wise and optimizer kernels.
    pub hbm: f64,
    /// Ring bus bandwidth inside the NVLink domain as a fraction of `nvlink_gbytes_per_s`.
    pub nvlink_busbw: f64,
    /// NVLS all-reduce bus bandwidth as a fraction of `nvlink_gbytes_per_s` (above 1:
    /// the switch does the reduction). Used only when `node.nvls`.
    #[serde(default)]
    pub nvls_busbw: f64,
    /// Per-step latency of an NVLink collective, microseconds.
    pub nvlink_latency_us: f64,
    /// Fraction of the NIC bandwidth that collectives across nodes reach.
    pub network_busbw: f64,
    /// Fraction by which compute slows when communication overlaps it on the same
    /// GPU (SM and memory contention).
    pub overlap_slowdown: f64,
    /// Host (CPU) time of one operation an eager PyTorch training layer issues from
    /// Python (the interpreter, module hooks, autograd, the dispatcher and the
    /// launch), microseconds. With `host_kernel_us` it bounds a mixture-of-experts
    /// layer, whose forward blocks the host until the GPU has caught up (see
    /// `cost/host.rs`). 0: not priced (profiles that do not state it).
    #[serde(default)]
    pub host_op_us: f64,
    /// Host time of one kernel a library issues from C++ in a loop (one cuBLASLt
    /// call per expert of a grouped GEMM), microseconds.
    #[serde(default)]
    pub host_kernel_us: f64,
    /// Host time of one kernel of a dense transformer layer's forward or backward
    /// (counted per stack in `cost/host.rs`), an effective figure: the layer costs
    /// the longer of its GPU time and its kernels at this rate. 0: not priced (and
    /// not written, so that plan files from before the field read back unchanged).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_layer_kernel_us: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// Memory that the model cannot use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReserve {
    /// CUDA context, NCCL buffers, cuBLAS workspaces: GiB per GPU.
    pub reserve_gib: f64,
    /// Allocator fragmentation, as a fraction of the bytes the model allocates.
    pub fragmentation: f64,
    /// Fraction of HBM no plan may use: the margin against the memory model's
    /// own error, so that no recommended plan sits at the edge of HBM. A
    /// profile without it reads [`DEFAULT_HEADROOM`]; `--mem-headroom` overrides it.
    #[serde(default = "default_headroom")]
    pub headroom: f64,
}

/// The headroom of a profile that does not state one (see the built-in profiles'
/// `memory.headroom` source).
pub const DEFAULT_HEADROOM: f64 = 0.05;

fn default_headroom() -> f64 {
    DEFAULT_HEADROOM
}

/// A published bus-bandwidth measurement, kept beside the constants it supports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectivePoint {
    pub collective: String,
    pub ranks: u64,
    pub bytes: f64,
    pub busbw_gbytes_per_s: f64,
    /// "nvlink", "nvls" or "network".
    pub tier: String,
    pub source: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HardwareProfile {
    pub schema_version: u32,
    pub name: String,
    pub description: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub gpu: Gpu,
    pub node: Node,
    pub network: Network,
    pub efficiency: Efficiency,
    pub memory: MemoryReserve,
    #[serde(default)]
    pub collective_points: Vec<CollectivePoint>,
    /// Measured GEMM throughput by shape, at most one per data type. Without one, GEMM
    /// efficiency does not depend on shape (beyond the memory roofline).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gemm_curves: Vec<GemmCurve>,
    /// Measured fused-attention throughput by head dimension and sequence length, at
    /// most one per (pass, causal). Without one for a pass, attention efficiency does
    /// not depend on shape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention_curves: Vec<AttentionCurve>,
    /// Field path -> where its value comes from.
    #[serde(default)]
    pub sources: BTreeMap<String, String>,
    /// Set by `calibration::apply`: the profile carries a calibration overlay (as
    /// in a plan made with `--calibration`), so it takes no second one. Not
    /// written when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub calibrated: bool,
}

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

impl HardwareProfile {
    /// Whether the GPU runs MXFP8 ([`Gpu::mxfp8`]). Profiles and plan files
    /// written before the flag existed lack it: a profile named as a built-in one
    /// that has it (b200, gb200-nvl72) is read as having it too.
    pub fn runs_mxfp8(&self) -> bool {
        self.gpu.mxfp8 || builtin::builtin_profile(&self.name).is_ok_and(|b| b.gpu.mxfp8)
    }

    /// The fraction of BF16 peak a bare GEMM reaches at its best shape on this GPU:
    /// `efficiency.gemm_bf16_bare` where stated, else the best point of the BF16
    /// curve (a measured table of bare GEMMs); `None` with neither. Training stacks
    /// sustain less (`gemm_bf16`, fitted on published runs); a measurement of bare
    /// GEMMs on the user's GPUs is read against this level, not against that one.
    pub fn bare_gemm_bf16(&self) -> Option<f64> {
        if self.efficiency.gemm_bf16_bare > 0.0 {
            return Some(self.efficiency.gemm_bf16_bare);
        }
        let peak = self.gpu.peak_tflops.bf16;
        self.gemm_curves
            .iter()
            .find(|c| c.dtype == GemmDtype::Bf16)
            .map(|c| c.best_tflops() / peak)
            .filter(|x| x.is_finite() && *x > 0.0)
    }

    /// The shape factor of a GEMM ([`GemmCurve::shape_factor`]) from the curve of its
    /// data type, or the BF16 curve for FP8 when only that one was measured; `None`
    /// without a curve.
    pub fn gemm_shape_factor(&self, fp8: bool, m: f64, n: f64, k: f64) -> Option<f64> {
        let want = if fp8 { GemmDtype::Fp8 } else { GemmDtype::Bf16 };
        let curve = self
            .gemm_curves
            .iter()
            .find(|c| c.dtype == want)
            .or_else(|| self.gemm_curves.iter().find(|c| c.dtype == GemmDtype::Bf16));
        curve.map(|c| c.shape_factor(m, n, k))
    }

    /// The shape factor of a causal attention pass ([`AttentionCurve::factor`]) from
    /// the causal curve of that pass, or the unmasked one where only that was
    /// measured; `None` without a curve for the pass.
    pub fn attention_factor(&self, pass: AttentionPass, head_dim: f64, seq: f64) -> Option<f64> {
        let of_pass = |causal: bool| {
            self.attention_curves
                .iter()
                .find(|c| c.pass == pass && c.causal == causal)
        };
        of_pass(true)
            .or_else(|| of_pass(false))
            .map(|c| c.factor(head_dim, seq))
    }

    /// Bus bandwidth (a fraction of the NIC's rate) and latency per step
    /// (microseconds) of an all-reduce, all-gather or reduce-scatter whose group
    /// spans `domains` NVLink domains. With `network.by_domains`: its points, linear
    /// in log2(domains) between two of them and the nearest one's outside them;
    /// without: `efficiency.network_busbw` and `network.latency_us` whatever the
    /// count. All-to-all and point-to-point transfers always take the latter: each
    /// rank's own traffic through its own NIC.
    pub fn network_collective(&self, domains: u64) -> (f64, f64) {
        let pts = &self.network.by_domains;
        let (Some(first), Some(last)) = (pts.first(), pts.last()) else {
            return (self.efficiency.network_busbw, self.network.latency_us);
        };
        if domains <= first.domains {
            return (first.busbw, first.latency_us);
        }
        if domains >= last.domains {
            return (last.busbw, last.latency_us);
        }
        let x = (domains as f64).log2();
        for w in pts.windows(2) {
            let (a, b) = (w[0], w[1]);
            if domains <= b.domains {
                let (xa, xb) = ((a.domains as f64).log2(), (b.domains as f64).log2());
                let t = (x - xa) / (xb - xa);
                return (
                    a.busbw + t * (b.busbw - a.busbw),
                    a.latency_us + t * (b.latency_us - a.latency_us),
                );
            }
        }
        (last.busbw, last.latency_us)
    }

    /// Peak dense throughput for GEMMs in the given precision, FLOP/s.
    pub fn peak_flops(&self, fp8: bool) -> f64 {
        if fp8 && self.gpu.peak_tflops.fp8 > 0.0 {
            self.gpu.peak_tflops.fp8 * 1e12
        } else {
            self.gpu.peak_tflops.bf16 * 1e12
        }
    }

    pub fn hbm_bytes(&self) -> f64 {
        self.gpu.hbm_gib * GIB
    }

    /// What a plan may use: HBM less the headroom (the reserve is inside it, in
    /// each plan's own memory).
    pub fn capacity_bytes(&self) -> f64 {
        self.hbm_bytes() * (1.0 - self.memory.headroom)
    }

    /// Usable bytes for the model: HBM less the reserve.
    pub fn usable_bytes(&self) -> f64 {
        (self.gpu.hbm_gib - self.memory.reserve_gib) * GIB
    }
}
