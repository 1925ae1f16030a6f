use super::*;
use crate::hardware::builtin_profile;

fn device(name: &str) -> BenchDevice {
    BenchDevice {
        name: name.into(),
        ordinals: vec![0],
        visible: 1,
        memory_bytes: 80 << 30,
        sms: 132,
        compute_capability: "9.0".into(),
    }
}

fn file(benchmark: &str) -> BenchFile {
    BenchFile {
        schema_version: BENCH_SCHEMA_VERSION,
        generator: "test".into(),
        benchmark: benchmark.into(),
        date: "2026-08-01T00:00:00Z".into(),
        device: device("NVIDIA H100 80GB HBM3"),
        versions: BenchVersions {
            cuda: "13.0".into(),
            ..BenchVersions::default()
        },
        method: "test".into(),
        warmup: 1,
        iters: 1,
        gemm_curves: vec![],
        gemms: vec![],
        memory: vec![],
        collective_points: vec![],
        collectives: vec![],
        p2p: vec![],
    }
}

/// A sweep at `tflops(m, n, k)` over a 2x2x2 grid, plus one plan shape.
fn gemm_file(tflops: impl Fn(u64, u64, u64) -> f64) -> BenchFile {
    let mut f = file("gemm");
    let mut points = Vec::new();
    for m in [1024u64, 4096] {
        for n in [1024u64, 4096] {
            for k in [1024u64, 4096] {
                let t = tflops(m, n, k);
                points.push([m as f64, n as f64, k as f64, t]);
                f.gemms.push(BenchGemm {
                    class: "sweep".into(),
                    m,
                    n,
                    k,
                    batch: 1,
                    calls: 10,
                    median_secs: 2.0 * (m * n * k) as f64 / (t * 1e12),
                    tflops: t,
                });
            }
        }
    }
    f.gemm_curves = vec![GemmCurve::from_points(GemmDtype::Bf16, "test".into(), points).unwrap()];
    f.gemms.push(BenchGemm {
        class: "mlp".into(),
        m: 2048,
        n: 2048,
        k: 2048,
        batch: 2,
        calls: 10,
        median_secs: 2.0 * 2.0 * 2048f64.powi(3) / 500e12,
        tflops: 500.0,
    });
    f
}

fn collective(op: &str, ranks: u64, bytes: u64, secs: f64) -> BenchCollective {
    let n = ranks as f64;
    let factor = if op == "all_reduce" {
        2.0 * (n - 1.0) / n
    } else {
        (n - 1.0) / n
    };
    let algbw = bytes as f64 / secs / 1e9;
    BenchCollective {
        op: op.into(),
        ranks,
        bytes,
        tier: "nvlink".into(),
        calls: 20,
        median_secs: secs,
        algbw_gbytes_per_s: algbw,
        busbw_gbytes_per_s: algbw * factor,
    }
}

