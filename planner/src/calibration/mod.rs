//! The measured-run format the executor writes, and calibration: measured runs in,
//! a profile overlay out, and the overlay applied to a hardware profile. Pure.
//!
//! A run records, per component, the seconds per step on the slowest rank, every
//! GEMM shape's median time and every collective's median time with its size, group
//! and tier. Calibration turns the GEMMs into achieved fractions of the profile's
//! peak (FLOP-weighted, by operation class) and the collectives into bus-bandwidth
//! fractions of the tier's link, which is what the cost model's constants are.
//!
//! An overlay fitted from the user's own training logs ([`crate::logfit`]) holds
//! multipliers on the profile's efficiencies instead ([`Scales`]): a log measures a
//! whole step, not a kernel, so it scales the profile's constants (and keeps its
//! shape curves) rather than replacing them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::{ParallelConfig, Workload};
use crate::error::InputError;
use crate::hardware::{ranges, show, GemmCurve, GemmDtype, HardwareProfile, Range, MAX_GPUS};
use crate::model::ModelSpec;

mod fit;
#[cfg(test)]
mod tests;

pub(crate) use fit::fit_collectives;
pub use fit::{
    apply, bare_gemm_ratio, bare_measurement, calibrate, duplicates, fit_two, on_fake_libraries,
    same_measurement, CalibrationError, Target,
};

pub const RUN_SCHEMA_VERSION: u32 = 1;

/// A measured time, when not 0: a nanosecond (the clocks' resolution) to about 11
/// days.
const SAMPLE_SECS: (f64, f64) = (1e-9, 1e6);
/// The largest GEMM dimension a run may record (the profile curves' bound).
const MAX_GEMM_DIM: u64 = 10_000_000;
/// Calls per step of one GEMM shape or collective.
const MAX_CALLS: u64 = 1_000_000_000;
/// One collective's buffer: 1 PB.
const MAX_COLLECTIVE_BYTES: f64 = 1e15;
/// Version 2 added the log fit's scales and points; version 1 files still read.
pub const OVERLAY_SCHEMA_VERSION: u32 = 2;
/// The backend an overlay fitted from training logs names.
pub const LOG_BACKEND: &str = "training-log";

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
    /// ZeRO-3 parameter all-gathers checked against the reference.
    #[serde(default)]
    pub param_gathers: u64,
    /// CUDA backend: GEMM shapes whose sampled results were checked against the
    /// same products computed on the host.
    #[serde(default)]
    pub gemm_results: u64,
    pub max_rel_error: f64,
}

/// Device memory one rank measured (CUDA backend): `cuMemGetInfo` at three points
/// of the run, and the peaks of the stream-ordered allocator's pool that held every
/// buffer the run allocated. Used bytes are `total_bytes` minus a free figure.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceMemory {
    pub rank: u64,
    pub total_bytes: u64,
    /// Free once the context and the stream exist.
    pub free_with_context_bytes: u64,
    /// Free once the NCCL communicators and the cuBLAS handle exist too, before the
    /// run allocated anything.
    pub free_before_run_bytes: u64,
    /// Free after the last timed step, the run's buffers still held by the pool.
    pub free_after_steps_bytes: u64,
    /// The pool's peak bytes handed out and reserved from the device
    /// (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`, `RESERVED_MEM_HIGH`).
    pub pool_used_peak_bytes: u64,
    pub pool_reserved_peak_bytes: u64,
    /// Bytes the pool reserved beyond what it held when the timed steps began: 0
    /// when it kept what the warm-up steps freed (so no timed step mapped memory).
    pub pool_grown_in_timed_steps_bytes: u64,
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
    /// Measured device memory per rank (CUDA backend; empty on the CPU backend).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_memory: Vec<DeviceMemory>,
}

