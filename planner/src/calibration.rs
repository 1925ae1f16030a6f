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
            let dims_ok = [g.m, g.n, g.k]
                .iter()
                .all(|d| (1..=MAX_GEMM_DIM).contains(d));
            if !dims_ok || g.calls > MAX_CALLS || !time_ok(g.median_secs) {
                return Err(InputError::Workload(format!(
                    "measured run: GEMM {} {}x{}x{}: m, n, k must be 1 to {MAX_GEMM_DIM}, calls at most {MAX_CALLS}, median_secs 0 or {} to {} (got {} calls, {} s)",
                    g.class.escape_debug(), g.m, g.n, g.k, show(SAMPLE_SECS.0), show(SAMPLE_SECS.1), g.calls, show(g.median_secs)
                )));
            }
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
    /// `nvlink_busbw`, `nvls_busbw` and `network_busbw`.
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
    p
}

impl Overlay {
    pub fn from_json(text: &str) -> Result<Overlay, InputError> {
        let o: Overlay = crate::json::from_str(text, "calibration overlay")?;
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

/// Least squares of `y ~ a * x1 + b * x2` in relative error (each row divided by
/// y), with `a > 0` and `b >= 0`; falls back to `b = 0` when the two-term fit is
/// not physical. `rows` are (x1, x2, y, weight).
pub fn fit_two(rows: &[(f64, f64, f64, f64)]) -> Option<(f64, f64)> {
    let rows: Vec<(f64, f64, f64)> = rows
        .iter()
        .filter(|r| r.2 > 0.0 && r.0.is_finite() && r.1.is_finite() && r.2.is_finite())
        .map(|&(x1, x2, y, w)| {
            let s = w.max(0.0).sqrt() / y;
            (x1 * s, x2 * s, y * s)
        })
        .collect();
    let (mut s11, mut s12, mut s22, mut s1y, mut s2y) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x1, x2, y) in &rows {
        s11 += x1 * x1;
        s12 += x1 * x2;
        s22 += x2 * x2;
        s1y += x1 * y;
        s2y += x2 * y;
    }
    let det = s11 * s22 - s12 * s12;
    if det.abs() > 1e-12 * (s11 * s22).max(f64::MIN_POSITIVE) {
        let a = (s1y * s22 - s2y * s12) / det;
        let b = (s11 * s2y - s12 * s1y) / det;
        if a > 0.0 && b >= 0.0 {
            return Some((a, b));
        }
    }
    (s11 > 0.0 && s1y > 0.0).then(|| (s1y / s11, 0.0))
}

/// GEMM fit: time = flops / (peak * eff) + overhead. Returns (eff, overhead_us).
fn fit_gemms(points: &[&GemmPoint], peak_flops: f64) -> Option<(f64, f64)> {
    let rows: Vec<(f64, f64, f64, f64)> = points
        .iter()
        .map(|g| {
            (
                gemm_flops(g) / peak_flops,
                1.0,
                g.median_secs,
                g.calls as f64,
            )
        })
        .collect();
    fit_two(&rows).map(|(a, b)| (1.0 / a, b * 1e6))
}

/// Collective fit in the cost model's form: time = factor * bytes / (link * frac)
/// + steps * latency. Returns (fraction of `link_bytes_per_s`, latency_us).
pub(crate) fn fit_collectives(points: &[&CommPoint], link_bytes_per_s: f64) -> Option<(f64, f64)> {
    let rows: Vec<(f64, f64, f64, f64)> = points
        .iter()
        .map(|c| {
            let n = c.ranks.max(1) as f64;
            let (factor, steps) = match c.op.as_str() {
                "all_reduce" => (
                    2.0 * (n - 1.0) / n,
                    2.0 * crate::comm::latency_steps(c.ranks.max(2)),
                ),
                "all_gather" | "reduce_scatter" => {
                    ((n - 1.0) / n, crate::comm::latency_steps(c.ranks.max(2)))
                }
                "all_to_all" => ((n - 1.0) / n, crate::comm::latency_steps(c.ranks.max(2))),
                _ => (1.0, 1.0),
            };
            (
                factor * c.bytes / link_bytes_per_s,
                steps,
                c.median_secs,
                c.calls as f64,
            )
        })
        .collect();
    fit_two(&rows).map(|(a, b)| (1.0 / a, b * 1e6))
}

/// Two files hold the same run when they hold the same measurement: the plan hash
/// and every recorded time (steps, components, GEMM and collective medians) equal.
/// Two executions of one plan never time every step alike to the nanosecond, so
/// this counts a file passed twice (or a copy, its labels edited or not) once.
pub fn same_measurement(a: &MeasuredRun, b: &MeasuredRun) -> bool {
    a.plan_hash == b.plan_hash
        && a.step_secs == b.step_secs
        && a.components == b.components
        && a.gemms.len() == b.gemms.len()
        && a.gemms
            .iter()
            .zip(&b.gemms)
            .all(|(x, y)| x.median_secs == y.median_secs)
        && a.collectives.len() == b.collectives.len()
        && a.collectives
            .iter()
            .zip(&b.collectives)
            .all(|(x, y)| x.median_secs == y.median_secs)
}

/// For each run, the index of the first earlier run with the same measurement
/// ([`same_measurement`]); `None` for the first of its kind.
pub fn duplicates(runs: &[MeasuredRun]) -> Vec<Option<usize>> {
    (0..runs.len())
        .map(|i| (0..i).find(|&j| same_measurement(&runs[i], &runs[j])))
        .collect()
}

/// Whether a device line names the fake driver of `tests/fakecuda` (its device name),
/// whose times are a made-up model: calibration refuses them.
pub fn on_fake_libraries(device: &str) -> bool {
    device.contains("sextant fake GPU")
}

/// FLOPs of one GEMM call (in f64: dimensions up to 1e7 cannot overflow it).
fn gemm_flops(g: &GemmPoint) -> f64 {
    2.0 * g.m as f64 * g.n as f64 * g.k as f64
}

/// A run that says it ran on a GPU must carry what the CUDA backend writes and the
/// CPU backend never does: a `cuda: ...` device line naming the GPU, BF16 or FP8
/// GEMMs (the CPU backend's are `f32`), no collective over `loopback`, and GEMM
/// throughput of at least [`ranges::EFFICIENCY`]'s floor of the profile's BF16 peak
/// over all its GEMMs together (CPU timings reach about 1e-5 of it). This is a
/// guard against accidents and naive edits (a CPU run relabelled `cuda`): a
/// determined forger can still write a file with plausible GPU numbers, and no
/// check on a file's content can tell.
fn check_gpu_evidence(r: &MeasuredRun, profile: &HardwareProfile) -> Result<(), CalibrationError> {
    let plan = r.plan_hash.clone();
    if !r.device.starts_with("cuda: ") {
        return Err(CalibrationError::NotCudaDevice {
            plan,
            device: r.device.escape_debug().to_string(),
        });
    }
    if let Some(g) = r
        .gemms
        .iter()
        .find(|g| !matches!(g.dtype.as_str(), "bf16" | "fp8"))
    {
        return Err(CalibrationError::CpuGemm {
            plan,
            dtype: g.dtype.escape_debug().to_string(),
        });
    }
    if let Some(c) = r
        .collectives
        .iter()
        .find(|c| !matches!(c.tier.as_str(), "nvlink" | "network"))
    {
        return Err(CalibrationError::CpuCollective {
            plan,
            tier: c.tier.escape_debug().to_string(),
        });
    }
    let (flops, secs) = r.gemms.iter().fold((0.0, 0.0), |(f, t), g| {
        let calls = g.calls.max(1) as f64;
        (f + gemm_flops(g) * calls, t + g.median_secs * calls)
    });
    if !(flops > 0.0 && secs > 0.0) {
        return Err(CalibrationError::NoTimedGemm(plan));
    }
    let achieved = flops / secs;
    let floor = ranges::EFFICIENCY.lo * profile.peak_flops(false);
    if achieved < floor {
        return Err(CalibrationError::SlowGemms {
            plan,
            tflops: achieved / 1e12,
            gpu: profile.gpu.name.clone(),
            peak: profile.gpu.peak_tflops.bf16,
        });
    }
    Ok(())
}

/// Why runs give no overlay ([`calibrate`]), or an overlay does not apply to a
/// profile ([`apply`]). `plan` is a run's plan hash; device names, dtypes, tiers
/// and backends are escaped as `{:?}` escapes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrationError {
    #[error("no measured run given")]
    NoRun,
    #[error("run of plan {plan} names backend '{backend}': expected cpu or cuda")]
    Backend { plan: String, backend: String },
    #[error("run of plan {plan} ran on Sextant's fake CUDA libraries ({device}): they check arguments and measure nothing; calibrate from a run on a GPU")]
    FakeLibraries { plan: String, device: String },
    #[error(
        "run of plan {plan} is marked incomplete ({failure}): calibrate only from complete runs"
    )]
    Incomplete { plan: String, failure: String },
    #[error("run of plan {0} records no timed step: calibrate only from complete runs")]
    NoTimedStep(String),
    #[error("run of plan {plan} was planned for profile '{planned}', not '{profile}'")]
    OtherProfile {
        plan: String,
        planned: String,
        profile: String,
    },
    #[error("runs mix backends ('{0}' and '{1}'): calibrate one device at a time")]
    MixedBackends(String, String),
    #[error("run of plan {plan} says backend 'cuda' but its device '{device}' is not the CUDA backend's ('cuda: N ranks, GPU on rank 0')")]
    NotCudaDevice { plan: String, device: String },
    #[error("run of plan {plan} says backend 'cuda' but holds a GEMM in '{dtype}' (the CUDA backend times BF16 or FP8 GEMMs; the CPU backend's are f32)")]
    CpuGemm { plan: String, dtype: String },
    #[error("run of plan {plan} says backend 'cuda' but holds a collective over '{tier}' (GPU collectives run over nvlink or network)")]
    CpuCollective { plan: String, tier: String },
    #[error("run of plan {0} says backend 'cuda' but records no timed GEMM (the CUDA backend times every GEMM of the step)")]
    NoTimedGemm(String),
    #[error("run of plan {plan} says backend 'cuda' but its GEMMs reach {tflops:.3e} TFLOP/s, below {} of {gpu}'s BF16 peak ({peak} TFLOP/s): these are not GPU timings", ranges::EFFICIENCY.lo)]
    SlowGemms {
        plan: String,
        tflops: f64,
        gpu: String,
        peak: f64,
    },
    #[error("the fit of {runs} run(s) gives {name} = {error}: no overlay written; check the runs' GEMM and collective times")]
    OutOfRange {
        runs: usize,
        name: String,
        error: crate::hardware::OutOfRange,
    },
    #[error("the calibration overlay was measured for profile '{overlay}', not '{profile}'")]
    WrongProfile { overlay: String, profile: String },
    #[error("{0}")]
    Overlay(InputError),
    #[error("the calibration overlay makes an invalid profile: {0}")]
    InvalidProfile(InputError),
}

