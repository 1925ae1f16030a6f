//! The report's charts, drawn by plotters into SVG strings.

use plotters::prelude::*;
use sextant_planner::config::ParallelConfig;
use sextant_planner::cost::{CommKind, Estimate};
use sextant_planner::hardware::GIB;
use sextant_planner::schedule::{simulate_schedule, Pass, PassCosts, Schedule, Task};
use sextant_planner::search::Point;

/// Most schedule passes drawn in the timeline (keeps the file small).
const MAX_GANTT_TASKS: u64 = 1600;
/// Grid of the scatter plot: points in one cell are drawn once.
const SCATTER_BINS: (usize, usize) = (110, 70);

pub const PALETTE: &[(&str, RGBColor)] = &[
    ("compute", RGBColor(70, 110, 180)),
    ("recompute", RGBColor(140, 170, 220)),
    ("TP", RGBColor(230, 140, 40)),
    ("CP", RGBColor(200, 90, 160)),
    ("EP", RGBColor(150, 90, 60)),
    ("PP", RGBColor(120, 120, 120)),
    ("DP", RGBColor(60, 160, 90)),
    ("bubble", RGBColor(220, 60, 60)),
    ("other", RGBColor(190, 190, 120)),
];

/// Plotters writes a standalone SVG; inline SVG in HTML needs no namespace.
fn inline(svg: String) -> String {
    svg.replace(" xmlns=\"http://www.w3.org/2000/svg\"", "")
}

type Draw<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn render(size: (u32, u32), f: impl FnOnce(&Draw) -> Result<(), String>) -> String {
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, size).into_drawing_area();
        let ok = root
            .fill(&WHITE)
            .map_err(|e| e.to_string())
            .and_then(|_| f(&root))
            .and_then(|_| root.present().map_err(|e| e.to_string()));
        if let Err(e) = ok {
            drop(root);
            return format!("<p class=\"note\">chart could not be drawn: {e}</p>");
        }
    }
    inline(s)
}

fn err<E: std::fmt::Debug>(e: E) -> String {
    format!("{e:?}")
}

