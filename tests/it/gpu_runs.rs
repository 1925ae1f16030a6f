//! The first runs of the CUDA backend on a GPU (one H200, 2026-11-28; see
//! `tests/data/measured/h200-2026-11-28/README.md`): what the closed loop makes of
//! real measurements rather than the fakes' made-up times.

use crate::common::{data, sextant, stderr, stdout, TempDir};
use serde_json::Value;
use sextant_planner::calibration::{bare_gemm_ratio, Overlay};
use sextant_planner::hardware::{builtin_profile, AttentionPass};

fn measured(name: &str) -> String {
    data(&format!("measured/h200-2026-11-28/{name}"))
}

/// The `step` row of `compare`'s table: (predicted, measured, calibrated).
fn step_row(out: &str) -> (f64, f64, f64) {
    let row: Vec<f64> = out
        .lines()
        .find(|l| l.starts_with("step "))
        .unwrap_or_else(|| panic!("no step row in:\n{out}"))
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (row[0], row[1], row[2])
}

fn step_secs(args: &[&str]) -> f64 {
    let o = sextant(args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    v["plans"][0]["estimate"]["step_secs"].as_f64().unwrap()
}

/// `calibrate` takes the three runs as GPU runs. Fitted on them, the executor's
/// own levels bring each run's predicted step within 5% of its measured one (the
/// uncalibrated prediction is a training stack's, 6-20% above the bare executor).
/// For planning, the same overlay moves a 70B plan on 128 H200s by the GPU's bare
/// GEMM speed against the profile's reference: never faster than the profile,
/// never slower than that ratio allows. Applied as the executor's levels, it made
/// the plan 12% faster than the profile.
#[test]
fn real_gpu_runs_close_the_loop_and_plan_by_the_bare_ratio() {
    let dir = TempDir::new("gpu-runs");
    let overlay = dir.path("overlay.json").display().to_string();
    let runs = ["gpt", "dense", "moe"].map(|r| measured(&format!("{r}-run.json")));
    let mut args = vec!["calibrate"];
    args.extend(runs.iter().map(String::as_str));
    args.extend(["--out", &overlay]);
    let o = sextant(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("for planning (plan/estimate --calibration"));
    for r in ["gpt", "dense", "moe"] {
        let o = sextant(&[
            "compare",
            &measured(&format!("{r}-plan.json")),
            &measured(&format!("{r}-run.json")),
            "--calibration",
            &overlay,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let (predicted, measured, calibrated) = step_row(&stdout(&o));
        assert!(predicted > 1.05 * measured, "{r}: {predicted} {measured}");
        assert!(
            (calibrated / measured - 1.0).abs() < 0.05,
            "{r}: calibrated {calibrated} against measured {measured}"
        );
    }
    let h200 = builtin_profile("h200-sxm").unwrap();
    let o = Overlay::from_json(&std::fs::read_to_string(&overlay).unwrap()).unwrap();
    let r = bare_gemm_ratio(&h200, &o.gemm_points).unwrap();
    assert!(r > 0.85 && r < 1.0, "{r}");
    let config = [
        "estimate", "--model", "70b", "--gpus", "128", "--gpu", "h200-sxm", "--tp", "2", "--pp",
        "4", "--vpp", "20", "--dp", "16", "--mbs", "1", "--json",
    ];
    let plain = step_secs(&config);
    let mut with = config.to_vec();
    with.extend(["--calibration", &overlay]);
    let calibrated = step_secs(&with);
    assert!(
        calibrated > plain && calibrated <= plain / r * 1.0001,
        "plain {plain}, calibrated {calibrated}, ratio {r}"
    );
}

/// The benchmarks of the same GPU: `calibrate --bench` builds an overlay whose
/// planning ratio is the GPU's (below 1 against the reference table), and a plan
/// made with it keeps the profile's curves.
#[test]
fn real_gpu_benchmarks_plan_by_the_bare_ratio() {
    let dir = TempDir::new("gpu-bench");
    let overlay = dir.path("overlay.json").display().to_string();
    let o = sextant(&[
        "calibrate",
        "--bench",
        &measured("bench-gemm.json"),
        &measured("bench-hbm.json"),
        "--hardware",
        "h200-sxm",
        "--out",
        &overlay,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let h200 = builtin_profile("h200-sxm").unwrap();
    let o = Overlay::from_json(&std::fs::read_to_string(&overlay).unwrap()).unwrap();
    let r = bare_gemm_ratio(&h200, &o.gemm_points).unwrap();
    assert!(r > 0.85 && r < 1.0, "{r}");
    let p =
        sextant_planner::calibration::apply(&h200, &o, sextant_planner::calibration::Target::Stack)
            .unwrap();
    assert_eq!(p.gemm_curves, h200.gemm_curves);
    assert!((p.efficiency.gemm_bf16 - r * h200.efficiency.gemm_bf16).abs() < 1e-12);
    assert_eq!(p.efficiency.hbm, o.hbm.unwrap());
}

/// The Hopper profiles' fused-attention curves (FlashAttention-3's H100 cuDNN bars)
/// against cuDNN's fused attention timed on the H200 through PyTorch's SDPA on the
/// same grid: 128-wide heads, forward causal and backward unmasked, within 15%
/// from 1k tokens on (the profile prices training sequences there).
#[test]
fn hopper_attention_curve_matches_cudnn_on_an_h200() {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(measured("attention-sdpa.json")).unwrap())
            .unwrap();
    let h200 = builtin_profile("h200-sxm").unwrap();
    // The curve's own points, as the profile file states them: [head dim, tokens,
    // TFLOP/s].
    let curve = |pass: AttentionPass, causal: bool, d: f64, s: f64| {
        let c = h200
            .attention_curves
            .iter()
            .find(|c| c.pass == pass && c.causal == causal)
            .unwrap();
        serde_json::to_value(c).unwrap()["points"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p[0].as_f64() == Some(d) && p[1].as_f64() == Some(s))
            .map(|p| p[2].as_f64().unwrap())
            .unwrap()
    };
    let mut checked = 0;
    for row in v["rows"].as_array().unwrap() {
        if row["backend"] != "cudnn" || row["d"].as_f64() != Some(128.0) {
            continue;
        }
        let s = row["s"].as_f64().unwrap();
        if s < 1024.0 {
            continue;
        }
        let (want, got) = if row["causal"] == true {
            (
                curve(AttentionPass::Fwd, true, 128.0, s),
                row["fwd_tflops"].as_f64().unwrap(),
            )
        } else {
            (
                curve(AttentionPass::Bwd, false, 128.0, s),
                row["bwd_tflops"].as_f64().unwrap(),
            )
        };
        assert!(
            (got / want - 1.0).abs() < 0.15,
            "{s} tokens, causal {}: measured {got:.0} TFLOP/s, profile curve {want:.0}",
            row["causal"]
        );
        checked += 1;
    }
    assert_eq!(checked, 10);
}