impl MeasuredRun {
    pub fn from_json(text: &str) -> Result<MeasuredRun, InputError> {
        let r: MeasuredRun = crate::json::from_str(text, "measured run")?;
        if r.schema_version != RUN_SCHEMA_VERSION {
            return Err(InputError::SchemaVersion {
                what: "measured run".into(),
                found: r.schema_version,
                supported: RUN_SCHEMA_VERSION,
            });
        }
        r.model.validate()?;
        r.workload
            .validate()
            .map_err(|e| InputError::Workload(e.to_string()))?;
        let bad = |x: f64| !x.is_finite() || x < 0.0;
        if r.step_secs.iter().any(|&x| bad(x)) || r.components.values().any(|&x| bad(x)) {
            return Err(InputError::Workload(
                "measured run holds a negative or non-finite time".into(),
            ));
        }
        if r.gemms.iter().any(|g| bad(g.median_secs) || bad(g.tflops))
            || r.collectives
                .iter()
                .any(|c| bad(c.median_secs) || bad(c.bytes) || bad(c.busbw_gbytes_per_s))
        {
            return Err(InputError::Workload(
                "measured run holds a negative or non-finite GEMM or collective sample".into(),
            ));
        }
        // A step takes time, and a run has ranks: a zero there is no measurement
        // (a zero component or sample is one the backend did not time).
        if r.step_secs.contains(&0.0) {
            return Err(InputError::Workload(
                "measured run holds a step of 0 s: every timed step took some time".into(),
            ));
        }
        if r.world_size == 0 {
            return Err(InputError::Workload(
                "measured run has world_size 0: it ran on at least one rank".into(),
            ));
        }
        // Sizes and times a run can hold, so that the fits below stay finite: a
        // median of 1e-310 s or a 1e30-row GEMM is no measurement.
        let time_ok = |x: f64| x == 0.0 || (SAMPLE_SECS.0..=SAMPLE_SECS.1).contains(&x);
        if let Some(x) = r
            .step_secs
            .iter()
            .chain(r.components.values())
            .find(|x| !time_ok(**x))
        {
            return Err(InputError::Workload(format!(
                "measured run holds a time of {} s: times are 0 or {} to {} s",
                show(*x),
                show(SAMPLE_SECS.0),
                show(SAMPLE_SECS.1)
            )));
        }
        for g in &r.gemms {
            check_gemm_point(g, "measured run")?;
        }
        for c in &r.collectives {
            if !(1..=MAX_GPUS).contains(&c.ranks)
                || c.bytes > MAX_COLLECTIVE_BYTES
                || c.calls > MAX_CALLS
                || !time_ok(c.median_secs)
            {
                return Err(InputError::Workload(format!(
                    "measured run: collective {} {}: ranks must be 1 to {MAX_GPUS}, bytes at most 1e15, calls at most {MAX_CALLS}, median_secs 0 or {} to {} (got {} ranks, {} bytes, {} calls, {} s)",
                    c.kind.escape_debug(), c.op.escape_debug(), show(SAMPLE_SECS.0), show(SAMPLE_SECS.1), c.ranks, show(c.bytes), c.calls, show(c.median_secs)
                )));
            }
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
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    })
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
    /// Fixed cost per GEMM call, microseconds (intercept of the GEMM fit).
    #[serde(default)]
    pub gemm_overhead_us: Option<f64>,
    /// Per-step latency of a collective inside one node, microseconds.
    #[serde(default)]
    pub nvlink_latency_us: Option<f64>,
    /// The same across nodes.
    #[serde(default)]
    pub network_latency_us: Option<f64>,
    /// Achieved fraction of the profile's HBM bandwidth by a large device-to-device
    /// copy (`sextant bench hbm`).
    #[serde(default)]
    pub hbm: Option<f64>,
    /// A measured BF16 GEMM curve (`sextant bench gemm`): it replaces the profile's
    /// BF16 curve, and `gemm_bf16` is its best point over the BF16 peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_curve: Option<GemmCurve>,
    /// The benchmark files it was built from (`calibrate --bench`), one line each:
    /// benchmark, device, date, driver and library versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub benchmarks: Vec<String>,
    pub gemm_points: Vec<GemmPoint>,
    pub collective_points: Vec<CommPoint>,
    /// From training logs: multiplier on the profile's GEMM efficiencies (BF16 and
    /// FP8); its GEMM shape curve is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_scale: Option<f64>,
    /// From training logs: multiplier on the attention efficiencies (forward and
    /// backward); the attention curve is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_scale: Option<f64>,
    /// From training logs: multiplier on the bus-bandwidth efficiencies (NVLink,
    /// NVLS, network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_scale: Option<f64>,
    /// The training logs the scales were fitted on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub log_points: Vec<LogPoint>,
}