/// Fits an overlay for `profile` from complete runs planned for it. A run whose
/// measurement repeats an earlier one's ([`duplicates`]) counts once. Every fitted
/// number must lie in its range for the backend ([`overlay_ranges`]); one outside
/// it (or not finite) refuses the whole calibration, naming it.
pub fn calibrate(
    runs: &[MeasuredRun],
    profile: &HardwareProfile,
) -> Result<Overlay, CalibrationError> {
    if runs.is_empty() {
        return Err(CalibrationError::NoRun);
    }
    let Some(limits) = overlay_ranges(&runs[0].backend) else {
        return Err(CalibrationError::Backend {
            plan: runs[0].plan_hash.clone(),
            backend: runs[0].backend.escape_debug().to_string(),
        });
    };
    let dups = duplicates(runs);
    let runs: Vec<&MeasuredRun> = runs
        .iter()
        .zip(&dups)
        .filter(|(_, d)| d.is_none())
        .map(|(r, _)| r)
        .collect();
    for r in &runs {
        if on_fake_libraries(&r.device) {
            return Err(CalibrationError::FakeLibraries {
                plan: r.plan_hash.clone(),
                device: r.device.escape_debug().to_string(),
            });
        }
        if !r.complete {
            return Err(CalibrationError::Incomplete {
                plan: r.plan_hash.clone(),
                failure: r
                    .failure
                    .as_deref()
                    .unwrap_or("no reason recorded")
                    .to_string(),
            });
        }
        if r.step_secs.is_empty() {
            return Err(CalibrationError::NoTimedStep(r.plan_hash.clone()));
        }
        if r.profile != profile.name {
            return Err(CalibrationError::OtherProfile {
                plan: r.plan_hash.clone(),
                planned: r.profile.clone(),
                profile: profile.name.clone(),
            });
        }
        if r.backend != runs[0].backend {
            return Err(CalibrationError::MixedBackends(
                runs[0].backend.escape_debug().to_string(),
                r.backend.escape_debug().to_string(),
            ));
        }
        if r.backend == "cuda" {
            check_gpu_evidence(r, profile)?;
        }
    }
    let gemms: Vec<GemmPoint> = runs.iter().flat_map(|r| r.gemms.iter().cloned()).collect();
    let colls: Vec<CommPoint> = runs
        .iter()
        .flat_map(|r| r.collectives.iter().cloned())
        .collect();
    let peak = profile.peak_flops(false);
    let large: Vec<&GemmPoint> = gemms
        .iter()
        .filter(|g| matches!(g.class.as_str(), "attention_proj" | "mlp" | "moe_experts"))
        .collect();
    let attn: Vec<&GemmPoint> = gemms
        .iter()
        .filter(|g| g.class == "attention_core")
        .collect();
    let gemm = fit_gemms(&large, peak);
    let attention = fit_gemms(&attn, peak);
    let tier = |tiers: &[&str], link: f64| {
        let v: Vec<&CommPoint> = colls
            .iter()
            .filter(|c| tiers.contains(&c.tier.as_str()) && c.ranks > 1)
            .collect();
        fit_collectives(&v, link * 1e9)
    };
    let nvl = tier(&["nvlink", "loopback"], profile.node.nvlink_gbytes_per_s);
    let net = tier(&["network"], profile.network.nic_gbytes_per_s);
    let overlay = Overlay {
        schema_version: OVERLAY_SCHEMA_VERSION,
        profile: profile.name.clone(),
        backend: runs[0].backend.clone(),
        device: runs[0].device.clone(),
        runs: runs.iter().map(|r| r.plan_hash.clone()).collect(),
        gemm_bf16: gemm.map(|g| g.0),
        attention: attention.map(|g| g.0),
        nvlink_busbw: nvl.map(|c| c.0),
        network_busbw: net.map(|c| c.0),
        gemm_overhead_us: gemm.map(|g| g.1),
        nvlink_latency_us: nvl.map(|c| c.1),
        network_latency_us: net.map(|c| c.1),
        hbm: None,
        gemm_curve: None,
        benchmarks: Vec::new(),
        gemm_points: gemms,
        collective_points: colls,
        gemm_scale: None,
        attention_scale: None,
        comm_scale: None,
        log_points: vec![],
    };
    for (name, v) in overlay.values() {
        if let Some(x) = v {
            limits
                .of(name)
                .check(x)
                .map_err(|e| CalibrationError::OutOfRange {
                    runs: runs.len(),
                    name: name.to_string(),
                    error: e,
                })?;
        }
    }
    Ok(overlay)
}

