//! Calibration proper: the fits (GEMMs, collectives, two-term least squares), the
//! checks on the runs given, and the overlay applied to a profile.

use super::*;

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
pub(super) fn fit_gemms(points: &[&GemmPoint], peak_flops: f64) -> Option<(f64, f64)> {
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
            gpu: crate::json::one_line(&profile.gpu.name, 60),
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
    #[error("profile '{profile}' states no bare GEMM level (efficiency.gemm_bf16_bare, or a BF16 GEMM curve) to read a bare-GEMM measurement against: add the GPU's best measured matmul as efficiency.gemm_bf16_bare (a fraction of the BF16 peak) to plan with this calibration")]
    NoBareReference { profile: String },
    #[error("the overlay's GEMMs ran {ratio:.3}x the bare-GEMM level of profile '{profile}', which would put its fitted GEMM level above the peak: is '{profile}' the profile of the GPU they ran on ({gpu})?")]
    BareTooFast {
        ratio: f64,
        profile: String,
        gpu: String,
    },
    #[error("profile '{profile}' carries a calibration already (a plan made with --calibration): give the plan made without one, or leave out --calibration")]
    AlreadyCalibrated { profile: String },
    #[error("the calibration overlay states measured levels but holds no timed large BF16 GEMM (projection, MLP, expert or benchmark grid point) to read them against the profile: make it with `sextant calibrate` from a CUDA run or `sextant calibrate --bench`")]
    NoBareGemm,
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
                profile: crate::json::one_line(&profile.name, 60),
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
        profile: crate::json::one_line(&profile.name, 60),
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

/// What a calibrated profile will predict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A training stack (`plan`, `estimate`, `compare --log`). The profile's GEMM and
    /// attention efficiencies were fitted on published training runs and sit below
    /// what bare cuBLAS reaches (H100: 0.644 of peak at the curve's best shape,
    /// against 0.81 for a bare GEMM there); the executor and `sextant bench` time bare
    /// GEMMs. Their measurement therefore moves those efficiencies by this GPU's
    /// speed relative to the profile's bare reference ([`bare_gemm_ratio`]) instead
    /// of replacing them, and the executor's attention (batched GEMMs, not the fused
    /// kernel training stacks run) is not carried over. Collectives, HBM bandwidth
    /// and latencies are bare measurements in the profile too, and are replaced.
    Stack,
    /// The executor's own runs (`compare` with a measured run): the measured levels
    /// replace the profile's, as the executor ran them.
    Executor,
}

/// The GEMM classes a bare-GEMM ratio is taken over: the large ones (the attention
/// core and the router are small batched or skinny products).
fn large_class(class: &str) -> bool {
    matches!(class, "attention_proj" | "mlp" | "moe_experts" | "sweep")
}

/// How fast this GPU ran bare BF16 GEMMs against the profile's reference for them:
/// the time the profile gives the measured GEMMs at its bare level
/// ([`HardwareProfile::bare_gemm_bf16`], with its shape curve) over their measured
/// time, summed over the large GEMMs (so the long ones weigh most). `None` without
/// a reference level or a measured large BF16 GEMM.
pub fn bare_gemm_ratio(profile: &HardwareProfile, points: &[GemmPoint]) -> Option<f64> {
    let bare = profile.bare_gemm_bf16()?;
    let peak = profile.peak_flops(false);
    let overhead = profile.efficiency.gemm_overhead_us * 1e-6;
    let (mut reference, mut measured) = (0.0, 0.0);
    for g in points {
        let timed = g.median_secs.is_finite() && g.median_secs > 0.0;
        if g.dtype != "bf16" || !large_class(&g.class) || !timed {
            continue;
        }
        let (m, n, k) = (g.m as f64, g.n as f64, g.k as f64);
        let t = match profile.gemm_shape_factor(false, m, n, k) {
            Some(shape) => gemm_flops(g) / (peak * bare * shape),
            None => gemm_flops(g) / (peak * bare) + overhead,
        };
        reference += t;
        measured += g.median_secs;
    }
    let r = reference / measured;
    (measured > 0.0 && r.is_finite() && r > 0.0).then_some(r)
}

/// How [`apply`] begins every source note it writes: a profile whose sources hold
/// it carries a calibration already.
const CALIBRATED: &str = "measured: sextant";

/// Whether an overlay holds bare-hardware GEMM measurements (an executor run or
/// `sextant bench gemm`), which planning reads through [`bare_gemm_ratio`], as
/// opposed to log scales, HBM or collective figures alone.
pub fn bare_measurement(o: &Overlay) -> bool {
    o.gemm_bf16.is_some() || o.attention.is_some() || o.gemm_curve.is_some()
}

