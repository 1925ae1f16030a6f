//! The CUDA backend on a machine without a GPU, against fake CUDA libraries
//! (tests/fakecuda, compiled here with `cc`: a driver, cuBLAS and a one-rank NCCL
//! over host memory that check every argument; see their README).
//!
//! - Finding the libraries where current stacks put them: fake `libcublas.so.13` and
//!   `libnccl.so.2` in a throwaway Python prefix's `site-packages/nvidia/*/lib`,
//!   LD_LIBRARY_PATH unset. Without `--features cuda` the search itself is checked.
//! - With `--features cuda`: `exec --backend cuda --ranks 1` runs small dense and MoE
//!   plans end to end on the fakes, compared with the CPU backend's run of the same
//!   plan; an allocation that fails and an NCCL call that fails inside a group end
//!   the run with one line, an incomplete run file, nothing leaked and no group open.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use sextant_executor::culibs::{find, Lib, SearchEnv};

use crate::common::{count_hostile, TempDir};

/// Where `fakecuda/*.c` live.
pub fn fakes_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fakecuda")
}

/// Compiles `fake_<stem>.c` into `dir/soname` with that soname (what glibc matches
/// when cudarc later opens the library by name).
pub fn build_fake(stem: &str, dir: &Path, soname: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let out = dir.join(soname);
    let src = fakes_src().join(format!("fake_{stem}.c"));
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(["-lpthread", "-ldl"])
        .output()
        .expect("the system C compiler `cc` runs (cargo needs it to link)");
    assert!(
        o.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A throwaway Python prefix with the fakes where NVIDIA's wheels put cuBLAS and NCCL.
pub struct Prefix {
    pub root: PathBuf,
    cublas: PathBuf,
    nccl: PathBuf,
}

pub fn prefix(dir: &TempDir) -> Prefix {
    let root = dir.path("venv");
    let site = root.join("lib/python3.12/site-packages/nvidia");
    let cublas = build_fake("cublas", &site.join("cublas/lib"), "libcublas.so.13");
    let nccl = build_fake("nccl", &site.join("nccl/lib"), "libnccl.so.2");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    Prefix { root, cublas, nccl }
}

/// The fakes say what they are, in a string the library carries.
fn says_it_is_a_fake(file: &Path, soname: &str) {
    let bytes = std::fs::read(file).unwrap();
    let needle = format!("sextant fake {soname} (tests only, no GPU)");
    assert!(
        bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
        "{} does not say it is a fake",
        file.display()
    );
}

#[test]
fn cuda_libraries_are_found_in_a_python_environments_nvidia_wheels() {
    let dir = TempDir::new("cudalibs-find");
    let p = prefix(&dir);
    says_it_is_a_fake(&p.cublas, "libcublas.so.13");
    says_it_is_a_fake(&p.nccl, "libnccl.so.2");
    let env = SearchEnv {
        virtual_env: Some(p.root.clone().into()),
        ..SearchEnv::default()
    };
    assert_eq!(find(Lib::Cublas, &env), Ok(p.cublas.clone()));
    assert_eq!(find(Lib::Nccl, &env), Ok(p.nccl.clone()));
    // The same prefix reached as the first python3 on PATH (a venv's bin/python3).
    std::fs::write(p.root.join("bin/python3"), b"").unwrap();
    let env = SearchEnv {
        path: Some(p.root.join("bin").into()),
        ..SearchEnv::default()
    };
    assert_eq!(find(Lib::Nccl, &env), Ok(p.nccl.clone()));
}

/// The fakes refuse what the real libraries refuse and report what was left behind:
/// `fake_selftest.c` misuses each on purpose (a copy past its allocation, a GEMM whose
/// leading dimension or operand extent is wrong, an unbalanced NCCL group, a double
/// free, a leaked allocation, a group left open) and checks one product's values.
#[test]
fn fake_cuda_libraries_catch_misuse() {
    let dir = TempDir::new("cudalibs-selftest");
    let lib = dir.path("lib");
    build_fake("cuda", &lib, "libcuda.so.1");
    build_fake("cublas", &lib, "libcublas.so.13");
    build_fake("nccl", &lib, "libnccl.so.2");
    let exe = dir.path("selftest");
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(fakes_src().join("fake_selftest.c"))
        .arg(format!("-L{}", lib.display()))
        .args(["-l:libcuda.so.1", "-l:libcublas.so.13", "-l:libnccl.so.2"])
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lpthread", "-ldl"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(&exe)
        .env_remove("SEXTANT_FAKE_OOM_AT")
        .output()
        .unwrap();
    let (out, err) = (crate::common::stdout(&o), crate::common::stderr(&o));
    assert!(
        o.status.success() && out.contains("selftest: 25 checks passed"),
        "{out}{err}"
    );
    for want in [
        "sextant fake libcuda.so.1 report at exit: 1 allocation(s) not freed (16 bytes)",
        "; 4 argument error(s);",
        "sextant fake libcublas.so.13 report at exit: 1 GEMM call(s) checked and computed; 2 argument error(s); 0 handle(s) not destroyed",
        "the process exits with an NCCL group open",
        "; 1 group(s) open; 0 communicator(s) not destroyed; 3 argument error(s)",
        "cublasGemmEx: B: 14 bytes at offset 0 run past allocation #2 of 12 bytes",
    ] {
        assert!(err.contains(want), "'{want}' missing from:\n{err}");
    }
}

#[test]
fn cuda_library_trees_that_are_not_libraries() {
    hostile_library_trees();
}

/// Trees that look like a library's home and are not: each is named as missing, with
/// the directories and names tried, in one line.
pub fn hostile_library_trees() {
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let dir = TempDir::new(&format!(
        "cudalibs-hostile-{}",
        CALLS.fetch_add(1, Ordering::Relaxed)
    ));
    let p = prefix(&dir);
    let env = SearchEnv {
        virtual_env: Some(p.root.clone().into()),
        ..SearchEnv::default()
    };
    let nccl_dir = p.nccl.parent().unwrap().to_path_buf();
    let cublas_dir = p.cublas.parent().unwrap().display().to_string();
    let check = |env: &SearchEnv, lib: Lib, tried: &[&str]| {
        count_hostile();
        let e = find(lib, env).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        for t in tried {
            assert!(e.contains(t), "'{t}' missing from: {e}");
        }
    };
    // Absent: the wheel directories searched are listed.
    std::fs::remove_file(&p.nccl).unwrap();
    check(
        &env,
        Lib::Nccl,
        &["NCCL not found: looked for libnccl.so.2 in ", &cublas_dir],
    );
    // A directory, and a dangling link, under the library's name.
    std::fs::create_dir(&p.nccl).unwrap();
    check(&env, Lib::Nccl, &["libnccl.so.2", "nvidia-nccl-cu13"]);
    std::fs::remove_dir(&p.nccl).unwrap();
    std::os::unix::fs::symlink(dir.path("nowhere"), &p.nccl).unwrap();
    check(&env, Lib::Nccl, &[&nccl_dir.display().to_string()]);
    // site-packages/nvidia as a file, and a prefix that is not a directory.
    let other = dir.path("other");
    let site = other.join("lib/python3.11/site-packages");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("nvidia"), b"x").unwrap();
    let env = SearchEnv {
        conda_prefix: Some(other.into()),
        virtual_env: Some(dir.path("not-there").into()),
        ..SearchEnv::default()
    };
    check(&env, Lib::Cublas, &["cuBLAS not found", "in no directory"]);
    // The driver is never taken from a wheel or a toolkit.
    let env = SearchEnv {
        virtual_env: Some(p.root.clone().into()),
        cuda_home: Some(p.root.clone().into()),
        ..SearchEnv::default()
    };
    check(
        &env,
        Lib::Driver,
        &["CUDA driver not found", "in no directory"],
    );
}

/// Whether the system loader already has `name` (a GPU machine's driver or NCCL):
/// then what the fakes show cannot be told apart from it, and the case is skipped.
#[cfg(feature = "cuda")]
fn system_has(name: &str) -> bool {
    Command::new("/sbin/ldconfig")
        .arg("-p")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{name} ")))
        })
        .unwrap_or(false)
}

