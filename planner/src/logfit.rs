//! Calibration from the user's own training runs: the step time of each run's log
//! (and, where given, a Kineto trace's kernel split) against what the cost model
//! predicts for the plan that ran, fitted as multipliers on the profile's
//! efficiencies ([`Scales`]). Pure: the CLI parses the files.
//!
//! The predicted step of a run is the plan file's first configuration priced as
//! `plan` prices it (closed form, then the schedule simulation) on the plan's own
//! profile with the scales applied. What is fitted depends on what was given:
//! - **One log**: one compute scale (GEMM and attention alike) that makes the
//!   predicted step equal the measured one; communication keeps the profile's.
//! - **Traces** (one per log): a trace fixes the ratios between the classes, so
//!   that the predicted GEMM : attention : collective kernel time matches the
//!   trace's; the logs then fit one level. The predicted kernel time of a class is
//!   the part of the slowest stage's compute (or its collectives' time) that scales
//!   with that class's efficiency, found by pricing the plan with that efficiency
//!   lowered ([`predicted_kernels`]). Ratios, not times, are matched: the trace is
//!   one rank's and the prediction is the slowest stage's.
//! - **Several logs without traces**: a compute and a communication scale by least
//!   squares of the relative step error, when the logs' configurations spend
//!   different shares of their step communicating: Gauss-Newton steps, each a
//!   [`fit_two`] of the measured steps on the linearised compute and
//!   communication parts. When the logs cannot tell the two apart (the two-term
//!   fit is not physical or leaves the profile's ranges), one compute scale.
//!
//! A scale is kept only if every efficiency it makes lies in the profile's ranges
//! (`hardware::ranges`); a log that no such scale can explain is refused with the
//! closest the model gets.

use crate::banded::{estimate_with, simulated};
use crate::calibration::{fit_two, scale_efficiencies, LogPoint, Overlay, Scales};
use crate::cost::Estimate;
use crate::hardware::{ranges, Cluster, HardwareProfile, Range};
use crate::kineto::KernelTimes;
use crate::plan::PlanFile;

/// One training run: its log's measured step, its plan, and optionally a trace.
#[derive(Debug, Clone)]
pub struct LogCase<'a> {
    /// How messages name it (the log's path).
    pub label: String,
    /// How messages name the plan (its path).
    pub plan_label: String,
    pub plan: &'a PlanFile,
    pub measured_step_secs: f64,
    pub kernels: Option<KernelTimes>,
}

/// The fit and each log's step before and after it.
#[derive(Debug, Clone, PartialEq)]
pub struct LogFit {
    pub scales: Scales,
    /// Whether the communication scale was fitted (else it is 1, the profile's).
    pub comm_fitted: bool,
    /// Whether traces set the attention and communication ratios.
    pub traced: bool,
    /// Why fewer scales were fitted than asked for, when that happened.
    pub note: Option<String>,
    pub rows: Vec<FitRow>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FitRow {
    pub label: String,
    pub measured_secs: f64,
    pub before_secs: f64,
    pub after_secs: f64,
}

/// Why the logs give no fit, or a plan no prediction. The two-scale fit's reasons
/// (`PartsUnexplained` to `TwoScaleOutOfRange`) end up in a note, not an error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LogFitError {
    #[error("{0}")]
    Cluster(crate::InputError),
    #[error("the cost model rejects the plan's configuration: {0}")]
    Rejected(crate::config::Rejection),
    /// A plan's error, under its label (escaped as `{:?}` escapes).
    #[error("'{label}': {error}")]
    Plan {
        label: String,
        error: Box<LogFitError>,
    },
    #[error("the profile '{0}' leaves no room to scale its efficiencies within their ranges")]
    NoRoom(String),
    #[error("no efficiency scale within the profile's ranges explains the log(s): {worst} (at compute scale {k:.3}: GEMM efficiency {gemm:.3} of peak, attention {attention:.3}); check that the plan is the configuration that ran")]
    Unexplained {
        worst: String,
        k: f64,
        gemm: f64,
        attention: f64,
    },
    #[error("the trace of '{0}' holds no GEMM kernel by the documented names (gemm, cutlass, xmma, nvjet, cublas): it cannot anchor the compute scale")]
    NoGemmInTrace(String),
    #[error("no training log given")]
    NoLog,
    #[error("plans '{first}' and '{other}' are for profiles '{}' and '{}': calibrate one GPU type at a time", .profiles[0], .profiles[1])]
    Profiles {
        first: String,
        other: String,
        profiles: [String; 2],
    },
    #[error("plans '{first}' and '{other}' carry different versions of profile '{profile}' (one made with --calibration or another --cluster file?): make every plan with the same profile")]
    ProfileVersions {
        first: String,
        other: String,
        profile: String,
    },
    #[error("'{label}': measured step {secs} s is not a time")]
    NotATime { label: String, secs: f64 },
    #[error("the logs' steps are not explained by compute and communication parts")]
    PartsUnexplained,
    #[error("no log's plan communicates")]
    NoComm,
    #[error("the two-scale fit has no solution")]
    NoSolution,
    #[error("the logs cannot tell compute from communication (their communication shares are too alike)")]
    Indistinct,
    #[error("the two-scale fit (compute {compute:.3}, communication {comm:.3}) leaves the profile's ranges")]
    TwoScaleOutOfRange { compute: f64, comm: f64 },
}

