//! `calibrate --log` and `compare --log`: the user's own training runs (Megatron-LM,
//! Megatron-Bridge, NeMo 2 logs, optionally a Kineto trace each) against the plan
//! they ran. Reads the files (bounded: logs a line at a time, traces whole under a
//! cap), checks each log against its plan, and hands values to the planner's
//! `trainlog`, `kineto` and `logfit`.

use std::path::Path;

use anyhow::{anyhow, bail, Result};
use sextant_planner::calibration::{apply, Target};
use sextant_planner::hardware::{HardwareProfile, GIB};
use sextant_planner::kineto::KernelTimes;
use sextant_planner::logfit::{self, LogCase, PredictedKernels};
use sextant_planner::memory::MemKind;
use sextant_planner::plan::PlanFile;
use sextant_planner::trainlog::{LogReader, StepSummary, TrainingLog};

use crate::io::{
    check_outputs, for_each_line, read_text, read_text_capped, write_new, MAX_LOG_BYTES,
    MAX_LOG_LINE_BYTES, MAX_TRACE_BYTES,
};

/// One log as read and summarised.
pub struct ReadLog {
    pub path: String,
    pub log: TrainingLog,
    pub summary: StepSummary,
}

pub fn read_log(path: &str, warmup_iters: u64) -> Result<ReadLog> {
    let mut r = LogReader::new();
    for_each_line(
        Path::new(path),
        "training log",
        MAX_LOG_BYTES,
        MAX_LOG_LINE_BYTES,
        |line, ended| r.line(line, ended),
    )?;
    let log = r
        .finish()
        .map_err(|e| anyhow!("training log '{path}': {e}"))?;
    let summary = log
        .summary(warmup_iters)
        .map_err(|e| anyhow!("training log '{path}': {e}"))?;
    Ok(ReadLog {
        path: path.to_string(),
        log,
        summary,
    })
}

pub fn read_trace(path: &str) -> Result<KernelTimes> {
    let text = read_text_capped(Path::new(path), "Kineto trace", MAX_TRACE_BYTES)?;
    KernelTimes::from_json(&text).map_err(|e| anyhow!("'{path}': {e}"))
}

pub fn read_plan(path: &str) -> Result<PlanFile> {
    let text = read_text(Path::new(path), "plan")?;
    PlanFile::from_json(&text).map_err(|e| anyhow!("'{path}': {e}"))
}

/// Refuses a log whose run is not the plan's first configuration, naming the
/// setting and both values: the global batch its iteration lines show, and every
/// setting its start-up lines state.
pub fn check_log_against_plan(l: &ReadLog, plan_path: &str, plan: &PlanFile) -> Result<()> {
    let cfg = &plan.plans[0].config;
    let mut pairs: Vec<(&str, u64, u64)> = Vec::new();
    if let Some(g) = l.summary.global_batch {
        pairs.push(("global batch size", g, plan.workload.global_batch));
    }
    for (name, v) in l.log.stated.stated() {
        let planned = match name {
            "world size" => plan.gpus,
            "tensor-parallel size" => cfg.tp,
            "pipeline-parallel size" => cfg.pp,
            "context-parallel size" => cfg.cp,
            "expert-parallel size" => cfg.ep,
            "data-parallel size" => cfg.dp,
            "micro-batch size" => cfg.mbs,
            "global batch size" => plan.workload.global_batch,
            "sequence length" => plan.workload.seq,
            _ => continue,
        };
        pairs.push((name, v, planned));
    }
    if let Some((name, logged, planned)) = pairs.into_iter().find(|p| p.1 != p.2) {
        bail!(
            "training log '{}' ran {name} {logged}, but plan '{plan_path}' is for {planned}: give the plan of the configuration the log ran",
            l.path
        );
    }
    Ok(())
}

