//! The report's hand-drawn SVG charts (each mark carries a `data-tip` tooltip and
//! the report's script drives them), and that script.
//!
//! Drawn by hand because every mark needs attributes (`data-tip`, `data-rank`,
//! the timeline's `data-t0`/`data-t1`) and the labels of the zoomed scatter need
//! placing so that no two overlap; plotters, which drew the first report, writes
//! neither.

use std::fmt::Write;

use crate::esc;

/// An `rgb()` colour.
pub type Rgb = (u8, u8, u8);

fn rgb(c: Rgb) -> String {
    format!("rgb({},{},{})", c.0, c.1, c.2)
}

/// A step time: seconds from 1 s up, milliseconds below; never "-0.0".
pub fn secs(x: f64) -> String {
    let x = if x.abs() < 5e-5 { 0.0 } else { x };
    if x.abs() >= 1.0 {
        format!("{x:.3} s")
    } else {
        format!("{:.1} ms", x * 1e3)
    }
}

/// Round tick values covering `[lo, hi]`: about five of them, on 1-2-5 steps.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|k| k * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + 1e-9 * span && out.len() < 12 {
        out.push(if t.abs() < 1e-12 * span { 0.0 } else { t });
        t += step;
    }
    out
}

fn tick_label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A legend as HTML below a chart (so it never covers data).
pub fn legend(items: &[(&str, Rgb)]) -> String {
    let mut s = String::from("<div class=\"legend\">");
    for (name, c) in items {
        let _ = write!(
            s,
            "<span><i style=\"background:{}\"></i>{}</span>",
            rgb(*c),
            esc(name)
        );
    }
    s.push_str("</div>\n");
    s
}

/// The opening of a bar chart's SVG: background, horizontal grid lines with
/// their values from 0 to `y_max`, and the rotated axis title.
fn bar_frame(
    id: &str,
    (w, h): (f64, f64),
    (left, right, top, bottom): (f64, f64, f64, f64),
    y_max: f64,
    y_title: &str,
) -> String {
    let ph = h - top - bottom;
    let mut s = format!(
        "<svg id=\"{id}\" class=\"chart\" viewBox=\"0 0 {w} {h}\" role=\"img\"><rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#fff\"/>"
    );
    for t in ticks(0.0, y_max) {
        let yy = top + ph * (1.0 - t / y_max);
        let _ = write!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"end\">{}</text>",
            w - right,
            left - 6.0,
            yy + 4.0,
            tick_label(t)
        );
    }
    let _ = write!(
        s,
        "<text x=\"14\" y=\"{:.1}\" class=\"axis\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">{}</text>",
        top + ph / 2.0,
        top + ph / 2.0,
        esc(y_title)
    );
    s
}

/// One bar of a stacked-bar chart.
pub struct Stack {
    /// Under the bar.
    pub label: String,
    /// Prefix of each segment's tooltip (e.g. the plan it belongs to).
    pub tip: String,
    /// Values in the order of the chart's series.
    pub values: Vec<f64>,
    /// An error bar (low, high), in the chart's unit.
    pub whisker: Option<(f64, f64)>,
}

