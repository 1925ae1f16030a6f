//! `sextant bench` and `scripts/gpu-smoke.sh` without a GPU.
//!
//! - Without `--features cuda`: every benchmark is one line saying CUDA support is
//!   not built in, and the smoke script stops at its first benchmark with one line.
//! - With it, on the fake CUDA libraries (tests/fakecuda, see `cuda_libs.rs`):
//!   `bench gemm`, `hbm` and `nccl` write well-formed files whose times are exactly
//!   what the fake device charges (so the host gate keeps launch gaps out of the
//!   events), `calibrate --bench` refuses the fakes' files, and the same files
//!   relabelled as a GPU's make an overlay that `plan --calibration` accepts;
//!   argument errors are one line. The smoke script runs against the fakes with a
//!   stand-in `nvidia-smi` and a stand-in PyTorch (tests/fakecuda/python), or none,
//!   up to `calibrate`, which refuses the fakes' run: its one failure line.
//! - The script passes `bash -n`, and shellcheck where it is installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{stderr, stdout, TempDir};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-smoke.sh")
}

#[test]
fn bench_smoke_script_is_valid_bash_and_shellcheck_clean() {
    let o = Command::new("bash")
        .arg("-n")
        .arg(script())
        .output()
        .unwrap();
    assert!(o.status.success(), "bash -n: {}", stderr(&o));
    match Command::new("shellcheck").arg(script()).output() {
        Ok(o) => assert!(
            o.status.success(),
            "shellcheck:\n{}{}",
            stdout(&o),
            stderr(&o)
        ),
        Err(_) => eprintln!("SKIPPED shellcheck: it is not installed (apt-get install shellcheck)"),
    }
}

/// A directory holding a stand-in `nvidia-smi` that names one H100.
fn stand_in_nvidia_smi(dir: &TempDir) -> PathBuf {
    let bin = dir.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let smi = bin.join("nvidia-smi");
    std::fs::write(
        &smi,
        r#"#!/bin/sh
# A stand-in for nvidia-smi in Sextant's tests: no GPU is here.
case "$*" in
  *--query-gpu=name*) echo "NVIDIA H100 80GB HBM3" ;;
  *--query-gpu=*) echo "0, NVIDIA H100 80GB HBM3, 580.00.00, 81559 MiB" ;;
  *) echo "stand-in nvidia-smi for Sextant's tests (no GPU); CUDA Version: 13.0" ;;
