//! Sextant's HTML cost report: one self-contained file (inline CSS, SVG and one
//! inline script; no fonts, scripts or links fetched from anywhere) that shows why
//! the recommended plan wins and what it would take to do better. Without
//! JavaScript it is a static page; with it, tables sort and filter, every chart
//! mark shows a tooltip and the timeline zooms.
//!
//! Rendering is a pure function from plan data to a string; the CLI gathers the
//! inputs (it runs the search, the exporter) and writes the file.

#![forbid(unsafe_code)]

mod charts;
mod interactive;

use std::fmt::Write;

use sextant_planner::config::RejectKind;
use sextant_planner::cost::CommKind;
use sextant_planner::hardware::GIB;
use sextant_planner::plan::PlanFile;
use sextant_planner::search::{Point, Sensitivity};

use interactive::{secs, PlanMark, SensRow, SCRIPT, STYLE};

/// The report's sections, in order: (id, heading).
pub const SECTIONS: &[(&str, &str)] = &[
    ("inputs", "1. Inputs and assumptions"),
    ("plans", "2. Ranked plans"),
    ("space", "3. Every valid configuration"),
    ("breakdown", "4. Where the step time goes"),
    ("memory", "5. Memory per pipeline stage"),
    ("schedule", "6. Pipeline schedule of one step"),
    ("others", "7. Why the others lost"),
    ("launch", "8. Launch configuration"),
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
    /// The chosen plan's configuration for `launch_for`, or why there is none.
    pub launch: Result<String, NoLaunch>,
    /// The framework `launch` is for: the plan's target (Megatron-LM when it has
    /// none, or `any`).
    pub launch_for: &'a str,
    /// Measured timings of the chosen plan, when an executor run exists.
    pub measured: &'a [Measured],
    /// Where they were measured (device and backend); empty without a run.
    pub measured_on: &'a str,
}

/// Why a report has no Megatron-LM arguments: the exporter's one-line refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoLaunch(pub String);

/// Escapes text for HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A configuration in one line, as the tooltips and tables give it.
fn describe(c: &sextant_planner::config::ParallelConfig) -> String {
    format!(
        "TP {} PP {} VPP {} CP {} EP {} DP {} MBS {} ZeRO {} RC {}",
        c.tp,
        c.pp,
        c.vpp,
        c.cp,
        c.ep,
        c.dp,
        c.mbs,
        c.zero,
        c.recompute_label()
    )
}