/// The profile with the overlay's measurements applied for `target` ([`Target`]).
pub fn apply(
    profile: &HardwareProfile,
    o: &Overlay,
    target: Target,
) -> Result<HardwareProfile, CalibrationError> {
    if o.profile != profile.name {
        return Err(CalibrationError::WrongProfile {
            // From the user's file: escaped and cut before it is echoed.
            overlay: crate::json::one_line(&o.profile, 60),
            profile: crate::json::one_line(&profile.name, 60),
        });
    }
    o.validate().map_err(CalibrationError::Overlay)?;
    // Levels are multiplied (log scales, the bare ratio): a second overlay on a
    // profile that carries one would apply it twice.
    // Plan files from before the flag carry only the source notes.
    if profile.calibrated || profile.sources.values().any(|v| v.contains(CALIBRATED)) {
        return Err(CalibrationError::AlreadyCalibrated {
            profile: crate::json::one_line(&profile.name, 60),
        });
    }
    let mut p = profile.clone();
    p.calibrated = true;
    // From the user's file, into plan files and reports: escaped and cut.
    let note = if o.benchmarks.is_empty() {
        format!(
            "{CALIBRATED} calibrate on {} ({})",
            crate::json::one_line(&o.device, 120),
            crate::json::one_line(&o.backend, 20)
        )
    } else {
        let lines: Vec<String> = o
            .benchmarks
            .iter()
            .map(|b| crate::json::one_line(b, 200))
            .collect();
        format!("{CALIBRATED} bench: {}", lines.join("; "))
    };
    let executor = target == Target::Executor;
    if let (Some(x), true) = (o.gemm_overhead_us, executor) {
        p.efficiency.gemm_overhead_us = x;
    }
    if let Some(x) = o.nvlink_latency_us {
        p.efficiency.nvlink_latency_us = x;
    }
    if let Some(x) = o.network_latency_us {
        p.network.latency_us = x;
        // Measured on the user's network: it replaces the profile's latency at
        // every node count as well as its single one; the bandwidth curve stays
        // unless the bandwidth was measured too.
        for q in &mut p.network.by_domains {
            q.latency_us = x;
        }
    }
    if !executor && bare_measurement(o) {
        if profile.bare_gemm_bf16().is_none() {
            return Err(CalibrationError::NoBareReference {
                profile: crate::json::one_line(&profile.name, 60),
            });
        }
        let ratio = bare_gemm_ratio(profile, &o.gemm_points).ok_or(CalibrationError::NoBareGemm)?;
        let e = &mut p.efficiency;
        if e.gemm_bf16 * ratio > ranges::EFFICIENCY.hi {
            return Err(CalibrationError::BareTooFast {
                ratio,
                profile: crate::json::one_line(&profile.name, 60),
                gpu: crate::json::one_line(&profile.gpu.name, 60),
            });
        }
        // GEMMs only: the executor and the benchmarks run no fused attention, and
        // on an H200 cuDNN's matched the profile's curve within 12% from 1k tokens
        // while bare GEMMs ran at 0.94 of theirs (docs/executor.md).
        e.gemm_bf16 *= ratio;
        e.gemm_fp8 *= ratio;
        for field in ["efficiency.gemm_bf16", "efficiency.gemm_fp8"] {
            let old = p.sources.get(field).cloned().unwrap_or_default();
            p.sources.insert(
                field.into(),
                format!("{old}; x{ratio:.4}: this GPU's bare BF16 GEMMs against the profile's bare level ({note})"),
            );
        }
    }
    if let (Some(x), true) = (o.gemm_bf16, executor) {
        // The measured fit (efficiency plus a cost per call) replaces the public
        // shape curve rather than stacking on it.
        p.gemm_curves.clear();
        p.efficiency.gemm_bf16 = x;
        // The executor's own level is bare: no separate bare reference remains.
        p.efficiency.gemm_bf16_bare = 0.0;
        p.sources
            .insert("efficiency.gemm_bf16".into(), note.clone());
    }
    if let (Some(c), true) = (&o.gemm_curve, executor) {
        // A measured curve: the shape dependence again, at the measured level.
        p.gemm_curves.retain(|d| d.dtype != c.dtype);
        p.gemm_curves.push(c.clone());
    }
    if let Some(x) = o.hbm {
        p.efficiency.hbm = x;
        p.sources.insert("efficiency.hbm".into(), note.clone());
    }
    if let (Some(x), true) = (o.attention, executor) {
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
        // Likewise the bandwidth at every node count; the latency curve stays.
        for q in &mut p.network.by_domains {
            q.busbw = x;
        }
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
    // The CPU backend runs each operation to completion from the thread that issues
    // it, so its measured times already hold the issuing: no device waits for a
    // host there, and the host terms (fitted for Python frameworks driving a GPU)
    // would price it twice.
    if o.backend == "cpu" {
        p.efficiency.host_layer_kernel_us = 0.0;
        p.efficiency.host_op_us = 0.0;
        p.efficiency.host_kernel_us = 0.0;
    }
    // A GPU overlay's numbers are in the profile's ranges, so this holds; it keeps
    // a plan made with the overlay one that `export` reads back. A CPU overlay's are
    // not physical for a GPU: only `compare` applies it, and writes no plan.
    if o.backend != "cpu" {
        p.validate().map_err(CalibrationError::InvalidProfile)?;
    }
    Ok(p)
}