/// The profile with the overlay's measured constants in place of its own.
pub fn apply(profile: &HardwareProfile, o: &Overlay) -> Result<HardwareProfile, CalibrationError> {
    if o.profile != profile.name {
        return Err(CalibrationError::WrongProfile {
            overlay: o.profile.clone(),
            profile: profile.name.clone(),
        });
    }
    o.validate().map_err(CalibrationError::Overlay)?;
    let mut p = profile.clone();
    let note = if o.benchmarks.is_empty() {
        format!(
            "measured: sextant calibrate on {} ({})",
            o.device, o.backend
        )
    } else {
        format!("measured: sextant bench: {}", o.benchmarks.join("; "))
    };
    if let Some(x) = o.gemm_overhead_us {
        p.efficiency.gemm_overhead_us = x;
    }
    if let Some(x) = o.nvlink_latency_us {
        p.efficiency.nvlink_latency_us = x;
    }
    if let Some(x) = o.network_latency_us {
        p.network.latency_us = x;
    }
    if let Some(x) = o.gemm_bf16 {
        // The measured fit (efficiency plus a cost per call) replaces the public
        // shape curve rather than stacking on it.
        p.gemm_curves.clear();
        p.efficiency.gemm_bf16 = x;
        p.sources
            .insert("efficiency.gemm_bf16".into(), note.clone());
    }
    if let Some(c) = &o.gemm_curve {
        // A measured curve: the shape dependence again, at the measured level.
        p.gemm_curves.retain(|d| d.dtype != c.dtype);
        p.gemm_curves.push(c.clone());
    }
    if let Some(x) = o.hbm {
        p.efficiency.hbm = x;
        p.sources.insert("efficiency.hbm".into(), note.clone());
    }
    if let Some(x) = o.attention {
        // A measured level at the executed shapes replaces the public curve too.
        p.attention_curves.clear();
        p.efficiency.attention_fwd = x;
        p.efficiency.attention_bwd = x;
        p.sources
            .insert("efficiency.attention_fwd".into(), note.clone());
    }
    if let Some(x) = o.nvlink_busbw {
        p.efficiency.nvlink_busbw = x;
        p.efficiency.nvls_busbw = 0.0;
        p.node.nvls = false;
        p.sources
            .insert("efficiency.nvlink_busbw".into(), note.clone());
    }
    if let Some(x) = o.network_busbw {
        p.efficiency.network_busbw = x;
        p.sources
            .insert("efficiency.network_busbw".into(), note.clone());
    }
    // A log fit's multipliers, on top of the profile's own constants.
    let s = Scales {
        gemm: o.gemm_scale.unwrap_or(1.0),
        attention: o.attention_scale.unwrap_or(1.0),
        comm: o.comm_scale.unwrap_or(1.0),
    };
    if s != Scales::ONE {
        p = scale_efficiencies(&p, &s);
        for (field, k) in [
            ("efficiency.gemm_bf16", o.gemm_scale),
            ("efficiency.attention_fwd", o.attention_scale),
            ("efficiency.nvlink_busbw", o.comm_scale),
        ] {
            if let Some(k) = k {
                let old = p.sources.get(field).cloned().unwrap_or_default();
                p.sources
                    .insert(field.into(), format!("{old}; x{k:.4} from {note}"));
            }
        }
    }
    // A GPU overlay's numbers are in the profile's ranges, so this holds; it keeps
    // a plan made with the overlay one that `export` reads back. A CPU overlay's are
    // not physical for a GPU: only `compare` applies it, and writes no plan.
    if o.backend != "cpu" {
        p.validate().map_err(CalibrationError::InvalidProfile)?;
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_term_fit_recovers_slope_and_intercept() {
        // y = 2 x1 + 0.5 x2 exactly.
        let rows: Vec<(f64, f64, f64, f64)> = (1..8)
            .map(|i| {
                (
                    i as f64,
                    (i % 3 + 1) as f64,
                    2.0 * i as f64 + 0.5 * (i % 3 + 1) as f64,
                    1.0,
                )
            })
            .collect();
        let (a, b) = fit_two(&rows).unwrap();
        assert!((a - 2.0).abs() < 1e-9 && (b - 0.5).abs() < 1e-9, "{a} {b}");
        // A negative intercept is not physical: falls back to a line through 0.
        let rows = [
            (1.0, 1.0, 0.5, 1.0),
            (2.0, 1.0, 1.5, 1.0),
            (4.0, 1.0, 3.5, 1.0),
        ];
        let (a, b) = fit_two(&rows).unwrap();
        assert!(a > 0.0 && b == 0.0);
        assert!(fit_two(&[]).is_none());
    }

    /// A measured GEMM fit replaces the profile's public shape curve; an overlay
    /// without one leaves it.
    #[test]
    fn measured_gemms_replace_the_shape_curve() {
        let h100 = crate::hardware::builtin_profile("h100-sxm").unwrap();
        assert!(!h100.gemm_curves.is_empty());
        let mut o = Overlay {
            schema_version: OVERLAY_SCHEMA_VERSION,
            profile: h100.name.clone(),
            backend: "cuda".into(),
            device: "test".into(),
            runs: vec![],
            gemm_bf16: None,
            attention: None,
            nvlink_busbw: Some(0.7),
            network_busbw: None,
            gemm_overhead_us: None,
            nvlink_latency_us: None,
            network_latency_us: None,
            hbm: None,
            gemm_curve: None,
            benchmarks: vec![],
            gemm_points: vec![],
            collective_points: vec![],
            gemm_scale: None,
            attention_scale: None,
            comm_scale: None,
            log_points: vec![],
        };
        assert_eq!(apply(&h100, &o).unwrap().gemm_curves, h100.gemm_curves);
        o.gemm_bf16 = Some(0.7);
        o.gemm_overhead_us = Some(6.0);
        let p = apply(&h100, &o).unwrap();
        assert!(p.gemm_curves.is_empty() && p.efficiency.gemm_bf16 == 0.7);
        assert!(p.gemm_shape_factor(false, 256.0, 256.0, 256.0).is_none());
        // Likewise a measured attention level replaces the public attention curves.
        assert_eq!(p.attention_curves, h100.attention_curves);
        o.attention = Some(0.5);
        let p = apply(&h100, &o).unwrap();
        assert!(
            p.attention_curves.is_empty()
                && p.attention_factor(crate::hardware::AttentionPass::Fwd, 128.0, 4096.0)
                    .is_none()
        );
    }

    /// A GPU overlay's numbers take the profile's ranges, a CPU one's only need to be
    /// finite and positive, and no other backend is read.
    #[test]
    fn overlay_numbers_take_their_backends_ranges() {
        let h100 = crate::hardware::builtin_profile("h100-sxm").unwrap();
        let mut o = Overlay {
            schema_version: OVERLAY_SCHEMA_VERSION,
            profile: h100.name.clone(),
            backend: "cuda".into(),
            device: "test".into(),
            runs: vec![],
            gemm_bf16: Some(5e-5),
            attention: None,
            nvlink_busbw: None,
            network_busbw: None,
            gemm_overhead_us: None,
            nvlink_latency_us: None,
            network_latency_us: None,
            hbm: None,
            gemm_curve: None,
            benchmarks: vec![],
            gemm_points: vec![],
            collective_points: vec![],
            gemm_scale: None,
            attention_scale: None,
            comm_scale: None,
            log_points: vec![],
        };
        // A CPU's GEMM efficiency against a GPU's peak, labelled as a GPU overlay.
        let e = apply(&h100, &o).unwrap_err().to_string();
        assert!(e.contains("gemm_bf16 = 5e-5 is out of range"), "{e}");
        o.backend = "cpu".into();
        assert_eq!(apply(&h100, &o).unwrap().efficiency.gemm_bf16, 5e-5);
        for x in [f64::NAN, f64::INFINITY, 0.0, -1.0, 1e308] {
            o.gemm_bf16 = Some(x);
            let e = apply(&h100, &o).unwrap_err().to_string();
            assert!(e.contains("gemm_bf16 = "), "{e}");
        }
        o.backend = "tpu".into();
        o.gemm_bf16 = Some(0.7);
        assert!(apply(&h100, &o)
            .unwrap_err()
            .to_string()
            .contains("not one of cpu, cuda"));
        // What a GPU overlay makes is a valid profile, so a plan made with it is one
        // that `export` reads back.
        o.backend = "cuda".into();
        o.nvlink_busbw = Some(1.05);
        o.network_latency_us = Some(0.0);
        apply(&h100, &o).unwrap().validate().unwrap();
    }

    #[test]
    fn gemm_fit_inverts_the_cost_models_form() {
        let peak = 1e15;
        let (eff, over) = (0.6, 7.0);
        let pts: Vec<GemmPoint> = [
            (1024u64, 1024u64, 1024u64),
            (4096, 4096, 4096),
            (8192, 1024, 4096),
            (256, 256, 256),
        ]
        .iter()
        .map(|&(m, n, k)| {
            let secs = 2.0 * (m * n * k) as f64 / (peak * eff) + over * 1e-6;
            GemmPoint {
                class: "mlp".into(),
                m,
                n,
                k,
                dtype: "bf16".into(),
                calls: 3,
                median_secs: secs,
                tflops: 0.0,
            }
        })
        .collect();
        let refs: Vec<&GemmPoint> = pts.iter().collect();
        let (e, o) = fit_gemms(&refs, peak).unwrap();
        assert!((e - eff).abs() < 1e-6 && (o - over).abs() < 1e-6, "{e} {o}");
    }
}