/// A stacked-bar chart: `series` (name, colour) stacked in order, one bar per
/// stack, an optional horizontal line (value, name) such as a capacity; values are
/// shown in tooltips through `fmt`.
pub fn stacked_bars(
    id: &str,
    series: &[(&str, Rgb)],
    stacks: &[Stack],
    line: Option<(f64, &str)>,
    y_title: &str,
    fmt: &dyn Fn(f64) -> String,
) -> String {
    let (w, h) = (900.0, 380.0);
    let (left, right, top, bottom) = (70.0, 12.0, 14.0, 44.0);
    let pw = w - left - right;
    let ph = h - top - bottom;
    let y_max = stacks
        .iter()
        .map(|s| {
            let total: f64 = s.values.iter().map(|v| v.max(0.0)).sum();
            total.max(s.whisker.map_or(0.0, |w| w.1))
        })
        .fold(line.map_or(0.0, |l| l.0), f64::max)
        .max(1e-12)
        * 1.08;
    let y = |v: f64| top + ph * (1.0 - v / y_max);
    let mut s = bar_frame(id, (w, h), (left, right, top, bottom), y_max, y_title);
    let n = stacks.len().max(1) as f64;
    let band = pw / n;
    let bw = (band * 0.7).min(60.0);
    for (i, st) in stacks.iter().enumerate() {
        let cx = left + band * (i as f64 + 0.5);
        let mut below = 0.0;
        for ((name, c), v) in series.iter().zip(&st.values) {
            if *v <= 0.0 {
                continue;
            }
            let (y0, y1) = (y(below + v), y(below));
            let _ = write!(
                s,
                "<rect x=\"{:.1}\" y=\"{y0:.1}\" width=\"{bw:.1}\" height=\"{:.2}\" fill=\"{}\" data-tip=\"{}\"/>",
                cx - bw / 2.0,
                (y1 - y0).max(0.3),
                rgb(*c),
                esc(&format!("{}: {name} {}", st.tip, fmt(*v)))
            );
            below += v;
        }
        if let Some((lo, hi)) = st.whisker {
            let (a, b) = (y(hi), y(lo));
            let _ = write!(
                s,
                "<path d=\"M{cx:.1} {a:.1}V{b:.1}M{:.1} {a:.1}h10M{:.1} {b:.1}h10\" stroke=\"#000\" stroke-width=\"2\" fill=\"none\" data-tip=\"{}\"/>",
                cx - 5.0,
                cx - 5.0,
                esc(&format!("{}: band {} to {}", st.tip, fmt(lo), fmt(hi)))
            );
        }
        let _ = write!(
            s,
            "<text x=\"{cx:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
            h - bottom + 16.0,
            esc(&st.label)
        );
    }
    if let Some((v, name)) = line {
        let yy = y(v);
        let _ = write!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#d22\" stroke-width=\"2\" data-tip=\"{}\"/>",
            w - right,
            esc(&format!("{name}: {}", fmt(v)))
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Bars side by side per category (e.g. predicted and measured per component),
/// each with a tooltip.
pub fn paired_bars(
    id: &str,
    series: &[(&str, Rgb); 2],
    rows: &[(String, [f64; 2])],
    y_title: &str,
    fmt: &dyn Fn(f64) -> String,
) -> String {
    let (w, h) = (900.0, 380.0);
    let (left, right, top, bottom) = (70.0, 12.0, 14.0, 84.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let y_max = rows.iter().flat_map(|r| r.1).fold(0.0, f64::max).max(1e-12) * 1.08;
    let y = |v: f64| top + ph * (1.0 - v / y_max);
    let mut s = bar_frame(id, (w, h), (left, right, top, bottom), y_max, y_title);
    let band = pw / rows.len().max(1) as f64;
    let bw = (band * 0.35).min(30.0);
    for (i, (name, v)) in rows.iter().enumerate() {
        let cx = left + band * (i as f64 + 0.5);
        for (k, ((sname, c), val)) in series.iter().zip(v).enumerate() {
            let x = cx - bw + k as f64 * bw;
            let top_y = y(val.max(0.0));
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{top_y:.1}\" width=\"{bw:.1}\" height=\"{:.2}\" fill=\"{}\" data-tip=\"{}\"/>",
                (y(0.0) - top_y).max(0.3),
                rgb(*c),
                esc(&format!("{name}: {sname} {}", fmt(*val)))
            );
        }
        let ly = h - bottom + 14.0;
        let _ = write!(
            s,
            "<text x=\"{cx:.1}\" y=\"{ly:.1}\" class=\"tick\" text-anchor=\"end\" transform=\"rotate(-35 {cx:.1} {ly:.1})\">{}</text>",
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A configuration in the zoomed scatter: one of the ranked plans.
pub struct PlanMark {
    pub rank: usize,
    pub step_secs: f64,
    pub peak_gib: f64,
    pub tip: String,
}

/// Axis-aligned box (x, y, w, h).
#[derive(Clone, Copy)]
struct Boxed(f64, f64, f64, f64);

impl Boxed {
    fn overlaps(&self, o: &Boxed, pad: f64) -> bool {
        self.0 < o.0 + o.2 + pad
            && o.0 < self.0 + self.2 + pad
            && self.1 < o.1 + o.3 + pad
            && o.1 < self.1 + self.3 + pad
    }
    fn inside(&self, area: &Boxed) -> bool {
        self.0 >= area.0
            && self.1 >= area.1
            && self.0 + self.2 <= area.0 + area.2
            && self.1 + self.3 <= area.1 + area.3
    }
}

/// Places each label box (width, height) near its anchor point without
/// overlapping another label, another anchor's marker or leaving `area`: the
/// first free spot on rings of growing radius in eight directions, else the first
/// free slot scanning the area's rows. Returns the boxes' top-left corners.
fn place_labels(anchors: &[(f64, f64)], sizes: &[(f64, f64)], area: Boxed) -> Vec<(f64, f64)> {
    let marker = 6.0;
    let markers: Vec<Boxed> = anchors
        .iter()
        .map(|&(x, y)| Boxed(x - marker, y - marker, 2.0 * marker, 2.0 * marker))
        .collect();
    let mut placed: Vec<Boxed> = Vec::new();
    let mut out = Vec::new();
    for (i, (&(ax, ay), &(lw, lh))) in anchors.iter().zip(sizes).enumerate() {
        let free = |b: &Boxed, placed: &[Boxed]| {
            b.inside(&area)
                && placed.iter().all(|p| !p.overlaps(b, 2.0))
                && markers
                    .iter()
                    .enumerate()
                    .all(|(j, m)| j == i || !m.overlaps(b, 0.0))
        };
        let mut found = None;
        'rings: for ring in 0..12 {
            let r = 7.0 + 12.0 * ring as f64;
            for (dx, dy) in [
                (r, -r - lh),
                (r, r),
                (-r - lw, -r - lh),
                (-r - lw, r),
                (r, -lh / 2.0),
                (-r - lw, -lh / 2.0),
                (-lw / 2.0, -r - lh),
                (-lw / 2.0, r),
            ] {
                let b = Boxed(ax + dx, ay + dy, lw, lh);
                if free(&b, &placed) {
                    found = Some(b);
                    break 'rings;
                }
            }
        }
        let b = found.unwrap_or_else(|| {
            // Scan the area row by row from the top right.
            let mut y = area.1;
            loop {
                let mut x = area.0 + area.2 - lw;
                while x >= area.0 {
                    let b = Boxed(x, y, lw, lh);
                    if free(&b, &placed) {
                        return b;
                    }
                    x -= lw + 4.0;
                }
                y += lh + 3.0;
                if y + lh > area.1 + area.3 {
                    // No room anywhere: below the area (the SVG is drawn taller).
                    let below = placed
                        .iter()
                        .map(|p| p.1 + p.3)
                        .fold(area.1 + area.3, f64::max);
                    return Boxed(area.0, below + 3.0, lw, lh);
                }
            }
        });
        placed.push(b);
        out.push((b.0, b.1));
    }
    out
}

/// The region of the scatter that matters: every configuration up to a little
/// above the slowest ranked plan, with the ranked plans labelled (labels placed so
/// that none overlap) and every cell of configurations carrying a tooltip.
pub fn zoomed_scatter(points: &[(f64, f64)], plans: &[PlanMark], capacity_gib: f64) -> String {
    let best = plans
        .iter()
        .map(|p| p.step_secs)
        .fold(f64::INFINITY, f64::min);
    if !best.is_finite() {
        return String::new();
    }
    let slowest = plans.iter().map(|p| p.step_secs).fold(best, f64::max);
    let y_hi = (slowest * 1.03).max(best * 1.05);
    let y_lo = points
        .iter()
        .map(|p| p.0)
        .chain(plans.iter().map(|p| p.step_secs))
        .fold(best, f64::min)
        * 0.995;
    let mems = points
        .iter()
        .filter(|p| p.0 <= y_hi && p.0 >= y_lo)
        .map(|p| p.1)
        .chain(plans.iter().map(|p| p.peak_gib));
    let (mut x_lo, mut x_hi) = mems.fold((f64::INFINITY, 0.0f64), |(a, b), m| (a.min(m), b.max(m)));
    if capacity_gib <= x_hi * 1.15 {
        x_hi = x_hi.max(capacity_gib);
    }
    let pad = ((x_hi - x_lo) * 0.06).max(0.5);
    x_lo = (x_lo - pad).max(0.0);
    x_hi += pad;
    scatter(
        "scatter-zoom",
        points,
        plans,
        capacity_gib,
        Region {
            x: (x_lo, x_hi),
            y: (y_lo, y_hi),
        },
        false,
    )
}

/// Every valid configuration: step time against peak memory up to 4x the best
/// step, shaded by how many fall in each cell, with the Pareto front (the fastest
/// configuration at or below each memory) and the ranked plans (unlabelled: the
/// zoomed scatter labels them).
pub fn full_scatter(points: &[(f64, f64)], plans: &[PlanMark], capacity_gib: f64) -> String {
    let best = plans
        .iter()
        .map(|p| p.step_secs)
        .chain(points.iter().map(|p| p.0))
        .fold(f64::INFINITY, f64::min);
    if !best.is_finite() {
        return String::new();
    }
    let y_hi = points
        .iter()
        .map(|p| p.0)
        .fold(best, f64::max)
        .min(4.0 * best)
        * 1.05;
    let x_hi = points
        .iter()
        .map(|p| p.1)
        .chain(plans.iter().map(|p| p.peak_gib))
        .fold(capacity_gib, f64::max)
        * 1.05;
    scatter(
        "scatter-all",
        points,
        plans,
        capacity_gib,
        Region {
            x: (0.0, x_hi),
            y: (best * 0.95, y_hi),
        },
        true,
    )
}

/// What a scatter shows: memory (GiB) and step time (s) ranges.
struct Region {
    x: (f64, f64),
    y: (f64, f64),
}

/// A scatter of `points` (step, GiB) in `region`, binned into cells that carry
/// their count and ranges as tooltips and are shaded by count; the ranked plans
/// as marks (the first ten labelled, placed so that no two labels overlap, unless
/// `front`, which draws the Pareto front instead of labels); the memory plans may
/// use as a line.
fn scatter(
    id: &str,
    points: &[(f64, f64)],
    plans: &[PlanMark],
    capacity_gib: f64,
    region: Region,
    front: bool,
) -> String {
    let Region {
        x: (x_lo, x_hi),
        y: (y_lo, y_hi),
    } = region;
    let inside: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|p| p.0 <= y_hi && p.0 >= y_lo && p.1 >= x_lo && p.1 <= x_hi)
        .collect();
    let (w, h) = (900.0, 420.0);
    let (left, right, top, bottom) = (70.0, 14.0, 14.0, 46.0);
    let (pw, ph) = (w - left - right, h - top - bottom);
    let sx = |m: f64| left + pw * (m - x_lo) / (x_hi - x_lo);
    let sy = |t: f64| top + ph * (1.0 - (t - y_lo) / (y_hi - y_lo));
    // Ranked plans in rank order; labels for the first ten.
    let labelled: Vec<&PlanMark> = if front {
        Vec::new()
    } else {
        plans.iter().take(10).collect()
    };
    let anchors: Vec<(f64, f64)> = labelled
        .iter()
        .map(|p| (sx(p.peak_gib), sy(p.step_secs)))
        .collect();
    let sizes: Vec<(f64, f64)> = labelled
        .iter()
        .map(|p| (10.0 + 7.0 * format!("#{}", p.rank).len() as f64, 16.0))
        .collect();
    let spots = place_labels(&anchors, &sizes, Boxed(left, top, pw, ph));
    let extra = spots
        .iter()
        .zip(&sizes)
        .map(|(s, z)| s.1 + z.1)
        .fold(h - bottom, f64::max)
        - (h - bottom);
    let hh = h + extra;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg id=\"{id}\" class=\"chart\" viewBox=\"0 0 {w} {hh}\" role=\"img\"><rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{hh}\" fill=\"#fff\"/>"
    );
    for t in ticks(y_lo, y_hi) {
        let yy = sy(t);
        let _ = write!(
            s,
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"end\">{}</text>",
            w - right,
            left - 6.0,
            yy + 4.0,
            tick_label(t)
        );
    }
    for t in ticks(x_lo, x_hi) {
        let xx = sx(t);
        let _ = write!(
            s,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{top}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{xx:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"middle\">{}</text>",
            h - bottom,
            h - bottom + 15.0,
            tick_label(t)
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" class=\"axis\" text-anchor=\"middle\">peak memory per GPU (GiB)</text><text x=\"14\" y=\"{:.1}\" class=\"axis\" transform=\"rotate(-90 14 {:.1})\" text-anchor=\"middle\">step time (s)</text>",
        left + pw / 2.0,
        h - bottom + 34.0,
        top + ph / 2.0,
        top + ph / 2.0
    );
    // The cloud, binned: one mark per cell, its count and ranges in the tooltip.
    const BX: usize = 90;
    const BY: usize = 45;
    let mut cells: Vec<(u32, f64, f64, f64, f64)> =
        vec![(0, f64::INFINITY, 0.0, f64::INFINITY, 0.0); BX * BY];
    for &(t, m) in &inside {
        if m < x_lo || m > x_hi {
            continue;
        }
        let i = (((m - x_lo) / (x_hi - x_lo)) * BX as f64).clamp(0.0, BX as f64 - 1.0) as usize;
        let j = (((t - y_lo) / (y_hi - y_lo)) * BY as f64).clamp(0.0, BY as f64 - 1.0) as usize;
        let c = &mut cells[j * BX + i];
        c.0 += 1;
        c.1 = c.1.min(t);
        c.2 = c.2.max(t);
        c.3 = c.3.min(m);
        c.4 = c.4.max(m);
    }
    let (cw, ch) = (pw / BX as f64, ph / BY as f64);
    let most = cells.iter().map(|c| c.0).max().unwrap_or(1).max(1) as f64;
    for (k, c) in cells.iter().enumerate() {
        if c.0 == 0 {
            continue;
        }
        let (i, j) = (k % BX, k / BX);
        let _ = write!(
            s,
            "<rect class=\"cell\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill-opacity=\"{:.2}\" data-tip=\"{}\"/>",
            left + i as f64 * cw,
            top + ph - (j as f64 + 1.0) * ch,
            cw,
            ch,
            0.25 + 0.75 * (c.0 as f64 / most).sqrt(),
            esc(&format!(
                "{} configuration{}: step {} to {}, {:.1} to {:.1} GiB",
                c.0,
                if c.0 == 1 { "" } else { "s" },
                secs(c.1),
                secs(c.2),
                c.3,
                c.4
            ))
        );
    }
    if front {
        // The fastest configuration at or below each memory level.
        let mut by_mem: Vec<(f64, f64)> = points.to_vec();
        by_mem.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut fastest = f64::INFINITY;
        let mut path = String::new();
        for (t, m) in by_mem {
            if t < fastest && m <= x_hi {
                fastest = t;
                let _ = write!(
                    path,
                    "{}{:.1} {:.1}",
                    if path.is_empty() { "M" } else { "L" },
                    sx(m),
                    sy(t.min(y_hi))
                );
            }
        }
        if !path.is_empty() {
            let _ = write!(
                s,
                "<path d=\"{path}\" fill=\"none\" stroke=\"#000\" stroke-width=\"2\" data-tip=\"Pareto front: the fastest configuration at or below each memory level\"/>"
            );
        }
    }
    if capacity_gib >= x_lo && capacity_gib <= x_hi {
        let xx = sx(capacity_gib);
        let _ = write!(
            s,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{top}\" y2=\"{}\" stroke=\"#d22\" stroke-width=\"2\" data-tip=\"{}\"/>",
            h - bottom,
            esc(&format!(
                "HBM plans may use: {capacity_gib:.1} GiB (less the allocator headroom)"
            ))
        );
    }
    // Leader lines, then markers, then labels (labels on top).
    for ((a, spot), size) in anchors.iter().zip(&spots).zip(&sizes) {
        let cx = spot.0 + size.0 / 2.0;
        let cy = spot.1 + size.1 / 2.0;
        let nx = a.0.clamp(spot.0, spot.0 + size.0);
        let ny = a.1.clamp(spot.1, spot.1 + size.1);
        if (nx - a.0).hypot(ny - a.1) > 9.0 {
            let _ = write!(
                s,
                "<line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{cx:.1}\" y2=\"{cy:.1}\" stroke=\"#999\"/>",
                a.0, a.1
            );
        }
    }
    for p in plans.iter().rev() {
        let _ = write!(
            s,
            "<circle class=\"plan\" data-rank=\"{}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" data-tip=\"{}\"/>",
            p.rank,
            sx(p.peak_gib),
            sy(p.step_secs),
            esc(&p.tip)
        );
    }
    for ((p, spot), size) in labelled.iter().zip(&spots).zip(&sizes) {
        let _ = write!(
            s,
            "<g class=\"plan-label\" data-rank=\"{}\" data-tip=\"{}\"><rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"3\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">#{}</text></g>",
            p.rank,
            esc(&p.tip),
            spot.0,
            spot.1,
            size.0,
            size.1,
            spot.0 + size.0 / 2.0,
            spot.1 + size.1 - 4.0,
            p.rank
        );
    }
    s.push_str("</svg>\n");
    s
}

/// One pass of the timeline.
pub struct Bar {
    pub rank: u64,
    pub start: f64,
    pub end: f64,
    /// Index into the timeline's colours.
    pub color: usize,
    /// Drawn inside the bar where it is wide enough (the micro-batch).
    pub label: String,
    pub tip: String,
}

/// The pipeline timeline: one row per pipeline rank, a bar per pass with its
/// micro-batch written inside where it fits. `#tl-zoom-in` / `#tl-zoom-out`
/// stretch the time axis (the script moves every mark by its `data-t0`/`data-t1`,
/// fractions of the span, so text keeps its size). Marks are kept small (a class
/// for the colour, one group per rank): a 405B plan draws thousands of passes.
pub fn timeline(bars: &[Bar], colors: &[Rgb], ranks: u64, span: f64) -> String {
    let w = 900.0;
    let (left, right, top, bottom) = (56.0, 12.0, 8.0, 40.0);
    let row = 22.0;
    let h = top + bottom + row * ranks as f64;
    let pw = w - left - right;
    let span = span.max(1e-12);
    let mut s = String::new();
    let _ = write!(
        s,
        "<div class=\"zoombar\"><button type=\"button\" id=\"tl-zoom-in\">zoom in</button> <button type=\"button\" id=\"tl-zoom-out\">zoom out</button></div>\n<div class=\"scroll\"><svg id=\"timeline\" class=\"chart zoomable\" viewBox=\"0 0 {w} {h}\" data-left=\"{left}\" data-pw=\"{pw}\" data-w=\"{w}\" role=\"img\"><style>"
    );
    for (i, c) in colors.iter().enumerate() {
        let _ = write!(s, "#timeline .p{i}{{fill:{}}}", rgb(*c));
    }
    let _ = write!(
        s,
        "</style><rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#fff\"/>"
    );
    for r in 0..ranks {
        let y = top + row * r as f64;
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"end\">rank {r}</text>",
            left - 6.0,
            y + row / 2.0 + 4.0
        );
    }
    let y_axis = top + row * ranks as f64;
    for t in ticks(0.0, span) {
        let f = t / span;
        let xx = left + pw * f;
        let _ = write!(
            s,
            "<text x=\"{xx:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"middle\" data-t0=\"{f:.5}\" data-t1=\"{f:.5}\">{}</text>",
            y_axis + 15.0,
            secs(t)
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" class=\"axis\" text-anchor=\"middle\">time in the step</text>",
        left + pw / 2.0,
        y_axis + 33.0
    );
    for r in 0..ranks {
        let _ = write!(
            s,
            "<g transform=\"translate(0,{:.1})\">",
            top + row * r as f64 + 2.0
        );
        let mut labels = String::new();
        for b in bars.iter().filter(|b| b.rank == r) {
            let (f0, f1) = (b.start / span, b.end / span);
            let x = left + pw * f0;
            let bw = (pw * (f1 - f0)).max(0.2);
            let _ = write!(
                s,
                "<rect class=\"p{}\" x=\"{x:.1}\" width=\"{bw:.2}\" height=\"{:.0}\" data-t0=\"{f0:.5}\" data-t1=\"{f1:.5}\" data-tip=\"{}\"/>",
                b.color,
                row - 4.0,
                esc(&b.tip)
            );
            let shown = bw >= 7.0 * b.label.len() as f64 + 4.0;
            let _ = write!(
                labels,
                "<text class=\"mb\" x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"middle\" data-t0=\"{f0:.5}\" data-t1=\"{f1:.5}\" data-len=\"{}\"{}>{}</text>",
                x + bw / 2.0,
                row - 9.0,
                b.label.len(),
                if shown { "" } else { " display=\"none\"" },
                esc(&b.label)
            );
        }
        s.push_str(&labels);
        s.push_str("</g>");
    }
    s.push_str("</svg></div>\n");
    s
}

/// One dimension's small multiple of the sensitivity: each value it can take, the
/// best plan's step time with the dimension held there, over the best overall.
pub struct SensRow {
    pub value: String,
    pub delta: f64,
    pub tip: String,
}

/// A small horizontal bar chart of `rows` (delta over the best, as a fraction),
/// bars scaled to `scale` (the largest delta over all dimensions, capped).
pub fn sensitivity_multiple(dimension: &str, rows: &[SensRow], scale: f64) -> String {
    let (w, row, top, lw) = (300.0, 16.0, 20.0, 78.0);
    let h = top + row * rows.len() as f64 + 4.0;
    let bar_w = w - lw - 58.0;
    let scale = scale.max(1e-6);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"sens chart\" viewBox=\"0 0 {w} {h}\" role=\"img\"><text x=\"2\" y=\"13\" class=\"axis\">{}</text>",
        esc(dimension)
    );
    for (i, r) in rows.iter().enumerate() {
        let y = top + row * i as f64;
        let len = (r.delta.max(0.0) / scale).min(1.0) * bar_w;
        let color = if r.delta <= 1e-9 {
            "#3a7d44"
        } else {
            "#c8803a"
        };
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\" text-anchor=\"end\">{}</text><rect x=\"{lw}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{color}\" data-tip=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" class=\"tick\">{}</text>",
            lw - 4.0,
            y + 11.0,
            esc(&r.value),
            y + 2.0,
            len.max(1.5),
            row - 4.0,
            esc(&r.tip),
            lw + len.max(1.5) + 4.0,
            y + 11.0,
            if r.delta.is_finite() {
                format!("{:+.1}%", 100.0 * r.delta)
            } else {
                "-".into()
            }
        );
    }
    s.push_str("</svg>");
    s
}

/// The report's stylesheet.
pub const STYLE: &str = "body{font-family:sans-serif;margin:24px auto;max-width:1400px;padding:0 16px;color:#222}\
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;font-size:12px;margin:6px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;white-space:nowrap}\
th{background:#f3f3f3}td.l,th.l{text-align:left;white-space:normal}tr.best{background:#fff4e0}.note{color:#555;font-size:12px}\
th[data-key]{cursor:pointer}th[aria-sort=ascending]::after{content:' \\25B2'}th[aria-sort=descending]::after{content:' \\25BC'}\
.scroll{overflow-x:auto;max-width:100%}pre{background:#f6f6f6;padding:8px;font-size:11px;white-space:pre-wrap;overflow-wrap:anywhere}\
svg{max-width:100%;height:auto}svg.chart{width:100%;display:block}svg.zoomable{max-width:none}\
svg text{font-family:sans-serif;font-size:12px;fill:#222}svg text.tick{font-size:11px;fill:#444}svg text.axis{font-size:12px}\
svg text.mb{font-size:10px;fill:#fff;pointer-events:none}svg rect.cell{fill:rgb(90,120,170)}\
svg circle.plan{fill:rgb(230,140,40);stroke:#000;stroke-width:1}g.plan-label rect{fill:#fff;stroke:#333}g.plan-label text{font-size:12px;font-weight:bold}\
.legend{font-size:12px;margin:4px 0 8px}.legend span{margin-right:14px;white-space:nowrap}.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}\
#sensitivity{display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start}#sensitivity svg.sens{width:300px;max-width:100%;display:block}\
#tip{position:fixed;display:none;z-index:10;max-width:420px;background:#fffff4;border:1px solid #888;padding:4px 6px;font-size:12px;pointer-events:none;box-shadow:1px 1px 3px rgba(0,0,0,.2)}\
input#ranked-filter{font-size:12px;padding:2px 4px;width:260px}details summary{cursor:pointer;font-size:12px;color:#555}\
@media print{section{page-break-inside:avoid}body{margin:0}#tip,.zoombar,input#ranked-filter{display:none}}";

/// The report's script: tooltips for every `[data-tip]`, sortable tables
/// (`th[data-key]`, numbers from `data-v`), the ranked table's filter and the
/// timeline's zoom. No network, no libraries.
pub const SCRIPT: &str = r#"(function(){
var tip=document.getElementById('tip');
function place(e){var x=e.clientX+14,y=e.clientY+14,r=tip.getBoundingClientRect();
if(x+r.width>window.innerWidth)x=Math.max(0,e.clientX-14-r.width);
if(y+r.height>window.innerHeight)y=Math.max(0,e.clientY-14-r.height);
tip.style.left=x+'px';tip.style.top=y+'px';}
function over(e){var t=e.target&&e.target.closest?e.target.closest('[data-tip]'):null;
if(!t){tip.style.display='none';return;}
tip.textContent=t.getAttribute('data-tip');tip.style.display='block';place(e);}
document.addEventListener('mouseover',over);document.addEventListener('mousemove',over);
document.addEventListener('mouseout',function(e){var r=e.relatedTarget;
if(!r||!r.closest||!r.closest('[data-tip]'))tip.style.display='none';});
Array.prototype.forEach.call(document.querySelectorAll('table.sortable'),function(t){
var ths=t.tHead.rows[0].cells;
Array.prototype.forEach.call(ths,function(th,i){if(!th.hasAttribute('data-key'))return;
th.addEventListener('click',function(){
var asc=th.getAttribute('aria-sort')!=='ascending';
Array.prototype.forEach.call(ths,function(o){o.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',asc?'ascending':'descending');
var body=t.tBodies[0],rows=Array.prototype.slice.call(body.rows);
rows.sort(function(a,b){var x=a.cells[i],y=b.cells[i],u=parseFloat(x.getAttribute('data-v')),v=parseFloat(y.getAttribute('data-v'));
var c=(isNaN(u)||isNaN(v))?x.textContent.localeCompare(y.textContent):u-v;
if(c===0)c=parseFloat(a.cells[0].getAttribute('data-v'))-parseFloat(b.cells[0].getAttribute('data-v'));
return asc?c:-c;});
rows.forEach(function(r){body.appendChild(r);});});});});
var f=document.getElementById('ranked-filter');
if(f)f.addEventListener('input',function(){var q=f.value.trim().toLowerCase(),t=document.getElementById('ranked');
Array.prototype.forEach.call(t.tBodies[0].rows,function(r){
var s=((r.getAttribute('data-desc')||'')+' '+r.textContent).toLowerCase();r.hidden=q!==''&&s.indexOf(q)<0;});});
var tl=document.getElementById('timeline');
if(tl){var zoom=1,L=parseFloat(tl.getAttribute('data-left')),PW=parseFloat(tl.getAttribute('data-pw')),W=parseFloat(tl.getAttribute('data-w'));
var vb=tl.viewBox.baseVal,H=vb.height,base=null;
function apply(){var pw=PW*zoom,w=W-PW+pw;if(base===null)base=tl.getBoundingClientRect().width||W;
tl.setAttribute('viewBox','0 0 '+w+' '+H);tl.style.width=(base*w/W)+'px';
Array.prototype.forEach.call(tl.querySelectorAll('[data-t0]'),function(el){
var t0=parseFloat(el.getAttribute('data-t0')),t1=parseFloat(el.getAttribute('data-t1'));
if(el.tagName.toLowerCase()==='rect'){el.setAttribute('x',L+pw*t0);el.setAttribute('width',Math.max(0.2,pw*(t1-t0)));}
else{el.setAttribute('x',L+pw*(t0+t1)/2);var n=el.getAttribute('data-len');
if(n!==null){if(pw*(t1-t0)>=7*parseFloat(n)+4)el.removeAttribute('display');else el.setAttribute('display','none');}}});}
document.getElementById('tl-zoom-in').addEventListener('click',function(){zoom=Math.min(zoom*1.6,200);apply();});
document.getElementById('tl-zoom-out').addEventListener('click',function(){zoom=Math.max(zoom/1.6,1);apply();});}
})();"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let t = ticks(13.2, 14.9);
        assert!(t.len() >= 3 && t.len() <= 7, "{t:?}");
        assert!(t.iter().all(|&v| (13.2..=14.9).contains(&v)));
    }

    #[test]
    fn no_negative_zero() {
        assert_eq!(secs(-1e-9), "0.0 ms");
        assert_eq!(secs(1.5), "1.500 s");
        assert_eq!(secs(0.0123), "12.3 ms");
    }

    #[test]
    fn labels_never_overlap_even_on_one_point() {
        // Ten plans at the same point and five in a tight cluster.
        let mut anchors = vec![(400.0, 200.0); 10];
        anchors.extend((0..5).map(|i| (100.0 + i as f64, 100.0)));
        let sizes: Vec<(f64, f64)> = anchors.iter().map(|_| (31.0, 16.0)).collect();
        let area = Boxed(70.0, 14.0, 816.0, 360.0);
        let spots = place_labels(&anchors, &sizes, area);
        let boxes: Vec<Boxed> = spots
            .iter()
            .zip(&sizes)
            .map(|(s, z)| Boxed(s.0, s.1, z.0, z.1))
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            assert!(a.inside(&area));
            for b in &boxes[i + 1..] {
                assert!(!a.overlaps(b, 0.0), "labels overlap");
            }
        }
    }
}