impl LogFitError {
    fn of_plan(c: &LogCase, e: LogFitError) -> LogFitError {
        LogFitError::Plan {
            label: c.plan_label.escape_debug().to_string(),
            error: Box::new(e),
        }
    }
}

/// The first plan of `plan` priced on `profile` as `plan` prices it.
pub fn predict(plan: &PlanFile, profile: &HardwareProfile) -> Result<Estimate, LogFitError> {
    let rp = &plan.plans[0];
    let mut cluster = Cluster::new(profile.clone(), plan.gpus).map_err(LogFitError::Cluster)?;
    cluster.allow_tp_beyond_nvlink = true;
    let e = estimate_with(
        &plan.model,
        &cluster,
        &plan.workload,
        &rp.config,
        plan.assumptions,
    )
    .map_err(LogFitError::Rejected)?;
    Ok(simulated(e, &rp.config))
}

/// Predicted kernel seconds per step on the slowest stage, by the classes a Kineto
/// trace is split into ([`crate::kineto::classify`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PredictedKernels {
    pub gemm_secs: f64,
    pub attention_secs: f64,
    pub collective_secs: f64,
    pub send_recv_secs: f64,
}

/// The efficiency a class's part is found by lowering.
const PROBE: f64 = 0.8;

/// GEMM and attention time: the part of the slowest stage's compute and
/// recomputation that grows by 1/0.8 when that efficiency is multiplied by 0.8
/// (memory-bound GEMMs and element-wise work do not). Collectives: the comm terms'
/// total time, all-reduce / all-gather / reduce-scatter apart from all-to-all and
/// point-to-point.
pub fn predicted_kernels(
    plan: &PlanFile,
    profile: &HardwareProfile,
) -> Result<PredictedKernels, LogFitError> {
    use crate::comm::Collective;
    let busy = |s: Scales| -> Result<(f64, Estimate), LogFitError> {
        let e = predict(plan, &scale_efficiencies(profile, &s))?;
        Ok((e.time.compute.total() + e.time.recompute, e))
    };
    let (base, e) = busy(Scales::ONE)?;
    let part = |t: f64| ((t - base) / (1.0 / PROBE - 1.0)).max(0.0);
    let (g, _) = busy(Scales {
        gemm: PROBE,
        ..Scales::ONE
    })?;
    let (a, _) = busy(Scales {
        attention: PROBE,
        ..Scales::ONE
    })?;
    let sum = |p2p: bool| {
        e.comm
            .iter()
            .filter(|t| matches!(t.collective, Collective::AllToAll | Collective::SendRecv) == p2p)
            .map(|t| t.total_secs)
            .sum::<f64>()
    };
    Ok(PredictedKernels {
        gemm_secs: part(g),
        attention_secs: part(a),
        collective_secs: sum(false),
        send_recv_secs: sum(true),
    })
}