/// Step time against peak memory for every valid configuration, with the Pareto
/// front, the top plans and the HBM capacity.
pub fn scatter(points: &[Point], top: &[&Estimate], capacity_gib: f64) -> String {
    let best = top.first().map(|e| e.step_secs).unwrap_or(1.0);
    let y_max = points
        .iter()
        .map(|p| p.step_secs)
        .fold(best, f64::max)
        .min(4.0 * best)
        * 1.05;
    let y_min = points.iter().map(|p| p.step_secs).fold(best, f64::min) * 0.95;
    let x_max = capacity_gib * 1.08;
    // Bin the cloud.
    let (bx, by) = SCATTER_BINS;
    let mut cells = vec![0u32; bx * by];
    for p in points {
        if p.step_secs > y_max || p.peak_gib > x_max {
            continue;
        }
        let i = ((p.peak_gib / x_max) * bx as f64).clamp(0.0, bx as f64 - 1.0) as usize;
        let j = (((p.step_secs - y_min) / (y_max - y_min)) * by as f64).clamp(0.0, by as f64 - 1.0)
            as usize;
        cells[j * bx + i] += 1;
    }
    // Pareto front: fastest plan at or below each memory level.
    let mut sorted: Vec<&Point> = points.iter().collect();
    sorted.sort_by(|a, b| a.peak_gib.total_cmp(&b.peak_gib));
    let mut front = Vec::new();
    let mut fastest = f64::INFINITY;
    for p in sorted {
        if p.step_secs < fastest {
            fastest = p.step_secs;
            front.push((p.peak_gib, p.step_secs.min(y_max)));
        }
    }
    render((900, 460), |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..x_max, y_min..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("peak memory per GPU (GiB)")
            .y_desc("step time (s)")
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        let cw = x_max / bx as f64;
        let ch = (y_max - y_min) / by as f64;
        let max_count = cells.iter().copied().max().unwrap_or(1).max(1) as f64;
        chart
            .draw_series(
                cells
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(k, &n)| {
                        let (i, j) = (k % bx, k / bx);
                        let x = i as f64 * cw;
                        let y = y_min + j as f64 * ch;
                        let shade = 0.25 + 0.75 * (n as f64 / max_count).sqrt();
                        Rectangle::new(
                            [(x, y), (x + cw, y + ch)],
                            RGBColor(90, 120, 170).mix(shade).filled(),
                        )
                    }),
            )
            .map_err(err)?
            .label("valid configurations")
            .legend(|(x, y)| {
                Rectangle::new(
                    [(x, y - 4), (x + 8, y + 4)],
                    RGBColor(90, 120, 170).filled(),
                )
            });
        chart
            .draw_series(LineSeries::new(
                front.clone(),
                ShapeStyle::from(&BLACK).stroke_width(2),
            ))
            .map_err(err)?
            .label("Pareto front")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK.stroke_width(2)));
        chart
            .draw_series(LineSeries::new(
                vec![(capacity_gib, y_min), (capacity_gib, y_max)],
                ShapeStyle::from(&RED).stroke_width(2),
            ))
            .map_err(err)?
            .label("HBM capacity")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], RED.stroke_width(2)));
        chart
            .draw_series(top.iter().enumerate().map(|(i, e)| {
                let pt = (e.memory.total / GIB, e.step_secs.min(y_max));
                EmptyElement::at(pt)
                    + Circle::new((0, 0), 5, RGBColor(230, 140, 40).filled())
                    + Text::new(format!("{}", i + 1), (6, -12), ("sans-serif", 12))
            }))
            .map_err(err)?
            .label("top plans")
            .legend(|(x, y)| Circle::new((x + 4, y), 4, RGBColor(230, 140, 40).filled()));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        Ok(())
    })
}

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
        ("other", e.time.optimizer + e.time.overlap_slowdown),
    ]
}

/// One stacked bar per plan, with its error band as an error bar.
pub fn stacked_bars(plans: &[&Estimate]) -> String {
    let y_max = plans
        .iter()
        .map(|e| {
            e.band
                .as_ref()
                .map(|b| b.high_secs)
                .unwrap_or(e.step_secs)
                .max(e.step_secs)
        })
        .fold(0.0, f64::max)
        * 1.1;
    render((900, 420), |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..plans.len() as f64 + 2.8, 0f64..y_max.max(1e-9))
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("plan")
            .y_desc("seconds per step")
            .x_labels(plans.len() + 3)
            .x_label_formatter(&|x| {
                if x.fract().abs() < 1e-9 && *x >= 1.0 && (*x as usize) <= plans.len() {
                    format!("#{}", *x as usize)
                } else {
                    String::new()
                }
            })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for (name, col) in PALETTE {
            let mut bars = Vec::new();
            for (i, e) in plans.iter().enumerate() {
                let parts = components(e);
                let below: f64 = parts
                    .iter()
                    .take_while(|(n, _)| n != name)
                    .map(|(_, v)| v)
                    .sum();
                let v = parts
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, v)| *v)
                    .unwrap_or(0.0);
                if v > 0.0 {
                    let x = i as f64 + 1.0;
                    bars.push(Rectangle::new(
                        [(x - 0.35, below), (x + 0.35, below + v)],
                        col.filled(),
                    ));
                }
            }
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(*name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 8, y + 4)], col.filled()));
        }
        let whiskers: Vec<PathElement<(f64, f64)>> = plans
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                e.band
                    .as_ref()
                    .map(|b| (i as f64 + 1.0, b.low_secs, b.high_secs))
            })
            .flat_map(|(x, lo, hi)| {
                vec![
                    PathElement::new(vec![(x, lo), (x, hi)], BLACK.stroke_width(2)),
                    PathElement::new(vec![(x - 0.12, lo), (x + 0.12, lo)], BLACK.stroke_width(2)),
                    PathElement::new(vec![(x - 0.12, hi), (x + 0.12, hi)], BLACK.stroke_width(2)),
                ]
            })
            .collect();
        chart
            .draw_series(whiskers)
            .map_err(err)?
            .label("error band")
            .legend(|(x, y)| {
                PathElement::new(vec![(x + 4, y - 5), (x + 4, y + 5)], BLACK.stroke_width(2))
            });
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        Ok(())
    })
}

