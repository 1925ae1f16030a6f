//! Absurd profile and calibration numbers (issue 22 items 12 and 14): every number of
//! a profile or an overlay is refused in one line naming it, or the estimates stay
//! finite; `calibrate` refuses runs it cannot fit, counts a repeated run once and
//! does not take a relabelled CPU run for a GPU one.

use serde_json::{json, Value};
use sextant_planner::banded::estimate;
use sextant_planner::config::{Precision, Workload};
use sextant_planner::hardware::{builtin_profiles, Cluster, HardwareProfile};
use sextant_planner::search::{search, SearchSpace};

use crate::common::{count_hostile, fails_with_one_line, sextant, stderr, stdout, TempDir};

type Get = fn(&mut HardwareProfile) -> &mut f64;

/// Accessors for a profile's numbers, named by their path in the file.
macro_rules! fields {
    ($($($seg:ident).+),* $(,)?) => {
        vec![$({
            fn get(p: &mut HardwareProfile) -> &mut f64 {
                &mut p.$($seg).+
            }
            ([$(stringify!($seg)),+].join("."), get as Get)
        }),*]
    };
}

/// Every floating-point number of a profile outside its curves and published points.
fn scalar_fields() -> Vec<(String, Get)> {
    fields![
        gpu.peak_tflops.bf16,
        gpu.peak_tflops.fp16,
        gpu.peak_tflops.fp8,
        gpu.hbm_gib,
        gpu.hbm_tbytes_per_s,
        node.nvlink_gbytes_per_s,
        network.nic_gbytes_per_s,
        network.latency_us,
        efficiency.gemm_bf16,
        efficiency.gemm_bf16_bare,
        efficiency.gemm_fp8,
        efficiency.gemm_overhead_us,
        efficiency.attention_fwd,
        efficiency.attention_bwd,
        efficiency.hbm,
        efficiency.nvlink_busbw,
        efficiency.nvls_busbw,
        efficiency.nvlink_latency_us,
        efficiency.network_busbw,
        efficiency.overlap_slowdown,
        efficiency.host_op_us,
        efficiency.host_kernel_us,
        efficiency.host_layer_kernel_us,
        memory.reserve_gib,
        memory.fragmentation,
        memory.headroom,
    ]
}

const HOSTILE: [f64; 11] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    1e-308,
    5e-324,
    0.0,
    -0.0,
    -1.0,
    1e308,
    1e15,
    f64::MAX,
];

/// The numeric leaves of a JSON value, by path, outside `skip`ped keys.
fn numbers(v: &Value, path: &str, skip: &[&str], out: &mut Vec<String>) {
    match v {
        Value::Number(_) => out.push(path.to_string()),
        Value::Object(m) => {
            for (k, x) in m {
                if !skip.contains(&k.as_str()) {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    numbers(x, &p, skip, out);
                }
            }
        }
        _ => {}
    }
}

/// A NaN or infinity in an estimate: serde_json writes them as null, and only the
/// optional parts of an estimate may be null.
fn non_finite(v: &Value, path: &str) -> Option<String> {
    match v {
        Value::Null
            if !["band", "moe_routing", "capacity_factor"]
                .iter()
                .any(|k| path.ends_with(k)) =>
        {
            Some(path.to_string())
        }
        Value::Number(n) if !n.as_f64().is_some_and(f64::is_finite) => Some(path.to_string()),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| non_finite(x, &format!("{path}[{i}]"))),
        Value::Object(m) => m
            .iter()
            .find_map(|(k, x)| non_finite(x, &format!("{path}.{k}"))),
        _ => None,
    }
}

/// The plans to estimate on a profile: the best 16-GPU plans of a dense and an MoE
/// model (NVLink and network collectives, the pipeline, all-to-all), in BF16 and,
/// where the GPU has it, FP8.
struct Probe {
    model: sextant_planner::model::ModelSpec,
    workload: Workload,
    gpus: u64,
    configs: Vec<sextant_planner::config::ParallelConfig>,
}