/// Each log's predicted step with `s`.
fn steps(
    cases: &[LogCase],
    profile: &HardwareProfile,
    s: &Scales,
) -> Result<Vec<f64>, LogFitError> {
    let p = scale_efficiencies(profile, s);
    cases
        .iter()
        .map(|c| {
            predict(c.plan, &p)
                .map(|e| e.step_secs)
                .map_err(|e| LogFitError::of_plan(c, e))
        })
        .collect()
}

/// Sum of squared log errors.
fn loss(cases: &[LogCase], pred: &[f64]) -> f64 {
    cases
        .iter()
        .zip(pred)
        .map(|(c, p)| (p / c.measured_step_secs).ln().powi(2))
        .sum()
}

/// The interval of `k` for which every `(value * mult * k)` lies in its range.
fn bounds(fields: &[(f64, f64, Range)]) -> (f64, f64) {
    let (mut lo, mut hi) = (0.0f64, f64::INFINITY);
    for &(v, mult, r) in fields {
        let x = v * mult;
        if x == 0.0 && r.zero_ok {
            continue; // a feature the GPU lacks (no FP8, no NVLS) stays 0
        }
        if x > 0.0 {
            lo = lo.max(r.lo / x);
            hi = hi.min(r.hi / x);
        }
    }
    (lo, hi)
}

/// Multipliers of the compute level `k` ([`Scales`] as a function of it).
#[derive(Debug, Clone, Copy)]
struct Tie {
    attention: f64,
    /// `Some(r)`: comm = r k; `None`: comm fixed at `comm`.
    comm_ratio: Option<f64>,
    comm: f64,
}

impl Tie {
    fn at(&self, k: f64) -> Scales {
        Scales {
            gemm: k,
            attention: k * self.attention,
            comm: self.comm_ratio.map_or(self.comm, |r| r * k),
        }
    }

    fn bounds(&self, p: &HardwareProfile) -> (f64, f64) {
        let e = &p.efficiency;
        let mut f = vec![
            (e.gemm_bf16, 1.0, ranges::EFFICIENCY),
            (e.gemm_fp8, 1.0, ranges::EFFICIENCY.or_zero()),
            (e.attention_fwd, self.attention, ranges::EFFICIENCY),
            (e.attention_bwd, self.attention, ranges::EFFICIENCY),
        ];
        if let Some(r) = self.comm_ratio {
            f.extend([
                (e.nvlink_busbw, r, ranges::NVLINK_BUSBW),
                (e.nvls_busbw, r, ranges::NVLINK_BUSBW.or_zero()),
                (e.network_busbw, r, ranges::NETWORK_BUSBW),
            ]);
            f.extend(
                p.network
                    .by_domains
                    .iter()
                    .map(|q| (q.busbw, r, ranges::NETWORK_BUSBW)),
            );
        }
        bounds(&f)
    }
}

/// The communication scale's range with everything else fixed.
fn comm_bounds(p: &HardwareProfile) -> (f64, f64) {
    let e = &p.efficiency;
    let mut f = vec![
        (e.nvlink_busbw, 1.0, ranges::NVLINK_BUSBW),
        (e.nvls_busbw, 1.0, ranges::NVLINK_BUSBW.or_zero()),
        (e.network_busbw, 1.0, ranges::NETWORK_BUSBW),
    ];
    f.extend(
        p.network
            .by_domains
            .iter()
            .map(|q| (q.busbw, 1.0, ranges::NETWORK_BUSBW)),
    );
    bounds(&f)
}

