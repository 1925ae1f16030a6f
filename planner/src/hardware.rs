//! Hardware profiles: what one GPU, one node and the network can do, with the
//! efficiency constants the cost model uses and the source of each.
//!
//! Profiles are JSON (schema in ARCHITECTURE.md); the built-in ones live in
//! `hwprofiles/` and are compiled in. A user-written profile goes through the same
//! [`HardwareProfile::from_json`] and is rejected with the offending field named.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::InputError;
use crate::presets::suggestions;

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
}

/// Achieved fractions of peak. Each one is named in `sources`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Efficiency {
    /// Fraction of BF16/FP16 peak that large training GEMMs sustain.
    pub gemm_bf16: f64,
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
}

/// Memory that the model cannot use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryReserve {
    /// CUDA context, NCCL buffers, cuBLAS workspaces: GiB per GPU.
    pub reserve_gib: f64,
    /// Allocator fragmentation, as a fraction of the bytes the model allocates.
    pub fragmentation: f64,
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
    /// Field path -> where its value comes from.
    #[serde(default)]
    pub sources: BTreeMap<String, String>,
}

/// Built-in profiles, compiled in from hwprofiles/.
const BUILTIN: &[(&str, &str)] = &[
    ("a100-80g", include_str!("../../hwprofiles/a100-80g.json")),
    ("h100-sxm", include_str!("../../hwprofiles/h100-sxm.json")),
    ("h200-sxm", include_str!("../../hwprofiles/h200-sxm.json")),
    ("h800", include_str!("../../hwprofiles/h800.json")),
    ("b200", include_str!("../../hwprofiles/b200.json")),
    ("gb200-nvl72", include_str!("../../hwprofiles/gb200-nvl72.json")),
    ("mi300x", include_str!("../../hwprofiles/mi300x.json")),
];

/// The default cluster: DGX H100.
pub const DEFAULT_PROFILE: &str = "h100-sxm";

/// Efficiency fields that every profile must justify in `sources`.
pub const SOURCED_FIELDS: &[&str] = &[
    "gpu.peak_tflops",
    "gpu.hbm_gib",
    "gpu.hbm_tbytes_per_s",
    "node.nvlink_gbytes_per_s",
    "network.nic_gbytes_per_s",
    "efficiency.gemm_bf16",
    "efficiency.attention_fwd",
    "efficiency.hbm",
    "efficiency.nvlink_busbw",
    "efficiency.network_busbw",
    "memory.reserve_gib",
];

