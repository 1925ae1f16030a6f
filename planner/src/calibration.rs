//! The measured-run format the executor writes, and calibration: measured runs in,
//! a profile overlay out, and the overlay applied to a hardware profile. Pure.
//!
//! A run records, per component, the seconds per step on the slowest rank, every
//! GEMM shape's median time and every collective's median time with its size, group
//! and tier. Calibration turns the GEMMs into achieved fractions of the profile's
//! peak (FLOP-weighted, by operation class) and the collectives into bus-bandwidth
//! fractions of the tier's link, which is what the cost model's constants are.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{ParallelConfig, Workload};
use crate::error::InputError;
use crate::hardware::HardwareProfile;
use crate::model::ModelSpec;

pub const RUN_SCHEMA_VERSION: u32 = 1;
pub const OVERLAY_SCHEMA_VERSION: u32 = 1;

/// One GEMM shape as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmPoint {
    /// Operation class (cost-model names: attention_proj, attention_core, mlp, ...).
    pub class: String,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// "bf16", "fp8" or "f32" (the CPU backend).
    pub dtype: String,
    pub calls: u64,
    pub median_secs: f64,
    pub tflops: f64,
}

/// One collective as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommPoint {
    /// Cost-model kind: tp, cp, ep, pp, dp_grad, dp_param, edp_grad, edp_param.
    pub kind: String,
    /// all_reduce, all_gather, reduce_scatter, all_to_all, send_recv.
    pub op: String,
    pub ranks: u64,
    /// nccl-tests convention: the full buffer (all-gather output, reduce-scatter input).
    pub bytes: f64,
    /// "nvlink", "network" or "loopback" (CPU backend: TCP on one host).
    pub tier: String,
    pub calls: u64,
    pub median_secs: f64,
    pub busbw_gbytes_per_s: f64,
}

/// What the executor's checks counted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunChecks {
    pub activations: u64,
    pub gradients: u64,
    pub collectives: u64,
    pub replicas: u64,
    pub p2p_messages: u64,
    pub max_rel_error: f64,
}

/// A measured run: what `sextant exec` writes on rank 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredRun {
    pub schema_version: u32,
    pub generator: String,
    /// False when any rank failed: the numbers are then partial and `failure` says why.
    pub complete: bool,
    #[serde(default)]
    pub failure: Option<String>,
    /// "cpu" or "cuda".
    pub backend: String,
    /// What ran it ("cpu: 8 local processes" or the GPU's name).
    pub device: String,
    /// FNV-1a hash of the plan file every rank ran.
    pub plan_hash: String,
    /// Which ranked plan of the file ran (1 = best).
    pub plan_rank: usize,
    /// The hardware profile the plan was made for.
    pub profile: String,
    /// The model as executed (scaled sizes, layer count).
    pub model: ModelSpec,
    pub workload: Workload,
    /// The configuration as executed (the layout re-split for the executed layers).
    pub config: ParallelConfig,
    pub schedule: String,
    pub world_size: u64,
    pub gpus_per_node: u64,
    pub warmup_steps: u64,
    pub steps: u64,
    /// Per timed step: the slowest rank's time.
    pub step_secs: Vec<f64>,
    /// Component -> seconds per step on the slowest rank for that component.
    pub components: BTreeMap<String, f64>,
    pub gemms: Vec<GemmPoint>,
    pub collectives: Vec<CommPoint>,
    /// Per pipeline rank: most (chunk, micro-batch) activations held at once.
    pub peak_live_chunks: Vec<u64>,
    pub peak_activation_bytes: u64,
    pub param_bytes: u64,
    pub optimizer_bytes: u64,
    pub checks: RunChecks,
}

impl MeasuredRun {
    pub fn from_json(text: &str) -> Result<MeasuredRun, InputError> {
        let r: MeasuredRun = serde_json::from_str(text).map_err(|e| InputError::Json { what: "measured run".into(), detail: e.to_string() })?;
        if r.schema_version != RUN_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion { what: "measured run".into(), found: r.schema_version, supported: RUN_SCHEMA_VERSION });
        }
        r.model.validate()?;
        r.workload.validate().map_err(InputError::Workload)?;
        let bad = |x: f64| !x.is_finite() || x < 0.0;
        if r.step_secs.iter().any(|&x| bad(x)) || r.components.values().any(|&x| bad(x)) {
            return Err(InputError::Workload("measured run holds a negative or non-finite time".into()));
        }
        if r.gemms.iter().any(|g| bad(g.median_secs) || bad(g.tflops)) || r.collectives.iter().any(|c| bad(c.median_secs) || bad(c.bytes) || bad(c.busbw_gbytes_per_s)) {
            return Err(InputError::Workload("measured run holds a negative or non-finite GEMM or collective sample".into()));
        }
        Ok(r)
    }

    /// Median of the timed steps.
    pub fn median_step_secs(&self) -> Option<f64> {
        median(&self.step_secs)
    }
}

pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    Some(if n % 2 == 1 { s[n / 2] } else { 0.5 * (s[n / 2 - 1] + s[n / 2]) })
}

/// Measured constants for one profile, fitted from measured runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Overlay {
    pub schema_version: u32,
    /// Profile the runs were planned for; the overlay applies only to it.
    pub profile: String,
    pub backend: String,
    pub device: String,
    /// The runs it was fitted on (plan hashes).
    pub runs: Vec<String>,
    /// Achieved fraction of the profile's BF16 peak by large GEMMs (projection, MLP,
    /// expert GEMMs), FLOP-weighted.
    #[serde(default)]
    pub gemm_bf16: Option<f64>,
    /// Achieved fraction of peak by the attention core (scores and weighted sum).
    #[serde(default)]
    pub attention: Option<f64>,
    /// Bus bandwidth as a fraction of the tier's link, median over the collectives
    /// inside one node (NVLink or, for the CPU backend, loopback).
    #[serde(default)]
    pub nvlink_busbw: Option<f64>,
    /// The same across nodes.
    #[serde(default)]
    pub network_busbw: Option<f64>,
    pub gemm_points: Vec<GemmPoint>,
    pub collective_points: Vec<CommPoint>,
}

