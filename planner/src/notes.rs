//! Sanity notes on a workload and a plan: things a practitioner would question
//! before running it. They never change a number; `plan` and `estimate` print them.

use crate::config::{ParallelConfig, Workload};

/// Notes on the workload alone (`gpus` GPUs) and, when given, on one plan.
pub fn sanity_notes(
    w: &Workload,
    gpus: u64,
    default_seq: u64,
    cfg: Option<&ParallelConfig>,
) -> Vec<String> {
    let mut out = Vec::new();
    let tokens = w.global_batch.saturating_mul(w.seq);
    let per_gpu = tokens as f64 / gpus.max(1) as f64;
    // Below one sequence per GPU the batch cannot fill data parallelism without
    // splitting sequences (TP, PP or CP over the rest), whose communication and
    // pipeline fill do not shrink with the batch. What that costs is the plan's
    // own bubble and communication columns, not a claim made here.
    if w.global_batch < gpus {
        out.push(format!(
            "global batch {} sequences is smaller than the {gpus} GPUs ({per_gpu:.0} tokens per GPU per step): data parallelism takes at most {} ways, so each sequence's work spreads over {} or more GPUs (TP x PP x CP), whose communication and pipeline fill do not shrink with the batch (see the bubble and comm columns; raise --global-batch, or plan on fewer GPUs)",
            w.global_batch,
            w.global_batch,
            gpus.div_ceil(w.global_batch.max(1))
        ));
    }
    if w.seq != default_seq {
        out.push(format!(
            "--seq {} makes each of the {} sequences {} tokens: {:.2}M tokens per step, {:.1}x the tokens of --seq {default_seq} at the same --global-batch",
            w.seq,
            w.global_batch,
            w.seq,
            tokens as f64 / 1e6,
            w.seq as f64 / default_seq as f64
        ));
    }
    if let Some(c) = cfg {
        let m = c.micro_batches(w);
        if c.pp > 1 && m == 1 {
            out.push(format!(
                "one micro-batch per step with pp {}: the stages run one after another, so the pipeline is idle (pp-1)/pp = {:.0}% of the time",
                c.pp,
                100.0 * (c.pp - 1) as f64 / c.pp as f64
            ));
        } else if c.pp > 1 && m < c.pp {
            out.push(format!("{m} micro-batches per step on {} pipeline stages: fewer micro-batches than stages leaves most of the pipeline idle", c.pp));
        }
    }
    out
}

/// A note when a mixture-of-experts plan is priced on a profile that states no host
/// costs: its MoE layers are then priced as if the host never held the GPU back
/// (`cost/host.rs`), which is optimistic at small micro-batches.
pub fn host_notes(moe: bool, profile: &crate::hardware::HardwareProfile) -> Vec<String> {
    let e = &profile.efficiency;
    if moe && e.host_op_us <= 0.0 && e.host_kernel_us <= 0.0 {
        vec![format!(
            "profile {} states no host costs (efficiency.host_op_us, host_kernel_us): its MoE layers are priced as if the GPU never waited for the host, optimistic at small micro-batches (the built-in profiles carry 90 and 3 us)",
            profile.name
        )]
    } else {
        Vec::new()
    }
}

/// Below this much GPU time per transformer layer and micro-batch (forward,
/// backward and recomputation, on the critical stage, without waiting for the
/// host) every published dense run took longer than the GPU time alone: vTrain's
/// single-node A100 iterations (tests/data/vtrain_single_node.csv,
/// Megatron-DeepSpeed: 582 rows) and the Ultra-Scale Playbook's nanotron runs
/// (tests/data/published_sweeps.csv); no published run of the Megatron-Core stack
/// has layers this small. The cost model prices the host's share for the stacks
/// whose kernels it counts (`cost/host.rs`); for the others this note says it is
/// missing. `small_layers_pay_the_host` checks it and prints the table;
/// docs/trust.md, "Small layers". A threshold for a note, not a constant of the
/// cost model: no number changes with it.
pub const SMALL_LAYER_SECS: f64 = 2e-3;