/// `exec --backend cuda --ranks 1` with the fakes: the libraries are found in the
/// wheel tree, opened, and cudarc's loader uses them (the fake driver's own limit
/// comes back: a 1.7B model's weights do not fit its 1 GiB); with one taken away,
/// one line names it and where it was looked for.
#[cfg(feature = "cuda")]
#[test]
fn exec_backend_cuda_opens_the_libraries_from_the_wheel_tree() {
    if ["libcuda.so", "libcuda.so.1", "libcublas.so", "libnccl.so"]
        .iter()
        .any(|n| system_has(n))
    {
        eprintln!("skipped: this machine's loader has real CUDA libraries");
        return;
    }
    let dir = TempDir::new("cudalibs-exec");
    let p = prefix(&dir);
    // The driver comes from the system loader's path (as on a GPU machine): here
    // LD_LIBRARY_PATH names a directory that has only the fake driver.
    let driver_dir = dir.path("driver");
    build_fake("cuda", &driver_dir, "libcuda.so.1");
    let plan = crate::exec::plan(&dir, "plan.json", &["--model", "gpt-1.7b", "--gpus", "1"]);
    let run = |ld: Option<&Path>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sextant"));
        c.args([
            "exec",
            &plan,
            "--backend",
            "cuda",
            "--ranks",
            "1",
            "--force",
        ])
        .arg("--out")
        .arg(dir.path("run.json"))
        .env("VIRTUAL_ENV", &p.root)
        .env("PATH", p.root.join("bin"))
        .env_remove("CONDA_PREFIX")
        .env_remove("CUDA_HOME")
        .env_remove("CUDA_PATH")
        .env_remove("LD_LIBRARY_PATH");
        if let Some(ld) = ld {
            c.env("LD_LIBRARY_PATH", ld);
        }
        let o = c.output().unwrap();
        assert!(!o.status.success());
        let e = crate::common::stderr(&o);
        assert!(!e.contains("panicked"), "{e}");
        eprintln!("exec --backend cuda: {}", e.trim_end());
        e
    };
    // Everything found: the run gets past the driver, NCCL's unique id, the cuBLAS
    // check, the context and the communicators, to the fake device's memory.
    let e = run(Some(&driver_dir));
    assert!(
        e.contains("out of memory on CUDA device 0: the weights needs")
            && e.contains("free of 1.0 GiB"),
        "{e}"
    );
    // cuBLAS missing from the wheel tree: one line naming the names and directories.
    let moved = dir.path("cublas-away");
    std::fs::rename(&p.cublas, &moved).unwrap();
    let e = run(Some(&driver_dir));
    assert!(
        e.contains("cuBLAS not found: looked for libcublas.so.13 or libcublas.so.12 in ")
            && e.contains(&p.nccl.parent().unwrap().display().to_string())
            && e.contains("system loader"),
        "{e}"
    );
    std::fs::rename(&moved, &p.cublas).unwrap();
    // A file that is not a library, named as NCCL: said, with the loader's reason.
    std::fs::write(&p.nccl, "not an ELF file\n".repeat(16)).unwrap();
    let e = run(Some(&driver_dir));
    assert!(
        e.contains("NCCL could not be opened")
            && e.contains(&format!("{} did not load", p.nccl.display()))
            && e.contains("invalid ELF header"),
        "{e}"
    );
    // No driver at all.
    let e = run(None);
    assert!(
        e.contains("CUDA driver not found: looked for libcuda.so.1"),
        "{e}"
    );
}

