//! What each fuzz target does with its input, shared by the cargo-fuzz targets in
//! `fuzz/fuzz_targets/` and the stable replay test `tests/it/fuzz_replay.rs`, so
//! that the corpus is replayed through exactly the code that was fuzzed.
//!
//! Each function takes arbitrary bytes, returns early on invalid UTF-8, parses the
//! text and, when it parses, runs the cheap pure code downstream of the parser. An
//! `Err` anywhere is fine; a panic is a bug. Nothing here reads a file.

use crate::calibration::Target;
use crate::config::{
    Dispatcher, Layout, Overlap, ParallelConfig, Precision, Recompute, Workload, Zero,
};
use crate::cost;
use crate::hardware::{builtin_profile, Cluster, HardwareProfile};
use crate::model::ModelSpec;
use crate::plan::PlanFile;

/// The fuzz targets, in the order the replay test reports them.
pub const TARGETS: &[&str] = &[
    "hf_config",
    "model_json",
    "profile_json",
    "plan_json",
    "runs_csv",
    "run_json",
    "overlay_json",
    "training_log",
    "kineto_trace",
    "bench_json",
];

/// Runs the named target on `data`. Panics on an unknown name.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "hf_config" => fuzz_hf_config(data),
        "model_json" => fuzz_model_json(data),
        "profile_json" => fuzz_profile_json(data),
        "plan_json" => fuzz_plan_json(data),
        "runs_csv" => fuzz_runs_csv(data),
        "run_json" => fuzz_run_json(data),
        "overlay_json" => fuzz_overlay_json(data),
        "training_log" => fuzz_training_log(data),
        "kineto_trace" => fuzz_kineto_trace(data),
        "bench_json" => fuzz_bench_json(data),
        other => panic!("unknown fuzz target '{other}'"),
    }
}

/// One GPU, no parallelism, one micro-batch of one sequence.
fn single(dp: u64) -> ParallelConfig {
    ParallelConfig {
        tp: 1,
        pp: 1,
        vpp: 1,
        cp: 1,
        ep: 1,
        etp: 1,
        dp,
        sp: false,
        mbs: 1,
        zero: Zero::None,
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

fn workload(seq: u64, global_batch: u64) -> Workload {
    Workload {
        seq,
        global_batch,
        precision: Precision::Bf16,
        moe_imbalance: 1.0,
        moe_capacity: None,
    }
}

/// A parsed model: parameter counts, the summary line, and one estimate on one GPU
/// (`evaluate`, so that memory and time are computed even when it does not fit).
fn exercise_model(m: &ModelSpec) {
    let _ = m.params();
    let _ = m.summary();
    let cluster =
        Cluster::new(builtin_profile("h100-sxm").expect("built-in profile"), 1).expect("one GPU");
    let _ = cost::evaluate(
        m,
        &cluster,
        &workload(4096, 1),
        &single(1),
        cost::Assumptions::default(),
    );
}

pub fn fuzz_hf_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = crate::hf::from_hf_config(text, "fuzz") {
        exercise_model(&m);
    }
}

pub fn fuzz_model_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = ModelSpec::from_json(text) {
        exercise_model(&m);
    }
}

/// A parsed profile: a small GPT on one GPU and data-parallel over two nodes.
pub fn fuzz_profile_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(p) = HardwareProfile::from_json(text) else {
        return;
    };
    let _ = p.peak_flops(true);
    let _ = p.usable_bytes();
    let model = crate::presets::gpt("fuzz", "fuzz", 4, 1024, 16);
    for gpus in [1, 2 * p.node.gpus_per_node] {
        if let Ok(cluster) = Cluster::new(p.clone(), gpus) {
            let _ = cost::evaluate(
                &model,
                &cluster,
                &workload(2048, gpus),
                &single(gpus),
                cost::Assumptions::default(),
            );
        }
    }
}

