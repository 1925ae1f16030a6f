//! The executor end to end on the CPU backend: real ranks (processes) exchanging
//! real data over loopback TCP, checked against the unsharded reference; failures
//! that must end every rank within the timeout; the calibrate/compare loop.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sextant_planner::calibration::MeasuredRun;
use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::{simulate_schedule, PassCosts, Schedule};

use crate::common::{fails_with_one_line, sextant, stderr, stdout, TempDir};

/// Writes a one-configuration plan with `sextant estimate` and returns its path.
pub fn plan(dir: &TempDir, name: &str, args: &[&str]) -> String {
    let mut a = vec!["estimate"];
    a.extend_from_slice(args);
    a.push("--json");
    crate::common::saved(dir, name, &a)
        .to_string_lossy()
        .into_owned()
}

/// Runs a plan on 8 local CPU ranks and returns the measured run.
fn exec_ok(dir: &TempDir, plan: &str, extra: &[&str]) -> MeasuredRun {
    let out = dir
        .path(&format!("{}-run.json", plan.rsplit('/').next().unwrap()))
        .to_string_lossy()
        .into_owned();
    let mut a = vec![
        "exec",
        plan,
        "--ranks",
        "8",
        "--timeout",
        "60",
        "--out",
        &out,
        "--force",
    ];
    a.extend_from_slice(extra);
    let o = sextant(&a);
    assert!(o.status.success(), "{a:?} failed:\n{}", stderr(&o));
    assert!(stdout(&o).contains("no unmatched send"), "{}", stdout(&o));
    let run = MeasuredRun::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(run.complete && run.failure.is_none());
    let c = &run.checks;
    assert_eq!(
        c.collectives,
        8 * 8 * 4,
        "every rank checks its 8 groups with 4 collectives"
    );
    // ZeRO-3 replicas hold different shares: their gathers are checked instead.
    assert!(
        c.activations > 0 && c.gradients > 0 && (c.replicas > 0 || c.param_gathers > 0),
        "{c:?}"
    );
    assert!(c.max_rel_error < 2e-3, "{c:?}");
    assert_eq!(run.step_secs.len() as u64, run.steps);
    run
}

/// The executor holds at most what the simulator says: 1F1B keeps p - r micro-batches
/// in flight on rank r, interleaving more.
fn assert_in_flight_matches_simulator(run: &MeasuredRun, schedule: Schedule) {
    let (p, v) = (
        run.config.pp,
        if schedule == Schedule::Interleaved {
            run.config.vpp
        } else {
            1
        },
    );
    let m = run.workload.global_batch / (run.config.dp * run.config.mbs);
    let costs = PassCosts {
        forward: vec![1.0; p as usize],
        backward: vec![2.0; p as usize],
        weight: vec![0.0; p as usize],
    };
    let t = simulate_schedule(schedule, p, v, m, &costs, 0.0).expect("schedule simulates");
    let want: Vec<u64> = t
        .peak_in_flight
        .iter()
        .map(|x| (x * v as f64).round() as u64)
        .collect();
    assert_eq!(
        run.peak_live_chunks, want,
        "executor vs simulator peak in-flight chunks"
    );
}

#[test]
fn cpu_backend_tp2_pp2_dp2() {
    let dir = TempDir::new("exec-tp2pp2dp2");
    let p = plan(
        &dir,
        "tp2pp2dp2.json",
        &[
            "--model", "8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--sp", "false",
        ],
    );
    let run = exec_ok(&dir, &p, &[]);
    assert_eq!((run.config.tp, run.config.pp, run.config.dp), (2, 2, 2));
    assert!(run.checks.p2p_messages > 0);
    assert!(
        run.components["tp"] > 0.0 && run.components["pp"] > 0.0 && run.components["dp_grad"] > 0.0
    );
    assert_in_flight_matches_simulator(&run, Schedule::OneFOneB);
}