/// GEMM curve, HBM copy and 8-GPU collectives become the overlay's constants;
/// the profile it makes has the measured curve at the measured level.
#[test]
fn bench_files_make_an_overlay_the_profile_takes() {
    let h100 = builtin_profile("h100-sxm").unwrap();
    let gemm = gemm_file(|m, n, k| 200.0 + 100.0 * ((m * n * k) as f64).log2() / 36.0 * 5.0);
    let best = gemm.gemm_curves[0].best_tflops();
    let mut hbm = file("hbm");
    for (bytes, gbs) in [(1u64 << 24, 3100.0), (1 << 30, 2800.0)] {
        hbm.memory.push(MemoryPoint {
            op: "copy".into(),
            bytes,
            calls: 10,
            median_secs: 2.0 * bytes as f64 / (gbs * 1e9),
            gbytes_per_s: gbs,
        });
    }
    let mut nccl = file("nccl");
    // An all-reduce at 0.8 of a 450 GB/s link plus 10 us of latency per call,
    // and one single-GPU point that must not enter the fit.
    let steps = 2.0 * crate::comm::latency_steps(8);
    for bytes in [1u64 << 20, 1 << 24, 1 << 28, 1 << 30] {
        let secs = 1.75 * bytes as f64 / (0.8 * 450e9) + steps * 10e-6;
        nccl.collectives
            .push(collective("all_reduce", 8, bytes, secs));
    }
    nccl.collectives
        .push(collective("all_reduce", 1, 1 << 20, 1e-5));
    let mut p2p = file("p2p");
    p2p.p2p.push(P2pPoint {
        src: 0,
        dst: 1,
        peer_access: true,
        bytes: 1 << 30,
        calls: 5,
        median_secs: 0.003,
        gbytes_per_s: 358.0,
    });
    for f in [&gemm, &hbm, &nccl, &p2p] {
        let text = serde_json::to_string(f).unwrap();
        let back = BenchFile::from_json(&text).unwrap();
        assert_eq!(
            (&back.device, &back.versions, back.gemms.len()),
            (&f.device, &f.versions, f.gemms.len())
        );
    }
    let (o, fit) = overlay(&[gemm.clone(), hbm, nccl, p2p], &h100).unwrap();
    assert!((o.gemm_bf16.unwrap() - best / 989.0).abs() < 1e-12);
    assert!((o.hbm.unwrap() - 2800.0 / 3350.0).abs() < 1e-12);
    assert!(
        (o.nvlink_busbw.unwrap() - 0.8).abs() < 1e-6,
        "{:?}",
        o.nvlink_busbw
    );
    assert!((o.nvlink_latency_us.unwrap() - 10.0).abs() < 1e-3);
    assert_eq!(fit.collectives_fitted, 4);
    assert_eq!(fit.plan_shapes.len(), 1);
    assert_eq!(fit.not_used.len(), 2, "{:?}", fit.not_used);
    assert_eq!(o.benchmarks.len(), 4);
    assert!(o.benchmarks[0].starts_with("gemm on NVIDIA H100 80GB HBM3 at 2026-08-01"));
    // A batched plan GEMM is booked per product, as runs book them.
    let mlp = o.gemm_points.iter().find(|g| g.class == "mlp").unwrap();
    assert_eq!(mlp.calls, 20);
    // Through the file format and onto the profile.
    let o = Overlay::from_json(&serde_json::to_string(&o).unwrap()).unwrap();
    let p = crate::calibration::apply(&h100, &o, crate::calibration::Target::Executor).unwrap();
    assert_eq!(p.gemm_curves, gemm.gemm_curves);
    assert_eq!(p.efficiency.gemm_bf16, o.gemm_bf16.unwrap());
    assert_eq!(p.efficiency.hbm, o.hbm.unwrap());
    assert!(p.sources["efficiency.hbm"].contains("hbm on NVIDIA H100"));
    // The best grid point's shape factor is 1: the level is the curve's best.
    let f = p.gemm_shape_factor(false, 4096.0, 4096.0, 4096.0).unwrap();
    assert!((f - 1.0).abs() < 1e-12);
    p.validate().unwrap();
    // For planning, the profile keeps its fitted level and curves, moved by the
    // measured GEMMs' speed against its bare curve; HBM is replaced the same way.
    let s = crate::calibration::apply(&h100, &o, crate::calibration::Target::Stack).unwrap();
    let r = crate::calibration::bare_gemm_ratio(&h100, &o.gemm_points).unwrap();
    assert!(r > 0.3 && r < 1.5, "{r}");
    assert!((s.efficiency.gemm_bf16 - r * h100.efficiency.gemm_bf16).abs() < 1e-12);
    assert_eq!(s.gemm_curves, h100.gemm_curves);
    assert_eq!(s.efficiency.hbm, o.hbm.unwrap());
    s.validate().unwrap();
}