/// One level `k` by least squares of the log errors: a grid over the range in
/// log space, then golden-section refinement around the best point. With one log
/// and a monotone step time this is the root (predicted = measured).
fn fit_level(cases: &[LogCase], p: &HardwareProfile, tie: &Tie) -> Result<(f64, f64), LogFitError> {
    let (lo, hi) = tie.bounds(p);
    if !(lo > 0.0 && lo < hi && hi.is_finite()) {
        return Err(LogFitError::NoRoom(p.name.clone()));
    }
    let (a, b) = (lo.ln(), hi.ln());
    let eval = |x: f64| -> Result<f64, LogFitError> {
        Ok(loss(cases, &steps(cases, p, &tie.at(x.exp()))?))
    };
    const GRID: usize = 48;
    let xs: Vec<f64> = (0..=GRID)
        .map(|i| a + (b - a) * i as f64 / GRID as f64)
        .collect();
    let mut best = (0, f64::INFINITY);
    for (i, &x) in xs.iter().enumerate() {
        let l = eval(x)?;
        if l < best.1 {
            best = (i, l);
        }
    }
    let (mut l, mut r) = (xs[best.0.saturating_sub(1)], xs[(best.0 + 1).min(GRID)]);
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut c, mut d) = (r - g * (r - l), l + g * (r - l));
    let (mut fc, mut fd) = (eval(c)?, eval(d)?);
    for _ in 0..60 {
        if fc < fd {
            r = d;
            d = c;
            fd = fc;
            c = r - g * (r - l);
            fc = eval(c)?;
        } else {
            l = c;
            c = d;
            fc = fd;
            d = l + g * (r - l);
            fd = eval(d)?;
        }
        if r - l < 1e-9 {
            break;
        }
    }
    let x = 0.5 * (l + r);
    let k = x.exp();
    Ok((k, eval(x)?))
}

/// The measured step that no scale in range explains, as one line.
fn unexplained(cases: &[LogCase], p: &HardwareProfile, s: &Scales, k: f64) -> LogFitError {
    let pred = steps(cases, p, s).unwrap_or_default();
    let worst = cases
        .iter()
        .zip(&pred)
        .max_by(|x, y| {
            let e = |(c, p): &(&LogCase, &f64)| (*p / c.measured_step_secs).ln().abs();
            e(x).total_cmp(&e(y))
        })
        .map(|(c, p)| {
            format!(
                "'{}' measured {:.4} s, the closest prediction is {:.4} s",
                c.label.escape_debug(),
                c.measured_step_secs,
                p
            )
        })
        .unwrap_or_default();
    let sc = scale_efficiencies(p, s);
    LogFitError::Unexplained {
        worst,
        k,
        gemm: sc.efficiency.gemm_bf16,
        attention: sc.efficiency.attention_fwd,
    }
}

/// Trace ratios: attention scale over GEMM scale, and comm scale over GEMM scale
/// (geometric means over the traces), or `None` where no trace measures them.
fn trace_ratios(cases: &[LogCase]) -> Result<(Option<f64>, Option<f64>), LogFitError> {
    let (mut ra, mut rn) = (Vec::new(), Vec::new());
    for c in cases {
        let Some(k) = &c.kernels else { continue };
        if k.gemm_secs <= 0.0 {
            return Err(LogFitError::NoGemmInTrace(
                c.label.escape_debug().to_string(),
            ));
        }
        let p =
            predicted_kernels(c.plan, &c.plan.hardware).map_err(|e| LogFitError::of_plan(c, e))?;
        if p.gemm_secs <= 0.0 {
            continue;
        }
        if p.attention_secs > 0.0 && k.attention_secs > 0.0 {
            ra.push((p.attention_secs / p.gemm_secs) / (k.attention_secs / k.gemm_secs));
        }
        if p.collective_secs > 0.0 && k.collective_secs > 0.0 {
            rn.push((p.collective_secs / p.gemm_secs) / (k.collective_secs / k.gemm_secs));
        }
    }
    let geo = |v: &[f64]| {
        (!v.is_empty()).then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
    };
    Ok((geo(&ra), geo(&rn)))
}

