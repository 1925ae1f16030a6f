//! Terminal text: the plan table, the estimate breakdown, the lists of built-ins.

use std::fmt::Write;

use sextant_planner::comm::Tier;
use sextant_planner::config::{Layout, ParallelConfig, Recompute, RecomputeModules, RejectKind};
use sextant_planner::cost::Estimate;
use sextant_planner::hardware::{HardwareProfile, GIB};
use sextant_planner::model::ModelSpec;
use sextant_planner::search::SearchResult;

use crate::args::Inputs;

/// A value from the user's CSV in a table: control characters escaped, cut to 80
/// characters, and in Markdown a `|` escaped so that it stays one cell.
fn csv_cell(text: &str, md: bool) -> String {
    let t = sextant_planner::json::one_line(text, 80);
    if md {
        t.replace('|', "\\|")
    } else {
        t
    }
}

pub fn assumptions(inp: &Inputs) -> String {
    let scaletorch = inp.assumptions.framework == sextant_planner::cost::Framework::ScaleTorch;
    let mut s = String::new();
    let m = &inp.model;
    let p = &inp.cluster.profile;
    let w = &inp.workload;
    // Names come from the user's files: control characters (a terminal escape would
    // rewrite the screen) are shown escaped, and a long name is cut.
    let name = |t: &str| sextant_planner::json::one_line(t, 100);
    let _ = writeln!(
        s,
        "Model:     {} ({}): {}",
        name(&m.name),
        name(&inp.model_note),
        m.summary()
    );
    let _ = writeln!(
        s,
        "Cluster:   {} x {} ({}), {} nodes of {}, NVLink domain {}{} at {:.0} GB/s, network {:.0} GB/s per GPU, {:.1} GiB HBM of which plans use at most {:.1} (headroom {:.0}%, --mem-headroom)",
        inp.cluster.gpus,
        name(&p.gpu.name),
        name(&p.name),
        inp.cluster.nodes(),
        p.node.gpus_per_node,
        p.node.nvlink_domain,
        if inp.cluster.gpus <= inp.cluster.profile_domain
            && inp.cluster.profile_domain != p.node.nvlink_domain
        {
            format!(" (the job's part of one {}-GPU domain)", inp.cluster.profile_domain)
        } else if inp.cluster.profile_domain != p.node.nvlink_domain {
            format!(
                " (the job in equal segments of whole nodes of the {}-GPU domains, as Slurm's --segment places it)",
                inp.cluster.profile_domain
            )
        } else {
            String::new()
        },
        p.node.nvlink_gbytes_per_s,
        p.network.nic_gbytes_per_s,
        p.gpu.hbm_gib,
        p.capacity_bytes() / sextant_planner::hardware::GIB,
        100.0 * p.memory.headroom
    );
    let _ = writeln!(
        s,
        "Workload:  seq {}, global batch {} sequences ({:.2}M tokens), precision {}, grads {}, loss kernel {}, overlap: grad-reduce {}, param-gather {}, tp-comm {}{}",
        w.seq,
        w.global_batch,
        (w.seq * w.global_batch) as f64 / 1e6,
        w.precision,
        grads_dtype(inp),
        loss_name(inp),
        onoff(inp.overlap.grad_reduce),
        if scaletorch { "n/a (no sharding)" } else { onoff(inp.overlap.param_gather) },
        // Only a TP group has TP communication to overlap.
        if inp.overlap.tp_comm { "on (TP > 1)" } else { "off" },
        if m.moe.is_some() {
            let cap = w.moe_capacity.map(|c| format!("capacity factor {}{}", c.factor, if c.pad { " padded" } else { "" })).unwrap_or_else(|| "dropless".into());
            format!(", ep-comm {}, MoE imbalance {:.2}, {cap}, CUDA graphs {}", onoff(inp.overlap.ep_comm), w.moe_imbalance, inp.assumptions.cuda_graphs)
        } else {
            String::new()
        }
    );
    s
}

/// How a model's state is spread when every parameter is split over all `gpus`, in
/// `framework`'s words: a floor whatever sharding the target offers (NeMo's export
/// has no ZeRO-3, yet tensor and pipeline parallelism can split as far); ScaleTorch
/// has no sharded data parallelism, so only tensor and pipeline parallelism split it.
pub fn fully_sharded(framework: sextant_planner::cost::Framework, gpus: u64) -> String {
    use sextant_planner::cost::Framework;
    if gpus <= 1 {
        return "on its one GPU".to_string();
    }
    let over = format!("all {gpus}");
    match framework {
        Framework::ScaleTorch => format!(
            "per GPU with every parameter split over {over} by tensor and pipeline parallelism (ScaleTorch shards nothing over data parallelism)"
        ),
        Framework::Torchtitan => format!("per GPU even with every parameter sharded over {over} (FSDP)"),
        Framework::MegatronCore | Framework::Nanotron | Framework::Scaling => {
            format!("per GPU even with every parameter sharded over {over}")
        }
    }
}

/// `v` as indented JSON text with no negative zero: an empty `f64` sum is -0.0,
/// and JSON readers keep its sign (the text tables print zero without one).
pub fn json_text(mut v: serde_json::Value) -> String {
    fn unsign(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) if n.as_f64() == Some(0.0) && n.is_f64() => {
                *v = serde_json::Value::from(0.0);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(unsign),
            serde_json::Value::Object(o) => o.values_mut().for_each(unsign),
            _ => {}
        }
    }
    unsign(&mut v);
    serde_json::to_string_pretty(&v).expect("a JSON value serialises")
}