/// Whether two logs hold the same run: no setting both state differs, and at
/// least half of the shorter one's measured lines (after its warm-up) appear in
/// the other as the same record: the same iteration, step time and loss values
/// (`IterationLine::record`). Independent runs may share an (iteration, time)
/// pair where a format prints coarse times (NeMo 2's seconds to two decimals),
/// but not the loss too on half of their lines; a copy, cut short, trimmed or
/// respaced, shares them all.
fn same_run(a: &ReadLog, b: &ReadLog) -> bool {
    let stated_b = b.log.stated.stated();
    let contradicts = a
        .log
        .stated
        .stated()
        .iter()
        .any(|(name, v)| stated_b.iter().any(|(n, w)| n == name && w != v));
    if contradicts {
        return false;
    }
    let kept = |l: &ReadLog| -> std::collections::HashSet<u64> {
        l.log
            .iterations
            .iter()
            .filter(|i| i.iteration >= l.summary.first_iteration)
            .map(|i| i.record)
            .collect()
    };
    let (ka, kb) = (kept(a), kept(b));
    let shared = ka.intersection(&kb).count();
    let shorter = ka.len().min(kb.len());
    shorter > 0 && 2 * shared >= shorter
}

fn describe(l: &ReadLog) -> String {
    let s = &l.summary;
    let mut dropped = vec![format!("{} warm-up", s.warmup)];
    if s.rampup > 0 {
        dropped.push(format!("{} before the batch-size ramp-up ended", s.rampup));
    }
    if l.log.unreadable_lines > 0 {
        dropped.push(format!(
            "{} with no readable time (cut off, or other output written into it)",
            l.log.unreadable_lines
        ));
    }
    if l.log.bad_time_lines > 0 {
        dropped.push(format!(
            "{} where {}",
            l.log.bad_time_lines,
            sextant_planner::trainlog::BAD_TIME
        ));
    }
    format!(
        "'{}' ({}): median step {:.4} s over {} iteration line(s) (iterations {} to {}, {:.4} to {:.4} s); dropped {}",
        l.path,
        l.log.format.name(),
        s.step_secs,
        s.kept,
        s.first_iteration,
        s.last_iteration,
        s.min_secs,
        s.max_secs,
        dropped.join(", ")
    )
}

fn describe_trace(path: &str, k: &KernelTimes) -> String {
    format!(
        "'{path}': {} kernels over {} profiler step(s); per step GEMM {:.4} s, attention {:.4} s, collectives {:.4} s, send/recv {:.4} s, other {:.4} s",
        k.kernels,
        k.steps,
        k.gemm_secs,
        k.attention_secs,
        k.collective_secs,
        k.send_recv_secs,
        k.other_secs
    )
}

/// The arguments of `calibrate --log`.
pub struct CalibrateLogs<'a> {
    pub logs: &'a [String],
    pub plans: &'a [String],
    pub traces: &'a [String],
    pub warmup_iters: u64,
    pub out: &'a str,
    pub force: bool,
}