/// The three fakes, built into a wheel tree (cuBLAS, NCCL) and a driver directory.
#[cfg(feature = "cuda")]
pub struct Fakes {
    pub prefix: Prefix,
    pub driver_dir: PathBuf,
}

#[cfg(feature = "cuda")]
impl Fakes {
    /// Sets `c`'s environment so that the binary finds the fakes (cuBLAS and NCCL
    /// in the wheel tree, the driver on LD_LIBRARY_PATH) and nothing else, with no
    /// fault injected.
    pub fn env<'a>(&self, c: &'a mut Command) -> &'a mut Command {
        c.env("VIRTUAL_ENV", &self.prefix.root)
            .env("LD_LIBRARY_PATH", &self.driver_dir)
            .env_remove("CONDA_PREFIX")
            .env_remove("CUDA_HOME")
            .env_remove("CUDA_PATH")
            .env_remove("SEXTANT_FAKE_OOM_AT")
            .env_remove("SEXTANT_FAKE_NCCL_FAIL_AT")
            .env_remove("SEXTANT_FAKE_DEVICE_BYTES")
    }
}

#[cfg(feature = "cuda")]
pub fn fakes(dir: &TempDir) -> Fakes {
    let prefix = prefix(dir);
    let driver_dir = dir.path("driver");
    build_fake("cuda", &driver_dir, "libcuda.so.1");
    Fakes { prefix, driver_dir }
}