/// "1 GPU", "8 GPUs".
pub fn gpu_count(n: u64) -> String {
    format!("{n} GPU{}", if n == 1 { "" } else { "s" })
}

/// `n` GPUs and, where they span several nodes of `per_node`, how many nodes.
pub fn gpus_in_nodes(n: u64, per_node: u64) -> String {
    let nodes = n.div_ceil(per_node.max(1));
    if nodes > 1 {
        format!(
            "{} of this kind ({nodes} nodes of {per_node})",
            gpu_count(n)
        )
    } else {
        format!("{} of this kind", gpu_count(n))
    }
}

/// The loss kernel as the header states it: torchtitan's eager loss is priced with
/// Megatron's fused passes (`native`), which is not a kernel torchtitan has.
fn loss_name(inp: &Inputs) -> &'static str {
    use sextant_planner::cost::{Framework, LossKernel};
    match (inp.assumptions.framework, inp.assumptions.loss) {
        (Framework::Torchtitan, LossKernel::Native) => {
            "eager (torchtitan's, priced as native's passes)"
        }
        (_, k) => k.name(),
    }
}

/// The gradients' precision as the header states it. ScaleTorch's gradients are
/// FP32 buckets only under data parallelism (BF16 `param.grad` without), so one
/// word cannot describe every plan of the table; torchtitan's FSDP keeps FP32
/// gradient shards whatever `--bf16-grads` says.
fn grads_dtype(inp: &Inputs) -> &'static str {
    use sextant_planner::cost::Framework;
    match inp.assumptions.framework {
        Framework::ScaleTorch => "fp32 (bf16 without data parallelism)",
        Framework::Torchtitan if inp.bf16_grads => "bf16 (fp32 shards under FSDP)",
        Framework::Scaling => "bf16 (reduced in fp32)",
        _ if inp.bf16_grads => "bf16",
        _ => "fp32",
    }
}

fn onoff(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// The layout column of a plan: `e`'s stages say how many multi-token-prediction
/// layers sit on the last one, which an explicit layout must name to read back.
fn layout_note(cfg: &ParallelConfig, e: &Estimate) -> String {
    match &cfg.layout {
        Layout::Even => String::new(),
        Layout::AccountEmbeddingLoss => " emb+loss as layers".into(),
        Layout::FirstLast { first, last } => format!(" first {first} last {last}"),
        Layout::Explicit { layers } => {
            let mtp = e.stages.iter().map(|s| s.mtp_layers).sum();
            format!(" --pp-layout \"{}\"", megatron_layout(layers, mtp))
        }
    }
}

/// An explicit layout (decoder layers per virtual stage, in pipeline order) in
/// Megatron's layout syntax, which `estimate --pp-layout` reads back: `E` on the
/// first chunk, the `mtp` multi-token-prediction layers (`m`) and `L` on the last,
/// `|` between chunks, runs of equal middle chunks as `(…|)*k`.
pub fn megatron_layout(layers: &[u64], mtp: u64) -> String {
    let last = layers.len().saturating_sub(1);
    let chunk = |i: usize, n: u64| {
        let mut c = String::new();
        if i == 0 {
            c.push('E');
        }
        match n {
            0 => {}
            1 => c.push('t'),
            n => {
                let _ = write!(c, "t*{n}");
            }
        }
        if i == last {
            match mtp {
                0 => {}
                1 => c.push('m'),
                n => {
                    let _ = write!(c, "m*{n}");
                }
            }
            c.push('L');
        }
        c
    };
    let mut out = String::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i + 1;
        if i > 0 {
            while j < last && layers[j] == layers[i] {
                j += 1;
            }
        }
        let run = j - i;
        if run > 1 {
            let _ = write!(out, "({}|)*{run}", chunk(i, layers[i]));
        } else {
            out.push_str(&chunk(i, layers[i]));
            if i < last {
                out.push('|');
            }
        }
        i = j;
    }
    out
}

/// One column of the plan table.
struct Column {
    header: &'static str,
    /// Dropped first when the terminal is too narrow: higher goes first; 0 never.
    drop_rank: u8,
    /// When every plan has the same value, the column may move to an
    /// "all plans:" line under the table to save width.
    collapsible: bool,
    cells: Vec<String>,
}

impl Column {
    fn width(&self) -> usize {
        self.cells
            .iter()
            .map(|c| c.chars().count())
            .chain(std::iter::once(self.header.len()))
            .max()
            .unwrap_or(0)
    }
    fn constant(&self) -> Option<&str> {
        let first = self.cells.first()?;
        self.cells
            .iter()
            .all(|c| c == first)
            .then_some(first.as_str())
    }
}