pub fn calibrate(a: CalibrateLogs) -> Result<()> {
    if a.plans.is_empty() {
        bail!("--log needs --plan: the plan file of the configuration each log ran (sextant estimate ... --json --out plan.json)");
    }
    if a.plans.len() != 1 && a.plans.len() != a.logs.len() {
        bail!(
            "{} --log and {} --plan: give one --plan per --log, in the same order (or one --plan that every log ran)",
            a.logs.len(),
            a.plans.len()
        );
    }
    if !a.traces.is_empty() && a.traces.len() != a.logs.len() {
        bail!(
            "{} --log and {} --trace: give one --trace per --log, in the same order, or none",
            a.logs.len(),
            a.traces.len()
        );
    }
    let inputs: Vec<(&str, &str)> = a
        .logs
        .iter()
        .map(|p| ("--log", p.as_str()))
        .chain(a.plans.iter().map(|p| ("--plan", p.as_str())))
        .chain(a.traces.iter().map(|p| ("--trace", p.as_str())))
        .collect();
    check_outputs(&[("--out", a.out)], &inputs, a.force)?;
    let plans: Vec<PlanFile> = a
        .plans
        .iter()
        .map(|p| read_plan(p))
        .collect::<Result<_>>()?;
    let plan_of = |i: usize| if plans.len() == 1 { 0 } else { i };
    let mut logs = Vec::new();
    for (i, path) in a.logs.iter().enumerate() {
        let l = read_log(path, a.warmup_iters)?;
        // Each log is one measured run: the same file twice, or a copy of one
        // (whole or in part), would count it twice in the fit.
        if let Some((k, first)) = logs.iter().enumerate().find(|(_, f): &(usize, &ReadLog)| {
            crate::io::same_file(&f.path, path) || same_run(f, &l)
        }) {
            bail!(
                "--log '{path}' (log {}) is the same run as --log '{}' (log {}): each log counts as one measured run; give it once",
                i + 1,
                first.path,
                k + 1
            );
        }
        let j = plan_of(i);
        check_log_against_plan(&l, &a.plans[j], &plans[j])?;
        logs.push(l);
    }
    let traces: Vec<KernelTimes> = a
        .traces
        .iter()
        .map(|p| read_trace(p))
        .collect::<Result<_>>()?;
    let cases: Vec<LogCase> = logs
        .iter()
        .enumerate()
        .map(|(i, l)| LogCase {
            label: l.path.clone(),
            plan_label: a.plans[plan_of(i)].clone(),
            plan: &plans[plan_of(i)],
            measured_step_secs: l.summary.step_secs,
            kernels: traces.get(i).copied(),
        })
        .collect();
    let fit = logfit::fit(&cases).map_err(|e| anyhow!(e))?;
    let format = logs[0].log.format.name();
    let overlay = logfit::overlay(&fit, &cases, &format!("{format} training log(s)"));
    overlay.validate().map_err(|e| anyhow!("{e}"))?;
    // What the overlay makes of the profile must be a valid profile.
    apply(&plans[0].hardware, &overlay, Target::Stack).map_err(|e| anyhow!(e))?;
    write_new(
        Path::new(a.out),
        &serde_json::to_string_pretty(&overlay).expect("overlay serialises"),
        a.force,
    )?;
    for l in &logs {
        println!("Read {}", describe(l));
    }
    for (p, k) in a.traces.iter().zip(&traces) {
        println!("Read {}", describe_trace(p, k));
    }
    let hw = &plans[0].hardware;
    let e = &hw.efficiency;
    let s = fit.scales;
    println!(
        "Calibrated '{}' from {} training log(s){}:",
        super::shown(&hw.name),
        cases.len(),
        if fit.traced { " and their traces" } else { "" }
    );
    println!(
        "  GEMM scale {:.4}: efficiency {:.3} -> {:.3} of peak",
        s.gemm,
        e.gemm_bf16,
        e.gemm_bf16 * s.gemm
    );
    println!(
        "  attention scale {:.4}: efficiency {:.3} -> {:.3} of peak (forward)",
        s.attention,
        e.attention_fwd,
        e.attention_fwd * s.attention
    );
    if fit.comm_fitted {
        println!(
            "  communication scale {:.4}: NVLink bus bandwidth {:.3} -> {:.3}, network {:.3} -> {:.3} of the link",
            s.comm,
            e.nvlink_busbw,
            e.nvlink_busbw * s.comm,
            e.network_busbw,
            e.network_busbw * s.comm
        );
    } else {
        println!("  communication: not fitted (the profile's efficiencies are kept)");
    }
    if let Some(n) = &fit.note {
        println!("  note: {n}");
    }
    println!("Step time, predicted against measured (seconds):");
    println!(
        "{:<28} {:>10} {:>10} {:>9} {:>10} {:>9}",
        "log", "measured", "predicted", "pred/meas", "calibrated", "cal/meas"
    );
    for r in &fit.rows {
        println!(
            "{:<28} {:>10.4} {:>10.4} {:>8.3}x {:>10.4} {:>8.3}x",
            shorten(&r.label, 28),
            r.measured_secs,
            r.before_secs,
            r.before_secs / r.measured_secs,
            r.after_secs,
            r.after_secs / r.measured_secs
        );
    }
    println!("Overlay written to {}", a.out);
    if cases.len() == 1 {
        println!("  fitted on one configuration: check it on another with `sextant compare PLAN --log LOG --calibration {}`", a.out);
    }
    Ok(())
}