fn probes(p: &HardwareProfile) -> Vec<Probe> {
    let mut v = Vec::new();
    for name in ["llama3-8b", "mixtral-8x7b"] {
        let model = sextant_planner::presets::resolve(name).unwrap().spec;
        let mut precisions = vec![Precision::Bf16];
        if p.gpu.peak_tflops.fp8 > 0.0 {
            precisions.push(Precision::Fp8);
        }
        for precision in precisions {
            let workload = Workload {
                seq: 4096,
                global_batch: 64,
                precision,
                moe_imbalance: 1.0,
                moe_capacity: None,
            };
            // 16 GPUs, or more where the model does not fit 16 (Mixtral on 40 GB).
            let r = [16, 32, 64]
                .into_iter()
                .map(|gpus| {
                    let cluster = Cluster::new(p.clone(), gpus).unwrap();
                    (
                        gpus,
                        search(&model, &cluster, &workload, &SearchSpace::default(), 3),
                    )
                })
                .find(|(_, r)| !r.top.is_empty());
            let Some((gpus, r)) = r else {
                panic!("{name} on up to 64 {} has no plan", p.name)
            };
            let configs = r.top.iter().map(|c| c.config.clone()).collect();
            v.push(Probe {
                model: model.clone(),
                workload,
                gpus,
                configs,
            });
        }
    }
    v
}

/// Estimates every probe on `p`; returns the path of a non-finite number, if any.
fn estimates_stay_finite(p: &HardwareProfile, probes: &[Probe]) -> Result<u32, String> {
    let mut n = 0;
    for pr in probes {
        let Ok(cluster) = Cluster::new(p.clone(), pr.gpus) else {
            return Ok(0);
        };
        for cfg in &pr.configs {
            // A configuration that no longer fits is a rejection: data, not a number.
            if let Ok(e) = estimate(&pr.model, &cluster, &pr.workload, cfg) {
                n += 1;
                let v = serde_json::to_value(sextant_planner::format::Estimate::from(&e)).unwrap();
                if let Some(path) = non_finite(&v, "estimate") {
                    return Err(path);
                }
            }
        }
    }
    Ok(n)
}

/// Checks one mutated profile: refused in one line naming `field`, or finite.
/// Returns whether it was accepted.
fn refused_or_finite(
    p: &HardwareProfile,
    parsed: Result<HardwareProfile, String>,
    field: &str,
    what: &str,
    probes: &[Probe],
) -> bool {
    match parsed {
        Err(e) => {
            assert!(
                e.contains(field) && !e.contains('\n'),
                "{}: {what}: the refusal does not name {field} in one line: {e}",
                p.name
            );
            false
        }
        Ok(q) => {
            if let Err(path) = estimates_stay_finite(&q, probes) {
                panic!(
                    "{}: {what} was accepted and made {path} NaN or infinite",
                    p.name
                );
            }
            true
        }
    }
}