/// The ranked plans as a table, fitted to `width` terminal columns when given
/// (`None`: no limit, as when writing to a pipe or file). To fit, columns whose
/// value is the same for every plan move to an "all plans:" line, then the least
/// needed columns are hidden (named under the table), then layouts go on their own
/// lines. A legend of the columns follows.
pub fn plan_table(res: &SearchResult, inp: &Inputs, width: Option<usize>) -> String {
    let cap = inp.cluster.profile.capacity_bytes() / sextant_planner::hardware::GIB;
    let mut outside_notes: Vec<String> = Vec::new();
    let col = |header, drop_rank, collapsible| Column {
        header,
        drop_rank,
        collapsible,
        cells: Vec::new(),
    };
    let mut cols = vec![
        col("#", 0, false),
        col("TP", 0, false),
        col("PP", 0, false),
        col("VPP", 0, true),
        col("CP", 0, true),
        col("SP", 0, true),
        col("EP", 0, true),
        col("ETP", 0, true),
        col("DP", 0, false),
        col("MBS", 0, false),
        col("GA", 4, true),
        col("ZeRO", 0, true),
        col("RC", 0, true),
        col("schedule", 3, true),
        col("step(s)", 0, false),
        col("upper(s)", 0, false),
        col("tok/s/GPU", 6, false),
        col("MFU", 5, false),
        col("mem GiB/cap", 1, false),
        col("bubble", 2, false),
        col("comm", 2, false),
    ];
    let mut layouts: Vec<String> = Vec::new();
    for (i, c) in res.top.iter().enumerate() {
        let cfg = &c.config;
        let e = &c.estimate;
        let upper = match &e.band {
            Some(b) if b.outside.is_empty() => format!("{:.3}", b.high_secs),
            Some(b) => {
                let n = outside_note(&b.outside);
                let k = match outside_notes.iter().position(|x| *x == n) {
                    Some(k) => k,
                    None => {
                        outside_notes.push(n);
                        outside_notes.len() - 1
                    }
                };
                format!("{:.3}{}", b.high_secs, "*".repeat(k + 1))
            }
            None => "-".into(),
        };
        let row = [
            (i + 1).to_string(),
            cfg.tp.to_string(),
            cfg.pp.to_string(),
            cfg.vpp.to_string(),
            cfg.cp.to_string(),
            if cfg.sp { "y" } else { "n" }.to_string(),
            cfg.ep.to_string(),
            cfg.etp.to_string(),
            cfg.dp.to_string(),
            cfg.mbs.to_string(),
            e.micro_batches.to_string(),
            cfg.zero.to_string(),
            match cfg.recompute {
                Recompute::Selective if cfg.recompute_modules != RecomputeModules::DEFAULT => {
                    "sel+".to_string()
                }
                r => r.to_string(),
            },
            cfg.schedule.name().to_string(),
            format!("{:.3}", e.step_secs),
            upper,
            format!("{:.0}", e.tokens_per_sec_per_gpu),
            format!("{:.1}%", 100.0 * e.mfu),
            format!("{:.1}/{:.1}", e.memory.total / GIB, cap),
            format!("{:.1}%", 100.0 * e.bubble_fraction),
            format!("{:.1}%", 100.0 * e.exposed_comm_fraction),
        ];
        for (c, v) in cols.iter_mut().zip(row) {
            c.cells.push(v);
        }
        layouts.push(layout_note(cfg, e).trim_start().to_string());
    }
    let total = |cols: &[Column]| -> usize { cols.iter().map(|c| c.width() + 1).sum() };
    let longest_layout = layouts.iter().map(|l| l.len()).max().unwrap_or(0);
    let fits = |cols: &[Column], with_layout: bool| match width {
        None => true,
        Some(w) => {
            total(cols)
                + if with_layout && longest_layout > 0 {
                    longest_layout + 1
                } else {
                    0
                }
                <= w
        }
    };
    let mut common: Vec<String> = Vec::new();
    let mut hidden: Vec<&'static str> = Vec::new();
    let mut separate_layouts = false;
    if !fits(&cols, true) && !res.top.is_empty() {
        // Constant columns first: nothing is lost by stating them once.
        let mut kept = Vec::new();
        for c in cols {
            match (c.collapsible, c.constant()) {
                (true, Some(v)) => common.push(format!("{} {v}", c.header)),
                _ => kept.push(c),
            }
        }
        cols = kept;
        if longest_layout > 0 && layouts.iter().all(|l| *l == layouts[0]) {
            common.push(format!("layout {}", layouts[0]));
            layouts.iter_mut().for_each(String::clear);
        }
        let longest_layout = layouts.iter().map(|l| l.len()).max().unwrap_or(0);
        let fits = |cols: &[Column], with_layout: bool| match width {
            None => true,
            Some(w) => {
                total(cols)
                    + if with_layout && longest_layout > 0 {
                        longest_layout + 1
                    } else {
                        0
                    }
                    <= w
            }
        };
        while !fits(&cols, !separate_layouts) {
            if !separate_layouts && longest_layout > 0 {
                separate_layouts = true;
                continue;
            }
            let Some((k, _)) = cols
                .iter()
                .enumerate()
                .filter(|(_, c)| c.drop_rank > 0)
                .max_by_key(|(k, c)| (c.drop_rank, *k))
            else {
                break;
            };
            hidden.push(cols.remove(k).header);
        }
    }
    let widths: Vec<usize> = cols.iter().map(Column::width).collect();
    let mut s = String::new();
    let line = |s: &mut String, cells: Vec<&str>, tail: &str| {
        let mut l = String::new();
        for (k, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if k > 0 {
                l.push(' ');
            }
            let _ = write!(l, "{c:>w$}");
        }
        if !tail.is_empty() {
            l.push(' ');
            l.push_str(tail);
        }
        let _ = writeln!(s, "{}", l.trim_end());
    };
    line(&mut s, cols.iter().map(|c| c.header).collect(), "");
    for (i, layout) in layouts.iter().enumerate() {
        let cells = cols.iter().map(|c| c.cells[i].as_str()).collect();
        if separate_layouts {
            line(&mut s, cells, "");
            if !layout.is_empty() {
                let _ = writeln!(s, "      layout {layout}");
            }
        } else {
            line(&mut s, cells, layout);
        }
    }
    let mut foot: Vec<String> = Vec::new();
    if !common.is_empty() {
        foot.push(format!("  all plans: {}", common.join(", ")));
    }
    if !hidden.is_empty() {
        foot.push(format!(
            "  hidden to fit {} columns: {} (a wider terminal, COLUMNS=200 or --json shows them)",
            width.unwrap_or(0),
            hidden.join(", ")
        ));
    }
    let mut fine: Vec<String> = res
        .top
        .iter()
        .filter(|c| {
            c.config.recompute == Recompute::Selective
                && c.config.recompute_modules != RecomputeModules::DEFAULT
        })
        .map(|c| c.config.recompute_modules.to_string())
        .collect();
    fine.dedup();
    if let Some(b) = res.top.iter().find_map(|c| c.estimate.band.as_ref()) {
        foot.push(format!(
                        "  upper: the {:.0}% band's upper end (--rank-by upper, the default, ranks by it; point ranks by step time)",
            100.0 * b.coverage
        ));
    }
    // Where the comparable runs all took longer than predicted, the step, MFU and
    // tok/s columns are optimistic: say so.
    if let Some(c) = res.top.first() {
        if let Some(b) = c
            .estimate
            .band
            .as_ref()
            .filter(|b| b.low_secs > c.estimate.step_secs)
        {
            foot.push(format!(
                "  note: the first plan's band lies wholly above its step time: the comparable runs ({}) took longer than the model predicts them, so read the upper column, not step(s), tok/s/GPU or MFU",
                b.basis
            ));
        }
    }
    for (k, n) in outside_notes.iter().enumerate() {
        foot.push(format!(
            "  {}: band widened outside the validated runs: {n}",
            "*".repeat(k + 1)
        ));
    }
    for m in fine {
        foot.push(format!("  sel+: selective recomputation of {m} (Megatron --recompute-modules); sel: core attention (Megatron's default)"));
    }
    for f in foot {
        s.push_str(&wrap(&f, width));
    }
    s.push_str(&wrap(LEGEND, width));
    s
}