/// Whether this machine's loader has real CUDA libraries, which the fakes could not
/// be told apart from: the end-to-end cases are then skipped, saying so.
#[cfg(feature = "cuda")]
pub fn real_cuda_here() -> bool {
    let real = ["libcuda.so", "libcuda.so.1", "libcublas.so", "libnccl.so"]
        .iter()
        .any(|n| system_has(n));
    if real {
        eprintln!("skipped: this machine's loader has real CUDA libraries");
    }
    real
}

/// A small model (a Sextant model JSON) and a one-GPU plan of it, returning the plan.
#[cfg(feature = "cuda")]
pub fn small_plan(dir: &TempDir, name: &str, moe: bool) -> String {
    let model = dir.path(&format!("{name}-model.json"));
    let moe = if moe {
        r#","moe":{"experts":4,"top_k":2,"expert_ffn_hidden":32}"#
    } else {
        ""
    };
    std::fs::write(
        &model,
        format!(
            r#"{{"schema_version":1,"name":"{name}","source":"test model for the fake CUDA libraries","layers":2,"hidden":64,"ffn_hidden":128,"heads":4,"kv_heads":4,"head_dim":16,"vocab":256,"mlp":"gated"{moe}}}"#
        ),
    )
    .unwrap();
    crate::exec::plan(
        dir,
        &format!("{name}.json"),
        &[
            "--model",
            model.to_str().unwrap(),
            "--gpus",
            "1",
            "--seq",
            "64",
            "--global-batch",
            "4",
        ],
    )
}

