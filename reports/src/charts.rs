//! What the report's charts show: the step-time components, the stage memory and
//! the simulated schedule, handed to the SVG drawing in `interactive`.

use crate::interactive::{self, legend, secs, Bar, Rgb, Stack};
use sextant_planner::config::ParallelConfig;
use sextant_planner::cost::{CommKind, Estimate};
use sextant_planner::hardware::GIB;
use sextant_planner::schedule::{simulate_schedule, Pass, PassCosts, Schedule};

/// Most schedule passes drawn in the timeline (keeps the file small).
const MAX_GANTT_TASKS: u64 = 1600;

pub const PALETTE: &[(&str, Rgb)] = &[
    ("compute", (70, 110, 180)),
    ("recompute", (140, 170, 220)),
    ("TP", (230, 140, 40)),
    ("CP", (200, 90, 160)),
    ("EP", (150, 90, 60)),
    ("PP", (120, 120, 120)),
    ("DP", (60, 160, 90)),
    ("bubble", (220, 60, 60)),
    ("other", (190, 190, 120)),
];

/// The scatter's legend, drawn as HTML below it.
pub const SCATTER_LEGEND: &[(&str, Rgb)] = &[
    ("valid configurations (darker: more)", (90, 120, 170)),
    ("Pareto front", (0, 0, 0)),
    ("HBM plans may use", (255, 0, 0)),
    ("ranked plans", (230, 140, 40)),
];

/// The step-time components of one plan, in drawing order.
pub fn components(e: &Estimate) -> Vec<(&'static str, f64)> {
    let exposed = |kinds: &[CommKind]| {
        e.comm
            .iter()
            .filter(|t| kinds.contains(&t.kind))
            .map(|t| t.exposed_secs)
            .sum::<f64>()
    };
    vec![
        ("compute", e.time.compute.total()),
        ("recompute", e.time.recompute),
        ("TP", exposed(&[CommKind::Tp])),
        ("CP", exposed(&[CommKind::Cp])),
        ("EP", exposed(&[CommKind::Ep, CommKind::Etp])),
        ("PP", exposed(&[CommKind::Pp])),
        (
            "DP",
            exposed(&[
                CommKind::DpGrad,
                CommKind::DpParam,
                CommKind::EdpGrad,
                CommKind::EdpParam,
            ]),
        ),
        ("bubble", e.time.bubble),
        (
            "other",
            e.time.optimizer + e.time.overlap_slowdown + e.time.host_wait,
        ),
    ]
}

/// One stacked bar per plan, with its error band as an error bar.
pub fn stacked_bars(plans: &[&Estimate]) -> String {
    let series: Vec<(&str, Rgb)> = PALETTE.to_vec();
    let stacks: Vec<Stack> = plans
        .iter()
        .enumerate()
        .map(|(i, e)| Stack {
            label: format!("#{}", i + 1),
            tip: format!("plan #{} (step {})", i + 1, secs(e.step_secs)),
            values: components(e).into_iter().map(|(_, v)| v).collect(),
            whisker: e.band.as_ref().map(|b| (b.low_secs, b.high_secs)),
        })
        .collect();
    let mut s =
        interactive::stacked_bars("bars", &series, &stacks, None, "seconds per step", &secs);
    s.push_str(&legend(&series));
    s
}

/// Memory per pipeline stage, stacked by component, against the HBM plans may use.
pub fn stage_memory(e: &Estimate, capacity_gib: f64) -> String {
    let series: [(&str, Rgb); 5] = [
        ("weights", (70, 110, 180)),
        ("gradients", (60, 160, 90)),
        ("optimizer", (230, 140, 40)),
        ("activations", (200, 90, 160)),
        (
            "other (logits, buffers, fragmentation, reserve)",
            (150, 150, 150),
        ),
    ];
    let stacks: Vec<Stack> = e
        .stages
        .iter()
        .map(|st| {
            let m = &st.memory;
            Stack {
                label: st.stage.to_string(),
                tip: format!("stage {} ({:.1} GiB)", st.stage, m.total / GIB),
                values: vec![
                    m.weights / GIB,
                    m.gradients / GIB,
                    m.optimizer / GIB,
                    m.activations / GIB,
                    (m.logits + m.buffers + m.fragmentation + m.reserve) / GIB,
                ],
                whisker: None,
            }
        })
        .collect();
    let mut s = interactive::stacked_bars(
        "stage-memory",
        &series,
        &stacks,
        Some((capacity_gib, "HBM plans may use")),
        "GiB per GPU",
        &|v| format!("{v:.2} GiB"),
    );
    let mut items = series.to_vec();
    items.push(("HBM plans may use", (221, 34, 34)));
    s.push_str(&legend(&items));
    s
}