/// `text` as one paragraph wrapped at `width` (no limit: as written), its first
/// line indented two spaces and the rest four.
fn wrap(text: &str, width: Option<usize>) -> String {
    let Some(width) = width else {
        return format!("{}\n", text.trim_end());
    };
    let mut out = String::new();
    let mut line = String::from(" ");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > width && !line.trim().is_empty() {
            out.push_str(&line);
            out.push('\n');
            line = String::from("   ");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// What the plan table's columns mean (printed under it).
const LEGEND: &str = concat!(
    "  columns: GA micro-batches per step; ZeRO 0 plain DP, 1/DO Megatron distributed optimizer,\n",
    "    2 optimizer+gradients sharded (Megatron-FSDP optim_grads; torchtitan: FSDP2 without resharding\n",
    "    after the forward), 3 parameters too (Megatron-FSDP optim_grads_params, FSDP FULL_SHARD);\n",
    "    RC recomputation none/sel(ective)/full;\n",
    "    mem: peak per GPU (weights, gradients, optimizer, activations, buffers, reserve) / usable HBM;\n",
    "    bubble: pipeline idle share of the step; comm: communication not hidden behind compute;\n",
    "    MFU: model FLOPs (attention over the whole s x s score matrix, the SC'21 convention;\n",
    "    Megatron-LM's own log halves it for the causal mask; routed tokens a capacity drops do not\n",
    "    count) per second against the BF16 dense peak, FP8 plans too\n",
);

/// The axes a plan leaves the validated runs on, with by how much.
pub fn outside_note(outside: &[sextant_planner::reach::Outside]) -> String {
    outside
        .iter()
        .map(|o| {
            if o.validated == 0.0 && o.value == 0.0 {
                format!(
                    "{} (no published run; +{:.1}%)",
                    o.axis,
                    100.0 * o.per_doubling
                )
            } else {
                let (v, m) = if o.axis.contains("HBM") {
                    (
                        format!("{:.0}%", 100.0 * o.value),
                        format!("{:.0}%", 100.0 * o.validated),
                    )
                } else {
                    (format!("{}", o.value), format!("{}", o.validated))
                };
                format!(
                    "{} {v} (validated to {m}; {:.1} doublings x {:.1}%)",
                    o.axis,
                    o.doublings,
                    100.0 * o.per_doubling
                )
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn search_summary(res: &SearchResult, millis: f64) -> String {
    let mut s = String::new();
    let rejected: u64 = res.rejected.values().sum();
    let _ = writeln!(
        s,
        "Searched {} configurations in {:.0} ms: {} valid, {} rejected.",
        res.enumerated, millis, res.valid, rejected
    );
    let mut reasons: Vec<(&RejectKind, &u64)> = res.rejected.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1));
    for (kind, n) in reasons {
        let _ = writeln!(s, "  {:>9}  {}", n, kind.describe());
    }
    s
}

fn secs(x: f64) -> String {
    if x >= 1.0 {
        format!("{x:8.3} s ")
    } else {
        format!("{:8.2} ms", x * 1e3)
    }
}

pub fn breakdown(cfg: &ParallelConfig, e: &Estimate, hw: &HardwareProfile) -> String {
    let mut s = String::new();
    let step = e.step_secs;
    let pct = |x: f64| 100.0 * x / step;
    let _ = writeln!(
        s,
        "Configuration: TP {} PP {} VPP {} CP {} SP {} EP {} ETP {} DP {}, micro-batch {} x {} accumulation steps, ZeRO {}{}, recompute {}, schedule {}{}",
        cfg.tp,
        cfg.pp,
        cfg.vpp,
        cfg.cp,
        onoff(cfg.sp),
        cfg.ep,
        cfg.etp,
        cfg.dp,
        cfg.mbs,
        e.micro_batches,
        cfg.zero,
        if cfg.bf16_moments { " (BF16 Adam moments)" } else { "" },
        match cfg.recompute {
            Recompute::Selective => format!("selective ({})", cfg.recompute_modules),
            r => format!("{r:?}").to_lowercase(),
        },
        cfg.schedule.name(),
        layout_note(cfg, e)
    );
    let _ = writeln!(
        s,
        "Step time {:.3} s | {:.0} tokens/s/GPU | MFU {:.1}% | HFU {:.1}% | {:.0} model TFLOP/s/GPU | bubble {:.1}% | exposed comm {:.1}%",
        step,
        e.tokens_per_sec_per_gpu,
        100.0 * e.mfu,
        100.0 * e.hfu,
        e.model_tflops_per_gpu,
        100.0 * e.bubble_fraction,
        100.0 * e.exposed_comm_fraction
    );
    if let Some(b) = &e.band {
        let _ = writeln!(
            s,
            "{:.0}% band: {:.3} to {:.3} s (the model's errors on {})",
            100.0 * b.coverage,
            b.low_secs,
            b.high_secs,
            b.basis
        );
        if !b.outside.is_empty() {
            let _ = writeln!(
                s,
                "  widened outside the validated runs: {}",
                outside_note(&b.outside)
            );
        }
        if let Some(a) = &b.attribution {
            let parts: Vec<String> = a
                .variance_shares
                .iter()
                .filter(|x| x.1 >= 0.005)
                .map(|(t, v)| format!("{t} {:.0}%", 100.0 * v))
                .collect();
            let sig: Vec<String> = a
                .term_sigmas
                .iter()
                .map(|(t, g)| format!("{t} {:.0}%", 100.0 * g))
                .collect();
            let _ = writeln!(s, "Uncertainty is dominated by {} (share of the error variance: {}; per-term error fitted on the published runs: {})", a.dominant, parts.join(", "), sig.join(", "));
        }
    }
    if let Some(r) = &e.moe_routing {
        let cap = match r.capacity_factor {
            None => "dropless".to_string(),
            Some(c) => format!(
                "capacity factor {c}{}, {:.2}% of routed tokens dropped",
                if r.pad_to_capacity { " padded" } else { "" },
                100.0 * r.dropped_fraction
            ),
        };
        let _ = writeln!(s, "MoE routing: busiest expert at {:.2}x the mean, {cap}; the busiest of {} expert-parallel ranks processes and receives {:.3}x the balanced tokens", r.imbalance, cfg.ep, r.busiest_rank_load);
    }
    let _ = writeln!(
        s,
        "\nTime per step on the critical stage (stage {} of {}):",
        e.critical_stage, cfg.pp
    );
    let c = &e.time.compute;
    for (name, v) in [
        ("attention projections", c.attention_proj),
        ("attention core", c.attention_core),
        ("MLP / shared experts", c.mlp),
        ("routed experts", c.moe_experts),
        ("router", c.router),
        ("output layer + loss", c.output_layer),
        ("element-wise", c.elementwise),
        ("recomputation", e.time.recompute),
        ("exposed communication", e.time.exposed_comm),
        ("pipeline bubble", e.time.bubble),
        ("optimizer step", e.time.optimizer),
        ("overlap contention", e.time.overlap_slowdown),
        ("waiting for the host", e.time.host_wait),
    ] {
        if v > 0.0 {
            let _ = writeln!(s, "  {:<24} {}  {:5.1}%", name, secs(v), pct(v));
        }
    }
    let _ = writeln!(s, "\nCommunication (critical stage, per step):");
    let _ = writeln!(
        s,
        "  {:<10} {:<15} {:>6} {:<8} {:>12} {:>8} {:>11} {:>11} {:>11}",
        "kind",
        "collective",
        "group",
        "link",
        "bytes/call",
        "calls",
        "total",
        "exposed",
        "overlapped"
    );
    for t in &e.comm {
        let link = match t.tier {
            Tier::Nvlink => "nvlink",
            Tier::Network => "network",
            Tier::Local => "local",
        };
        let _ = writeln!(
            s,
            "  {:<10} {:<15} {:>6} {:<8} {:>10.1}MB {:>8.0} {} {} {}",
            t.kind.label(),
            format!("{:?}", t.collective),
            format!("{}x{}", t.group.domains, t.group.per_domain),
            link,
            t.bytes_per_call / 1e6,
            t.calls_per_step,
            secs(t.total_secs),
            secs(t.exposed_secs),
            secs(t.overlapped_secs)
        );
    }
    let m = &e.memory;
    let _ = writeln!(
        s,
        "\nMemory per GPU, worst stage (stage {}, {:.1} micro-batches in flight):",
        m.stage, m.in_flight
    );
    for (name, v) in [
        ("weights", m.weights),
        ("gradients", m.gradients),
        ("optimizer states", m.optimizer),
        ("activations", m.activations),
        ("logits", m.logits),
        ("framework buffers", m.buffers),
        ("fragmentation", m.fragmentation),
        ("runtime reserve", m.reserve),
        ("cached, not in total", m.cached),
    ] {
        if v > 0.0 {
            let _ = writeln!(s, "  {:<20} {:8.2} GiB", name, v / GIB);
        }
    }
    let _ = writeln!(
        s,
        "  {:<20} {:8.2} GiB of {:.1} GiB ({:.0}%)",
        "total",
        m.total / GIB,
        hw.gpu.hbm_gib,
        100.0 * m.total / e.hbm_bytes
    );
    if e.stages.len() > 1 {
        let _ = writeln!(s, "\nStages:");
        for st in &e.stages {
            let mtp = if st.mtp_layers > 0 {
                format!(" + {} MTP", st.mtp_layers)
            } else {
                String::new()
            };
            let _ = writeln!(
                s,
                "  stage {:>3}: {:>3} layers ({} MoE){mtp}, {} per micro-batch, {:.1} GiB",
                st.stage,
                st.layers,
                st.moe_layers,
                secs(st.secs_per_micro_batch),
                st.memory.total / GIB
            );
        }
    }
    s
}

pub fn models_list() -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<16} {:<36} {:>9} {:>9} {:>9}  source",
        "name", "aliases", "params", "active", "w/o emb"
    );
    for p in sextant_planner::presets::PRESETS {
        let m: ModelSpec = (p.spec)();
        let c = m.params();
        let _ = writeln!(
            s,
            "{:<16} {:<36} {:>8.1}B {:>8.1}B {:>8.1}B  {}",
            p.name,
            p.aliases.join(", "),
            c.total as f64 / 1e9,
            c.active as f64 / 1e9,
            c.active_without_embedding as f64 / 1e9,
            m.source
        );
    }
    let _ = writeln!(
        s,
        "\nactive: parameters one token touches, the input embedding included (as Mistral's, Qwen's and DeepSeek's model cards count); w/o emb: the same without the input embedding (as OpenAI's gpt-oss card counts)."
    );
    let _ = writeln!(
        s,
        "--model also takes a Hugging Face config.json ({}) or a Sextant model JSON file.",
        sextant_planner::hf::SUPPORTED_TYPES.join(", ")
    );
    s
}

pub fn profiles_list() -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:<22} {:>6} {:>6} {:>8} {:>6} {:>8} {:>8}  description",
        "name", "aliases", "BF16TF", "FP8TF", "HBM GiB", "TB/s", "NVL GB/s", "NIC GB/s"
    );
    for p in sextant_planner::hardware::builtin_profiles() {
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>6.0} {:>6.0} {:>8.1} {:>6.2} {:>8.0} {:>8.1}  {}",
            p.name,
            p.aliases.join(", "),
            p.gpu.peak_tflops.bf16,
            p.gpu.peak_tflops.fp8,
            p.gpu.hbm_gib,
            p.gpu.hbm_tbytes_per_s,
            p.node.nvlink_gbytes_per_s,
            p.network.nic_gbytes_per_s,
            p.description
        );
    }
    let _ = writeln!(s, "\n--cluster FILE takes a profile JSON of the same schema (see hwprofiles/ and ARCHITECTURE.md).");
    s
}