/// The share of a step the GPU spends waiting for the host above which `plan` and
/// `estimate` say so. A threshold for a note: no number changes with it.
pub const HOST_BOUND_SHARE: f64 = 0.10;

/// GPU time per transformer layer and micro-batch on the stage that sets the
/// pace (its time per micro-batch over its layers, less what it waits for the
/// host), what [`SMALL_LAYER_SECS`] is compared with; `None` for a stage without
/// layers.
pub fn layer_secs(est: &crate::cost::Estimate) -> Option<f64> {
    let stage = est.stages.get(est.critical_stage as usize)?;
    let host = est.time.host_wait / est.micro_batches.max(1) as f64;
    (stage.layers > 0).then(|| (stage.secs_per_micro_batch - host).max(0.0) / stage.layers as f64)
}

/// A note when a dense plan's layers are so small that the host issuing their
/// kernels holds the GPU back: how much of the step the cost model gives the host
/// (`host_layer_kernel_us` is the profile's figure), or, for a stack or profile
/// it does not price the host for, that the step will be slower than priced.
pub fn small_layer_notes(
    moe: bool,
    est: &crate::cost::Estimate,
    a: &crate::cost::Assumptions,
    hw: &crate::hardware::HardwareProfile,
) -> Vec<String> {
    let host_layer_kernel_us = hw.efficiency.host_layer_kernel_us;
    let Some(per_layer) = layer_secs(est).filter(|_| !moe) else {
        return Vec::new();
    };
    let share = est.time.host_wait / est.step_secs.max(f64::MIN_POSITIVE);
    if share >= HOST_BOUND_SHARE {
        return vec![format!(
            "the GPU waits for the host {:.0}% of this step: each layer runs {:.1} ms of GPU time per micro-batch, less than the host takes to issue its kernels ({:.0} us each, a figure fitted on Megatron-DeepSpeed's A100 iterations and untested on this stack and host, so the band does not cover it: docs/trust.md); CUDA graphs over the whole layer (priced by --cuda-graphs full_iteration) or more work per layer (a larger micro-batch, less tensor parallelism) would give the time back",
            100.0 * share,
            per_layer * 1e3,
            host_layer_kernel_us
        )];
    }
    // Where the host is priced (or a whole-step graph leaves nothing to issue),
    // a wait under the threshold is no news.
    let priced = host_layer_kernel_us > 0.0 && a.framework.counts_dense_kernels();
    if per_layer >= SMALL_LAYER_SECS || priced || a.cuda_graphs.full_iteration {
        return Vec::new();
    }
    vec![format!(
        "each layer takes {:.1} ms of GPU time per micro-batch (forward and backward): every published run with layers under {:.0} ms (Megatron-DeepSpeed and nanotron) took longer than its GPU time, held back by the host issuing the kernels, which is not priced for this stack or profile (docs/trust.md); expect this step to be slower, or give each layer more work (a larger micro-batch, less tensor parallelism)",
        per_layer * 1e3,
        SMALL_LAYER_SECS * 1e3
    )]
}

/// Plans whose ranking keys lie within this fraction of the first plan's are ties as
/// far as the evidence goes: the published-sweep test checks the model's order only
/// for configurations measured 5% or more apart (`published_sweeps_are_ordered`),
/// and its median error on the published runs is 4-5% (docs/trust.md). A threshold
/// for a note: no ranking changes with it.
pub const TIE: f64 = 0.05;