/// Fits scales to the logs (see the module doc). Every case's plan must carry the
/// same hardware profile.
pub fn fit(cases: &[LogCase]) -> Result<LogFit, LogFitError> {
    let Some(first) = cases.first() else {
        return Err(LogFitError::NoLog);
    };
    let p = &first.plan.hardware;
    for c in cases {
        if c.plan.hardware.name != p.name {
            return Err(LogFitError::Profiles {
                first: first.plan_label.escape_debug().to_string(),
                other: c.plan_label.escape_debug().to_string(),
                profiles: [p.name.clone(), c.plan.hardware.name.clone()],
            });
        }
        if c.plan.hardware != *p {
            return Err(LogFitError::ProfileVersions {
                first: first.plan_label.escape_debug().to_string(),
                other: c.plan_label.escape_debug().to_string(),
                profile: p.name.clone(),
            });
        }
        if !(c.measured_step_secs.is_finite() && c.measured_step_secs > 0.0) {
            return Err(LogFitError::NotATime {
                label: c.label.escape_debug().to_string(),
                secs: c.measured_step_secs,
            });
        }
    }
    let traced = cases.iter().any(|c| c.kernels.is_some());
    let (ra, rn) = trace_ratios(cases)?;
    let mut note = None;
    let tie = Tie {
        attention: ra.unwrap_or(1.0),
        comm_ratio: rn,
        comm: 1.0,
    };
    if traced && rn.is_none() {
        note = Some(
            "no trace holds both collective kernels and a plan with collectives: communication keeps the profile's efficiency".to_string(),
        );
    }
    let (k, l) = fit_level(cases, p, &tie)?;
    let mut scales = tie.at(k);
    let mut comm_fitted = rn.is_some();
    let (lo, hi) = tie.bounds(p);
    // At an end of the range with the logs unexplained: refuse rather than write a
    // saturated overlay.
    let rms = (l / cases.len() as f64).sqrt();
    if rms > 0.01 && ((k / lo).ln() < 1e-3 || (hi / k).ln() < 1e-3) {
        return Err(unexplained(cases, p, &scales, k));
    }
    if cases.len() >= 2 && !traced {
        match fit_compute_and_comm(cases, p, k) {
            Ok((s, l2)) if l2 < l => {
                scales = s;
                comm_fitted = true;
            }
            Ok(_) => {
                note = Some("the two-scale fit did not beat one compute scale: communication keeps the profile's efficiency".into());
            }
            Err(why) => {
                note = Some(format!(
                    "{why}: communication keeps the profile's efficiency"
                ))
            }
        }
    }
    let before = steps(cases, p, &Scales::ONE)?;
    let after = steps(cases, p, &scales)?;
    Ok(LogFit {
        scales,
        comm_fitted,
        traced,
        note,
        rows: cases
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(c, (b, a))| FitRow {
                label: c.label.clone(),
                measured_secs: c.measured_step_secs,
                before_secs: *b,
                after_secs: *a,
            })
            .collect(),
    })
}

/// Compute and communication scales from several logs: Gauss-Newton on the
/// relative step error, each step a [`fit_two`] of `measured - F` on the
/// linearised parts `C / compute + N / comm + F` (C, N from a 5% step in each
/// inverse scale). Returns the scales and their loss, or why they cannot be told
/// apart.
fn fit_compute_and_comm(
    cases: &[LogCase],
    p: &HardwareProfile,
    k0: f64,
) -> Result<(Scales, f64), LogFitError> {
    const H: f64 = 0.05;
    let (klo, khi) = Tie {
        attention: 1.0,
        comm_ratio: None,
        comm: 1.0,
    }
    .bounds(p);
    let (clo, chi) = comm_bounds(p);
    let (mut u, mut v) = (1.0 / k0, 1.0);
    let at = |u: f64, v: f64| Scales {
        gemm: 1.0 / u,
        attention: 1.0 / u,
        comm: 1.0 / v,
    };
    for _ in 0..40 {
        let base = steps(cases, p, &at(u, v))?;
        let du = steps(cases, p, &at(u * (1.0 + H), v))?;
        let dv = steps(cases, p, &at(u, v * (1.0 + H)))?;
        let mut rows = Vec::with_capacity(cases.len());
        for (i, c) in cases.iter().enumerate() {
            let cc = (du[i] - base[i]) / (u * H);
            let nn = (dv[i] - base[i]) / (v * H);
            let f = base[i] - cc * u - nn * v;
            let y = c.measured_step_secs - f;
            if !(y > 0.0 && cc >= 0.0 && nn >= 0.0) {
                return Err(LogFitError::PartsUnexplained);
            }
            let w = (y / c.measured_step_secs).powi(2);
            rows.push((cc, nn, y, w));
        }
        if rows.iter().all(|r| r.1 <= 0.0) {
            return Err(LogFitError::NoComm);
        }
        let Some((a, b)) = fit_two(&rows) else {
            return Err(LogFitError::NoSolution);
        };
        if b <= 0.0 {
            return Err(LogFitError::Indistinct);
        }
        let (k, c) = (1.0 / a, 1.0 / b);
        if !(klo..=khi).contains(&k) || !(clo..=chi).contains(&c) {
            return Err(LogFitError::TwoScaleOutOfRange {
                compute: k,
                comm: c,
            });
        }
        let done = (a / u).ln().abs() < 1e-7 && (b / v).ln().abs() < 1e-7;
        (u, v) = (a, b);
        if done {
            break;
        }
    }
    let s = at(u, v);
    let l = loss(cases, &steps(cases, p, &s)?);
    Ok((s, l))
}