fn summary_lines(s: &mut String, sum: &sextant_planner::validate::Summary, md: bool) {
    let groups = std::iter::once(("", &sum.all))
        .chain(sum.by_kind.iter().map(|g| ("kind", g)))
        .chain(sum.by_profile.iter().map(|g| ("gpu", g)))
        .chain(sum.by_source.iter().map(|g| ("source", g)));
    if md {
        let _ = writeln!(s, "| group | rows | median abs error | max abs error | mean signed error |\n|---|---:|---:|---:|---:|");
    } else {
        let _ = writeln!(
            s,
            "{:<26} {:>5} {:>11} {:>9} {:>12}",
            "group", "rows", "median|err|", "max|err|", "mean signed"
        );
    }
    for (kind, g) in groups {
        let group = csv_cell(&g.group, md);
        let name = if kind.is_empty() {
            group
        } else {
            format!("{kind}: {group}")
        };
        if md {
            let _ = writeln!(
                s,
                "| {name} | {} | {:.1}% | {:.1}% | {:+.1}% |",
                g.rows,
                100.0 * g.median_abs,
                100.0 * g.max_abs,
                100.0 * g.mean_signed
            );
        } else {
            let _ = writeln!(
                s,
                "{:<26} {:>5} {:>10.1}% {:>8.1}% {:>+11.1}%",
                name,
                g.rows,
                100.0 * g.median_abs,
                100.0 * g.max_abs,
                100.0 * g.mean_signed
            );
        }
    }
}