/// What the overlay refuses, each in one line.
#[test]
fn bench_overlay_refusals() {
    let h100 = builtin_profile("h100-sxm").unwrap();
    let one = |files: &[BenchFile]| {
        let e = overlay(files, &h100).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    };
    let mut fake = gemm_file(|_, _, _| 100.0);
    fake.device.name = "sextant fake GPU (tests only)".into();
    assert!(one(&[fake]).contains("fake CUDA libraries"));
    let mut other = file("hbm");
    other.device.name = "NVIDIA H200".into();
    other.memory.push(MemoryPoint {
        op: "copy".into(),
        bytes: 1 << 30,
        calls: 1,
        median_secs: 1e-3,
        gbytes_per_s: 2000.0,
    });
    assert!(one(&[gemm_file(|_, _, _| 100.0), other]).contains("different GPUs"));
    let g = gemm_file(|_, _, _| 100.0);
    assert!(one(&[g.clone(), g]).contains("two gemm benchmark files"));
    // Above the profile's peak: the wrong profile.
    let e = one(&[gemm_file(|_, _, _| 1500.0)]);
    assert!(
        e.contains("above the BF16 peak of profile 'h100-sxm' (989 TFLOP/s)"),
        "{e}"
    );
    // Another GPU's profile: refused by name before any number is read.
    let a100 = builtin_profile("a100-80g").unwrap();
    let e = overlay(&[gemm_file(|_, _, _| 100.0)], &a100)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("but profile 'a100-80g' is for 'A100 SXM4 80GB': calibrate the profile of the GPU you measured"),
        "{e}"
    );
    for p in ["mi300x", "b200", "gb200-nvl72", "h200-sxm"] {
        let e = overlay(&[gemm_file(|_, _, _| 100.0)], &builtin_profile(p).unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("calibrate the profile of the GPU you measured"),
            "{p}: {e}"
        );
    }
    // The same model under another profile (AWS's H100 cluster) is fine, and a
    // name without a model word is not judged.
    overlay(
        &[gemm_file(|_, _, _| 100.0)],
        &builtin_profile("aws-p5-hf").unwrap(),
    )
    .unwrap();
    let mut plain = gemm_file(|_, _, _| 100.0);
    plain.device.name = "some accelerator".into();
    overlay(&[plain], &h100).unwrap();
    assert_eq!(
        super::overlay::gpu_models("NVIDIA H100 80GB HBM3"),
        ["H100"]
    );
    assert_eq!(super::overlay::gpu_models("NVIDIA GB200"), ["GB200"]);
    assert_eq!(super::overlay::gpu_models("MI300X 192GB"), ["MI300X"]);
}

/// A file that breaks the format is refused with the point named.
#[test]
fn bench_file_checks() {
    let ok = gemm_file(|_, _, _| 100.0);
    let check = |edit: &dyn Fn(&mut BenchFile), want: &str| {
        let mut f = ok.clone();
        edit(&mut f);
        let e = BenchFile::from_json(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "'{want}' missing from: {e}");
    };
    check(
        &|f| f.benchmark = "tpu".into(),
        "is not one of gemm, hbm, nccl, p2p",
    );
    check(
        &|f| f.gemms[0].median_secs = 4e3,
        "median_secs 4000 must be 1e-9 to 3600 s",
    );
    check(&|f| f.gemms[0].median_secs = 0.0, "median_secs 0 must be");
    check(&|f| f.gemms[0].m = 0, "m, n, k must be 1 to 1e7");
    check(&|f| f.gemms[0].tflops = -1.0, "rate -1 must be positive");
    // A rate its own size and time do not give: the file was edited.
    check(
        &|f| f.gemms[0].tflops *= 2.0,
        "is not what its size and median_secs give",
    );
    check(&|f| f.gemms.clear(), "holds no measured point");
    check(&|f| f.iters = 0, "iters");
    check(
        &|f| {
            f.memory.push(MemoryPoint {
                op: "copy".into(),
                bytes: 1,
                calls: 1,
                median_secs: 1e-6,
                gbytes_per_s: 1.0,
            })
        },
        "a gemm benchmark has no memory",
    );
    let mut nccl = file("nccl");
    nccl.collectives
        .push(collective("all_reduce", 1, 1024, 1e-5));
    BenchFile::from_json(&serde_json::to_string(&nccl).unwrap()).unwrap();
    nccl.collectives[0].busbw_gbytes_per_s = 5.0;
    let e = BenchFile::from_json(&serde_json::to_string(&nccl).unwrap()).unwrap_err();
    assert!(e.to_string().contains("0 on one rank"), "{e}");
    let text = serde_json::to_string(&ok)
        .unwrap()
        .replace("\"schema_version\":1", "\"schema_version\":2");
    assert!(BenchFile::from_json(&text)
        .unwrap_err()
        .to_string()
        .contains("schema_version 2"));
}