/// A note when the first plan is tied (within [`TIE`]) with plans a practitioner
/// would rather run: one holding clearly less memory when the first sits at the
/// edge of the usable HBM, or one with fewer, deeper virtual stages when the first
/// gives each virtual stage a single layer. `key` is what the ranking sorted by.
pub fn tie_notes(
    top: &[crate::search::Candidate],
    key: impl Fn(&crate::search::Candidate) -> f64,
    cap_bytes: f64,
) -> Vec<String> {
    let Some(first) = top.first() else {
        return Vec::new();
    };
    let k0 = key(first);
    let tied: Vec<(usize, &crate::search::Candidate)> = top
        .iter()
        .enumerate()
        .filter(|(_, c)| key(c) <= k0 * (1.0 + TIE))
        .collect();
    if tied.len() < 2 {
        return Vec::new();
    }
    let gib = |c: &crate::search::Candidate| c.estimate.memory.total / crate::hardware::GIB;
    let mem = |c: &crate::search::Candidate| c.estimate.memory.total / cap_bytes;
    // Layers per virtual stage on the stage that sets the pace.
    let depth = |c: &crate::search::Candidate| {
        let e = &c.estimate;
        e.stages
            .get(e.critical_stage as usize)
            .map_or(0.0, |s| s.layers as f64 / c.config.vpp.max(1) as f64)
    };
    let behind = |c: &crate::search::Candidate| 100.0 * (key(c) / k0 - 1.0);
    let mut why = Vec::new();
    // The best-ranked tied plan with a margin, when the first has none.
    if mem(first) >= 0.95 {
        if let Some((i, c)) = tied.iter().find(|(_, c)| mem(c) <= 0.85) {
            why.push(format!(
                "plan {} ({:+.1}%) needs {:.1} GiB where the first needs {:.1} of the {:.1} a plan may use",
                i + 1,
                behind(c),
                gib(c),
                gib(first),
                cap_bytes / crate::hardware::GIB
            ));
        }
    }
    if first.config.vpp > 1 && depth(first) <= 1.0 {
        if let Some((i, c)) = tied.iter().find(|(_, c)| depth(c) >= 2.0) {
            why.push(format!(
                "plan {} ({:+.1}%) gives each virtual stage {:.0} layers where the first gives one (PP {} x VPP {} = {} virtual stages against PP {} x VPP {} = {}: fewer pipeline messages and launches)",
                i + 1,
                behind(c),
                depth(c),
                c.config.pp,
                c.config.vpp,
                c.config.pp * c.config.vpp,
                first.config.pp,
                first.config.vpp,
                first.config.pp * first.config.vpp
            ));
        }
    }
    if why.is_empty() {
        return Vec::new();
    }
    vec![format!(
        "plans 1 to {} rank within {:.0}% of the first, and the published sweeps check the model's order only for configurations measured 5% or more apart (docs/trust.md), so it cannot tell these apart: {}; run the one you would trust",
        tied.last().map_or(1, |t| t.0 + 1),
        TIE * 100.0,
        why.join(", and ")
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Precision;

    fn w(seq: u64, gbs: u64) -> Workload {
        Workload {
            seq,
            global_batch: gbs,
            precision: Precision::Bf16,
            moe_imbalance: 1.0,
            moe_capacity: None,
        }
    }

    /// A dense Megatron-Core layout: TP `tp` (with SP), PP `pp`, DP `dp`, micro-batch 1.
    fn dense(tp: u64, pp: u64, dp: u64) -> ParallelConfig {
        use crate::config::{Dispatcher, Layout, Overlap, Recompute, Zero};
        ParallelConfig {
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
            schedule: crate::schedule::Schedule::OneFOneB,
        }
    }

    #[test]
    fn notes_name_the_problem() {
        assert!(sanity_notes(&w(4096, 1024), 128, 4096, None).is_empty());
        let n = sanity_notes(&w(4096, 64), 128, 4096, None);
        assert!(
            n.len() == 1
                && n[0].contains("2048 tokens per GPU")
                && n[0].contains("at most 64 ways")
                && n[0].contains("spreads over 2 or more GPUs"),
            "{n:?}"
        );
        let n = sanity_notes(&w(8192, 1024), 128, 4096, None);
        assert!(
            n.len() == 1 && n[0].contains("8.39M tokens") && n[0].contains("2.0x"),
            "{n:?}"
        );
        let c = dense(8, 4, 4);
        let n = sanity_notes(&w(4096, 4), 128, 4096, Some(&c));
        assert_eq!(c.micro_batches(&w(4096, 4)), 1);
        assert!(
            n.iter()
                .any(|s| s.contains("one micro-batch per step with pp 4") && s.contains("75%")),
            "{n:?}"
        );
        let n = sanity_notes(&w(4096, 8), 128, 4096, Some(&c));
        assert_eq!(c.micro_batches(&w(4096, 8)), 2);
        assert!(
            n.iter()
                .any(|s| s.contains("2 micro-batches per step on 4 pipeline stages")),
            "{n:?}"
        );
    }

    #[test]
    fn a_profile_without_host_costs_is_named_for_moe_plans() {
        let mut p = crate::hardware::builtin_profile("h100-sxm").unwrap();
        assert!(host_notes(true, &p).is_empty());
        p.efficiency.host_op_us = 0.0;
        p.efficiency.host_kernel_us = 0.0;
        assert!(host_notes(false, &p).is_empty());
        let n = host_notes(true, &p);
        assert!(n.len() == 1 && n[0].contains("host_op_us"), "{n:?}");
    }

    /// The small-layer notes: a dense plan whose GPU waits for the host a tenth of
    /// the step or more says how much; a plan with small layers on a stack whose
    /// host is not priced (torchtitan) says that it is missing; MoE plans and
    /// plans with enough work per layer get neither.
    #[test]
    fn small_layers_are_named() {
        let hw = crate::hardware::builtin_profile("h100-sxm").unwrap();
        let cluster = crate::hardware::Cluster::new(hw.clone(), 64).unwrap();
        let core = crate::cost::Assumptions::default();
        let model = crate::presets::resolve("8b").unwrap().spec;
        let mut c = dense(8, 1, 8);
        let e = crate::cost::estimate(&model, &cluster, &w(2048, 512), &c).unwrap();
        let per_layer = layer_secs(&e).unwrap();
        assert!(per_layer < SMALL_LAYER_SECS, "{per_layer}");
        let share = e.time.host_wait / e.step_secs;
        assert!(share >= HOST_BOUND_SHARE, "{:?}", e.time);
        let n = small_layer_notes(false, &e, &core, &hw);
        assert!(
            n.len() == 1
                && n[0].contains(&format!("{:.0}% of this step", 100.0 * share))
                && n[0].contains(&format!("{:.1} ms of GPU time", per_layer * 1e3)),
            "{n:?}"
        );
        assert!(small_layer_notes(true, &e, &core, &hw).is_empty());
        // A whole-step graph leaves the host nothing to issue: no note.
        let graphed = crate::cost::Assumptions {
            cuda_graphs: crate::cost::CudaGraphs::parse("full_iteration").unwrap(),
            ..Default::default()
        };
        let g = crate::cost::evaluate(&model, &cluster, &w(2048, 512), &c, graphed).unwrap();
        assert_eq!(g.time.host_wait, 0.0);
        assert!(small_layer_notes(false, &g, &graphed, &hw).is_empty());
        // The same layers on a stack whose host the model does not price.
        let titan = crate::cost::Assumptions {
            framework: crate::cost::Framework::Torchtitan,
            ..Default::default()
        };
        let t = crate::cost::evaluate(&model, &cluster, &w(2048, 512), &c, titan).unwrap();
        assert_eq!(t.time.host_wait, 0.0);
        let n = small_layer_notes(false, &t, &titan, &hw);
        assert!(n.len() == 1 && n[0].contains("not priced"), "{n:?}");
        c.tp = 1;
        c.sp = false;
        c.dp = 64;
        c.mbs = 2;
        let e = crate::cost::estimate(&model, &cluster, &w(2048, 512), &c).unwrap();
        assert!(layer_secs(&e).unwrap() >= SMALL_LAYER_SECS);
        assert!(small_layer_notes(false, &e, &core, &hw).is_empty());
    }
}

/// A note on a plan trained with `framework` when the published runs of that
/// framework all took longer than the model priced them (torchtitan: every one of
/// its runs), or when none validates it: the point estimate (step time,
/// tokens/s, MFU) is not corrected for that, only the band's upper end carries it,
/// so plans of different frameworks compare fairly only by that end.
pub fn framework_notes(framework: crate::cost::Framework) -> Vec<String> {
    if framework.is_megatron_core() {
        return Vec::new();
    }
    let mut errors: Vec<f64> = crate::uncertainty::validation()
        .samples
        .iter()
        .filter(|s| s.framework == framework)
        .map(|s| s.rel_error)
        .collect();
    errors.sort_by(f64::total_cmp);
    let name = framework.name();
    match errors.as_slice() {
        [] => vec![format!(
            "no published {name} run validates these numbers: its band borrows every framework's errors, and step time, tokens/s and MFU are the model's point estimate; compare it with another framework's plans by the upper end"
        )],
        // Sorted errors: the first is the most optimistic, the last the closest.
        [most, .., closest] if errors.len() >= 3 && *closest < 0.0 => vec![format!(
            "every one of the {} published {name} runs took longer than the model priced it ({:.0}% to {:.0}% fast, median {:.0}%): step time, tokens/s and MFU here are not corrected for that, only the band's upper end (which ranks by default) carries it; compare with another framework's plans by that end",
            errors.len(),
            -100.0 * closest,
            -100.0 * most,
            -100.0 * errors[errors.len() / 2]
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod framework_tests {
    use super::framework_notes;
    use crate::cost::Framework;

    #[test]
    fn framework_notes_say_when_the_point_is_not_corrected() {
        assert!(framework_notes(Framework::MegatronCore).is_empty());
        let tt = framework_notes(Framework::Torchtitan).join(" ");
        assert!(
            tt.contains("published torchtitan runs took longer") && tt.contains("% to "),
            "{tt}"
        );
        let st = framework_notes(Framework::ScaleTorch).join(" ");
        assert!(st.contains("no published scaletorch run"), "{st}");
    }
}

/// A note when a plan needs 95% or more of the memory a plan may use (`cap_bytes`,
/// HBM less the headroom): no published Megatron-Core run states its peak memory,
/// so the memory model is checked only against torchtitan's and nanotron's peaks
/// (docs/trust.md), and dropless MoE routing moves activation memory from step to
/// step. `--mem-headroom` asks for a margin.
pub fn memory_edge_notes(total_bytes: f64, cap_bytes: f64, moe: bool) -> Vec<String> {
    if cap_bytes.is_nan() || cap_bytes <= 0.0 || total_bytes < 0.95 * cap_bytes {
        return Vec::new();
    }
    let gib = crate::hardware::GIB;
    vec![format!(
        "the first plan needs {:.1} of the {:.1} GiB a plan may use: the memory model has been checked against measured peaks of torchtitan and nanotron runs only (docs/trust.md){}; for a margin, re-plan with --mem-headroom 0.15",
        total_bytes / gib,
        cap_bytes / gib,
        if moe {
            ", and dropless routing moves activation memory from step to step"
        } else {
            ""
        }
    )]
}

#[cfg(test)]
mod memory_edge_tests {
    use super::memory_edge_notes;

    #[test]
    fn memory_edge_notes_only_at_the_edge() {
        let gib = crate::hardware::GIB;
        assert!(memory_edge_notes(70.0 * gib, 75.6 * gib, false).is_empty());
        let n = memory_edge_notes(75.4 * gib, 75.6 * gib, true).join(" ");
        assert!(
            n.contains("75.4 of the 75.6 GiB")
                && n.contains("dropless")
                && n.contains("--mem-headroom"),
            "{n}"
        );
        assert!(!memory_edge_notes(75.4 * gib, 75.6 * gib, false)
            .join(" ")
            .contains("dropless"));
    }
}