fn rows_table(s: &mut String, rows: &[sextant_planner::validate::RowResult], md: bool) {
    if md {
        let _ = writeln!(s, "| run | gpu | gpus | kind | measured (s) | predicted (s) | error |\n|---|---|---:|---|---:|---:|---:|");
    } else {
        let _ = writeln!(
            s,
            "{:<44} {:<12} {:>6} {:<5} {:>11} {:>11} {:>8}",
            "run", "gpu", "gpus", "kind", "measured", "predicted", "error"
        );
    }
    for r in rows {
        let kind = if r.moe { "MoE" } else { "dense" };
        if md {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {kind} | {:.3} | {:.3} | {:+.1}% |",
                csv_cell(&r.id, md),
                r.profile,
                r.gpus,
                r.measured_secs,
                r.predicted_secs,
                100.0 * r.error
            );
        } else {
            let _ = writeln!(
                s,
                "{:<44} {:<12} {:>6} {:<5} {:>10.3}s {:>10.3}s {:>+7.1}%",
                csv_cell(&r.id, md),
                r.profile,
                r.gpus,
                kind,
                r.measured_secs,
                r.predicted_secs,
                100.0 * r.error
            );
        }
    }
}

/// `sextant validate`: predicted against measured per row, then summaries.
pub fn validation(
    rows: &[sextant_planner::validate::RowResult],
    sum: &sextant_planner::validate::Summary,
    unrepresentable: &[sextant_planner::runs::Unrepresentable],
    md: bool,
) -> String {
    let mut s = String::new();
    if md {
        let _ = writeln!(s, "## Predicted against measured step time\n");
    }
    rows_table(&mut s, rows, md);
    let _ = writeln!(s);
    if md {
        let _ = writeln!(s, "## Summary\n");
    }
    summary_lines(&mut s, sum, md);
    if !unrepresentable.is_empty() {
        let _ = writeln!(s, "\nRows not estimated:");
        for u in unrepresentable {
            let _ = writeln!(
                s,
                "{}{}: {}",
                if md { "- " } else { "  " },
                csv_cell(&u.id, md),
                sextant_planner::json::one_line(&u.reason, 400)
            );
        }
    }
    s
}