#[test]
fn cpu_backend_cp2_with_sequence_parallelism() {
    let dir = TempDir::new("exec-cp2sp");
    let p = plan(
        &dir,
        "cp2sp.json",
        &[
            "--model", "8b", "--gpus", "8", "--tp", "2", "--cp", "2", "--pp", "2", "--sp", "true",
            "--zero", "1",
        ],
    );
    let run = exec_ok(&dir, &p, &[]);
    assert_eq!((run.config.cp, run.config.sp), (2, true));
    assert!(
        run.components["cp"] > 0.0 && run.components["dp_param"] > 0.0,
        "CP ring and DO all-gather ran: {:?}",
        run.components
    );
    assert!(
        run.collectives
            .iter()
            .any(|c| c.kind == "tp" && c.op == "reduce_scatter"),
        "SP reduce-scatters"
    );
}

#[test]
fn cpu_backend_expert_parallelism() {
    let dir = TempDir::new("exec-ep");
    // TP2 x EP2 with SP, pipelined; then EP over all 8 ranks.
    let p = plan(
        &dir,
        "ep2.json",
        &[
            "--model",
            "30b-a3b",
            "--gpu",
            "b200",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "2",
            "--ep",
            "2",
            "--sp",
            "true",
            "--recompute",
            "full",
        ],
    );
    let run = exec_ok(&dir, &p, &[]);
    assert!(
        run.components["ep"] > 0.0 && run.components["edp_grad"] > 0.0,
        "{:?}",
        run.components
    );
    assert!(run.components["recompute"] > 0.0);
    let p = plan(
        &dir,
        "ep8.json",
        &[
            "--model",
            "30b-a3b",
            "--gpu",
            "b200",
            "--gpus",
            "8",
            "--ep",
            "8",
            "--zero",
            "1",
            "--recompute",
            "full",
        ],
    );
    let run = exec_ok(&dir, &p, &[]);
    assert!(run
        .collectives
        .iter()
        .any(|c| c.kind == "ep" && c.op == "all_to_all" && c.ranks == 8));
}

/// ZeRO-3: each pass all-gathers its virtual stage's parameters from the replicas
/// (checked against the reference), and between passes a rank keeps only its
/// share, so it holds half the parameter bytes of the distributed optimizer at
/// DP 2.
#[test]
fn cpu_backend_zero3_gathers_parameters_for_every_pass() {
    let dir = TempDir::new("exec-zero3");
    let args = |zero: &'static str| {
        vec![
            "--model", "8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--vpp", "2", "--sp", "true",
            "--zero", zero,
        ]
    };
    let z3 = exec_ok(&dir, &plan(&dir, "z3.json", &args("3")), &[]);
    let z1 = exec_ok(&dir, &plan(&dir, "z1.json", &args("1")), &[]);
    // Two virtual stages per rank, a forward and a backward of each per
    // micro-batch, in every step (warm-up included): one gather each, all checked.
    let m = z3.workload.global_batch / (z3.config.dp * z3.config.mbs);
    assert_eq!(
        z3.checks.param_gathers,
        8 * (z3.warmup_steps + z3.steps) * 2 * 2 * m,
        "{:?}",
        z3.checks
    );
    assert_eq!(z1.checks.param_gathers, 0);
    assert!(
        z3.collectives
            .iter()
            .any(|c| c.kind == "dp_param" && c.op == "all_gather"),
        "{:?}",
        z3.collectives
    );
    assert_eq!(
        z3.param_bytes * 2,
        z1.param_bytes,
        "ZeRO-3 keeps 1/dp of the parameters"
    );
    // Experts are gathered over the expert-data-parallel group.
    let moe = exec_ok(
        &dir,
        &plan(
            &dir,
            "z3moe.json",
            &[
                "--model", "30b-a3b", "--gpu", "b200", "--gpus", "8", "--tp", "2", "--pp", "2",
                "--ep", "2", "--sp", "true", "--zero", "3",
            ],
        ),
        &[],
    );
    assert!(
        moe.collectives
            .iter()
            .any(|c| c.kind == "edp_param" && c.op == "all_gather"),
        "{:?}",
        moe.collectives
    );
    assert!(moe.checks.param_gathers > 0);
}

#[test]
fn cpu_backend_interleaved_schedule_with_uneven_layers() {
    let dir = TempDir::new("exec-vpp");
    let p = plan(
        &dir,
        "vpp.json",
        &[
            "--model",
            "8b",
            "--gpus",
            "8",
            "--pp",
            "4",
            "--vpp",
            "2",
            "--tp",
            "2",
            "--sp",
            "true",
            "--recompute",
            "selective",
            "--mbs",
            "2",
        ],
    );
    let run = exec_ok(&dir, &p, &["--scale-layers", "11"]);
    assert_eq!(run.model.layers, 11);
    assert_in_flight_matches_simulator(&run, Schedule::Interleaved);
}