/// A parsed plan: the chosen plan re-estimated on the plan's own inputs, its
/// pipeline simulated, and the file written back out.
pub fn fuzz_plan_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(p) = PlanFile::from_json(text) else {
        return;
    };
    let _ = p.to_json();
    let Ok(mut cluster) = Cluster::new(p.hardware.clone(), p.gpus) else {
        return;
    };
    cluster.allow_tp_beyond_nvlink = true;
    let cfg = &p.plans[0].config;
    if let Ok(e) = crate::banded::estimate(&p.model, &cluster, &p.workload, cfg) {
        let _ = crate::banded::simulated(e, cfg);
    }
}

/// A parsed CSV: every representable row estimated.
pub fn fuzz_runs_csv(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(rows) = crate::runs::parse_runs(text) else {
        return;
    };
    for case in rows.iter().flatten() {
        let _ = case.estimate();
        let _ = case.measured_step_secs();
    }
}

/// A parsed measured run (what `sextant exec` writes): calibrated against its
/// profile when that is built in, and its configuration estimated.
pub fn fuzz_run_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(r) = crate::calibration::MeasuredRun::from_json(text) else {
        return;
    };
    let _ = r.median_step_secs();
    let Ok(profile) = builtin_profile(&r.profile) else {
        return;
    };
    if let Ok(o) = crate::calibration::calibrate(std::slice::from_ref(&r), &profile) {
        for target in [Target::Stack, Target::Executor] {
            let _ = crate::calibration::apply(&profile, &o, target);
        }
    }
    if let Ok(mut cluster) = Cluster::new(profile, r.world_size) {
        cluster.allow_tp_beyond_nvlink = true;
        let _ = crate::banded::estimate(&r.model, &cluster, &r.workload, &r.config);
    }
}

/// A parsed calibration overlay, applied to its profile and used for one estimate.
pub fn fuzz_overlay_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(o) = crate::calibration::Overlay::from_json(text) else {
        return;
    };
    let Ok(profile) = builtin_profile(&o.profile) else {
        return;
    };
    for target in [Target::Stack, Target::Executor] {
        let Ok(p) = crate::calibration::apply(&profile, &o, target) else {
            continue;
        };
        let gpus = 2 * p.node.gpus_per_node;
        evaluate_small(p, gpus);
    }
}

/// One small GPT priced on `gpus` GPUs of a (calibrated) profile.
fn evaluate_small(p: HardwareProfile, gpus: u64) {
    let model = crate::presets::gpt("fuzz", "fuzz", 4, 1024, 16);
    if let Ok(cluster) = Cluster::new(p, gpus) {
        let _ = cost::evaluate(
            &model,
            &cluster,
            &workload(2048, gpus),
            &single(gpus),
            cost::Assumptions::default(),
        );
    }
}

/// A training log (bytes that are not UTF-8 replaced, as the CLI reads logs): read,
/// summarised with and without the warm-up rule, memory peaks taken.
pub fn fuzz_training_log(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let Ok(log) = crate::trainlog::parse(&text) else {
        return;
    };
    for warmup in [0, crate::trainlog::DEFAULT_WARMUP_ITERS, u64::MAX] {
        if let Ok(s) = log.summary(warmup) {
            assert!(s.step_secs.is_finite() && s.step_secs > 0.0);
        }
    }
    let _ = log.peak_memory_bytes();
    let _ = log.stated.stated();
}

/// A Kineto trace: kernel time per step by class.
pub fn fuzz_kineto_trace(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(k) = crate::kineto::KernelTimes::from_json(text) {
        assert!(k.total_secs().is_finite() && k.steps > 0);
    }
}

/// A parsed benchmark file (`sextant bench`), made into an overlay for a built-in
/// profile (the H100's, and the one whose GPU name it may carry), applied, and used
/// for one estimate.
pub fn fuzz_bench_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(f) = crate::bench::BenchFile::from_json(text) else {
        return;
    };
    let _ = f.summary();
    for name in ["h100-sxm", "a100-80g"] {
        let Ok(profile) = builtin_profile(name) else {
            continue;
        };
        let Ok((o, _)) = crate::bench::overlay(std::slice::from_ref(&f), &profile) else {
            continue;
        };
        for target in [Target::Stack, Target::Executor] {
            if let Ok(p) = crate::calibration::apply(&profile, &o, target) {
                let gpus = p.node.gpus_per_node;
                evaluate_small(p, gpus);
            }
        }
    }
}