/// Predicted against measured peak memory, like with like, for the rows that
/// state one (`validate`).
pub fn memory_validation(rows: &[sextant_planner::validate::MemoryRow], md: bool) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        return s;
    }
    let head = [
        "run",
        "framework",
        "kind",
        "stage",
        "measured",
        "predicted",
        "error",
    ];
    if md {
        let _ = writeln!(s, "\n## Predicted against measured peak memory\n");
        let _ = writeln!(s, "| {} |", head.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(head.len()));
    } else {
        let _ = writeln!(
            s,
            "\nPeak memory, predicted like with like (reserved: tensors, fragmentation and cached blocks; allocated, active: tensors; neither the runtime reserve):"
        );
        let _ = writeln!(
            s,
            "{:<44} {:<13} {:<14} {:>5} {:>9} {:>10} {:>8}",
            head[0], head[1], head[2], head[3], head[4], head[5], head[6]
        );
    }
    for r in rows {
        let stage = match r.stage {
            sextant_planner::runs::MemStage::Max => "max".to_string(),
            sextant_planner::runs::MemStage::Stage(i) => i.to_string(),
        };
        if md {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.1} GiB | {:.1} GiB | {:+.1}% |",
                csv_cell(&r.id, md),
                r.framework,
                r.kind.name(),
                stage,
                r.measured_gib,
                r.predicted_gib,
                100.0 * r.error
            );
        } else {
            let _ = writeln!(
                s,
                "{:<44} {:<13} {:<14} {:>5} {:>7.1}Gi {:>8.1}Gi {:>+7.1}%",
                csv_cell(&r.id, md),
                r.framework,
                r.kind.name(),
                stage,
                r.measured_gib,
                r.predicted_gib,
                100.0 * r.error
            );
        }
    }
    let _ = writeln!(s);
    for g in sextant_planner::validate::memory_summary(rows) {
        let _ = writeln!(
            s,
            "{}{:<26} {:>4} rows  median |error| {:>5.1}%  max {:>5.1}%  mean signed {:>+6.1}%",
            if md { "- " } else { "" },
            csv_cell(&g.group, md),
            g.rows,
            100.0 * g.median_abs,
            100.0 * g.max_abs,
            100.0 * g.mean_signed
        );
    }
    s
}

/// How often the measured step time fell inside its error band, each band drawn
/// from the other rows' errors; then the rows that fell outside.
pub fn band_coverage(
    checks: &[sextant_planner::validate::BandCheck],
    held: &str,
    md: bool,
) -> String {
    let mut s = String::new();
    let cov = sextant_planner::validate::coverage(checks);
    let Some(all) = cov.first().filter(|c| c.rows > 0) else {
        return s;
    };
    let pct = |c: &sextant_planner::validate::Coverage| 100.0 * c.inside as f64 / c.rows as f64;
    let kinds: Vec<String> = cov[1..]
        .iter()
        .map(|c| format!("{} {} of {} ({:.0}%)", c.group, c.inside, c.rows, pct(c)))
        .collect();
    let _ = writeln!(
        s,
        "\n{}Error bands (claiming {:.0}% on average, each drawn with {held}): measured inside for {} of {} rows ({:.0}%){}{}",
        if md { "**" } else { "" },
        100.0 * all.nominal,
        all.inside,
        all.rows,
        pct(all),
        if kinds.is_empty() { String::new() } else { format!("; {}", kinds.join(", ")) },
        if md { "**" } else { "" },
    );
    for c in checks.iter().filter(|c| !c.inside) {
        let _ = writeln!(
            s,
            "{}outside: {} measured {:.3} s, band {:.3} to {:.3} s ({})",
            if md { "- " } else { "  " },
            c.id,
            c.measured_secs,
            c.low_secs,
            c.high_secs,
            c.basis
        );
    }
    s
}