/// Every number of every built-in profile set to NaN, the infinities, 0, -0,
/// negative, the smallest and largest doubles: the profile is refused in one line
/// naming the field, or every estimate stays finite. Returns (cases, accepted).
fn every_profile_number_refused_or_finite() -> (u32, u32) {
    let (mut cases, mut accepted) = (0, 0);
    let fields = scalar_fields();
    for base in builtin_profiles() {
        let probes = probes(&base);
        assert!(estimates_stay_finite(&base, &probes).unwrap() > 0);
        // Every number in the file is either one of the accessors or below.
        let file = serde_json::to_value(&base).unwrap();
        let mut paths = Vec::new();
        let skip = [
            "sources",
            "gemm_curves",
            "attention_curves",
            "collective_points",
        ];
        numbers(&file, "", &skip, &mut paths);
        for path in &paths {
            assert!(
                fields.iter().any(|(f, _)| f == path)
                    || ["schema_version", "node.gpus_per_node", "node.nvlink_domain"]
                        .contains(&path.as_str()),
                "{}: {path} has no hostile-value case",
                base.name
            );
        }
        for (field, get) in &fields {
            for x in HOSTILE {
                let mut p = base.clone();
                *get(&mut p) = x;
                // Finite values go through the file; NaN and the infinities (which
                // JSON cannot hold) reach `validate` as a plan file's profile would.
                let parsed = if x.is_finite() {
                    HardwareProfile::from_json(&serde_json::to_string(&p).unwrap())
                } else {
                    p.validate().map(|_| p.clone())
                };
                let parsed = parsed.map_err(|e| e.to_string());
                cases += 1;
                accepted +=
                    refused_or_finite(&base, parsed, field, &format!("{field} = {x}"), &probes)
                        as u32;
            }
        }
        // Integers, curves and published points, through the file.
        let edits: Vec<(&str, Vec<&str>, Vec<Value>)> = vec![
            (
                "node.gpus_per_node",
                vec!["node", "gpus_per_node"],
                vec![json!(0), json!(1025), json!(u64::MAX)],
            ),
            (
                "node.nvlink_domain",
                vec!["node", "nvlink_domain"],
                vec![json!(0), json!(7), json!(1u64 << 40)],
            ),
            (
                "collective_points[0].bytes",
                vec!["collective_points", "0", "bytes"],
                vec![json!(0), json!(-1), json!(1e308), json!(1e-308)],
            ),
            (
                "collective_points[0].busbw_gbytes_per_s",
                vec!["collective_points", "0", "busbw_gbytes_per_s"],
                vec![json!(0), json!(1e308), json!(1e-308)],
            ),
            (
                "collective_points[0].ranks",
                vec!["collective_points", "0", "ranks"],
                vec![json!(0), json!(u64::MAX)],
            ),
            (
                "network.by_domains[0].busbw",
                vec!["network", "by_domains", "0", "busbw"],
                vec![json!(0), json!(-1), json!(1e308), json!(1e-308)],
            ),
            (
                "network.by_domains[0].latency_us",
                vec!["network", "by_domains", "0", "latency_us"],
                vec![json!(-1), json!(1e308)],
            ),
            (
                "network.by_domains[0].domains",
                vec!["network", "by_domains", "0", "domains"],
                vec![json!(0), json!(1), json!(u64::MAX)],
            ),
            (
                "GEMM curve point",
                vec!["gemm_curves", "0", "points", "0", "3"],
                vec![json!(0), json!(1e-300), json!(1e308), json!(-5)],
            ),
            (
                "GEMM curve point",
                vec!["gemm_curves", "0", "points", "0", "0"],
                vec![json!(0), json!(1e-300), json!(1e308)],
            ),
            (
                "attention curve point",
                vec!["attention_curves", "0", "points", "0", "2"],
                vec![json!(0), json!(1e-300), json!(1e308)],
            ),
            (
                "attention curve point",
                vec!["attention_curves", "0", "points", "0", "1"],
                vec![json!(0), json!(1e-300), json!(1e308)],
            ),
        ];
        for (field, path, values) in edits {
            for x in values {
                let mut v = file.clone();
                let pointer = format!("/{}", path.join("/"));
                let Some(at) = v.pointer_mut(&pointer) else {
                    continue;
                };
                *at = x.clone();
                let parsed = HardwareProfile::from_json(&v.to_string()).map_err(|e| e.to_string());
                // A number that does not fit the field's type is a parse error, which
                // names its line and column instead.
                let named = match &parsed {
                    Err(e) if e.contains("malformed") => {
                        assert!(!e.contains('\n'), "{e}");
                        cases += 1;
                        continue;
                    }
                    _ => field,
                };
                cases += 1;
                accepted += refused_or_finite(
                    &base,
                    parsed,
                    named,
                    &format!("{} = {x}", path.join(".")),
                    &probes,
                ) as u32;
            }
        }
    }
    (cases, accepted)
}

#[test]
fn every_number_of_every_builtin_profile_is_refused_or_finite() {
    let (cases, accepted) = every_profile_number_refused_or_finite();
    // Most hostile values are refused; the zeros of fields where 0 means "none"
    // (FP8 peak, a latency, the slowdown) are accepted and priced finitely.
    assert!(
        cases > 7 * 22 * 11 && accepted > 0 && accepted < cases / 4,
        "{cases} {accepted}"
    );
    println!("{cases} hostile profile numbers, {accepted} accepted with finite estimates");
}