/// Memory points, collectives and GEMM curves that disagree with their own
/// sizes, times and sweep points are refused, naming them; consistent ones pass.
#[test]
fn bench_rates_agree_with_sizes_and_times() {
    let mut hbm = file("hbm");
    hbm.memory.push(MemoryPoint {
        op: "copy".into(),
        bytes: 1 << 30,
        calls: 1,
        median_secs: 1e-3,
        gbytes_per_s: 2.0 * (1u64 << 30) as f64 / 1e-3 / 1e9,
    });
    BenchFile::from_json(&serde_json::to_string(&hbm).unwrap()).unwrap();
    hbm.memory[0].gbytes_per_s = 2900.0;
    let e = BenchFile::from_json(&serde_json::to_string(&hbm).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("memory copy of 1073741824 bytes: gbytes_per_s 2900 is not what its size and median_secs give"),
        "{e}"
    );
    // A memset writes its bytes once; a peer copy moves them once.
    let mut set = file("hbm");
    set.memory.push(MemoryPoint {
        op: "memset".into(),
        bytes: 1 << 30,
        calls: 1,
        median_secs: 1e-3,
        gbytes_per_s: 2.0 * (1u64 << 30) as f64 / 1e-3 / 1e9,
    });
    let e = BenchFile::from_json(&serde_json::to_string(&set).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("memory memset of 1073741824 bytes: gbytes_per_s"),
        "{e}"
    );
    // A collective's bus bandwidth is nccl-tests' factor of its algorithm
    // bandwidth: 2(n-1)/n for an all-reduce.
    let mut nccl = file("nccl");
    let algbw = (1u64 << 30) as f64 / 1e-2 / 1e9;
    nccl.collectives.push(BenchCollective {
        op: "all_reduce".into(),
        ranks: 8,
        bytes: 1 << 30,
        tier: "nvlink".into(),
        calls: 1,
        median_secs: 1e-2,
        algbw_gbytes_per_s: algbw,
        busbw_gbytes_per_s: algbw * 2.0 * 7.0 / 8.0,
    });
    BenchFile::from_json(&serde_json::to_string(&nccl).unwrap()).unwrap();
    nccl.collectives[0].busbw_gbytes_per_s = algbw * 7.0 / 8.0;
    let e = BenchFile::from_json(&serde_json::to_string(&nccl).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("must be the algorithm bandwidth times nccl-tests' factor"),
        "{e}"
    );
    // The curve calibration reads must be the sweep points' own.
    let g = gemm_file(|_, _, _| 100.0);
    BenchFile::from_json(&serde_json::to_string(&g).unwrap()).unwrap();
    let mut v = serde_json::to_value(&g).unwrap();
    let t = v["gemm_curves"][0]["points"][0][3].as_f64().unwrap();
    v["gemm_curves"][0]["points"][0][3] = serde_json::json!(t * 3.0);
    let e = BenchFile::from_json(&v.to_string())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gemm_curves: the curve is not the one"), "{e}");
}