impl Overlay {
    pub fn from_json(text: &str) -> Result<Overlay, InputError> {
        let o: Overlay = serde_json::from_str(text).map_err(|e| InputError::Json { what: "calibration overlay".into(), detail: e.to_string() })?;
        if o.schema_version != OVERLAY_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion { what: "calibration overlay".into(), found: o.schema_version, supported: OVERLAY_SCHEMA_VERSION });
        }
        for (name, v) in [("gemm_bf16", o.gemm_bf16), ("attention", o.attention), ("nvlink_busbw", o.nvlink_busbw), ("network_busbw", o.network_busbw)] {
            if let Some(x) = v {
                if !x.is_finite() || x <= 0.0 || x > 10.0 {
                    return Err(InputError::Workload(format!("calibration overlay: {name} = {x} is not a fraction of peak in (0, 10]")));
                }
            }
        }
        Ok(o)
    }
}

fn flop_weighted(points: &[&GemmPoint], peak_flops: f64) -> Option<f64> {
    let (flops, secs) = points.iter().fold((0.0, 0.0), |(f, s), g| {
        let calls = g.calls as f64;
        (f + calls * 2.0 * (g.m * g.n * g.k) as f64, s + calls * g.median_secs)
    });
    (flops > 0.0 && secs > 0.0).then(|| flops / secs / peak_flops)
}

/// Fits an overlay for `profile` from complete runs planned for it.
pub fn calibrate(runs: &[MeasuredRun], profile: &HardwareProfile) -> Result<Overlay, String> {
    if runs.is_empty() {
        return Err("no measured run given".into());
    }
    for r in runs {
        if !r.complete {
            return Err(format!("run of plan {} is marked incomplete ({}): calibrate only from complete runs", r.plan_hash, r.failure.as_deref().unwrap_or("no reason recorded")));
        }
        if r.profile != profile.name {
            return Err(format!("run of plan {} was planned for profile '{}', not '{}'", r.plan_hash, r.profile, profile.name));
        }
        if r.backend != runs[0].backend {
            return Err(format!("runs mix backends ('{}' and '{}'): calibrate one device at a time", runs[0].backend, r.backend));
        }
    }
    let gemms: Vec<GemmPoint> = runs.iter().flat_map(|r| r.gemms.iter().cloned()).collect();
    let colls: Vec<CommPoint> = runs.iter().flat_map(|r| r.collectives.iter().cloned()).collect();
    let peak = profile.peak_flops(false);
    let large: Vec<&GemmPoint> = gemms.iter().filter(|g| matches!(g.class.as_str(), "attention_proj" | "mlp" | "moe_experts")).collect();
    let attn: Vec<&GemmPoint> = gemms.iter().filter(|g| g.class == "attention_core").collect();
    let busbw = |tiers: &[&str], link: f64| -> Option<f64> {
        let v: Vec<f64> = colls.iter().filter(|c| tiers.contains(&c.tier.as_str()) && c.op != "send_recv" && c.ranks > 1).map(|c| c.busbw_gbytes_per_s / link).collect();
        median(&v)
    };
    Ok(Overlay {
        schema_version: OVERLAY_SCHEMA_VERSION,
        profile: profile.name.clone(),
        backend: runs[0].backend.clone(),
        device: runs[0].device.clone(),
        runs: runs.iter().map(|r| r.plan_hash.clone()).collect(),
        gemm_bf16: flop_weighted(&large, peak),
        attention: flop_weighted(&attn, peak),
        nvlink_busbw: busbw(&["nvlink", "loopback"], profile.node.nvlink_gbytes_per_s),
        network_busbw: busbw(&["network"], profile.network.nic_gbytes_per_s),
        gemm_points: gemms,
        collective_points: colls,
    })
}

/// The profile with the overlay's measured constants in place of its own.
pub fn apply(profile: &HardwareProfile, o: &Overlay) -> Result<HardwareProfile, String> {
    if o.profile != profile.name {
        return Err(format!("the calibration overlay was measured for profile '{}', not '{}'", o.profile, profile.name));
    }
    let mut p = profile.clone();
    let note = format!("measured: sextant calibrate on {} ({})", o.device, o.backend);
    if let Some(x) = o.gemm_bf16 {
        p.efficiency.gemm_bf16 = x;
        p.efficiency.gemm_overhead_us = 0.0;
        p.sources.insert("efficiency.gemm_bf16".into(), note.clone());
    }
    if let Some(x) = o.attention {
        p.efficiency.attention_fwd = x;
        p.efficiency.attention_bwd = x;
        p.sources.insert("efficiency.attention_fwd".into(), note.clone());
    }
    if let Some(x) = o.nvlink_busbw {
        p.efficiency.nvlink_busbw = x;
        p.efficiency.nvls_busbw = 0.0;
        p.node.nvls = false;
        p.sources.insert("efficiency.nvlink_busbw".into(), note.clone());
    }
    if let Some(x) = o.network_busbw {
        p.efficiency.network_busbw = x;
        p.sources.insert("efficiency.network_busbw".into(), note);
    }
    Ok(p)
}