/// The tail of a path that fits `n` characters.
fn shorten(s: &str, n: usize) -> String {
    let c: Vec<char> = s.chars().collect();
    if c.len() <= n {
        s.to_string()
    } else {
        format!("...{}", c[c.len() + 3 - n..].iter().collect::<String>())
    }
}

/// One row of `compare --log`.
struct Row {
    name: &'static str,
    unit: &'static str,
    predicted: f64,
    measured: Option<f64>,
    calibrated: Option<f64>,
}

/// Predicted (on `profile`) against measured, per row; `calibrated` is filled in
/// by the caller.
fn rows(
    plan: &PlanFile,
    profile: &HardwareProfile,
    l: &ReadLog,
    trace: Option<&KernelTimes>,
) -> Result<Vec<Row>> {
    let e = logfit::predict(plan, profile).map_err(|e| anyhow!(e))?;
    let m = &e.memory;
    // torch's allocator counts what the framework allocates: no CUDA context or
    // NCCL buffers (the profile's reserve); "reserved" adds the allocator's slack.
    let allocated = MemKind::PeakAllocated.comparable_bytes(m);
    let reserved = MemKind::PeakReserved.comparable_bytes(m);
    let (alloc_meas, reserved_meas) = l.log.peak_memory_bytes();
    let row = |name, unit, predicted, measured| Row {
        name,
        unit,
        predicted,
        measured,
        calibrated: None,
    };
    let mut v = vec![
        row("step", "s", e.step_secs, Some(l.summary.step_secs)),
        row(
            "model TFLOP/s per GPU",
            "TFLOP/s",
            e.model_tflops_per_gpu,
            l.summary.tflops_per_gpu,
        ),
        row(
            "max allocated",
            "GiB",
            allocated / GIB,
            alloc_meas.map(|x| x / GIB),
        ),
        row(
            "max reserved",
            "GiB",
            reserved / GIB,
            reserved_meas.map(|x| x / GIB),
        ),
    ];
    if let Some(k) = trace {
        let p: PredictedKernels =
            logfit::predicted_kernels(plan, profile).map_err(|e| anyhow!(e))?;
        v.extend([
            row("GEMM kernels", "s", p.gemm_secs, Some(k.gemm_secs)),
            row(
                "attention kernels",
                "s",
                p.attention_secs,
                Some(k.attention_secs),
            ),
            row(
                "collective kernels",
                "s",
                p.collective_secs,
                Some(k.collective_secs),
            ),
            row(
                "send/recv kernels",
                "s",
                p.send_recv_secs,
                Some(k.send_recv_secs),
            ),
        ]);
    }
    Ok(v)
}

/// The arguments of `compare PLAN --log LOG`.
pub struct CompareLog<'a> {
    pub plan: &'a str,
    pub log: &'a str,
    pub trace: Option<&'a str>,
    pub warmup_iters: u64,
    pub calibration: Option<&'a str>,
    pub json: bool,
}

/// One number of the comparison table: 4 decimals, and a value that rounds to
/// zero prints as 0.0000, never -0.0000.
fn cell(x: f64) -> String {
    let x = if x.abs() < 5e-5 { 0.0 } else { x };
    format!("{x:>11.4}")
}