/// Memory per pipeline stage, stacked by component, against capacity.
pub fn stage_memory(e: &Estimate, capacity_gib: f64) -> String {
    let parts = |m: &sextant_planner::memory::StageMemory| {
        [
            ("weights", m.weights, RGBColor(70, 110, 180)),
            ("gradients", m.gradients, RGBColor(60, 160, 90)),
            ("optimizer", m.optimizer, RGBColor(230, 140, 40)),
            ("activations", m.activations, RGBColor(200, 90, 160)),
            (
                "other (logits, buffers, fragmentation, reserve)",
                m.logits + m.buffers + m.fragmentation + m.reserve,
                RGBColor(150, 150, 150),
            ),
        ]
    };
    let n = e.stages.len();
    let y_max = e
        .stages
        .iter()
        .map(|s| s.memory.total / GIB)
        .fold(capacity_gib, f64::max)
        * 1.6;
    render((900, 400), |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(56)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, 0f64..y_max)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("pipeline stage")
            .y_desc("GiB per GPU")
            .x_labels(n.min(16))
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-6 {
                    format!("{}", x.round() as i64)
                } else {
                    String::new()
                }
            })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        for k in 0..5 {
            let (name, _, col) = parts(&e.stages[0].memory)[k];
            let bars: Vec<_> = e
                .stages
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let p = parts(&s.memory);
                    let below: f64 = p[..k].iter().map(|x| x.1).sum::<f64>() / GIB;
                    let x = i as f64;
                    Rectangle::new(
                        [(x - 0.4, below), (x + 0.4, below + p[k].1 / GIB)],
                        col.filled(),
                    )
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 4), (x + 8, y + 4)], col.filled()));
        }
        chart
            .draw_series(LineSeries::new(
                vec![(-0.5, capacity_gib), (n as f64 - 0.5, capacity_gib)],
                ShapeStyle::from(&RED).stroke_width(2),
            ))
            .map_err(err)?
            .label("HBM capacity")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], RED.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        Ok(())
    })
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
        format!("{} schedule, {shown} of {m} micro-batches shown (the steady state repeats); {passes}; {pp} stages x {chunks} chunks.", schedule.name())
    } else {
        format!(
            "{} schedule, all {m} micro-batches; {passes}; {pp} stages x {chunks} chunks.",
            schedule.name()
        )
    };
    let svg = render((900, (60 + 22 * pp.min(64)) as u32 + 40), |root| {
        let mut chart = ChartBuilder::on(root)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..span, -0.5f64..pp as f64 - 0.5)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc("pipeline rank")
            .y_labels(pp.min(16) as usize)
            .y_label_formatter(&|y| {
                if (y - y.round()).abs() < 1e-6 {
                    format!("{}", y.round() as i64)
                } else {
                    String::new()
                }
            })
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
        let rect = |t: &Task| {
            // Alternate chunks are lighter, so interleaving is visible.
            let shade = if t.chunk.is_multiple_of(2) { 1.0 } else { 0.7 };
            let col = match t.pass {
                Pass::Forward => RGBColor(70, 110, 180).mix(shade),
                Pass::Backward => RGBColor(60, 160, 90).mix(shade),
                Pass::Weight => RGBColor(200, 170, 60).mix(shade),
            };
            let y = t.rank as f64;
            Rectangle::new([(t.start, y - 0.4), (t.end, y + 0.4)], col.filled())
        };
        chart.draw_series(tasks.iter().map(rect)).map_err(err)?;
        Ok(())
    });
    (svg, caption)
}