/// A deep interleaved pipeline with TP 4 runs four steps within the reference's
/// tolerance. Under ReLU a pre-activation within rounding of zero switched a unit
/// on in the sharded run and off in the reference (their summation orders
/// differ), and this plan failed at its third step 2.11e-3 off, with no layout
/// error; the executed MLPs now use SiLU, whose derivative is continuous.
#[test]
fn cpu_backend_deep_interleaving_stays_within_tolerance_over_steps() {
    let dir = TempDir::new("exec-deep-vpp");
    let p = plan(
        &dir,
        "deep.json",
        &[
            "--model",
            "8b",
            "--gpus",
            "8",
            "--tp",
            "4",
            "--pp",
            "2",
            "--vpp",
            "8",
            "--dp",
            "1",
            "--mbs",
            "2",
            "--global-batch",
            "16",
        ],
    );
    let run = exec_ok(&dir, &p, &["--warmup", "0", "--max-steps", "4"]);
    assert_eq!(run.steps, 4);
}

/// `compare` reads a run's own records after its hash matched the plan file: a
/// run with no timed step, one that names a plan the file does not hold, or one
/// whose configuration was edited is refused in one line (each was compared:
/// a measured step of 0, or predictions for another layout).
#[test]
fn compare_refuses_an_edited_run() {
    let dir = TempDir::new("exec-compare-edited");
    let p = plan(
        &dir,
        "cmp.json",
        // Micro-batch 4: the CPU backend runs 2, which is no edit.
        &[
            "--model", "8b", "--gpus", "8", "--tp", "2", "--pp", "2", "--mbs", "4",
        ],
    );
    let out = dir.path("cmp-run.json");
    let o = sextant(&[
        "exec",
        &p,
        "--ranks",
        "8",
        "--out",
        out.to_str().unwrap(),
        "--force",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = sextant(&["compare", &p, out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(run["config"]["mbs"], 2, "the CPU backend's cap");
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit, &str); 3] = [
        (
            "steps",
            |r| r["step_secs"] = serde_json::json!([]),
            "records no timed step",
        ),
        (
            "rank",
            |r| r["plan_rank"] = 2.into(),
            "says it ran plan #2 but",
        ),
        (
            "config",
            |r| {
                r["config"]["tp"] = 1.into();
                r["config"]["dp"] = 4.into();
            },
            "records another configuration than plan #1 of",
        ),
    ];
    for (name, edit, needle) in edits {
        let mut r = run.clone();
        edit(&mut r);
        let path = dir.path(&format!("edited-{name}.json"));
        std::fs::write(&path, serde_json::to_string(&r).unwrap()).unwrap();
        fails_with_one_line(&["compare", &p, path.to_str().unwrap()], needle);
    }
}

/// Fault cases below are run by the reliability summary, which counts them.
fn temp_plan_8b(dir: &TempDir) -> String {
    temp_plan_8b_with(dir, &[])
}

/// The same plan with `extra` flags.
fn temp_plan_8b_with(dir: &TempDir, extra: &[&str]) -> String {
    let mut args = vec!["--model", "8b", "--gpus", "8", "--tp", "2", "--pp", "2"];
    args.extend_from_slice(extra);
    plan(dir, "p.json", &args)
}

pub fn a_rank_killed_mid_step_ends_every_rank_within_the_timeout() {
    let dir = TempDir::new("exec-kill");
    let p = temp_plan_8b(&dir);
    let out = dir.path("run.json").to_string_lossy().into_owned();
    let t = Instant::now();
    let o = sextant(&[
        "exec",
        &p,
        "--ranks",
        "8",
        "--timeout",
        "20",
        "--out",
        &out,
        "--fault",
        "die:3:1",
    ]);
    let took = t.elapsed();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        took < Duration::from_secs(20),
        "ranks took {took:?} to notice"
    );
    assert!(!err.contains("panicked"), "{err}");
    // Every other rank names rank 3; the launcher reports all 8 failed.
    for r in [0, 1, 2, 4, 5, 6, 7] {
        assert!(
            err.contains(&format!("rank {r}, step 1")),
            "rank {r} did not report:\n{err}"
        );
    }
    assert!(err.contains("8 of 8 local ranks failed"), "{err}");
    let run = MeasuredRun::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert!(!run.complete && run.step_secs.is_empty());
    assert!(
        run.failure.unwrap().contains("rank 3"),
        "the incomplete run names the dead rank"
    );
}

pub fn a_rank_that_never_arrives_is_named_after_the_timeout() {
    let dir = TempDir::new("exec-absent");
    let p = temp_plan_8b(&dir);
    let out = dir.path("run.json").to_string_lossy().into_owned();
    let t = Instant::now();
    let o = sextant(&[
        "exec",
        &p,
        "--ranks",
        "8",
        "--timeout",
        "3",
        "--out",
        &out,
        "--fault",
        "absent:5",
    ]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("rank 5 of world size 8 never arrived"),
        "{err}"
    );
    // Rank 0 gives up after 3 s; the absent rank is killed by the launcher at 2 x 3 + 10 s.
    assert!(
        t.elapsed() < Duration::from_secs(3 * 2 + 10 + 5),
        "{:?}",
        t.elapsed()
    );
}

pub fn ranks_with_different_plan_files_are_refused_at_the_rendezvous() {
    let dir = TempDir::new("exec-mismatch");
    let a = plan(
        &dir,
        "a.json",
        &["--model", "gpt-1.7b", "--gpus", "2", "--tp", "2"],
    );
    let b = plan(
        &dir,
        "b.json",
        &[
            "--model",
            "gpt-1.7b",
            "--gpus",
            "2",
            "--tp",
            "2",
            "--recompute",
            "full",
        ],
    );
    let port = TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let spawn = |rank: &str, plan: &str| {
        Command::new(env!("CARGO_BIN_EXE_sextant"))
            .args([
                "exec",
                plan,
                "--timeout",
                "10",
                "--out",
                &dir.path("r.json").to_string_lossy(),
            ])
            .env("RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .env("SEXTANT_JOB_SECRET", "mismatch-test-secret-0123")
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let r0 = spawn("0", &a);
    let r1 = spawn("1", &b);
    let (o0, o1) = (
        r0.wait_with_output().unwrap(),
        r1.wait_with_output().unwrap(),
    );
    assert!(!o0.status.success() && !o1.status.success());
    assert!(
        stderr(&o0).contains("rank 1 runs a different plan file"),
        "{}",
        stderr(&o0)
    );
    assert!(
        stderr(&o1).contains("rendezvous refused by rank 0"),
        "{}",
        stderr(&o1)
    );
}

pub fn a_rendezvous_port_in_use_is_one_clear_line() {
    let dir = TempDir::new("exec-port");
    let p = plan(&dir, "one.json", &["--model", "gpt-1.7b", "--gpus", "1"]);
    let taken = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_sextant"))
        .args([
            "exec",
            &p,
            "--timeout",
            "5",
            "--out",
            &dir.path("r.json").to_string_lossy(),
        ])
        .env("RANK", "0")
        .env("WORLD_SIZE", "1")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(!o.status.success());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("MASTER_PORT {port} is already in use")),
        "{err}"
    );
}

pub fn exec_refuses_bad_input_and_never_overwrites() {
    let dir = TempDir::new("exec-bad");
    let p = temp_plan_8b(&dir);
    let existing = dir.path("mine.json");
    std::fs::write(&existing, "keep me").unwrap();
    let e = existing.to_string_lossy().into_owned();
    fails_with_one_line(
        &["exec", &p, "--ranks", "8", "--out", &e],
        "not overwriting",
    );
    assert_eq!(std::fs::read_to_string(&existing).unwrap(), "keep me");
    fails_with_one_line(
        &["exec", &p, "--ranks", "0"],
        "--ranks 0: give the plan's 8 ranks",
    );
    fails_with_one_line(
        &["exec", &p, "--ranks", "300"],
        "but --ranks 300 was given: use --ranks 8",
    );
    fails_with_one_line(
        &["exec", &p, "--backend", "tpu"],
        "[possible values: cpu, cuda]",
    );
    fails_with_one_line(&["exec", &p, "--max-steps", "0"], "at least one timed step");
    fails_with_one_line(&["exec", &p, "--fault", "die:x:1"], "not a number");
    fails_with_one_line(&["compare", &p, &e], "measured run");
    fails_with_one_line(&["calibrate", &e], "measured run");
    #[cfg(not(feature = "cuda"))]
    {
        let o = Command::new(env!("CARGO_BIN_EXE_sextant"))
            .args([
                "exec",
                &p,
                "--backend",
                "cuda",
                "--out",
                &dir.path("c.json").to_string_lossy(),
            ])
            .env("RANK", "0")
            .env("WORLD_SIZE", "8")
            .env("MASTER_ADDR", "127.0.0.1")
            .output()
            .unwrap();
        assert!(
            stderr(&o).contains("built without CUDA support"),
            "{}",
            stderr(&o)
        );
        // Said once, not by each of the ranks it would have started.
        fails_with_one_line(
            &["exec", &p, "--backend", "cuda", "--ranks", "8"],
            "built without CUDA support",
        );
    }
}

#[test]
fn calibration_from_a_run_moves_the_prediction_toward_the_measurement() {
    let dir = TempDir::new("exec-calibrate");
    // Priced as one CUDA graph: the executed program's scaled-down layers would
    // otherwise be priced as waiting for a Python host on the GPU (a few hundred
    // kernels at 50 us), a term a CPU run has no counterpart of (its overlay drops
    // it), which would make the uncalibrated GPU prediction the yardstick by chance.
    let p = temp_plan_8b_with(&dir, &["--cuda-graphs", "full_iteration"]);
    let run = dir.path("p.json-run.json").to_string_lossy().into_owned();
    let overlay = dir.path("overlay.json").to_string_lossy().into_owned();
    // A run of 4 steps on 8 CPU processes is a noisy sample: under the whole
    // suite's load (CI), about one run in ten times its collectives so that the
    // overlay fitted from it misses (seen once in CI, once in 11 loaded local
    // runs). The property is the calibration's, not one sample's: it must hold on
    // one of three fresh runs, and every miss is printed with its overlay.
    let mut misses = Vec::new();
    for _attempt in 0..3 {
        let _ = std::fs::remove_file(&run);
        exec_ok(&dir, &p, &["--max-steps", "4"]);
        let _ = std::fs::remove_file(&overlay);
        let o = sextant(&["calibrate", &run, "--out", &overlay]);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = sextant(&["compare", &p, &run, "--calibration", &overlay, "--json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let step = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["component"] == "step")
            .unwrap();
        let (before, after, measured) = (
            step["predicted_secs"].as_f64().unwrap(),
            step["calibrated_secs"].as_f64().unwrap(),
            step["measured_secs"].as_f64().unwrap(),
        );
        let miss = |x: f64| (x / measured).ln().abs();
        if miss(after) < miss(before) {
            misses.clear();
            break;
        }
        misses.push(format!(
            "calibrated {after} is not closer to measured {measured} than {before}; overlay {}; compare {}",
            std::fs::read_to_string(&overlay).unwrap(),
            stdout(&o)
        ));
    }
    assert!(misses.is_empty(), "{misses:#?}");
    // A CPU overlay describes this CPU, not the plan's GPUs: plan refuses it.
    let plan_file = PlanFile::from_json(&std::fs::read_to_string(&p).unwrap()).unwrap();
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--gpu",
            &plan_file.hardware.name,
            "--calibration",
            &overlay,
        ],
        "CPU test backend",
    );
    // A run whose steps took 0 s, or that ran on no rank, is no measurement.
    let text = std::fs::read_to_string(&run).unwrap();
    for (key, value, needle) in [
        ("step_secs", serde_json::json!([0.0, 0.0]), "a step of 0 s"),
        ("world_size", serde_json::json!(0), "world_size 0"),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v[key] = value;
        let bad = dir.path(&format!("bad-{key}.json"));
        std::fs::write(&bad, v.to_string()).unwrap();
        fails_with_one_line(
            &[
                "calibrate",
                bad.to_str().unwrap(),
                "--out",
                dir.path("never.json").to_str().unwrap(),
            ],
            needle,
        );
    }
}

#[test]
fn cpu_backend_zero_bubble_gpipe_and_dualpipe_schedules() {
    let dir = TempDir::new("exec-zb");
    let p = plan(
        &dir,
        "zb.json",
        &[
            "--model",
            "8b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "4",
            "--sp",
            "true",
            "--schedule",
            "zb-h1",
        ],
    );
    let run = exec_ok(&dir, &p, &[]);
    assert_eq!(run.schedule, "ZbH1");
    let p = plan(
        &dir,
        "gpipe.json",
        &[
            "--model",
            "gpt-1.7b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "4",
            "--sp",
            "true",
            "--schedule",
            "gpipe",
            "--global-batch",
            "32",
        ],
    );
    let run = exec_ok(&dir, &p, &[]);
    assert_in_flight_matches_simulator(&run, Schedule::Gpipe);
    // DualPipe: both directions, every stage held twice and the mirror copies'
    // gradients summed; p + 1 micro-batches live on every rank, as simulated.
    let p = plan(
        &dir,
        "dual.json",
        &[
            "--model",
            "gpt-1.7b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "4",
            "--sp",
            "true",
            "--schedule",
            "dualpipe",
            "--global-batch",
            "32",
        ],
    );
    let run = exec_ok(&dir, &p, &[]);
    assert_eq!(run.peak_live_chunks, vec![5; 4]);
    assert_in_flight_matches_simulator(&run, Schedule::DualPipe);
    assert!(
        run.collectives
            .iter()
            .any(|c| c.kind == "dp_grad" && c.ranks == 2),
        "mirror gradient sum"
    );
}

/// Expert tensor parallelism: each expert's FFN columns split over the ETP group,
/// its rows all-gathered after the EP all-to-all and the partial outputs
/// reduce-scattered back, checked against the unsharded reference.
#[test]
fn cpu_backend_expert_tensor_parallelism() {
    let dir = TempDir::new("exec-etp");
    for (name, args) in [
        (
            "etp2.json",
            vec!["--tp", "2", "--ep", "2", "--etp", "2", "--sp", "true"],
        ),
        // ETP wider than TP, across pipeline stages, with SP (Megatron-Core refuses MoE with TP and no SP).
        (
            "etp4.json",
            vec![
                "--tp", "2", "--pp", "2", "--ep", "1", "--etp", "2", "--sp", "true", "--zero", "3",
            ],
        ),
        (
            "etp4ep.json",
            vec!["--ep", "2", "--etp", "4", "--zero", "1"],
        ),
    ] {
        let mut a = vec![
            "--model",
            "30b-a3b",
            "--gpu",
            "b200",
            "--gpus",
            "8",
            "--recompute",
            "full",
        ];
        a.extend_from_slice(&args);
        let p = plan(&dir, name, &a);
        let run = exec_ok(&dir, &p, &[]);
        let etp = run.config.etp;
        assert!(etp > 1);
        for op in ["all_gather", "reduce_scatter"] {
            assert!(
                run.collectives
                    .iter()
                    .any(|c| c.kind == "etp" && c.op == op && c.ranks == etp),
                "{name}: no etp {op} in {:?}",
                run.collectives
            );
        }
    }
}

/// `--full-size` on the CPU backend is refused in one line, before any rank
/// starts, when the plan's own per-GPU memory over its ranks exceeds what the host
/// has available (405B on 128 ranks: about 9 TiB), instead of growing until the
/// host runs out.
#[test]
fn full_size_on_the_cpu_refuses_what_the_host_cannot_hold() {
    if std::fs::read_to_string("/proc/meminfo").is_err() {
        return;
    }
    let dir = TempDir::new("full-size-host");
    let plan = crate::common::saved(
        &dir,
        "p.json",
        &["plan", "--model", "405b", "--gpus", "128"],
    );
    let out = dir.0.join("r.json");
    fails_with_one_line(
        &[
            "exec",
            plan.to_str().unwrap(),
            "--ranks",
            "128",
            "--full-size",
            "--out",
            out.to_str().unwrap(),
        ],
        "--full-size on the CPU backend would hold at least",
    );
    assert!(!out.exists());
}