impl HardwareProfile {
    /// Parses and checks a profile. Errors name the field.
    pub fn from_json(text: &str) -> Result<HardwareProfile, InputError> {
        let p: HardwareProfile = serde_json::from_str(text).map_err(|e| InputError::Json {
            what: "hardware profile".into(),
            detail: e.to_string(),
        })?;
        if p.schema_version != PROFILE_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion {
                what: "hardware profile".into(),
                found: p.schema_version,
                supported: PROFILE_SCHEMA_VERSION,
            });
        }
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), InputError> {
        let err = |field: &str, problem: String| {
            Err(InputError::Profile {
                profile: self.name.clone(),
                field: field.into(),
                problem,
            })
        };
        let positive: [(&str, f64, f64); 11] = [
            ("gpu.peak_tflops.bf16", self.gpu.peak_tflops.bf16, 1e6),
            ("gpu.peak_tflops.fp16", self.gpu.peak_tflops.fp16, 1e6),
            ("gpu.hbm_gib", self.gpu.hbm_gib, 1e5),
            ("gpu.hbm_tbytes_per_s", self.gpu.hbm_tbytes_per_s, 1e3),
            ("node.nvlink_gbytes_per_s", self.node.nvlink_gbytes_per_s, 1e5),
            ("network.nic_gbytes_per_s", self.network.nic_gbytes_per_s, 1e5),
            ("network.latency_us", self.network.latency_us, 1e5),
            ("efficiency.gemm_overhead_us", self.efficiency.gemm_overhead_us, 1e4),
            ("efficiency.nvlink_latency_us", self.efficiency.nvlink_latency_us, 1e5),
            ("memory.reserve_gib", self.memory.reserve_gib + 1.0, 1e5),
            ("gpu.peak_tflops.fp8", self.gpu.peak_tflops.fp8 + 1.0, 1e6),
        ];
        for (field, v, max) in positive {
            if !(v.is_finite() && v > 0.0 && v <= max) {
                return err(field, format!("{v} must be a positive number no larger than {max}"));
            }
        }
        if self.memory.reserve_gib >= self.gpu.hbm_gib {
            return err(
                "memory.reserve_gib",
                format!(
                    "reserve {} GiB leaves nothing of {} GiB HBM",
                    self.memory.reserve_gib, self.gpu.hbm_gib
                ),
            );
        }
        let fractions = [
            ("efficiency.gemm_bf16", self.efficiency.gemm_bf16, false),
            ("efficiency.gemm_fp8", self.efficiency.gemm_fp8, true),
            ("efficiency.attention_fwd", self.efficiency.attention_fwd, false),
            ("efficiency.attention_bwd", self.efficiency.attention_bwd, false),
            ("efficiency.hbm", self.efficiency.hbm, false),
            ("efficiency.nvlink_busbw", self.efficiency.nvlink_busbw, false),
            ("efficiency.network_busbw", self.efficiency.network_busbw, false),
            ("efficiency.overlap_slowdown", self.efficiency.overlap_slowdown, true),
            ("memory.fragmentation", self.memory.fragmentation, true),
        ];
        for (field, v, zero_ok) in fractions {
            let ok = v.is_finite() && v <= 1.0 && (v > 0.0 || (zero_ok && v == 0.0));
            if !ok {
                let lo = if zero_ok { "0" } else { "a number above 0" };
                return err(field, format!("{v} is not a fraction: expected {lo} up to 1"));
            }
        }
        if self.gpu.peak_tflops.fp8 > 0.0 && self.efficiency.gemm_fp8 <= 0.0 {
            return err("efficiency.gemm_fp8", "the GPU has FP8 peak throughput but no FP8 GEMM efficiency".into());
        }
        if self.node.nvls && !(self.efficiency.nvls_busbw > 0.0 && self.efficiency.nvls_busbw <= 2.0) {
            return err("efficiency.nvls_busbw", format!("{} must be in (0, 2] when node.nvls is true", self.efficiency.nvls_busbw));
        }
        if self.node.gpus_per_node == 0 || self.node.gpus_per_node > 1024 {
            return err("node.gpus_per_node", format!("{} must be between 1 and 1024", self.node.gpus_per_node));
        }
        if self.node.nvlink_domain == 0
            || !self.node.nvlink_domain.is_multiple_of(self.node.gpus_per_node)
            || self.node.nvlink_domain > 1 << 16
        {
            return err(
                "node.nvlink_domain",
                format!(
                    "{} must be a positive multiple of gpus_per_node ({})",
                    self.node.nvlink_domain, self.node.gpus_per_node
                ),
            );
        }
        Ok(())
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

    /// Usable bytes for the model: HBM less the reserve.
    pub fn usable_bytes(&self) -> f64 {
        (self.gpu.hbm_gib - self.memory.reserve_gib) * GIB
    }
}

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// All built-in profiles, parsed. Panics only if a compiled-in file is broken, which
/// the unit tests rule out.
pub fn builtin_profiles() -> Vec<HardwareProfile> {
    BUILTIN
        .iter()
        .map(|(name, text)| {
            HardwareProfile::from_json(text)
                .unwrap_or_else(|e| panic!("built-in profile {name} is invalid: {e}"))
        })
        .collect()
}

/// Finds a built-in profile by name or alias.
pub fn builtin_profile(name: &str) -> Result<HardwareProfile, InputError> {
    let key = name.trim().to_ascii_lowercase();
    let all = builtin_profiles();
    if let Some(p) = all
        .iter()
        .find(|p| p.name == key || p.aliases.contains(&key))
    {
        return Ok(p.clone());
    }
    let names: Vec<&str> = all
        .iter()
        .flat_map(|p| std::iter::once(p.name.as_str()).chain(p.aliases.iter().map(|a| a.as_str())))
        .collect();
    Err(InputError::UnknownProfile {
        name: name.to_string(),
        suggestions: suggestions(&key, names.into_iter()),
    })
}