esac
"#,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// The smoke script with `env`, the stand-in nvidia-smi first on PATH, in `dir`.
fn smoke(dir: &TempDir, outdir: &str, env: &[(&str, &str)]) -> Output {
    let bin = stand_in_nvidia_smi(dir);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = Command::new("bash");
    c.arg(script())
        .arg(outdir)
        .current_dir(&dir.0)
        .env("PATH", path)
        .env("SEXTANT", env!("CARGO_BIN_EXE_sextant"))
        .env("PYTHON", dir.path("no-python-here"))
        .env_remove("SEXTANT_PROFILE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Refusals before any step: no binary, a non-empty OUTDIR, no OUTDIR.
#[test]
fn bench_smoke_script_refuses_what_it_cannot_use() {
    let dir = TempDir::new("smoke-refuse");
    let one_line = |o: &Output, want: &str| {
        let e = stderr(o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.starts_with("gpu-smoke: ") && e.contains(want), "{e}");
    };
    let o = smoke(&dir, "out", &[("SEXTANT", "/nonexistent/sextant")]);
    one_line(&o, "no sextant binary at '/nonexistent/sextant'");
    std::fs::create_dir(dir.path("full")).unwrap();
    std::fs::write(dir.path("full/keep.txt"), "mine").unwrap();
    let o = smoke(&dir, "full", &[]);
    one_line(&o, "OUTDIR 'full' is not empty");
    assert_eq!(
        std::fs::read_to_string(dir.path("full/keep.txt")).unwrap(),
        "mine"
    );
    let o = Command::new("bash").arg(script()).output().unwrap();
    one_line(&o, "usage: gpu-smoke.sh OUTDIR");
}

#[cfg(not(feature = "cuda"))]
mod without_cuda {
    use super::*;
    use crate::common::fails_with_one_line;

    #[test]
    fn bench_without_cuda_is_one_line() {
        for b in ["gemm", "hbm", "nccl", "p2p"] {
            fails_with_one_line(
                &["bench", b],
                &format!("this sextant was built without CUDA support, so `sextant bench {b}` cannot run: rebuild with `cargo build --release --features cuda`"),
            );
        }
        // Arguments are still checked first.
        fails_with_one_line(&["bench", "gemm", "--sizes", "64"], "give 2 to 16");
    }

    /// Without CUDA the script gets through the plan and stops at the first
    /// benchmark, with one line saying why.
    #[test]
    fn bench_smoke_script_stops_at_the_first_benchmark_without_cuda() {
        let dir = TempDir::new("smoke-nocuda");
        let o = smoke(&dir, "out", &[]);
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(
            e.starts_with("gpu-smoke: step 'bench-gemm' failed (exit 1): error: this sextant was built without CUDA support"),
            "{e}"
        );
        let said = stdout(&o);
        assert!(
            said.contains("GPUs: 1 x NVIDIA H100 80GB HBM3; profile: h100-sxm"),
            "{said}"
        );
        assert!(dir.path("out/plan.json").is_file());
        assert!(dir.path("out/versions.txt").is_file());
        assert!(!dir.path("out/bench-gemm.json").exists());
    }
}

#[cfg(feature = "cuda")]
mod on_the_fakes {
    use super::*;
    use crate::cuda_libs::{fakes, fakes_reported, real_cuda_here, small_plan, Fakes};
    use sextant_planner::bench::BenchFile;

    /// `sextant ARGS` with the fakes; returns the output and its stderr without the
    /// fakes' (clean) report lines.
    fn on_fakes(f: &Fakes, dir: &TempDir, args: &[&str], libraries: usize) -> (Output, String) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sextant"));
        f.env(&mut c).args(args).current_dir(&dir.0);
        let o = c.output().unwrap();
        let rest = fakes_reported(&stderr(&o), 0, libraries);
        (o, rest)
    }

    fn read(path: &Path) -> BenchFile {
        BenchFile::from_json(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The fake device's charge for a stream item of `bytes` at 2 TB/s, plus 2 us.
    fn charged(bytes: f64) -> f64 {
        2e-6 + bytes / 2e12
    }

    fn close(got: f64, want: f64) -> bool {
        (got - want).abs() <= 1e-3 * want
    }

    /// Common checks of a benchmark file from the fakes.
    fn from_the_fakes(b: &BenchFile, kind: &str, f: &Fakes) {
        assert_eq!(b.benchmark, kind);
        assert_eq!(b.device.name, "sextant fake GPU (tests only)");
        assert_eq!(
            (b.device.visible, b.device.memory_bytes, b.device.sms),
            (1, 1 << 30, 4)
        );
        assert_eq!(b.device.compute_capability, "9.0");
        assert_eq!(b.versions.cuda, "13.0");
        let driver = f.driver_dir.join("libcuda.so.1").display().to_string();
        assert_eq!(b.versions.libraries["CUDA driver"], driver);
        // RFC 3339, UTC, from the clock.
        let d = b.date.as_bytes();
        assert!(
            d.len() == 20 && d[4] == b'-' && d[10] == b'T' && d[19] == b'Z',
            "{}",
            b.date
        );
        assert!(b.date.as_str() > "2025" && b.generator.starts_with("sextant "));
        assert_eq!((b.warmup, b.iters), (2, 4));
    }

    /// gemm, hbm and nccl on the fakes: every point's time is the fake device's
    /// charge (the host gate keeps the 4 us launch gaps out), the sweep is a profile
    /// curve, the plan's shapes are there; calibrate refuses the fakes' files, and the
    /// same files relabelled as an H100's make an overlay that plan accepts.
    #[test]
    fn bench_gemm_hbm_nccl_on_the_fakes() {
        if real_cuda_here() {
            return;
        }
        let dir = TempDir::new("bench-fakes");
        let f = fakes(&dir);
        let plan = small_plan(&dir, "bench-plan", false);
        let timing = ["--iters", "4", "--warmup", "2"];
        let mut a = vec![
            "bench",
            "gemm",
            "--sizes",
            "256,128",
            "--plan",
            &plan,
            "-o",
            "gemm.json",
        ];
        a.extend(timing);
        let (o, rest) = on_fakes(&f, &dir, &a, 2);
        assert!(o.status.success() && rest.is_empty(), "{rest}");
        let said = stdout(&o);
        assert!(
            said.contains("GEMM sweep, 8 shapes (BF16): best ")
                && said.contains("The plan's GEMM shapes:"),
            "{said}"
        );
        let g = read(&dir.path("gemm.json"));
        from_the_fakes(&g, "gemm", &f);
        assert_eq!(g.versions.cublas.as_deref(), Some("13.0.0"));
        assert_eq!(
            g.versions.libraries["cuBLAS"],
            f.prefix
                .root
                .join("lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.13")
                .display()
                .to_string()
        );
        let [curve] = g.gemm_curves.as_slice() else {
            panic!("one curve: {:?}", g.gemm_curves)
        };
        assert!(
            curve
                .source
                .starts_with("sextant bench gemm on sextant fake GPU (tests only) (device 0) at "),
            "{}",
            curve.source
        );
        let sweep: Vec<_> = g.gemms.iter().filter(|x| x.class == "sweep").collect();
        assert_eq!(sweep.len(), 8);
        assert!(
            (curve.best_tflops() - sweep.iter().map(|x| x.tflops).fold(0.0, f64::max)).abs() < 1e-9
        );
        let plan_shapes: Vec<_> = g.gemms.iter().filter(|x| x.class != "sweep").collect();
        for class in ["attention_proj", "mlp", "attention_core"] {
            assert!(
                plan_shapes.iter().any(|x| x.class == class),
                "{class} missing: {plan_shapes:?}"
            );
        }
        assert!(
            plan_shapes.iter().any(|x| x.batch > 1),
            "the batched attention core"
        );
        for x in &g.gemms {
            assert!(
                x.tflops.is_finite() && x.tflops > 0.0 && x.calls == 4,
                "{x:?}"
            );
            let flops = 2.0 * (x.m * x.n * x.k * x.batch) as f64;
            assert!((x.tflops - flops / x.median_secs / 1e12).abs() < 1e-9 * x.tflops);
            if x.batch == 1 {
                let want = 2e-6 + flops / 1e14;
                assert!(
                    close(x.median_secs, want),
                    "{x:?}: the fake charges {want} s"
                );
            }
        }

        let mut a = vec!["bench", "hbm", "--bytes", "1M,256K", "-o", "hbm.json"];
        a.extend(timing);
        let (o, rest) = on_fakes(&f, &dir, &a, 1);
        assert!(o.status.success() && rest.is_empty(), "{rest}");
        let h = read(&dir.path("hbm.json"));
        from_the_fakes(&h, "hbm", &f);
        let ops: Vec<(&str, u64)> = h.memory.iter().map(|p| (p.op.as_str(), p.bytes)).collect();
        assert_eq!(
            ops,
            [
                ("copy", 262_144),
                ("memset", 262_144),
                ("copy", 1 << 20),
                ("memset", 1 << 20)
            ]
        );
        for p in &h.memory {
            // A device copy is charged its bytes twice; a copy's traffic is 2 x bytes.
            let traffic = if p.op == "copy" { 2.0 } else { 1.0 } * p.bytes as f64;
            assert!(close(p.median_secs, charged(traffic)), "{p:?}");
            assert!((p.gbytes_per_s - traffic / p.median_secs / 1e9).abs() < 1e-9 * p.gbytes_per_s);
        }

        let mut a = vec![
            "bench",
            "nccl",
            "--bytes",
            "64K,1M",
            "--ops",
            "all_gather,all_reduce",
            "-o",
            "nccl.json",
        ];
        a.extend(timing);
        let (o, rest) = on_fakes(&f, &dir, &a, 2);
        assert!(o.status.success() && rest.is_empty(), "{rest}");
        assert!(stdout(&o).contains("one GPU: NCCL's one-rank path"));
        let n = read(&dir.path("nccl.json"));
        from_the_fakes(&n, "nccl", &f);
        assert_eq!(n.versions.nccl.as_deref(), Some("2.28.0"));
        assert!(n.method.contains("one rank on one GPU"), "{}", n.method);
        assert_eq!(n.collectives.len(), 4);
        assert!(
            n.collective_points.is_empty(),
            "one GPU makes no bus-bandwidth point"
        );
        for c in &n.collectives {
            // The fake's NCCL call: 2 us + 5 us + bytes at 1e11 B/s.
            let want = 7e-6 + c.bytes as f64 / 1e11;
            assert!(close(c.median_secs, want), "{c:?}: the fake charges {want}");
            assert_eq!((c.ranks, c.busbw_gbytes_per_s), (1, 0.0));
            assert!(
                (c.algbw_gbytes_per_s - c.bytes as f64 / c.median_secs / 1e9).abs()
                    < 1e-9 * c.algbw_gbytes_per_s
            );
        }

        // calibrate refuses the fakes' measurements.
        let files =
            ["gemm.json", "hbm.json", "nccl.json"].map(|x| dir.path(x).display().to_string());
        let calib = |files: &[String], out: &str| {
            let mut c = Command::new(env!("CARGO_BIN_EXE_sextant"));
            c.args(["calibrate", "--hardware", "h100-sxm", "-o", out, "--bench"])
                .args(files);
            c.current_dir(&dir.0).output().unwrap()
        };
        let o = calib(&files, "fake-overlay.json");
        let e = stderr(&o);
        assert!(!o.status.success() && e.lines().count() == 1, "{e}");
        assert!(
            e.contains("the gemm benchmark ran on Sextant's fake CUDA libraries"),
            "{e}"
        );
        assert!(!dir.path("fake-overlay.json").exists());
        // Relabelled as an H100's, the same files make an overlay plan accepts.
        let relabelled: Vec<String> = files
            .iter()
            .map(|p| {
                let t = std::fs::read_to_string(p)
                    .unwrap()
                    .replace("sextant fake GPU (tests only)", "NVIDIA H100 80GB HBM3");
                let to = format!("{p}.h100.json");
                std::fs::write(&to, t).unwrap();
                to
            })
            .collect();
        let o = calib(&relabelled, "overlay.json");
        assert!(o.status.success(), "{}", stderr(&o));
        let said = stdout(&o);
        for want in [
            "Calibrated 'h100-sxm' from 3 benchmark file(s) on NVIDIA H100 80GB HBM3:",
            "GEMM: the measured BF16 curve (8 shapes); its best point, ",
            "for planning: refused: the overlay's GEMMs ran ",
            "the curve against the plan's ",
            "HBM: a 1048576-byte copy at ",
            "intra-node bus bandwidth: not measured (no collective over 2 or more GPUs)",
            "not used: 4 one-GPU collective point(s)",
        ] {
            assert!(said.contains(want), "'{want}' missing from:\n{said}");
        }
        let overlay = sextant_planner::calibration::Overlay::from_json(
            &std::fs::read_to_string(dir.path("overlay.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(overlay.backend, "cuda");
        assert!(
            overlay.gemm_curve.is_some() && overlay.hbm.is_some() && overlay.nvlink_busbw.is_none()
        );
        assert_eq!(overlay.benchmarks.len(), 3);
        // `compare` with a measured run takes the measured levels as they are; a
        // plan reads the GEMMs against the H100's bare curve, where the fakes' made-up
        // rate at these small shapes is 2.4x what an H100 does: the fitted level
        // scaled by that passes the peak, which is refused in one line naming it.
        let o = crate::common::sextant(&[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--top",
            "2",
            "--calibration",
            &dir.path("overlay.json").display().to_string(),
        ]);
        let e = stderr(&o);
        assert!(!o.status.success() && e.lines().count() == 1, "{e}");
        assert!(
            e.contains("the bare-GEMM level of profile 'h100-sxm'")
                && e.contains("is 'h100-sxm' the profile of the GPU they ran on"),
            "{e}"
        );
        // One file per benchmark.
        let o = calib(
            &[relabelled[0].clone(), relabelled[0].clone()],
            "twice.json",
        );
        let e = stderr(&o);
        assert!(!o.status.success() && e.lines().count() == 1, "{e}");
        assert!(e.contains("two gemm benchmark files given"), "{e}");
        // A profile whose name holds terminal escapes: the summary shows them
        // escaped, on one line.
        let hostile = dir.path("hostile-profile.json");
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/hwprofiles/h100-sxm.json"
        ))
        .unwrap()
        .replacen(
            "\"name\": \"h100-sxm\"",
            "\"name\": \"ev\\u001b]0;T\\u0007\\u001b[2J\\nx\"",
            1,
        );
        std::fs::write(&hostile, text).unwrap();
        let mut c = Command::new(env!("CARGO_BIN_EXE_sextant"));
        c.args(["calibrate", "-o", "hostile-overlay.json", "--hardware"])
            .arg(&hostile)
            .arg("--bench")
            .args(&relabelled);
        let o = c.current_dir(&dir.0).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let said = stdout(&o);
        assert!(
            !said.contains('\u{1b}') && !said.contains('\u{7}'),
            "{said:?}"
        );
        assert!(
            said.lines()
                .next()
                .unwrap()
                .starts_with("Calibrated 'ev\\u{1b}"),
            "{said:?}"
        );
    }

    /// Wrong arguments and what the fakes cannot give: one line each, nothing
    /// written, the fakes clean.
    #[test]
    fn bench_errors_are_one_line() {
        if real_cuda_here() {
            return;
        }
        let dir = TempDir::new("bench-errors");
        let f = fakes(&dir);
        std::fs::write(dir.path("taken.json"), "mine").unwrap();
        let cases: &[(&[&str], &str, usize)] = &[
            (&["bench", "gemm", "--sizes", "64"], "--sizes: give 2 to 16 distinct values", 0),
            (&["bench", "gemm", "--sizes", "32,64"], "--sizes 32: GEMM dimensions must be 64 to 65536", 0),
            (&["bench", "gemm", "--sizes", "64,x"], "invalid digit", 0),
            (&["bench", "gemm", "--iters", "0"], "--iters 0 --warmup 3: use 1 to 10000", 0),
            (&["bench", "gemm", "--plan-rank", "2"], "--plan-rank needs --plan", 0),
            (&["bench", "gemm", "--plan", "missing.json"], "cannot read plan 'missing.json'", 0),
            (&["bench", "hbm", "--bytes", "0"], "--bytes '0': give sizes in bytes from 1 to 1T", 0),
            (&["bench", "hbm", "-o", "taken.json"], "'taken.json' exists; not overwriting it (pass --force to replace it)", 0),
            (&["bench", "nccl", "--ranks", "0"], "--ranks 0: give 1 to 64 GPUs", 0),
            (&["bench", "nccl", "--ops", "broadcast"], "--ops 'broadcast' is not one of all_reduce, all_gather, reduce_scatter", 0),
            (&["bench", "p2p", "--peer", "0"], "--peer 0 is --device too", 0),
            (&["bench", "frob"], "unrecognized subcommand 'frob'", 0),
            // Past the arguments, on the fake device (1 GPU, 1 GiB).
            (&["bench", "hbm", "--device", "3"], "CUDA device 3 does not exist (1 device visible)", 1),
            (&["bench", "p2p"], "p2p needs two GPUs: --device 0 and --peer 1, but 1 device(s) are visible", 1),
            (&["bench", "nccl", "--ranks", "2"], "--ranks 2 from --device 0 needs devices 0..=1, but 1 device(s) are visible", 1),
            (&["bench", "hbm", "--bytes", "1G"], "out of memory on CUDA device 0: two buffers of 1073741824 bytes (copy source and destination) needs 2147483648 bytes", 1),
        ];
        for (args, want, libraries) in cases {
            crate::common::count_hostile();
            let (o, rest) = on_fakes(&f, &dir, args, *libraries);
            assert!(!o.status.success(), "{args:?} succeeded");
            assert!(!rest.contains("panicked"), "{args:?}: {rest}");
            assert_eq!(rest.trim_end().lines().count(), 1, "{args:?}:\n{rest}");
            assert!(
                rest.starts_with("error: ") && rest.contains(want),
                "{args:?}: expected '{want}' in: {rest}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(dir.path("taken.json")).unwrap(),
            "mine"
        );
        let left: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            !left
                .iter()
                .any(|n| n.to_string_lossy().starts_with("sextant-bench-")),
            "{left:?}"
        );
    }

    /// The smoke script against the fakes: versions, plan, benchmarks, the torch
    /// comparison with the stand-in PyTorch (or skipped without one), exec, then
    /// calibrate refuses the fakes' run: one line naming that step.
    #[test]
    fn bench_smoke_script_runs_on_the_fakes_up_to_calibrate() {
        if real_cuda_here() {
            return;
        }
        let dir = TempDir::new("smoke-fakes");
        let f = fakes(&dir);
        let model = dir.path("small.json");
        std::fs::write(
            &model,
            r#"{"schema_version":1,"name":"smoke-small","source":"test model for the fake CUDA libraries","layers":2,"hidden":64,"ffn_hidden":128,"heads":4,"kv_heads":4,"head_dim":16,"vocab":256,"mlp":"gated"}"#,
        )
        .unwrap();
        let python = ["python3", "python"].into_iter().find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
        let stand_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakecuda/python");
        let root = f.prefix.root.display().to_string();
        let driver = f.driver_dir.display().to_string();
        let model = model.display().to_string();
        let stand_in = stand_in.display().to_string();
        let run = |outdir: &str, python: Option<&str>| {
            let mut env = vec![
                ("VIRTUAL_ENV", root.as_str()),
                ("LD_LIBRARY_PATH", driver.as_str()),
                ("SMOKE_MODEL", model.as_str()),
                ("SMOKE_SEQ", "64"),
                ("SMOKE_GLOBAL_BATCH", "4"),
                ("SMOKE_GEMM_SIZES", "128,256"),
                ("SMOKE_HBM_BYTES", "256K,1M"),
                ("SMOKE_NCCL_BYTES", "64K,1M"),
                ("SMOKE_ITERS", "3"),
            ];
            if let Some(p) = python {
                env.push(("PYTHON", p));
                env.push(("PYTHONPATH", stand_in.as_str()));
            }
            let o = smoke(&dir, outdir, &env);
            let e = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{e}\n{}", stdout(&o));
            assert_eq!(e.lines().count(), 1, "{e}");
            assert!(
                e.starts_with("gpu-smoke: step 'calibrate' failed (exit 1): error: run of plan ")
                    && e.contains("ran on Sextant's fake CUDA libraries")
                    && e.ends_with(&format!(
                        "its output is in {}/{outdir}/calibrate.log\n",
                        dir.0.canonicalize().unwrap().display()
                    )),
                "{e}"
            );
            for file in [
                "versions.txt",
                "plan.json",
                "bench-gemm.json",
                "bench-hbm.json",
                "bench-nccl.json",
                "run.json",
                "exec.log",
                "calibrate.log",
            ] {
                assert!(dir.path(outdir).join(file).is_file(), "{file} missing");
            }
            assert!(
                !dir.path(outdir).join("bench-p2p.json").exists(),
                "one GPU: no p2p"
            );
            let run: sextant_planner::calibration::MeasuredRun =
                sextant_planner::calibration::MeasuredRun::from_json(
                    &std::fs::read_to_string(dir.path(outdir).join("run.json")).unwrap(),
                )
                .unwrap();
            assert!(run.complete && run.backend == "cuda");
            stdout(&o)
        };
        // Without PyTorch: the comparison is skipped, saying so.
        let said = run("no-torch", None);
        assert!(said.contains("no PyTorch with CUDA in "), "{said}");
        assert!(!dir.path("no-torch/gemm-vs-torch.tsv").exists());
        let Some(python) = python else {
            eprintln!("SKIPPED the torch comparison with the stand-in PyTorch: no python3 here");
            return;
        };
        let said = run("torch", Some(python));
        assert!(
            said.contains("torch 0.0-sextant-test-stand-in (CUDA 13.0) on stand-in GPU"),
            "{said}"
        );
        let gemm = BenchFile::from_json(
            &std::fs::read_to_string(dir.path("torch/bench-gemm.json")).unwrap(),
        )
        .unwrap();
        let table = std::fs::read_to_string(dir.path("torch/gemm-vs-torch.tsv")).unwrap();
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert!(table
            .lines()
            .next()
            .unwrap()
            .starts_with("# torch 0.0-sextant-test-stand-in"));
        assert_eq!(
            table.lines().nth(1).unwrap(),
            "class\tm\tn\tk\tbatch\tsextant_tflops\ttorch_tflops\tratio"
        );
        assert_eq!(rows.len(), gemm.gemms.len());
        for (row, g) in rows.iter().zip(&gemm.gemms) {
            let c: Vec<&str> = row.split('\t').collect();
            assert_eq!(
                c[..5],
                [
                    g.class.clone(),
                    g.m.to_string(),
                    g.n.to_string(),
                    g.k.to_string(),
                    g.batch.to_string()
                ]
            );
            let (mine, theirs, ratio): (f64, f64, f64) = (
                c[5].parse().unwrap(),
                c[6].parse().unwrap(),
                c[7].parse().unwrap(),
            );
            assert!(
                theirs > 0.0 && (ratio - mine / theirs).abs() < 1e-3 * ratio,
                "{row}"
            );
        }
        // Nothing outside OUTDIR.
        let mut here: Vec<String> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        here.sort();
        assert_eq!(
            here,
            ["bin", "driver", "no-torch", "small.json", "torch", "venv"]
        );
    }
}
