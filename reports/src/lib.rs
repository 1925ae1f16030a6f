//! Sextant's HTML cost report: one self-contained file (inline CSS and SVG, no
//! scripts, fonts or links fetched from anywhere) that shows why the recommended
//! plan wins and what it would take to do better.
//!
//! Rendering is a pure function from plan data to a string; the CLI gathers the
//! inputs (it runs the search, the exporter) and writes the file.

mod charts;

use std::fmt::Write;

use sextant_planner::config::RejectKind;
use sextant_planner::cost::CommKind;
use sextant_planner::hardware::GIB;
use sextant_planner::plan::PlanFile;
use sextant_planner::search::{Point, Sensitivity};

/// The report's sections, in order: (id, heading).
pub const SECTIONS: &[(&str, &str)] = &[
    ("inputs", "1. Inputs and assumptions"),
    ("plans", "2. Ranked plans"),
    ("space", "3. Every valid configuration"),
    ("breakdown", "4. Where the step time goes"),
    ("memory", "5. Memory per pipeline stage"),
    ("schedule", "6. Pipeline schedule of one step"),
    ("others", "7. Why the others lost"),
    ("launch", "8. Launch arguments (Megatron-LM)"),
    ("measured", "9. Predicted against measured"),
];

/// A measured component next to its prediction (from an executor run).
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub component: String,
    pub predicted_secs: f64,
    pub measured_secs: f64,
}

pub struct ReportInput<'a> {
    pub plan: &'a PlanFile,
    /// Every valid configuration of the search (empty for a single estimate).
    pub points: &'a [Point],
    pub sensitivity: &'a [Sensitivity],
    /// Megatron-LM arguments of the chosen plan, or why there are none.
    pub launch: Result<String, String>,
    /// Measured timings of the chosen plan, when an executor run exists.
    pub measured: &'a [Measured],
}

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn secs(x: f64) -> String {
    if x >= 1.0 {
        format!("{x:.3} s")
    } else {
        format!("{:.1} ms", x * 1e3)
    }
}

const STYLE: &str = "body{font-family:sans-serif;margin:24px auto;max-width:960px;color:#222}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;font-size:12px;margin:6px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}\
th{background:#f3f3f3}td.l,th.l{text-align:left}tr.best{background:#fff4e0}.note{color:#555;font-size:12px}\
pre{background:#f6f6f6;padding:8px;font-size:11px;white-space:pre-wrap}svg{max-width:100%;height:auto}\
@media print{section{page-break-inside:avoid}body{margin:0}}";