/// One training log a log overlay was fitted on: its step as measured, as the
/// profile predicted it, and as the calibrated profile predicts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogPoint {
    pub log: String,
    pub plan: String,
    pub gpus: u64,
    pub global_batch: u64,
    /// A Kineto trace split its kernel time.
    pub traced: bool,
    pub measured_step_secs: f64,
    pub predicted_step_secs: f64,
    pub calibrated_step_secs: f64,
}

/// Multipliers on a profile's efficiencies (1: as the profile says).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scales {
    /// `gemm_bf16` and `gemm_fp8`.
    pub gemm: f64,
    /// `attention_fwd` and `attention_bwd`.
    pub attention: f64,
    /// `nvlink_busbw`, `nvls_busbw` and `network_busbw`, and the bus bandwidth of
    /// the network's points by node count (`network.by_domains`).
    pub comm: f64,
}

impl Scales {
    pub const ONE: Scales = Scales {
        gemm: 1.0,
        attention: 1.0,
        comm: 1.0,
    };
}

/// The profile with its efficiencies multiplied by `s`; curves are kept (they are
/// ratios to their best point). Not validated: the caller checks the ranges.
pub fn scale_efficiencies(profile: &HardwareProfile, s: &Scales) -> HardwareProfile {
    let mut p = profile.clone();
    let e = &mut p.efficiency;
    e.gemm_bf16 *= s.gemm;
    e.gemm_fp8 *= s.gemm;
    e.attention_fwd *= s.attention;
    e.attention_bwd *= s.attention;
    e.nvlink_busbw *= s.comm;
    e.nvls_busbw *= s.comm;
    e.network_busbw *= s.comm;
    for q in &mut p.network.by_domains {
        q.busbw *= s.comm;
    }
    p
}

/// A GEMM point's sizes, calls and time, as a run or an overlay may hold them, so
/// that the fits and the planning ratio stay finite: a median of 1e-310 s or a
/// 1e30-row GEMM is no measurement.
fn check_gemm_point(g: &GemmPoint, what: &str) -> Result<(), InputError> {
    let dims_ok = [g.m, g.n, g.k]
        .iter()
        .all(|d| (1..=MAX_GEMM_DIM).contains(d));
    let time_ok = g.median_secs == 0.0 || (SAMPLE_SECS.0..=SAMPLE_SECS.1).contains(&g.median_secs);
    if !dims_ok || g.calls > MAX_CALLS || !time_ok {
        return Err(InputError::Workload(format!(
            "{what}: GEMM {} {}x{}x{}: m, n, k must be 1 to {MAX_GEMM_DIM}, calls at most {MAX_CALLS}, median_secs 0 or {} to {} (got {} calls, {} s)",
            g.class.escape_debug(), g.m, g.n, g.k, show(SAMPLE_SECS.0), show(SAMPLE_SECS.1), g.calls, show(g.median_secs)
        )));
    }
    Ok(())
}

impl Overlay {
    pub fn from_json(text: &str) -> Result<Overlay, InputError> {
        let o: Overlay = crate::json::from_str_known(text, "calibration overlay")?;
        if !(1..=OVERLAY_SCHEMA_VERSION).contains(&o.schema_version) {
            return Err(InputError::SchemaVersion {
                what: "calibration overlay".into(),
                found: o.schema_version,
                supported: OVERLAY_SCHEMA_VERSION,
            });
        }
        o.validate()?;
        Ok(o)
    }

    /// Every fitted number against its range for the overlay's backend
    /// ([`overlay_ranges`]); the error names the number.
    pub fn validate(&self) -> Result<(), InputError> {
        let Some(r) = overlay_ranges(&self.backend) else {
            return Err(InputError::Workload(format!(
                "calibration overlay: backend '{}' is not one of cpu, cuda",
                self.backend.escape_debug()
            )));
        };
        for (name, v) in self.values() {
            if let Some(x) = v {
                r.of(name).check(x).map_err(|e| {
                    InputError::Workload(format!(
                        "calibration overlay ({} backend): {name} = {e}",
                        self.backend
                    ))
                })?;
            }
        }
        for g in &self.gemm_points {
            check_gemm_point(g, "calibration overlay")?;
        }
        let time_ok = |x: f64| (SAMPLE_SECS.0..=SAMPLE_SECS.1).contains(&x);
        for l in &self.log_points {
            let times = [
                l.measured_step_secs,
                l.predicted_step_secs,
                l.calibrated_step_secs,
            ];
            if !times.iter().all(|&x| time_ok(x)) || !(1..=MAX_GPUS).contains(&l.gpus) {
                return Err(InputError::Workload(format!(
                    "calibration overlay: log point '{}' needs step times of {} to {} s and 1 to {MAX_GPUS} GPUs",
                    l.log.escape_debug(),
                    show(SAMPLE_SECS.0),
                    show(SAMPLE_SECS.1)
                )));
            }
        }
        if let Some(c) = &self.gemm_curve {
            if c.dtype != GemmDtype::Bf16 || self.gemm_bf16.is_none() {
                return Err(InputError::Workload(
                    "calibration overlay: gemm_curve must be a BF16 curve, given with gemm_bf16 (the efficiency at its best point)".into(),
                ));
            }
        }
        Ok(())
    }