pub fn compare(a: CompareLog) -> Result<()> {
    let plan = read_plan(a.plan)?;
    let l = read_log(a.log, a.warmup_iters)?;
    check_log_against_plan(&l, a.plan, &plan)?;
    let trace = a.trace.map(read_trace).transpose()?;
    let before = rows(&plan, &plan.hardware, &l, trace.as_ref())?;
    let calibrated = match a.calibration {
        Some(p) => {
            let o = super::read_overlay(p)?;
            if o.backend == "cpu" {
                bail!("--calibration '{p}' was measured by the CPU test backend: it describes that CPU, not {}", plan.hardware.gpu.name);
            }
            let hw = apply(&plan.hardware, &o, Target::Stack)
                .map_err(|e| anyhow!("--calibration '{p}': {e}"))?;
            Some(rows(&plan, &hw, &l, trace.as_ref())?)
        }
        None => None,
    };
    let mut table = before;
    if let Some(c) = &calibrated {
        for (r, c) in table.iter_mut().zip(c) {
            r.calibrated = Some(c.predicted);
        }
    }
    if a.json {
        let rows: Vec<serde_json::Value> = table
            .iter()
            .map(|r| {
                serde_json::json!({"component": r.name, "unit": r.unit,
                    "predicted": r.predicted, "measured": r.measured,
                    "calibrated": r.calibrated})
            })
            .collect();
        let s = &l.summary;
        println!(
            "{}",
            crate::render::json_text(serde_json::json!({
                "log": a.log, "format": l.log.format.name(), "plan": a.plan,
                "profile": plan.hardware.name,
                "iterations_kept": s.kept, "warmup_dropped": s.warmup,
                "rampup_dropped": s.rampup, "unreadable_lines": l.log.unreadable_lines,
                "bad_time_lines": l.log.bad_time_lines,
                "rows": rows}))
        );
        return Ok(());
    }
    println!("Read {}", describe(&l));
    if let (Some(p), Some(k)) = (a.trace, &trace) {
        println!("Read {}", describe_trace(p, k));
        println!("  (kernel rows: the trace's rank against the plan's slowest stage; collective kernels include waiting for peers)");
    }
    println!(
        "Predicted ({}) vs measured, per step:",
        super::shown(&plan.hardware.name)
    );
    print!(
        "{:<24} {:>8} {:>11} {:>11} {:>9}",
        "", "unit", "predicted", "measured", "pred/meas"
    );
    if calibrated.is_some() {
        print!(" {:>11} {:>9}", "calibrated", "cal/meas");
    }
    println!();
    let ratio = |p: f64, m: Option<f64>| match m {
        Some(m) if m > 0.0 && p > 0.0 => format!("{:>8.3}x", p / m),
        _ => format!("{:>9}", "-"),
    };
    let num = |x: Option<f64>| x.map_or(format!("{:>11}", "-"), cell);
    for r in &table {
        print!(
            "{:<24} {:>8} {} {} {}",
            r.name,
            r.unit,
            num(Some(r.predicted)),
            num(r.measured),
            ratio(r.predicted, r.measured)
        );
        if let Some(c) = r.calibrated {
            print!(" {} {}", num(Some(c)), ratio(c, r.measured));
        }
        println!();
    }
    if l.summary.tflops_per_gpu.is_some() {
        println!("  (TFLOP/s: the log's is the framework's own FLOP count, the prediction Sextant's model FLOPs over its step)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cell_never_shows_a_negative_zero() {
        assert_eq!(super::cell(-0.0).trim(), "0.0000");
        assert_eq!(super::cell(-1e-6).trim(), "0.0000");
        assert_eq!(super::cell(-0.25).trim(), "-0.2500");
        assert_eq!(super::cell(1.5).trim(), "1.5000");
    }

    /// The JSON outputs write no negative zero (`render::json_text`): JSON
    /// readers keep its sign; other numbers pass as they are.
    #[test]
    fn json_numbers_carry_no_negative_zero() {
        assert_eq!(serde_json::json!(-0.0f64).to_string(), "-0.0");
        let v = serde_json::json!({"a": -0.0f64, "b": [1, -0.0f64, -0.25], "c": {"d": -0.0f64}});
        let text = crate::render::json_text(v);
        assert!(
            !text.contains("-0.0,") && !text.contains("-0.0\n"),
            "{text}"
        );
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"a": 0.0, "b": [1, 0.0, -0.25], "c": {"d": 0.0}})
        );
        assert!(back["a"].as_f64().unwrap().is_sign_positive());
        assert_eq!(super::super::unsigned_zero(-0.25), -0.25);
        assert!(super::super::unsigned_zero(-0.0).is_sign_positive());
    }
}