pub fn render(input: &ReportInput) -> String {
    let plan = input.plan;
    let hw = &plan.hardware;
    let best = &plan.plans[0];
    let cap = hw.gpu.hbm_gib;
    let mut h = String::new();
    let _ = write!(h, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Sextant plan: {} on {} GPUs</title>\n<style>{STYLE}</style>\n</head>\n<body>\n", esc(&plan.model.name), plan.gpus);
    let _ = writeln!(
        h,
        "<h1>Sextant plan: {} on {} x {}</h1>\n<p>Best plan: TP {} PP {} VPP {} CP {} EP {} DP {}, step {} ({:.0} tokens/s/GPU, MFU {:.1}%). {}</p>",
        esc(&plan.model.name),
        plan.gpus,
        esc(&hw.gpu.name),
        best.config.tp,
        best.config.pp,
        best.config.vpp,
        best.config.cp,
        best.config.ep,
        best.config.dp,
        secs(best.estimate.step_secs),
        best.estimate.tokens_per_sec_per_gpu,
        100.0 * best.estimate.mfu,
        esc(&plan.generator)
    );
    let section = |h: &mut String, id: &str, body: String| {
        let title = SECTIONS
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, t)| *t)
            .unwrap_or(id);
        let _ = write!(
            h,
            "<section id=\"{id}\">\n<h2>{title}</h2>\n{body}</section>\n"
        );
    };

    // 1. Inputs.
    let mut b = String::new();
    let w = &plan.workload;
    let m = &plan.model;
    let p = m.params();
    let _ = writeln!(b, "<table><tbody>");
    let row = |b: &mut String, k: &str, v: String| {
        let _ = writeln!(
            b,
            "<tr><th class=\"l\">{k}</th><td class=\"l\">{v}</td></tr>"
        );
    };
    row(
        &mut b,
        "model",
        format!(
            "{}: {} ({})",
            esc(&m.name),
            esc(&m.summary()),
            esc(&m.source)
        ),
    );
    row(
        &mut b,
        "parameters",
        format!(
            "{:.2}B total, {:.2}B active per token ({:.2}B without the input embedding)",
            p.total as f64 / 1e9,
            p.active as f64 / 1e9,
            p.active_without_embedding as f64 / 1e9
        ),
    );
    row(
        &mut b,
        "cluster",
        format!(
            "{} x {} ({}): {}",
            plan.gpus,
            esc(&hw.gpu.name),
            esc(&hw.name),
            esc(&hw.description)
        ),
    );
    row(
        &mut b,
        "GPU",
        format!(
            "{:.0} BF16 / {:.0} FP8 TFLOP/s dense, {:.1} GiB HBM at {:.2} TB/s",
            hw.gpu.peak_tflops.bf16,
            hw.gpu.peak_tflops.fp8,
            hw.gpu.hbm_gib,
            hw.gpu.hbm_tbytes_per_s
        ),
    );
    row(
        &mut b,
        "interconnect",
        format!(
            "NVLink domain of {} at {:.0} GB/s per GPU; network {:.1} GB/s per GPU",
            hw.node.nvlink_domain, hw.node.nvlink_gbytes_per_s, hw.network.nic_gbytes_per_s
        ),
    );
    row(
        &mut b,
        "workload",
        format!(
            "sequence {}, global batch {} sequences ({:.2}M tokens), precision {}",
            w.seq,
            w.global_batch,
            (w.seq * w.global_batch) as f64 / 1e6,
            w.precision
        ),
    );
    if let Some(s) = &plan.search {
        let rejected: u64 = s.rejected.values().sum();
        row(
            &mut b,
            "search space",
            format!(
                "{} configurations enumerated: {} valid, {} rejected",
                s.enumerated, s.valid, rejected
            ),
        );
    }
    let _ = writeln!(
        b,
        "</tbody></table>\n<p class=\"note\">Profile sources:</p>\n<table><tbody>"
    );
    for (k, v) in &hw.sources {
        let _ = writeln!(
            b,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            esc(k),
            esc(v)
        );
    }
    let _ = writeln!(b, "</tbody></table>");
    section(&mut h, "inputs", b);

    // 2. Ranked plans.
    let mut b = String::new();
    let _ = writeln!(b, "<table><thead><tr><th>#</th><th>TP</th><th>PP</th><th>VPP</th><th>CP</th><th>SP</th><th>EP</th><th>ETP</th><th>DP</th><th>MBS</th><th>GA</th><th>ZeRO</th><th>RC</th><th>step</th><th>band</th><th>tok/s/GPU</th><th>MFU</th><th>mem GiB / cap</th><th>bubble</th><th>exposed comm</th></tr></thead><tbody>");
    for rp in &plan.plans {
        let c = &rp.config;
        let e = &rp.estimate;
        let band = e
            .band
            .as_ref()
            .map(|b| format!("{:.3}-{:.3} s", b.low_secs, b.high_secs))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            b,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{:.1}%</td><td>{:.1} / {:.1}</td><td>{:.1}%</td><td>{:.1}%</td></tr>",
            if rp.rank == 1 { " class=\"best\"" } else { "" },
            rp.rank, c.tp, c.pp, c.vpp, c.cp, if c.sp { "y" } else { "n" }, c.ep, c.etp, c.dp, c.mbs, e.micro_batches, esc(&c.zero.to_string()), esc(&c.recompute_label()),
            secs(e.step_secs), band, e.tokens_per_sec_per_gpu, 100.0 * e.mfu, e.memory.total / GIB, cap, 100.0 * e.bubble_fraction, 100.0 * e.exposed_comm_fraction
        );
    }
    let _ = writeln!(b, "</tbody></table>");
    if let Some(band) = &best.estimate.band {
        let _ = writeln!(b, "<p class=\"note\">The band holds the measured step time with probability {:.0}% if the cost model errs on these plans as it did on {} (published measurements).</p>", 100.0 * band.coverage, esc(&band.basis));
    }
    section(&mut h, "plans", b);

    // 3. Scatter.
    let tops: Vec<&sextant_planner::cost::Estimate> =
        plan.plans.iter().map(|r| &r.estimate).collect();
    let mut b = String::new();
    let fallback;
    let pts: &[Point] = if input.points.is_empty() {
        fallback = tops
            .iter()
            .map(|e| Point {
                step_secs: e.step_secs,
                peak_gib: e.memory.total / GIB,
                rank_secs: e.band.as_ref().map_or(e.step_secs, |b| b.high_secs),
            })
            .collect::<Vec<_>>();
        &fallback
    } else {
        input.points
    };
    b.push_str(&charts::scatter(pts, &tops, cap));
    let _ = writeln!(b, "<p class=\"note\">{} valid configurations (shaded by density; step times above 4x the best are clipped). The front is the fastest plan at or below each memory level; numbers mark the ranked plans.</p>", pts.len());
    section(&mut h, "space", b);

    // 4. Stacked bars.
    let mut b = charts::stacked_bars(&tops);
    let _ = writeln!(
        b,
        "<table><thead><tr><th>#</th>{}<th>step</th></tr></thead><tbody>",
        charts::PALETTE
            .iter()
            .map(|(n, _)| format!("<th>{n}</th>"))
            .collect::<String>()
    );
    for rp in &plan.plans {
        let parts = charts::components(&rp.estimate);
        let _ = writeln!(
            b,
            "<tr><td>{}</td>{}<td>{}</td></tr>",
            rp.rank,
            parts
                .iter()
                .map(|(_, v)| format!("<td>{}</td>", secs(*v)))
                .collect::<String>(),
            secs(rp.estimate.step_secs)
        );
    }
    let _ = writeln!(b, "</tbody></table><p class=\"note\">Communication is the part not hidden behind compute; \"other\" is the optimizer step and the slowdown of compute that shares the GPU with overlapped communication.</p>");
    section(&mut h, "breakdown", b);

    // 5. Memory per stage.
    let mut b = charts::stage_memory(&best.estimate, cap);
    let worst = &best.estimate.memory;
    let _ = writeln!(b, "<p class=\"note\">Worst stage {}: {:.1} GiB of {:.1} GiB, with {:.1} micro-batches of activations in flight.</p>", worst.stage, worst.total / GIB, cap, worst.in_flight);
    section(&mut h, "memory", b);

    // 6. Schedule.
    let p2p = best
        .estimate
        .comm
        .iter()
        .find(|t| t.kind == CommKind::Pp)
        .map(|t| t.total_secs / t.calls_per_step.max(1.0))
        .unwrap_or(0.0);
    let (svg, caption) = charts::gantt(&best.estimate, &best.config, p2p);
    section(
        &mut h,
        "schedule",
        format!("{svg}<p class=\"note\">{}</p>\n", esc(&caption)),
    );

    // 7. Why the others lost.
    let mut b = String::new();
    if let Some(s) = &plan.search {
        let _ = writeln!(b, "<table><thead><tr><th class=\"l\">rejected because</th><th>configurations</th></tr></thead><tbody>");
        let mut reasons: Vec<(&RejectKind, &u64)> = s.rejected.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1));
        for (k, n) in reasons {
            let _ = writeln!(
                b,
                "<tr><td class=\"l\">{}</td><td>{n}</td></tr>",
                esc(k.describe())
            );
        }
        let _ = writeln!(b, "</tbody></table>");
    } else {
        let _ = writeln!(
            b,
            "<p class=\"note\">This plan was estimated, not searched: no rejection counts.</p>"
        );
    }
    if !input.sensitivity.is_empty() {
        // Simulated step times, as the ranked plans', compared with the best.
        let best_step = input
            .sensitivity
            .iter()
            .map(|s| s.step_secs)
            .fold(f64::INFINITY, f64::min);
        let _ = writeln!(b, "<p>Best plan with one dimension held at each value it can take (step times with the schedule simulated, as for the ranked plans above):</p><table><thead><tr><th class=\"l\">dimension</th><th>value</th><th>best step</th><th>vs best</th><th class=\"l\">that plan</th></tr></thead><tbody>");
        for s in input.sensitivity {
            let c = &s.config;
            let _ = writeln!(
                b,
                "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{:+.1}%</td><td class=\"l\">TP {} PP {} VPP {} CP {} EP {} DP {} MBS {} ZeRO {} RC {}</td></tr>",
                s.dimension, esc(&s.value), secs(s.step_secs), 100.0 * (s.step_secs / best_step - 1.0), c.tp, c.pp, c.vpp, c.cp, c.ep, c.dp, c.mbs, esc(&c.zero.to_string()), esc(&c.recompute_label())
            );
        }
        let _ = writeln!(b, "</tbody></table>");
    }
    section(&mut h, "others", b);

    // 8. Launch arguments.
    let b = match &input.launch {
        Ok(args) => format!("<pre>{}</pre>\n", esc(args)),
        Err(why) => format!("<p class=\"note\">{}</p>\n", esc(why)),
    };
    section(&mut h, "launch", b);

    // 9. Measured.
    let b = if input.measured.is_empty() {
        "<p class=\"note\">No measured run is attached to this plan. A run of the plan on GPUs (the executor) produces one; this section then compares every component.</p>\n".to_string()
    } else {
        let mut b = String::from("<table><thead><tr><th class=\"l\">component</th><th>predicted</th><th>measured</th><th>error</th></tr></thead><tbody>\n");
        for r in input.measured {
            let _ = writeln!(
                b,
                "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{:+.1}%</td></tr>",
                esc(&r.component),
                secs(r.predicted_secs),
                secs(r.measured_secs),
                100.0 * (r.predicted_secs / r.measured_secs - 1.0)
            );
        }
        b.push_str("</tbody></table>\n");
        b
    };
    section(&mut h, "measured", b);

    h.push_str("</body>\n</html>\n");
    h
}