/// A profile file with one number replaced.
fn profile_with(dir: &TempDir, name: &str, section: &str, key: &str, x: Value) -> String {
    let mut v: Value =
        serde_json::from_str(include_str!("../../hwprofiles/h100-sxm.json")).unwrap();
    v[section][key] = x;
    let path = dir.path(name).to_string_lossy().into_owned();
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

/// A measured run on two local CPU ranks (a tiny plan: fast).
fn cpu_run(dir: &TempDir) -> (String, Value) {
    let plan = dir.path("p.json").to_string_lossy().into_owned();
    let run = dir.path("run.json").to_string_lossy().into_owned();
    let o = sextant(&[
        "estimate",
        "--model",
        "llama2-7b",
        "--gpus",
        "2",
        "--tp",
        "2",
        "--seq",
        "1024",
        "--json",
        "--out",
        &plan,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = sextant(&[
        "exec",
        &plan,
        "--ranks",
        "2",
        "--max-steps",
        "2",
        "--timeout",
        "60",
        "--out",
        &run,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = serde_json::from_str(&std::fs::read_to_string(&run).unwrap()).unwrap();
    (run, v)
}

fn write(dir: &TempDir, name: &str, v: &Value) -> String {
    let path = dir.path(name).to_string_lossy().into_owned();
    std::fs::write(&path, serde_json::to_string_pretty(v).unwrap()).unwrap();
    path
}

/// The command-line reproducers of items 12 and 14, counted as hostile inputs.
pub fn hostile_profiles_and_calibrations() {
    let dir = TempDir::new("profiles");
    // Item 12: numbers that passed validation and priced plans at infinity.
    for (section, key, x, field) in [
        (
            "efficiency",
            "gemm_bf16",
            json!(1e-308),
            "efficiency.gemm_bf16",
        ),
        (
            "gpu",
            "hbm_tbytes_per_s",
            json!(1e-308),
            "gpu.hbm_tbytes_per_s",
        ),
        ("gpu", "hbm_gib", json!(1e308), "gpu.hbm_gib"),
        (
            "network",
            "nic_gbytes_per_s",
            json!(-50),
            "network.nic_gbytes_per_s",
        ),
        (
            "efficiency",
            "nvls_busbw",
            json!(0),
            "efficiency.nvls_busbw",
        ),
        (
            "efficiency",
            "network_busbw",
            json!(1e-308),
            "efficiency.network_busbw",
        ),
        (
            "memory",
            "fragmentation",
            json!(1e308),
            "memory.fragmentation",
        ),
    ] {
        let f = profile_with(&dir, &format!("{key}.json"), section, key, x);
        fails_with_one_line(
            &["estimate", "--model", "8b", "--gpus", "8", "--cluster", &f],
            field,
        );
        fails_with_one_line(
            &[
                "plan",
                "--model",
                "8b",
                "--gpus",
                "8",
                "--cluster",
                &f,
                "--json",
            ],
            field,
        );
    }
    let mut peak: Value =
        serde_json::from_str(include_str!("../../hwprofiles/h100-sxm.json")).unwrap();
    peak["gpu"]["peak_tflops"]["bf16"] = json!(1e308);
    let f = write(&dir, "peak.json", &peak);
    fails_with_one_line(
        &["estimate", "--model", "8b", "--gpus", "8", "--cluster", &f],
        "gpu.peak_tflops.bf16",
    );
    // A misspelt key (`by_domain` for `by_domains`) would leave the profile at its
    // defaults without a word; it is refused, named.
    let mut typo = peak.clone();
    typo["gpu"]["peak_tflops"]["bf16"] = json!(989);
    typo["network"]["by_domain"] = json!([]);
    let f = write(&dir, "typo.json", &typo);
    fails_with_one_line(
        &["estimate", "--model", "8b", "--gpus", "8", "--cluster", &f],
        "unknown key 'network.by_domain'",
    );
    let mut curve = peak.clone();
    curve["gpu"]["peak_tflops"]["bf16"] = json!(989);
    curve["gemm_curves"][0]["points"][0][3] = json!(1e-300);
    let f = write(&dir, "curve.json", &curve);
    fails_with_one_line(
        &["estimate", "--model", "8b", "--gpus", "8", "--cluster", &f],
        "GEMM curve point",
    );

    // Item 14: calibration.
    let (run, good) = cpu_run(&dir);
    let overlay = dir.path("o.json").to_string_lossy().into_owned();
    // The same run twice counts once, and the output says so.
    let o = sextant(&["calibrate", &run, &run, "--out", &overlay]);
    count_hostile();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("from 1 run(s)")
            && stdout(&o).contains("1 duplicate(s) counted once: run 2")
            && stdout(&o).contains("repeats run 1"),
        "{}",
        stdout(&o)
    );
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&overlay).unwrap()).unwrap();
    assert_eq!(written["runs"].as_array().unwrap().len(), 1);
    // A copy with its labels edited is still the same measurement.
    let mut copy = good.clone();
    copy["generator"] = json!("sextant 9.9");
    let c = write(&dir, "copy.json", &copy);
    let o = sextant(&["calibrate", &run, &c, "--out", &overlay, "--force"]);
    count_hostile();
    assert!(
        o.status.success() && stdout(&o).contains("from 1 run(s)"),
        "{}",
        stdout(&o)
    );

    // A crafted time that made the fitted efficiency NaN (written as null).
    let mut nan = good.clone();
    nan["gemms"][1]["median_secs"] = json!(1e-310);
    let f = write(&dir, "nan.json", &nan);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "median_secs",
    );
    // Times inside the sample range whose fit is no efficiency at all.
    let mut fast = good.clone();
    for g in fast["gemms"].as_array_mut().unwrap() {
        (g["m"], g["n"], g["k"], g["median_secs"]) = (
            json!(10_000_000),
            json!(10_000_000),
            json!(10_000_000),
            json!(1e-9),
        );
    }
    let f = write(&dir, "fast.json", &fast);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "gives gemm_bf16 = 2.02",
    );
    // A 1e30-row GEMM (its FLOPs overflowed 64 bits).
    let mut wide = good.clone();
    wide["gemms"][0]["m"] = json!(u64::MAX);
    let f = write(&dir, "wide.json", &wide);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "m, n, k must be 1 to",
    );

    // A CPU run relabelled as a GPU run, one edit further each time.
    let mut relabelled = good.clone();
    relabelled["backend"] = json!("cuda");
    let f = write(&dir, "r1.json", &relabelled);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "not the CUDA backend's",
    );
    relabelled["device"] = json!("cuda: 2 ranks, NVIDIA H100 80GB HBM3 on rank 0");
    let f = write(&dir, "r2.json", &relabelled);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "GEMM in 'f32'",
    );
    for g in relabelled["gemms"].as_array_mut().unwrap() {
        g["dtype"] = json!("bf16");
    }
    let f = write(&dir, "r3.json", &relabelled);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "over 'loopback'",
    );
    for c in relabelled["collectives"].as_array_mut().unwrap() {
        c["tier"] = json!("nvlink");
    }
    let f = write(&dir, "r4.json", &relabelled);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "these are not GPU timings",
    );
    relabelled["backend"] = json!("tpu");
    let f = write(&dir, "r5.json", &relabelled);
    fails_with_one_line(
        &["calibrate", &f, "--out", &overlay, "--force"],
        "expected cpu or cuda",
    );

    // A CPU overlay relabelled as a GPU one: its numbers are a CPU's, out of range.
    let o = sextant(&["calibrate", &run, "--out", &overlay, "--force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut cpu: Value = serde_json::from_str(&std::fs::read_to_string(&overlay).unwrap()).unwrap();
    cpu["backend"] = json!("cuda");
    let f = write(&dir, "o-cuda.json", &cpu);
    let plan = |f: &str, needle: &str| {
        fails_with_one_line(
            &["plan", "--model", "8b", "--gpus", "8", "--calibration", f],
            needle,
        )
    };
    plan(&f, "gemm_bf16");
    let mut gpu = cpu.clone();
    for (k, x) in [
        ("gemm_bf16", json!(0.7)),
        ("attention", json!(0.5)),
        ("nvlink_busbw", json!(0.8)),
        ("gemm_overhead_us", json!(5.0)),
        ("nvlink_latency_us", json!(2.0)),
    ] {
        gpu[k] = x;
    }
    // Planning reads GPU levels against timed BF16 GEMMs (the CPU run's are f32):
    // one at 0.7 of the H100's peak.
    let secs = 2.0 * 4096f64.powi(3) / (0.7 * 989e12);
    gpu["gemm_points"] = json!([{"class": "mlp", "m": 4096, "n": 4096, "k": 4096,
        "dtype": "bf16", "calls": 1, "median_secs": secs, "tflops": 0.7 * 989.0}]);
    let ok = write(&dir, "o-gpu.json", &gpu);
    let o = sextant(&["plan", "--model", "8b", "--gpus", "8", "--calibration", &ok]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (k, x, needle) in [
        ("network_busbw", json!(1e-308), "network_busbw = 1e-308"),
        ("nvlink_busbw", json!(50.0), "nvlink_busbw = 50"),
        ("gemm_overhead_us", json!(-1.0), "gemm_overhead_us = -1"),
        ("attention", json!(1e308), "attention = 1e308"),
    ] {
        let mut bad = gpu.clone();
        bad[k] = x;
        let f = write(&dir, &format!("o-{k}.json"), &bad);
        plan(&f, needle);
    }
    let mut tpu = gpu.clone();
    tpu["backend"] = json!("tpu");
    let f = write(&dir, "o-tpu.json", &tpu);
    plan(&f, "backend 'tpu' is not one of cpu, cuda");
}