/// The pipeline schedule of one step (the first micro-batches when the step has
/// too many to draw), under the plan's schedule. Returns the SVG and a caption.
pub fn gantt(e: &Estimate, cfg: &ParallelConfig, p2p_secs: f64) -> (String, String) {
    let schedule = cfg.schedule;
    let pp = cfg.pp;
    let vpp = if schedule == Schedule::Interleaved {
        cfg.vpp
    } else {
        1
    };
    let split = schedule.splits_weight_grad();
    let m = e.micro_batches;
    let per_mb = ((if split { 3 } else { 2 }) * pp * vpp).max(1);
    let mut shown = m.min((MAX_GANTT_TASKS / per_mb).max(1));
    if vpp > 1 {
        shown = (shown / pp).max(1) * pp;
    }
    if schedule == Schedule::DualPipe {
        // DualPipe needs an even count of at least 2 x pp.
        shown = (shown.max(2 * pp) / 2 * 2).min(m);
    }
    let v = vpp as f64;
    let weight: Vec<f64> = e
        .stages
        .iter()
        .map(|s| {
            if split {
                s.weight_grad_secs.clamp(0.0, s.secs_per_micro_batch / 3.0) / v
            } else {
                0.0
            }
        })
        .collect();
    let costs = PassCosts {
        forward: e
            .stages
            .iter()
            .map(|s| s.secs_per_micro_batch / 3.0 / v)
            .collect(),
        backward: e
            .stages
            .iter()
            .zip(&weight)
            .map(|(s, w)| 2.0 * s.secs_per_micro_batch / 3.0 / v - w)
            .collect(),
        weight,
    };
    let Some(tasks) =
        simulate_schedule(schedule, pp, vpp, shown, &costs, p2p_secs).map(|t| t.tasks)
    else {
        return (
            String::new(),
            "The schedule could not be simulated for this plan.".into(),
        );
    };
    // Interleaving needs at least `pp` micro-batches simulated, which for deep
    // virtual pipelines is thousands of passes: draw those that start before the
    // MAX_GANTT_TASKS-th start (the warm-up and the start of the steady state).
    let full_span = tasks.iter().map(|t| t.end).fold(0.0, f64::max).max(1e-9);
    let mut tasks = tasks;
    let cut = if tasks.len() as u64 > MAX_GANTT_TASKS {
        let mut starts: Vec<f64> = tasks.iter().map(|t| t.start).collect();
        starts.sort_by(f64::total_cmp);
        let cutoff = starts[MAX_GANTT_TASKS as usize];
        tasks.retain(|t| t.start < cutoff);
        Some(cutoff)
    } else {
        None
    };
    let span = tasks.iter().map(|t| t.end).fold(0.0, f64::max).max(1e-9);
    let passes = if split {
        "forward passes blue, backward green, weight gradients yellow"
    } else {
        "forward passes blue, backward green"
    };
    let chunks = if schedule == Schedule::DualPipe {
        "2 (the two directions)".to_string()
    } else {
        vpp.to_string()
    };
    let caption = if shown < m {
        format!("{} schedule, {shown} of {m} micro-batches shown (the steady state repeats); {passes}; {pp} stages x {chunks} chunks; numbers are micro-batches.", schedule.name())
    } else {
        format!(
            "{} schedule, all {m} micro-batches; {passes}; {pp} stages x {chunks} chunks; numbers are micro-batches.",
            schedule.name()
        )
    };
    let caption = match cut {
        Some(c) => format!(
            "{caption} The passes that start in the first {} of the {} these micro-batches take are drawn.",
            secs(c),
            secs(full_span)
        ),
        None => caption,
    };
    let bars: Vec<Bar> = tasks
        .iter()
        .filter(|t| t.rank < 64)
        .map(|t| {
            // Alternate chunks are lighter, so interleaving is visible.
            let light = usize::from(!t.chunk.is_multiple_of(2));
            let (name, base) = match t.pass {
                Pass::Forward => ("forward", 0),
                Pass::Backward => ("backward", 2),
                Pass::Weight => ("weight gradient", 4),
            };
            let c = base + light;
            Bar {
                rank: t.rank,
                start: t.start,
                end: t.end,
                color: c,
                label: t.micro_batch.to_string(),
                tip: format!(
                    "rank {}, micro-batch {}, chunk {}: {name} {} to {}",
                    t.rank,
                    t.micro_batch,
                    t.chunk,
                    secs(t.start),
                    secs(t.end)
                ),
            }
        })
        .collect();
    let colors: [Rgb; 6] = [
        (70, 110, 180),
        (120, 150, 205),
        (60, 160, 90),
        (110, 190, 130),
        (200, 170, 60),
        (220, 195, 110),
    ];
    let svg = interactive::timeline(&bars, &colors, pp.min(64), span);
    let caption = if pp > 64 {
        format!("{caption} Pipeline ranks 0 to 63 of {pp} drawn.")
    } else {
        caption
    };
    (svg, caption)
}