pub fn render(input: &ReportInput) -> String {
    let plan = input.plan;
    let hw = &plan.hardware;
    let best = &plan.plans[0];
    let cap = hw.gpu.hbm_gib;
    let mut h = String::new();
    let _ = write!(h, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Sextant plan: {} on {} GPUs</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<div id=\"tip\" role=\"tooltip\"></div>\n", esc(&plan.model.name), plan.gpus);
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
        "</tbody></table>\n<details id=\"sources\"><summary>Profile sources ({} entries)</summary>\n<div class=\"scroll\"><table><tbody>",
        hw.sources.len()
    );
    for (k, v) in &hw.sources {
        let _ = writeln!(
            b,
            "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            esc(k),
            esc(v)
        );
    }
    let _ = writeln!(b, "</tbody></table></div></details>");
    section(&mut h, "inputs", b);

    // 2. Ranked plans.
    let mut b = String::new();
    let _ = writeln!(b, "<p><input id=\"ranked-filter\" type=\"search\" placeholder=\"filter plans, e.g. TP 8 or ZeRO 1\" aria-label=\"filter plans\"> <span class=\"note\">Click a column to sort.</span></p>");
    // The bands' coverage: one heading when every plan's band claims the same,
    // else each cell says its own.
    let coverages: Vec<f64> = plan
        .plans
        .iter()
        .filter_map(|rp| rp.estimate.band.as_ref().map(|b| b.coverage))
        .collect();
    let one_coverage = coverages
        .first()
        .filter(|c| coverages.iter().all(|x| (x - *c).abs() < 1e-9))
        .copied();
    let band_head = match one_coverage {
        Some(c) => format!("{:.0}% band", 100.0 * c),
        None => "band".to_string(),
    };
    let heads = [
        ("rank", "#"),
        ("tp", "TP"),
        ("pp", "PP"),
        ("vpp", "VPP"),
        ("cp", "CP"),
        ("sp", "SP"),
        ("ep", "EP"),
        ("etp", "ETP"),
        ("dp", "DP"),
        ("mbs", "MBS"),
        ("ga", "GA"),
        ("zero", "ZeRO"),
        ("rc", "RC"),
        ("step", "step"),
        ("band", band_head.as_str()),
        ("tps", "tok/s/GPU"),
        ("mfu", "MFU"),
        ("mem", "mem GiB / cap"),
        ("bubble", "bubble"),
        ("comm", "exposed comm"),
    ];
    let _ = writeln!(
        b,
        "<div class=\"scroll\"><table id=\"ranked\" class=\"sortable\"><thead><tr>{}</tr></thead><tbody>",
        heads
            .iter()
            .map(|(k, t)| format!("<th data-key=\"{k}\">{t}</th>"))
            .collect::<String>()
    );
    for rp in &plan.plans {
        let c = &rp.config;
        let e = &rp.estimate;
        let (band, band_v) = e
            .band
            .as_ref()
            .map(|b| {
                (
                    format!(
                        "{}&ndash;{}{}",
                        secs(b.low_secs),
                        secs(b.high_secs),
                        if one_coverage.is_some() {
                            String::new()
                        } else {
                            format!(" ({:.0}%)", 100.0 * b.coverage)
                        }
                    ),
                    b.high_secs,
                )
            })
            .unwrap_or_else(|| ("-".into(), e.step_secs));
        let zero = c.zero.to_string();
        let rc = c.recompute_label();
        let desc = format!(
            "TP {} PP {} VPP {} CP {} EP {} ETP {} DP {} MBS {} ZeRO {} RC {}",
            c.tp, c.pp, c.vpp, c.cp, c.ep, c.etp, c.dp, c.mbs, zero, rc
        );
        let num = |v: f64, text: String| format!("<td data-v=\"{v}\">{text}</td>");
        let _ = writeln!(
            b,
            "<tr{} data-desc=\"{}\">{}{}{}{}{}<td data-v=\"{}\">{}</td>{}{}{}{}{}<td>{}</td><td>{}</td>{}<td data-v=\"{band_v}\">{band}</td>{}{}{}{}{}</tr>",
            if rp.rank == 1 { " class=\"best\"" } else { "" },
            esc(&desc),
            num(rp.rank as f64, rp.rank.to_string()),
            num(c.tp as f64, c.tp.to_string()),
            num(c.pp as f64, c.pp.to_string()),
            num(c.vpp as f64, c.vpp.to_string()),
            num(c.cp as f64, c.cp.to_string()),
            u8::from(c.sp),
            if c.sp { "y" } else { "n" },
            num(c.ep as f64, c.ep.to_string()),
            num(c.etp as f64, c.etp.to_string()),
            num(c.dp as f64, c.dp.to_string()),
            num(c.mbs as f64, c.mbs.to_string()),
            num(e.micro_batches as f64, e.micro_batches.to_string()),
            esc(&zero),
            esc(&rc),
            num(e.step_secs, secs(e.step_secs)),
            num(e.tokens_per_sec_per_gpu, format!("{:.0}", e.tokens_per_sec_per_gpu)),
            num(e.mfu, format!("{:.1}%", 100.0 * e.mfu)),
            num(e.memory.total / GIB, format!("{:.1} / {:.1}", e.memory.total / GIB, cap)),
            num(e.bubble_fraction, format!("{:.1}%", 100.0 * e.bubble_fraction)),
            num(e.exposed_comm_fraction, format!("{:.1}%", 100.0 * e.exposed_comm_fraction)),
        );
    }
    let _ = writeln!(b, "</tbody></table></div>");
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
    let marks: Vec<PlanMark> = plan
        .plans
        .iter()
        .map(|rp| {
            let c = &rp.config;
            let e = &rp.estimate;
            PlanMark {
                rank: rp.rank,
                step_secs: e.step_secs,
                peak_gib: e.memory.total / GIB,
                tip: format!(
                    "#{}: {}; step {}{}; peak {:.1} of {:.1} GiB",
                    rp.rank,
                    describe(c),
                    secs(e.step_secs),
                    e.band
                        .as_ref()
                        .map(|b| format!(
                            " ({:.0}% band {} to {})",
                            100.0 * b.coverage,
                            secs(b.low_secs),
                            secs(b.high_secs)
                        ))
                        .unwrap_or_default(),
                    e.memory.total / GIB,
                    cap
                ),
            }
        })
        .collect();
    let cloud: Vec<(f64, f64)> = pts.iter().map(|p| (p.step_secs, p.peak_gib)).collect();
    if !input.points.is_empty() {
        let _ = writeln!(b, "<p>The region that matters: every configuration up to a little above the slowest ranked plan. Hover a mark for its configuration.</p>");
        b.push_str(&interactive::zoomed_scatter(&cloud, &marks, cap));
        let _ = writeln!(b, "<p>The whole space:</p>");
    }
    b.push_str(&interactive::full_scatter(&cloud, &marks, cap));
    b.push_str(&interactive::legend(charts::SCATTER_LEGEND));
    let _ = writeln!(b, "<p class=\"note\">{} valid configurations (shaded by density; step times above 4x the best are clipped). The front is the fastest plan at or below each memory level.</p>", pts.len());
    section(&mut h, "space", b);

    // 4. Stacked bars.
    let mut b = charts::stacked_bars(&tops);
    let _ = writeln!(
        b,
        "<div class=\"scroll\"><table><thead><tr><th>#</th>{}<th>step</th></tr></thead><tbody>",
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
    let _ = writeln!(b, "</tbody></table></div><p class=\"note\">Communication is the part not hidden behind compute; \"other\" is the optimizer step and the slowdown of compute that shares the GPU with overlapped communication.</p>");
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
        let _ = writeln!(b, "<p>Best plan with one dimension held at each value it can take (step times with the schedule simulated, as for the ranked plans above), over the best plan:</p><div id=\"sensitivity\">");
        let mut dims: Vec<&str> = Vec::new();
        for s in input.sensitivity {
            if !dims.contains(&s.dimension) {
                dims.push(s.dimension);
            }
        }
        let delta = |s: &Sensitivity| s.step_secs / best_step - 1.0;
        let scale = input
            .sensitivity
            .iter()
            .map(delta)
            .filter(|d| d.is_finite())
            .fold(0.0, f64::max)
            .min(1.0);
        for d in &dims {
            let mut held: Vec<&Sensitivity> = input
                .sensitivity
                .iter()
                .filter(|s| s.dimension == *d)
                .collect();
            // Numbers in numeric order; names (schedules, recomputation) as searched.
            if held.iter().all(|s| s.value.parse::<f64>().is_ok()) {
                held.sort_by(|a, b| {
                    let x: f64 = a.value.parse().unwrap_or(0.0);
                    let y: f64 = b.value.parse().unwrap_or(0.0);
                    x.total_cmp(&y)
                });
            }
            let rows: Vec<SensRow> = held
                .into_iter()
                .map(|s| SensRow {
                    value: s.value.clone(),
                    delta: delta(s),
                    tip: format!(
                        "{} = {}: best step {} ({:+.1}%), {}",
                        d,
                        s.value,
                        secs(s.step_secs),
                        100.0 * delta(s),
                        describe(&s.config)
                    ),
                })
                .collect();
            b.push_str(&interactive::sensitivity_multiple(d, &rows, scale));
        }
        let _ = writeln!(b, "</div><details><summary>The same as a table ({} rows)</summary><div class=\"scroll\"><table class=\"sortable\"><thead><tr><th class=\"l\" data-key=\"dim\">dimension</th><th data-key=\"value\">value</th><th data-key=\"step\">best step</th><th data-key=\"delta\">vs best</th><th class=\"l\">that plan</th></tr></thead><tbody>", input.sensitivity.len());
        let mut sorted: Vec<&Sensitivity> = input.sensitivity.iter().collect();
        sorted.sort_by(|a, b| {
            let da = dims.iter().position(|d| *d == a.dimension);
            let db = dims.iter().position(|d| *d == b.dimension);
            da.cmp(&db).then(a.step_secs.total_cmp(&b.step_secs))
        });
        for s in &sorted {
            let _ = writeln!(
                b,
                "<tr><td class=\"l\">{}</td><td>{}</td><td data-v=\"{}\">{}</td><td data-v=\"{}\">{:+.1}%</td><td class=\"l\">{}</td></tr>",
                s.dimension,
                esc(&s.value),
                s.step_secs,
                secs(s.step_secs),
                delta(s),
                100.0 * delta(s),
                esc(&describe(&s.config))
            );
        }
        let _ = writeln!(b, "</tbody></table></div></details>");
    }
    section(&mut h, "others", b);

    // 8. Launch configuration, for the plan's own target.
    let b = match &input.launch {
        Ok(args) => format!(
            "<p>For {} (<code>sextant export plan.json --to {}</code>):</p>\n<pre>{}</pre>\n",
            esc(input.launch_for),
            esc(input.launch_for),
            esc(args)
        ),
        Err(why) => format!("<p class=\"note\">{}</p>\n", esc(&why.0)),
    };
    section(&mut h, "launch", b);

    // 9. Measured.
    let b = if input.measured.is_empty() {
        "<p class=\"note\">No measured run is attached to this plan. Run the plan with the executor (`sextant exec plan.json --out run.json`) and give the run to `sextant report plan.json --run run.json -o report.html`: this section then compares every component.</p>\n".to_string()
    } else {
        let mut b = format!(
            "<p>Measured on {}: each component's predicted time over its measured time, per step, on the slowest rank (as <code>sextant compare</code> prints it).</p>\n",
            esc(input.measured_on)
        );
        let series: [(&str, interactive::Rgb); 2] =
            [("predicted", (70, 110, 180)), ("measured", (230, 140, 40))];
        b.push_str(&interactive::paired_bars(
            "measured-chart",
            &series,
            &input
                .measured
                .iter()
                .filter(|r| r.component != "step")
                .map(|r| (r.component.clone(), [r.predicted_secs, r.measured_secs]))
                .collect::<Vec<_>>(),
            "seconds per step",
            &secs,
        ));
        b.push_str(&interactive::legend(&series));
        b.push_str("<div class=\"scroll\"><table class=\"sortable\"><thead><tr><th class=\"l\" data-key=\"component\">component</th><th data-key=\"predicted\">predicted</th><th data-key=\"measured\">measured</th><th data-key=\"ratio\">predicted / measured</th></tr></thead><tbody>\n");
        for (i, r) in input.measured.iter().enumerate() {
            let ratio = if r.measured_secs > 0.0 && r.predicted_secs > 0.0 {
                Some(r.predicted_secs / r.measured_secs)
            } else {
                None
            };
            let _ = writeln!(
                b,
                "<tr{}><td class=\"l\" data-v=\"{i}\">{}</td><td data-v=\"{}\">{}</td><td data-v=\"{}\">{}</td><td data-v=\"{}\">{}</td></tr>",
                if r.component == "step" { " class=\"best\"" } else { "" },
                esc(&r.component),
                r.predicted_secs,
                secs(r.predicted_secs),
                r.measured_secs,
                secs(r.measured_secs),
                ratio.unwrap_or(f64::NAN),
                ratio.map_or("-".to_string(), |x| format!("{x:.2}x"))
            );
        }
        b.push_str("</tbody></table></div>\n");
        b
    };
    section(&mut h, "measured", b);

    let _ = write!(h, "<script>{SCRIPT}</script>\n</body>\n</html>\n");
    h
}