/// A set of identical GPUs described by one profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    pub profile: HardwareProfile,
    pub gpus: u64,
    /// Let tensor parallelism span more than one NVLink domain (off by default:
    /// TP's per-layer collectives need NVLink bandwidth).
    pub allow_tp_beyond_nvlink: bool,
}

/// Largest cluster Sextant reasons about.
pub const MAX_GPUS: u64 = 1 << 24;

impl Cluster {
    /// Checks the GPU count against the node size.
    pub fn new(profile: HardwareProfile, gpus: u64) -> Result<Cluster, InputError> {
        let per_node = profile.node.gpus_per_node;
        if per_node == 0 {
            return Err(InputError::Profile { profile: profile.name.clone(), field: "node.gpus_per_node".into(), problem: "0 must be between 1 and 1024".into() });
        }
        if gpus == 0 {
            return Err(InputError::Workload("--gpus must be at least 1".into()));
        }
        if gpus > MAX_GPUS {
            return Err(InputError::Workload(format!(
                "{gpus} GPUs is more than Sextant models (at most {MAX_GPUS})"
            )));
        }
        let ok = if gpus < per_node {
            per_node.is_multiple_of(gpus)
        } else {
            gpus.is_multiple_of(per_node)
        };
        if !ok {
            let lower = if gpus < per_node {
                (1..=gpus).rev().find(|d| per_node.is_multiple_of(*d)).unwrap_or(1)
            } else {
                gpus / per_node * per_node
            };
            return Err(InputError::Workload(format!(
                "{gpus} GPUs do not fill {} nodes of {per_node} GPUs: use a multiple of {per_node} (e.g. {} or {}), or a divisor of {per_node} for a single node",
                profile.name,
                lower,
                lower.max(per_node) + if gpus < per_node { 0 } else { per_node },
            )));
        }
        Ok(Cluster { profile, gpus, allow_tp_beyond_nvlink: false })
    }

    pub fn nodes(&self) -> u64 {
        self.gpus.div_ceil(self.profile.node.gpus_per_node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_and_cite_sources() {
        let all = builtin_profiles();
        assert_eq!(all.len(), BUILTIN.len());
        for p in &all {
            for field in SOURCED_FIELDS {
                assert!(
                    p.sources.keys().any(|k| k == field),
                    "profile {} gives no source for {field}",
                    p.name
                );
            }
        }
    }

    #[test]
    fn lookup_by_alias_and_suggestion() {
        assert_eq!(builtin_profile("h100").unwrap().name, "h100-sxm");
        let e = builtin_profile("h10").unwrap_err().to_string();
        assert!(e.contains("h100"), "{e}");
    }

    #[test]
    fn wrong_profile_names_the_field() {
        let text = include_str!("../../hwprofiles/h100-sxm.json");
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["efficiency"]["gemm_bf16"] = serde_json::json!(1.7);
        let e = HardwareProfile::from_json(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("efficiency.gemm_bf16"), "{e}");
        v["efficiency"]["gemm_bf16"] = serde_json::json!(0.7);
        v["node"]["gpus_per_node"] = serde_json::json!(0);
        let e = HardwareProfile::from_json(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("gpus_per_node"), "{e}");
        v["node"].as_object_mut().unwrap().remove("gpus_per_node");
        let e = HardwareProfile::from_json(&v.to_string()).unwrap_err().to_string();
        assert!(e.contains("gpus_per_node"), "{e}");
    }

    #[test]
    fn gpu_counts_must_fill_nodes() {
        let p = builtin_profile("h100-sxm").unwrap();
        assert!(Cluster::new(p.clone(), 128).is_ok());
        assert!(Cluster::new(p.clone(), 1).is_ok());
        assert!(Cluster::new(p.clone(), 4).is_ok());
        let e = Cluster::new(p.clone(), 7).unwrap_err().to_string();
        assert!(e.contains("7 GPUs"), "{e}");
        assert!(Cluster::new(p.clone(), 12).is_err());
        assert!(Cluster::new(p, 0).is_err());
    }
}