/// `sextant exec PLAN --ranks 1` (CUDA backend on the fakes when `fakes` is given,
/// with `env` set), returning the output and the run file (present or not).
#[cfg(feature = "cuda")]
fn exec_on(
    dir: &TempDir,
    plan: &str,
    fakes: Option<&Fakes>,
    env: &[(&str, &str)],
    out: &str,
) -> (
    std::process::Output,
    Option<sextant_planner::calibration::MeasuredRun>,
) {
    let out = dir.path(out);
    let mut c = Command::new(env!("CARGO_BIN_EXE_sextant"));
    c.args(["exec", plan, "--ranks", "1", "--force", "--timeout", "60"])
        .arg("--out")
        .arg(&out);
    match fakes {
        Some(f) => {
            c.args(["--backend", "cuda"])
                .env("VIRTUAL_ENV", &f.prefix.root)
                .env("PATH", f.prefix.root.join("bin"))
                .env("LD_LIBRARY_PATH", &f.driver_dir)
                .env_remove("CONDA_PREFIX")
                .env_remove("CUDA_HOME")
                .env_remove("CUDA_PATH")
                .env_remove("SEXTANT_FAKE_OOM_AT")
                .env_remove("SEXTANT_FAKE_NCCL_FAIL_AT")
                .env_remove("SEXTANT_FAKE_DEVICE_BYTES");
        }
        None => {
            c.arg("--full-size");
        }
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let run = std::fs::read_to_string(&out)
        .ok()
        .map(|t| sextant_planner::calibration::MeasuredRun::from_json(&t).unwrap());
    (o, run)
}

/// The fakes' report lines say nothing leaked, no argument was wrong, no group was
/// left open and no host function held a full launch queue; returns stderr without
/// them.
#[cfg(feature = "cuda")]
fn fakes_clean(err: &str, injected: u32) -> String {
    fakes_reported(err, injected, 3)
}

/// [`fakes_clean`] for a process that loaded `libraries` of the three fakes.
#[cfg(feature = "cuda")]
pub fn fakes_reported(err: &str, injected: u32, libraries: usize) -> String {
    let mut rest = String::new();
    let mut reports = 0;
    for line in err.lines() {
        if !line.starts_with("sextant fake ") {
            rest.push_str(line);
            rest.push('\n');
            continue;
        }
        assert!(!line.contains("argument error: "), "{line}");
        if line.starts_with("sextant fake libcuda.so.1 report") {
            reports += 1;
            for want in [
                " 0 allocation(s) not freed (0 bytes)",
                "; 0 stream(s) and 0 event(s) not destroyed",
                "; 0 argument error(s)",
                "; 0 stall(s) behind a host function",
            ] {
                assert!(line.contains(want), "'{want}' missing from: {line}");
            }
        } else if line.starts_with("sextant fake libnccl.so.2 report") {
            reports += 1;
            for want in [
                "; 0 group(s) open",
                "; 0 communicator(s) not destroyed",
                "; 0 argument error(s)",
            ] {
                assert!(line.contains(want), "'{want}' missing from: {line}");
            }
        } else if line.starts_with("sextant fake libcublas.so.13 report") {
            reports += 1;
            assert!(
                line.contains("; 0 argument error(s); 0 handle(s) not destroyed"),
                "{line}"
            );
        }
    }
    assert_eq!(
        reports, libraries,
        "each fake loaded reports once at the end:\n{err}"
    );
    let faults: u32 = err
        .lines()
        .filter_map(|l| {
            l.split("; ")
                .find_map(|f| f.strip_suffix(" injected fault(s)"))
        })
        .map(|n| n.parse::<u32>().unwrap())
        .sum();
    assert_eq!(faults, injected, "{err}");
    rest
}

/// A CUDA run on the fakes against the CPU backend's run of the same plan: the same
/// executed model and schedule, the same projection and MLP GEMMs (shape and count),
/// the same activations in flight; the backend's own checks (every communicator's
/// sum, every GEMM shape's sampled results against the host) passed; each unbatched
/// GEMM's event time is exactly what the fake device charges for it (2 us plus
/// 2mnk / 1e14 s: host-gated, so no host launch gap is in it; ungated it is 4 us or
/// more); the measured memory is there and no timed step grew the pool.
#[cfg(feature = "cuda")]
fn cuda_matches_cpu(moe: bool) {
    use sextant_planner::calibration::MeasuredRun;
    if real_cuda_here() {
        return;
    }
    let name = if moe { "small-moe" } else { "small-dense" };
    let dir = TempDir::new(&format!("cudalibs-{name}"));
    let f = fakes(&dir);
    let plan = small_plan(&dir, name, moe);
    let (o, cpu) = exec_on(&dir, &plan, None, &[], "cpu.json");
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let (o, cuda) = exec_on(&dir, &plan, Some(&f), &[], "cuda.json");
    let err = crate::common::stderr(&o);
    assert!(o.status.success(), "{err}");
    let rest = fakes_clean(&err, 0);
    assert!(rest.trim().is_empty(), "{rest}");
    let (cpu, cuda): (MeasuredRun, MeasuredRun) = (cpu.unwrap(), cuda.unwrap());
    assert!(
        cuda.complete && cuda.backend == "cuda",
        "{:?}",
        cuda.failure
    );
    assert!(cuda.device.contains("sextant fake GPU"), "{}", cuda.device);
    assert_eq!(
        (&cuda.model, &cuda.workload, &cuda.config, &cuda.schedule),
        (&cpu.model, &cpu.workload, &cpu.config, &cpu.schedule)
    );
    assert_eq!((&cuda.plan_hash, cuda.steps), (&cpu.plan_hash, cpu.steps));
    assert_eq!(cuda.peak_live_chunks, cpu.peak_live_chunks);
    let classes: &[&str] = if moe {
        &["attention_proj"]
    } else {
        &["attention_proj", "mlp"]
    };
    let shapes = |r: &MeasuredRun| -> Vec<(String, u64, u64, u64, u64)> {
        r.gemms
            .iter()
            .filter(|g| classes.contains(&g.class.as_str()))
            .map(|g| (g.class.clone(), g.m, g.n, g.k, g.calls))
            .collect()
    };
    assert!(!shapes(&cpu).is_empty());
    assert_eq!(shapes(&cuda), shapes(&cpu), "GEMMs on CUDA vs the CPU");
    for class in ["attention_core", "moe_experts", "router"] {
        let has = |r: &MeasuredRun| r.gemms.iter().any(|g| g.class == class);
        assert_eq!(has(&cuda), has(&cpu), "{class}");
    }
    for g in cuda
        .gemms
        .iter()
        .filter(|g| classes.contains(&g.class.as_str()))
    {
        let charged = 2e-6 + 2.0 * (g.m * g.n * g.k) as f64 / 1e14;
        assert!(
            (g.median_secs - charged).abs() < 1e-3 * charged,
            "{} {}x{}x{}: {} s, the fake device charges {charged} s",
            g.class,
            g.m,
            g.n,
            g.k,
            g.median_secs
        );
    }
    let c = &cuda.checks;
    assert_eq!(c.collectives, 9, "the world's and 8 groups' communicators");
    assert!(c.gemm_results >= 7 && c.max_rel_error < 1.0 / 64.0, "{c:?}");
    assert_eq!(cuda.step_secs.len() as u64, cuda.steps);
    assert!(cuda.step_secs.iter().all(|&s| s > 0.0));
    let [m] = cuda.device_memory.as_slice() else {
        panic!("one rank's memory: {:?}", cuda.device_memory)
    };
    assert_eq!(m.total_bytes, 1 << 30);
    assert!(m.free_with_context_bytes < m.total_bytes);
    assert!(m.free_before_run_bytes <= m.free_with_context_bytes);
    assert!(m.free_after_steps_bytes < m.free_before_run_bytes, "{m:?}");
    assert!(
        m.pool_used_peak_bytes
            >= cuda.param_bytes + cuda.optimizer_bytes + cuda.peak_activation_bytes,
        "{m:?}"
    );
    assert!(m.pool_reserved_peak_bytes >= m.pool_used_peak_bytes);
    assert_eq!(m.pool_grown_in_timed_steps_bytes, 0, "{m:?}");
    // Its times are the fake's: calibrate refuses them.
    let overlay = dir.path("overlay.json");
    crate::common::fails_with_one_line(
        &[
            "calibrate",
            dir.path("cuda.json").to_str().unwrap(),
            "--out",
            overlay.to_str().unwrap(),
        ],
        "ran on Sextant's fake CUDA libraries",
    );
    let said = crate::common::stdout(&o);
    assert!(
        said.contains("Device memory on rank 0 (of 1.0 GiB): "),
        "{said}"
    );
}

#[cfg(feature = "cuda")]
#[test]
fn exec_backend_cuda_runs_a_dense_plan_on_the_fakes() {
    cuda_matches_cpu(false);
}

#[cfg(feature = "cuda")]
#[test]
fn exec_backend_cuda_runs_a_moe_plan_on_the_fakes() {
    cuda_matches_cpu(true);
}

/// Faults injected through the fakes end the run with one line from the rank (and
/// the launcher's one-line summary), the run file marked incomplete with the reason,
/// nothing leaked, every NCCL group closed and no panic.
#[cfg(feature = "cuda")]
#[test]
fn exec_backend_cuda_faults_on_the_fakes() {
    if real_cuda_here() {
        return;
    }
    let dir = TempDir::new("cudalibs-faults");
    let f = fakes(&dir);
    let plan = small_plan(&dir, "faults", true);
    // `libraries`: how many fakes were used (and so report) before the fault.
    let check_with = |env: &[(&str, &str)], needles: &[&str], libraries: usize| {
        let (o, run) = exec_on(&dir, &plan, Some(&f), env, "fault.json");
        let err = crate::common::stderr(&o);
        assert!(!o.status.success(), "{env:?} succeeded: {err}");
        assert!(!err.contains("panicked"), "{err}");
        let rest = fakes_reported(&err, 1, libraries);
        let lines: Vec<&str> = rest.lines().collect();
        assert_eq!(lines.len(), 2, "{env:?}: {rest}");
        assert!(lines[0].starts_with("error: rank 0, "), "{rest}");
        assert!(
            lines[0].ends_with("fault.json' is marked incomplete)"),
            "{rest}"
        );
        assert!(
            lines[1].starts_with("error: 1 of 1 local ranks failed"),
            "{rest}"
        );
        for n in needles {
            assert!(lines[0].contains(n), "'{n}' missing from: {}", lines[0]);
        }
        let run = run.expect("an incomplete run file");
        assert!(!run.complete);
        let failure = run.failure.unwrap();
        assert!(needles.iter().all(|n| failure.contains(n)), "{failure}");
    };
    let check = |env: &[(&str, &str)], needles: &[&str]| check_with(env, needles, 3);
    // The first allocation (the cuBLAS workspace, before any handle or
    // communicator: only the driver's fake was used), the weights, then the first
    // stored activation.
    check_with(
        &[("SEXTANT_FAKE_OOM_AT", "1")],
        &["allocating 33554432 bytes for the cuBLAS workspace on CUDA device 0: CUDA_ERROR_OUT_OF_MEMORY"],
        1,
    );
    check(
        &[("SEXTANT_FAKE_OOM_AT", "2")],
        &["out of memory on CUDA device 0: the weights needs"],
    );
    check(
        &[("SEXTANT_FAKE_OOM_AT", "10")],
        &[
            "step 0",
            "out of memory on CUDA device 0: the stored activations of chunk 0",
        ],
    );
    // The third call inside an NCCL group (the communicator check's): the group is
    // ended before the communicators are aborted.
    check(
        &[("SEXTANT_FAKE_NCCL_FAIL_AT", "3")],
        &[
            "checking the communicators: ncclAllReduce failed: ncclInternalError",
            "injected failure of in-group call 3",
        ],
    );
}