    /// The fitted numbers by name (`None`: not measured).
    pub(crate) fn values(&self) -> [(&'static str, Option<f64>); 11] {
        [
            ("gemm_scale", self.gemm_scale),
            ("attention_scale", self.attention_scale),
            ("comm_scale", self.comm_scale),
            ("hbm", self.hbm),
            ("gemm_bf16", self.gemm_bf16),
            ("attention", self.attention),
            ("nvlink_busbw", self.nvlink_busbw),
            ("network_busbw", self.network_busbw),
            ("gemm_overhead_us", self.gemm_overhead_us),
            ("nvlink_latency_us", self.nvlink_latency_us),
            ("network_latency_us", self.network_latency_us),
        ]
    }
}

/// The ranges of an overlay's numbers for one backend.
pub struct OverlayRanges {
    efficiency: Range,
    nvlink_busbw: Range,
    network_busbw: Range,
    latency_us: Range,
    gemm_overhead_us: Range,
}

impl OverlayRanges {
    pub(crate) fn of(&self, name: &str) -> Range {
        match name {
            "gemm_scale" | "attention_scale" | "comm_scale" => SCALE,
            "gemm_bf16" | "attention" | "hbm" => self.efficiency,
            "nvlink_busbw" => self.nvlink_busbw,
            "network_busbw" => self.network_busbw,
            "gemm_overhead_us" => self.gemm_overhead_us,
            _ => self.latency_us,
        }
    }
}

/// A multiplier on a profile's efficiency; what it makes of the profile must still
/// lie in the profile's ranges, which [`apply`] checks.
const SCALE: Range = Range {
    lo: 0.01,
    hi: 100.0,
    zero_ok: false,
    why: "a multiplier on the profile's own efficiency",
};

/// A GPU overlay replaces profile constants, so its numbers take the profile's own
/// physical ranges: what `apply` makes of it is a profile that validates. The CPU
/// test backend's numbers describe a CPU measured against a GPU's peaks and links
/// (about 1e-6 to 1e-3 of them); they are kept finite and positive, for `compare`,
/// and `plan --calibration` refuses them. `None` for any other backend.
pub fn overlay_ranges(backend: &str) -> Option<OverlayRanges> {
    /// A CPU's fraction of a GPU's peak or link: far below 1, never 0.
    const CPU_FRACTION: Range = Range {
        lo: 1e-12,
        hi: 10.0,
        zero_ok: false,
        why: "the CPU test backend's fraction of the GPU's peak or link",
    };
    /// Loopback TCP and a CPU's GEMM calls: up to a second per call.
    const CPU_LATENCY_US: Range = Range {
        lo: 0.0,
        hi: 1e6,
        zero_ok: false,
        why: "microseconds on the CPU test backend",
    };
    match backend {
        "cuda" | LOG_BACKEND => Some(OverlayRanges {
            efficiency: ranges::EFFICIENCY,
            nvlink_busbw: ranges::NVLINK_BUSBW,
            network_busbw: ranges::NETWORK_BUSBW,
            latency_us: ranges::LATENCY_US,
            gemm_overhead_us: ranges::GEMM_OVERHEAD_US,
        }),
        "cpu" => Some(OverlayRanges {
            efficiency: CPU_FRACTION,
            nvlink_busbw: CPU_FRACTION,
            network_busbw: CPU_FRACTION,
            latency_us: CPU_LATENCY_US,
            gemm_overhead_us: CPU_LATENCY_US,
        }),
        _ => None,
    }
}