/// The overlay of a fit: its scales (a scale left at the profile's is absent),
/// and each log's point.
pub fn overlay(fit: &LogFit, cases: &[LogCase], device: &str) -> Overlay {
    let p = &cases[0].plan.hardware;
    Overlay {
        schema_version: crate::calibration::OVERLAY_SCHEMA_VERSION,
        profile: p.name.clone(),
        backend: crate::calibration::LOG_BACKEND.into(),
        device: device.into(),
        runs: cases.iter().map(|c| c.label.clone()).collect(),
        gemm_bf16: None,
        attention: None,
        nvlink_busbw: None,
        network_busbw: None,
        gemm_overhead_us: None,
        nvlink_latency_us: None,
        network_latency_us: None,
        hbm: None,
        gemm_curve: None,
        benchmarks: Vec::new(),
        gemm_points: vec![],
        collective_points: vec![],
        gemm_scale: Some(fit.scales.gemm),
        attention_scale: Some(fit.scales.attention),
        comm_scale: fit.comm_fitted.then_some(fit.scales.comm),
        log_points: cases
            .iter()
            .zip(&fit.rows)
            .map(|(c, r)| LogPoint {
                log: c.label.clone(),
                plan: c.plan_label.clone(),
                gpus: c.plan.gpus,
                global_batch: c.plan.workload.global_batch,
                traced: c.kernels.is_some(),
                measured_step_secs: r.measured_secs,
                predicted_step_secs: r.before_secs,
                calibrated_step_secs: r.after_secs,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Dispatcher, Layout, Overlap, Precision, Recompute, Workload, Zero};
    use crate::cost::Assumptions;
    use crate::hardware::builtin_profile;
    use crate::schedule::Schedule;
    use crate::ParallelConfig;

    /// A plan file for Llama 3 8B on `gpus` H100s with one configuration.
    fn plan(gpus: u64, tp: u64, pp: u64, dp: u64, gbs: u64) -> PlanFile {
        let model = crate::presets::resolve("8b").unwrap().spec;
        let hw = builtin_profile("h100-sxm").unwrap();
        let w = Workload {
            seq: 4096,
            global_batch: gbs,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        };
        let cfg = ParallelConfig {
            tp,
            pp,
            vpp: 1,
            cp: 1,
            ep: 1,
            etp: 1,
            dp,
            sp: tp > 1,
            mbs: 1,
            zero: Zero::DistOpt,
            recompute: Recompute::None,
            layout: Layout::Even,
            overlap: Overlap::default(),
            bf16_grads: false,
            bf16_moments: false,
            recompute_modules: Default::default(),
            moe_dispatcher: Dispatcher::AllToAll,
            schedule: Schedule::OneFOneB,
        };
        let cluster = Cluster::new(hw.clone(), gpus).unwrap();
        let e = estimate_with(&model, &cluster, &w, &cfg, Assumptions::default()).unwrap();
        PlanFile::new(
            model,
            hw,
            gpus,
            w,
            Assumptions::default(),
            None,
            vec![(cfg, e)],
        )
    }

    fn case<'a>(label: &str, plan: &'a PlanFile, truth: &Scales, traced: bool) -> LogCase<'a> {
        let t = scale_efficiencies(&plan.hardware, truth);
        let k = predicted_kernels(plan, &t).unwrap();
        LogCase {
            label: label.into(),
            plan_label: format!("{label}.json"),
            plan,
            measured_step_secs: predict(plan, &t).unwrap().step_secs,
            kernels: traced.then_some(KernelTimes {
                steps: 3,
                kernels: 1000,
                gemm_secs: k.gemm_secs,
                attention_secs: k.attention_secs,
                collective_secs: k.collective_secs,
                send_recv_secs: k.send_recv_secs,
                other_secs: 0.01,
            }),
        }
    }

    /// One log: the compute scale that makes the prediction equal the
    /// measurement, communication untouched.
    #[test]
    fn one_log_fits_one_compute_scale_to_its_step() {
        let a = plan(8, 2, 2, 2, 128);
        let truth = Scales {
            gemm: 0.8,
            attention: 0.8,
            comm: 1.0,
        };
        let f = fit(&[case("a", &a, &truth, false)]).unwrap();
        assert!(!f.comm_fitted && f.scales.comm == 1.0);
        assert!((f.scales.gemm - 0.8).abs() < 1e-4, "{:?}", f.scales);
        assert_eq!(f.scales.gemm, f.scales.attention);
        let r = &f.rows[0];
        assert!((r.after_secs / r.measured_secs - 1.0).abs() < 1e-6, "{r:?}");
        assert!(r.before_secs < 0.9 * r.measured_secs, "{r:?}");
    }

    /// Traces set the GEMM : attention : collective ratios, the log the level: a
    /// truth with three different scales is recovered.
    #[test]
    fn a_trace_splits_gemm_attention_and_communication() {
        let a = plan(16, 8, 1, 2, 128);
        let truth = Scales {
            gemm: 0.8,
            attention: 0.6,
            comm: 0.7,
        };
        let f = fit(&[case("a", &a, &truth, true)]).unwrap();
        assert!(f.traced && f.comm_fitted);
        let s = f.scales;
        for (got, want) in [(s.gemm, 0.8), (s.attention, 0.6), (s.comm, 0.7)] {
            assert!((got / want - 1.0).abs() < 0.03, "{s:?}");
        }
        assert!((f.rows[0].after_secs / f.rows[0].measured_secs - 1.0).abs() < 1e-6);
    }

    /// Two logs whose configurations communicate in different shares separate
    /// compute from communication; the fit then predicts a third configuration.
    #[test]
    fn two_logs_fit_compute_and_communication_and_predict_a_third() {
        let a = plan(16, 8, 1, 2, 128);
        let b = plan(16, 1, 1, 16, 128);
        let c = plan(16, 4, 2, 2, 128);
        let truth = Scales {
            gemm: 0.8,
            attention: 0.8,
            comm: 0.6,
        };
        let f = fit(&[case("a", &a, &truth, false), case("b", &b, &truth, false)]).unwrap();
        assert!(f.comm_fitted, "{:?}", f.note);
        assert!((f.scales.gemm / 0.8 - 1.0).abs() < 0.02, "{:?}", f.scales);
        assert!((f.scales.comm / 0.6 - 1.0).abs() < 0.05, "{:?}", f.scales);
        let third = case("c", &c, &truth, false);
        let p = predict(&c, &scale_efficiencies(&c.hardware, &f.scales)).unwrap();
        assert!((p.step_secs / third.measured_step_secs - 1.0).abs() < 0.01);
    }

    /// A step faster than the model allows at 100% of peak is refused, naming it.
    #[test]
    fn an_impossible_step_is_refused() {
        let a = plan(8, 2, 2, 2, 128);
        let mut c = case("a", &a, &Scales::ONE, false);
        c.measured_step_secs *= 0.05;
        let e = fit(&[c]).unwrap_err().to_string();
        assert!(
            e.contains("no efficiency scale within the profile's ranges"),
            "{e}"
        );
        let mut other = plan(8, 2, 2, 2, 128);
        other.hardware.efficiency.gemm_bf16 *= 0.9;
        let e = fit(&[
            case("a", &a, &Scales::ONE, false),
            case("b", &other, &Scales::ONE, false),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("different versions of profile"), "{e}");
    }
}