/// `sextant validate --cross-validate`.
pub fn cross_validation(
    rows: &[sextant_planner::validate::RowResult],
    sum: &sextant_planner::validate::Summary,
    scales: &[(String, String, f64)],
    md: bool,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}Leave-one-source-out: each source predicted with its profiles' compute-efficiency scale refitted on the other sources", if md { "## " } else { "" });
    if md {
        let _ = writeln!(s);
    }
    for (src, prof, k) in scales {
        let _ = writeln!(
            s,
            "{}held out {src}: {prof} scale {k:.3}",
            if md { "- " } else { "  " }
        );
    }
    let _ = writeln!(s);
    rows_table(&mut s, rows, md);
    let _ = writeln!(s);
    summary_lines(&mut s, sum, md);
    s
}

/// Sanity notes, one line each, after a blank line (nothing when there are none).
pub fn notes(list: &[String]) -> String {
    let mut s = String::new();
    if !list.is_empty() {
        s.push('\n');
    }
    for n in list {
        let _ = writeln!(s, "note: {n}");
    }
    s
}

/// What the search claims over the experts' configurations (`validate --search`):
/// per run, the first plan against the measurement and against the experts'
/// configuration, and the claimed gain split into knob groups.
pub fn search_claims(
    claims: &[sextant_planner::claims::Claim],
    none: &[sextant_planner::claims::NoClaim],
    md: bool,
) -> String {
    let mut s = String::new();
    if md {
        let _ = writeln!(s, "\n## The search against the experts\n");
        let _ = writeln!(
            s,
            "| run | measured s | experts' config, predicted s | first plan, predicted s | first / measured | first / experts' | model error at experts' | first plan | claimed gain by knob |"
        );
        let _ = writeln!(s, "|{}", "---|".repeat(9));
    } else {
        let _ = writeln!(
            s,
            "\nThe search against the experts: the first plan for each run's model, machine, batch and software stack,\npriced against the measurement (first/meas) and the experts' own configuration (first/exp), the model's\nerror at the experts' configuration, and the claimed gain split into knob groups (factors multiply to first/exp):"
        );
        let _ = writeln!(
            s,
            "{:<44} {:>9} {:>9} {:>10} {:>9}  first plan",
            "run", "measured", "first/meas", "first/exp", "model err"
        );
    }
    for c in claims {
        let steps: Vec<String> = c
            .steps
            .iter()
            .map(|st| format!("{} x{:.2}", st.change, st.factor))
            .collect();
        if md {
            let _ = writeln!(
                s,
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:+.1}% | {} | {} |",
                c.id,
                c.measured_secs,
                c.experts_secs,
                c.top_secs,
                c.top_over_measured,
                c.top_over_experts,
                100.0 * c.model_error,
                c.top,
                steps.join("; ")
            );
        } else {
            let _ = writeln!(
                s,
                "{:<44} {:>8.3}s {:>9.3} {:>10.3} {:>+8.1}%  {}",
                c.id,
                c.measured_secs,
                c.top_over_measured,
                c.top_over_experts,
                100.0 * c.model_error,
                c.top
            );
            for st in &steps {
                let _ = writeln!(s, "{:<44}   {st}", "");
            }
        }
    }
    if let Some(sum) = sextant_planner::claims::summarize(claims) {
        let _ = writeln!(
            s,
            "{}median first/measured {:.3}, first/experts' {:.3}; {} of {} runs promise more than 15% over the measurement",
            if md { "\n" } else { "" },
            sum.median_top_over_measured,
            sum.median_top_over_experts,
            sum.below_085,
            sum.runs
        );
    }
    for n in none {
        let _ = writeln!(s, "{}{}: {}", if md { "- " } else { "  " }, n.id, n.reason);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::megatron_layout;
    use sextant_planner::config::Layout;

    /// The plan table's layout reads back through `--pp-layout` unchanged.
    #[test]
    fn explicit_layouts_round_trip_through_megatron_syntax() {
        for (layers, pp) in [
            (vec![0, 1, 1, 1, 1, 1, 1, 0], 4u64),
            (vec![3, 4, 4, 4, 4, 4, 4, 3], 4),
            (vec![0, 2, 2, 1], 2),
            (vec![5, 5], 2),
        ] {
            for mtp in [0, 1, 2] {
                let text = megatron_layout(&layers, mtp);
                let back =
                    Layout::from_megatron(&text, pp).unwrap_or_else(|e| panic!("{text}: {e}"));
                assert_eq!(
                    (back.layout, back.mtp_layers),
                    (
                        Layout::Explicit {
                            layers: layers.clone()
                        },
                        mtp
                    ),
                    "{text}"
                );
            }
        }
        assert_eq!(megatron_layout(&[0, 1, 1, 1, 1, 1, 1, 0], 0), "E|(t|)*6L");
        // Megatron-Bridge's DeepSeek-V3 layout, its MTP layer kept.
        let mut dsv3 = vec![4u64; 16];
        dsv3[15] = 1;
        assert_eq!(megatron_layout(&dsv3, 1), "Et*4|(t*4|)*14tmL");
    }
}
