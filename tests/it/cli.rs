//! The `sextant` binary end to end.

use std::path::Path;

use crate::common::{data, fails_with_one_line, saved, sextant, stderr, stdout, words, TempDir};

use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::Schedule;

#[test]
fn plan_70b_on_128_gpus_prints_ten_ranked_plans_and_counts() {
    let o = sextant(&["plan", "--model", "70b", "--gpus", "128"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("70b -> llama3-70b"),
        "alias resolution not printed:\n{out}"
    );
    for needle in [
        "seq 4096",
        "global batch 1024",
        "precision bf16",
        "h100-sxm",
        "TP",
        "VPP",
        "MFU",
        "mem GiB/cap",
        "bubble",
    ] {
        assert!(out.contains(needle), "missing '{needle}':\n{out}");
    }
    let rows = out
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .map(|w| w.parse::<u32>().is_ok())
                .unwrap_or(false)
                && l.contains('%')
        })
        .count();
    assert_eq!(rows, 10, "expected 10 plan rows:\n{out}");
    let summary = out
        .lines()
        .find(|l| l.starts_with("Searched "))
        .expect("search summary");
    assert!(
        summary.contains("valid") && summary.contains("rejected"),
        "{summary}"
    );
    assert!(
        out.contains("does not fit in GPU memory"),
        "rejection reasons not listed:\n{out}"
    );
    // Megatron-Core's band straddles the step: no note that the step is optimistic.
    assert!(!out.contains("wholly above"), "{out}");
}

/// torchtitan's runs all took longer than predicted: a torchtitan plan's band lies
/// above its step, and the table says to read the upper column.
#[test]
fn plan_says_when_the_step_is_optimistic() {
    let o = sextant(&[
        "plan",
        "--model",
        "70b",
        "--gpus",
        "128",
        "--target",
        "torchtitan",
        "--top",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("band lies wholly above its step time")
            && out.contains("h100-sxm dense torchtitan runs")
            && out.contains("read the upper column"),
        "{out}"
    );
}

/// A dense plan whose layers take under 2 ms per micro-batch is named as one the
/// published runs ran slower than priced; the default 70B plan is not.
#[test]
fn small_layers_get_a_note() {
    let o = sextant(&[
        "estimate", "--model", "8b", "--gpus", "64", "--seq", "2048", "--tp", "8", "--dp", "8",
        "--mbs", "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("note: the GPU waits for the host")
            && out.contains("ms of GPU time per micro-batch")
            && out.contains("waiting for the host"),
        "{out}"
    );
    let o = sextant(&["plan", "--model", "70b", "--gpus", "128", "--top", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("waits for the host"), "{}", stdout(&o));
    assert!(!stdout(&o).contains("each layer takes"), "{}", stdout(&o));
}

/// Counts near u64::MAX must not wrap below the bounds they are checked against, and
/// a shell completion that cannot be written is one error line, not clap's panic.
#[test]
fn huge_counts_do_not_wrap_and_completions_fail_cleanly() {
    crate::common::fails_with_one_line(
        &[
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--prompt-len",
            "1",
            "--prompt-max",
            "18446744073709551615",
            "--response-len",
            "2",
            "--emit",
            "rlinf",
        ],
        "beyond what Sextant prices",
    );
    crate::common::fails_with_one_line(
        &[
            "estimate",
            "--model",
            "70b",
            "--gpus",
            "128",
            "--tp",
            "8",
            "--pp",
            "16",
            "--global-batch",
            "64",
            "--mix",
            "h100-sxm:18446744073709551552,a100-80g:192",
        ],
        "add up to 18446744073709551615 GPUs",
    );
    if let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_sextant"))
            .args(["completions", "bash"])
            .stdout(full)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            !err.contains("panicked") && err.trim_end().lines().count() == 1,
            "{err}"
        );
    }
}

/// A search that only --schedule interleaved empties names that rule, not the
/// --tp/--pp flags the user did not give.
#[test]
fn an_impossible_interleaving_is_named() {
    crate::common::fails_with_one_line(
        &[
            "plan",
            "--model",
            "deepseek-v3",
            "--gpus",
            "1024",
            "--gpu",
            "h800",
            "--schedule",
            "interleaved",
        ],
        "--schedule interleaved needs the 61 layers split evenly",
    );
}

/// A run id from the user's CSV stays one table cell: escaped, and in Markdown a
/// `|` escaped.
/// A control character in a value clap refuses (a newline, a carriage return, a
/// terminal escape) is shown escaped inside the one error line, not printed raw:
/// a raw newline cut the line after the quote.
#[test]
fn control_characters_in_refused_values_stay_on_one_line() {
    use crate::common::fails_with_one_line;
    // plan --model 70b --gpus 8 and one more option; the values are not words.
    let plan = |extra: &[&str], needle: &str| {
        let mut args = vec!["plan", "--model", "70b", "--gpus", "8"];
        args.extend_from_slice(extra);
        fails_with_one_line(&args, needle);
    };
    fails_with_one_line(&["plan", "--model", "70b", "--gpus", "8\nx"], "'8\\nx'");
    plan(&["--precision", "bf\r\n16"], "'bf\\r\\n16'");
    plan(&["--precision", "\u{1b}[31mbf16"], "'\\u{1b}[31mbf16'");
    fails_with_one_line(&["plan", "--mo\ndel", "70b"], "'--mo\\ndel'");
    // A value clap quotes altered (it drops some escape sequences) or not at all
    // is named escaped; a BEL and CR never reach the terminal raw.
    plan(&["\u{7}\rx"], "'\\u{7}\\rx'");
    plan(
        &["--precision", "bf\u{1b}]0;pwn\u{7}"],
        "'bf\\u{1b}]0;pwn\\u{7}'",
    );
    // A value that is not UTF-8 with another argument wrong: no panic.
    {
        use std::os::unix::ffi::OsStrExt;
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_sextant"))
            .args(["plan", "--model"])
            .arg(std::ffi::OsStr::from_bytes(b"\xff\xfe"))
            .args(["--gpus", "8", "--bogus"])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert!(
            o.status.code() == Some(2)
                && err.trim_end().lines().count() == 1
                && !err.contains("panicked"),
            "{err}"
        );
    }
    // A 100 kB value (one argument can hold no more than 128 kB) is cut, not echoed whole.
    let huge = "7".repeat(100_000);
    let o = sextant(&["plan", "--model", "70b", "--gpus", &huge]);
    assert!(
        !o.status.success() && stderr(&o).len() < 1000,
        "{}",
        stderr(&o).len()
    );
    // The tool's own refusals already escape what they quote.
    fails_with_one_line(&["plan", "--model", "70b\nx", "--gpus", "8"], "'70b\\nx'");
}

#[test]
fn validate_tables_escape_the_csv_ids() {
    let dir = crate::common::TempDir::new("csv-ids");
    let text = std::fs::read_to_string(crate::common::data("published_runs.csv")).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    let row = lines.next().unwrap();
    let (_, rest) = row.split_once(',').unwrap();
    let csv = format!("{header}\n\"a|b\u{1b}[2Jc\",{rest}\n");
    let path = dir.0.join("runs.csv");
    std::fs::write(&path, csv).unwrap();
    let o = sextant(&["validate", path.to_str().unwrap(), "--markdown"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(!out.contains('\u{1b}'), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("a\\|b"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(line.matches(" | ").count(), 6, "{line}");
    // A stack file at fault is named, not the runs CSV beside it.
    let stack = dir.0.join("stack.csv");
    std::fs::write(&stack, "run,source\nx,y\n").unwrap();
    let o = sextant(&[
        "validate",
        path.to_str().unwrap(),
        "--stack",
        stack.to_str().unwrap(),
    ]);
    let err = stderr(&o);
    assert!(
        !o.status.success()
            && err.contains("stack.csv': stack file has no 'id' column")
            && !err.contains("runs.csv"),
        "{err}"
    );
}

/// When the first plan is tied (within 5%) with a plan holding a margin of memory or
/// deeper virtual stages, the note names them; a lone plan gets no such note.
#[test]
fn tied_plans_name_the_safer_one() {
    let o = sextant(&["plan", "--model", "70b", "--gpus", "128"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let note = out
        .lines()
        .find(|l| l.starts_with("note: plans 1 to"))
        .unwrap_or_else(|| panic!("no tie note: {out}"));
    assert!(
        note.contains("rank within 5% of the first")
            && note.contains("where the first needs 75.6 of the 75.6 a plan may use")
            && note.contains("where the first gives one (PP 4 x VPP 10 = 40 virtual stages against PP 4 x VPP 20 = 80"),
        "{note}"
    );
    let o = sextant(&["plan", "--model", "70b", "--gpus", "128", "--top", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("note: plans 1 to"), "{}", stdout(&o));
}

#[test]
fn plan_flags_change_assumptions_and_json_is_a_plan_file() {
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "16",
        "--seq",
        "8192",
        "--global-batch",
        "256",
        "--precision",
        "fp8",
        "--top",
        "3",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = PlanFile::from_json(&stdout(&o)).expect("valid plan JSON");
    assert_eq!(plan.plans.len(), 3);
    assert_eq!(plan.gpus, 16);
    assert_eq!(plan.workload.seq, 8192);
    assert_eq!(plan.workload.global_batch, 256);
    assert_eq!(plan.workload.precision.to_string(), "fp8");
    let search = plan.search.expect("search summary");
    assert!(search.enumerated >= search.valid && search.valid > 0);
    for p in &plan.plans {
        assert!(p.estimate.memory.total <= p.estimate.hbm_bytes);
        assert_eq!(p.config.gpus(), 16);
    }
}

#[test]
fn out_file_is_not_overwritten_without_force() {
    let dir = TempDir::new("out");
    let out = dir.path("plan.json");
    let out_s = out.to_str().unwrap();
    let o = sextant(&[
        "plan", "--model", "8b", "--gpus", "8", "--top", "2", "--out", out_s,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first = std::fs::read_to_string(&out).unwrap();
    PlanFile::from_json(&first).unwrap();
    std::fs::write(&out, "user data").unwrap();
    fails_with_one_line(
        &["plan", "--model", "8b", "--gpus", "8", "--out", out_s],
        "--force",
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "user data",
        "an existing file was touched"
    );
    let o = sextant(&[
        "plan", "--model", "8b", "--gpus", "8", "--top", "2", "--out", out_s, "--force",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    PlanFile::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    // No temporary files left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn write_into_missing_directory_fails_cleanly() {
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--out",
            "/nonexistent-dir/sub/plan.json",
        ],
        "cannot write",
    );
}

#[test]
fn estimate_prints_full_breakdown() {
    let o = sextant(&[
        "estimate",
        "--model",
        "405b",
        "--gpus",
        "16384",
        "--tp",
        "8",
        "--pp",
        "16",
        "--cp",
        "1",
        "--account-embedding-loss",
        "--global-batch",
        "2048",
        "--seq",
        "8192",
        "--recompute",
        "full",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "Step time",
        "attention projections",
        "attention core",
        "MLP",
        "recomputation",
        "pipeline bubble",
        "TP ",
        "PP ",
        "DP grad",
        "exposed",
        "overlapped",
        "weights",
        "gradients",
        "optimizer states",
        "activations",
        "runtime reserve",
        "stage  15",
    ] {
        assert!(out.contains(needle), "missing '{needle}':\n{out}");
    }
}

/// A plan file that breaks a rule is refused, not rendered.
#[test]
fn plan_files_are_checked_when_read() {
    let dir = TempDir::new("badplan");
    let good = dir.path("p.json");
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--top",
        "1",
        "--out",
        good.to_str().unwrap(),
    ]);
    assert!(o.status.success());
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&good).unwrap()).unwrap();
    for (field, value, needle) in [
        ("vpp", serde_json::json!(0), "vpp must be"),
        (
            "dp",
            serde_json::json!(2305843009213693953u64),
            "dp must be",
        ),
    ] {
        let mut bad = v.clone();
        bad["plans"][0]["config"][field] = value;
        let path = dir.path(&format!("bad-{field}.json"));
        std::fs::write(&path, bad.to_string()).unwrap();
        fails_with_one_line(
            &[
                "report",
                path.to_str().unwrap(),
                "-o",
                dir.path("r.html").to_str().unwrap(),
            ],
            needle,
        );
        fails_with_one_line(
            &["export", path.to_str().unwrap(), "--to", "rank-map"],
            needle,
        );
    }
    v["workload"]["seq"] = serde_json::json!(0);
    let path = dir.path("bad-seq.json");
    std::fs::write(&path, v.to_string()).unwrap();
    fails_with_one_line(
        &["export", path.to_str().unwrap(), "--to", "megatron-lm"],
        "sequence length 0",
    );
}

/// `estimate` gives the step time `plan` ranked with, for the same configuration.
#[test]
fn estimate_agrees_with_plan() {
    let o = sextant(&[
        "plan", "--model", "70b", "--gpus", "64", "--top", "1", "--json",
    ]);
    let plan = PlanFile::from_json(&stdout(&o)).unwrap();
    let c = &plan.plans[0].config;
    let mut args: Vec<String> = ["estimate", "--model", "70b", "--gpus", "64", "--json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (k, v) in [
        ("--tp", c.tp),
        ("--pp", c.pp),
        ("--vpp", c.vpp),
        ("--cp", c.cp),
        ("--dp", c.dp),
        ("--mbs", c.mbs),
    ] {
        args.push(k.into());
        args.push(v.to_string());
    }
    args.push("--sp".into());
    args.push(c.sp.to_string());
    args.push("--schedule".into());
    args.push(c.schedule.name().into());
    args.push("--recompute".into());
    args.push(format!("{:?}", c.recompute).to_lowercase());
    if c.recompute == sextant_planner::config::Recompute::Selective {
        args.push("--recompute-modules".into());
        args.push(c.recompute_modules.to_string());
    }
    args.push("--zero".into());
    args.push(
        match c.zero {
            sextant_planner::config::Zero::None => "0",
            sextant_planner::config::Zero::DistOpt => "1",
            sextant_planner::config::Zero::Zero2 => "2",
            sextant_planner::config::Zero::Zero3 => "3",
        }
        .into(),
    );
    if let sextant_planner::config::Layout::Explicit { layers } = &c.layout {
        args.push("--layers-per-stage".into());
        args.push(
            layers
                .iter()
                .map(|x| x.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    if let sextant_planner::config::Layout::FirstLast { first, last } = &c.layout {
        args.extend([
            "--first-stage-layers".into(),
            first.to_string(),
            "--last-stage-layers".into(),
            last.to_string(),
        ]);
    }
    if c.layout == sextant_planner::config::Layout::AccountEmbeddingLoss {
        args.push("--account-embedding-loss".into());
    }
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let o = sextant(&refs);
    assert!(o.status.success(), "{}", stderr(&o));
    let est = PlanFile::from_json(&stdout(&o)).unwrap();
    let (a, b) = (
        plan.plans[0].estimate.step_secs,
        est.plans[0].estimate.step_secs,
    );
    assert!(
        (a - b).abs() < 1e-9 * a,
        "plan {a} vs estimate {b} for {c:?}"
    );
}

/// `--schedule` restricts the search and picks the schedule `estimate` costs.
#[test]
fn schedule_flag_restricts_plan_and_sets_estimate() {
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--schedule",
        "dualpipe,zb-h1",
        "--target",
        "any",
        "--top",
        "5",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = PlanFile::from_json(&stdout(&o)).unwrap();
    assert!(plan
        .plans
        .iter()
        .all(|p| matches!(p.config.schedule, Schedule::DualPipe | Schedule::ZbH1)));
    let o = sextant(&[
        "estimate",
        "--model",
        "8b",
        "--gpus",
        "64",
        "--pp",
        "4",
        "--global-batch",
        "512",
        "--schedule",
        "dualpipe",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("schedule dualpipe"), "{}", stdout(&o));
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--pp",
            "4",
            "--global-batch",
            "512",
            "--schedule",
            "zb-h2",
        ],
        "invalid value 'zb-h2' for '--schedule <SCHEDULE>': [possible values: 1f1b, interleaved, zb-h1, dualpipe, gpipe]",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--pp",
            "4",
            "--global-batch",
            "96",
            "--schedule",
            "dualpipe",
        ],
        "at least 2 x pp = 8",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--pp",
            "4",
            "--schedule",
            "interleaved",
        ],
        "needs vpp > 1",
    );
    // --emit searches only the schedules its target states, so the README's
    // command gives Megatron-LM arguments (without --emit, ZB-H1 ranks first here).
    let o = sextant(&[
        "plan",
        "--model",
        "70b",
        "--gpus",
        "64",
        "--emit",
        "megatron-lm",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("--pipeline-model-parallel-size")
            && !stdout(&o).contains("zb-h1")
            && !stdout(&o).contains("dualpipe"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn estimate_json_is_versioned() {
    let o = sextant(&[
        "estimate",
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "64",
        "--tp",
        "2",
        "--ep",
        "8",
        "--global-batch",
        "256",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["schema_version"], 2);
    assert_eq!(v["plans"][0]["estimate"]["schema_version"], 1);
    assert_eq!(v["plans"][0]["config"]["ep"], 8);
    // Enums are spelled as on the command line.
    let cfg = &v["plans"][0]["config"];
    assert_eq!(cfg["schedule"], "1f1b", "{cfg}");
    assert_eq!(cfg["zero"], "1", "{cfg}");
    assert_eq!(cfg["moe_dispatcher"], "alltoall", "{cfg}");
    let kinds: Vec<&str> = v["plans"][0]["estimate"]["comm"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"ep") && kinds.contains(&"tp") && kinds.contains(&"edp_grad"),
        "{kinds:?}"
    );
}

/// `--loss` picks the cross-entropy kernel: only the last stage's output layer
/// changes, growing with the passes the kernel makes over the logits.
#[test]
fn loss_kernel_changes_only_the_output_layer() {
    let run = |loss: &str| {
        let o = sextant(&[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "2",
            "--global-batch",
            "64",
            "--json",
            "--loss",
            loss,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        v["plans"][0]["estimate"].clone()
    };
    let [te, native, unfused] = ["te", "native", "unfused"].map(run);
    let secs =
        |e: &serde_json::Value, i: usize| e["stages"][i]["secs_per_micro_batch"].as_f64().unwrap();
    assert!(secs(&te, 0) == secs(&native, 0) && secs(&native, 0) == secs(&unfused, 0));
    assert!(secs(&te, 1) < secs(&native, 1) && secs(&native, 1) < secs(&unfused, 1));
    fails_with_one_line(
        &[
            "estimate", "--model", "8b", "--gpus", "8", "--loss", "fused",
        ],
        "invalid value 'fused' for '--loss <LOSS>': [possible values: te, native, unfused, compiled]",
    );
}

#[test]
fn invalid_configurations_say_exactly_why() {
    fails_with_one_line(
        &[
            "estimate", "--model", "405b", "--gpus", "16384", "--tp", "8", "--pp", "16",
        ],
        "does not divide 126 layers",
    );
    fails_with_one_line(
        &[
            "estimate", "--model", "70b", "--gpus", "64", "--tp", "16", "--pp", "4",
        ],
        "NVLink domain",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "70b",
            "--gpus",
            "48",
            "--tp",
            "3",
            "--dp",
            "16",
            "--global-batch",
            "96",
        ],
        "valid: 1, 2, 4, 8",
    );
    fails_with_one_line(
        &[
            "estimate", "--model", "8b", "--gpus", "8", "--cp", "8", "--seq", "4100",
        ],
        "divisible by 2 x 8",
    );
    fails_with_one_line(
        &["estimate", "--model", "8x7b", "--gpus", "16", "--ep", "16"],
        "does not divide 8 experts",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--global-batch",
            "12",
        ],
        "not divisible by micro-batch",
    );
    fails_with_one_line(
        &[
            "estimate", "--model", "8x7b", "--gpus", "16", "--tp", "2", "--sp", "false", "--ep",
            "8",
        ],
        "needs sequence parallelism",
    );
    // Megatron-Core's MoE layer refuses TP without SP even with no EP.
    fails_with_one_line(
        &[
            "estimate", "--model", "8x7b", "--gpus", "16", "--tp", "2", "--sp", "false",
        ],
        "needs sequence parallelism",
    );
    // Megatron's own assertions, each refused in one line instead of priced: TP
    // communication overlap only with sequence parallelism; the expert-parallel
    // overlap only where Megatron runs it; the CUDA-graph scopes' rules (router
    // scopes on MoE models, the preprocess with the router, per-layer graphs
    // without full recomputation).
    for (line, needle) in [
        (
            "estimate --model 70b --gpus 64 --tp 8 --sp false --tp-comm-overlap",
            "--tp-comm-overlap) needs sequence parallelism",
        ),
        (
            "estimate --model qwen3-30b-a3b --gpus 16 --ep 8 --pp 2 --ep-comm-overlap",
            "only under the interleaved schedule",
        ),
        (
            "estimate --model 8b --gpus 8 --ep-comm-overlap",
            "it needs expert parallelism",
        ),
        (
            "estimate --model 8b --gpus 8 --cuda-graphs moe_router",
            "llama3-8b is dense",
        ),
        (
            "estimate --model qwen3-30b-a3b --gpus 16 --ep 8 --cuda-graphs moe_preprocess",
            "runs only with moe_router",
        ),
        (
            "estimate --model 8b --gpus 8 --tp 2 --recompute full --cuda-graphs attn",
            "cannot be combined with full recomputation",
        ),
        (
            "plan --model 8b --gpus 8 --recompute full --cuda-graphs attn",
            "cannot be combined with full recomputation",
        ),
    ] {
        fails_with_one_line(&words(line), needle);
    }
    // TP across nodes only when asked for.
    let o = sextant(&[
        "estimate",
        "--model",
        "70b",
        "--gpus",
        "64",
        "--tp",
        "16",
        "--pp",
        "4",
        "--allow-tp-across-nodes",
        "--global-batch",
        "64",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("network"),
        "TP over 16 GPUs must cross the network"
    );
    // Out of memory: the breakdown goes to stdout, the verdict is the one error line.
    let o = sextant(&["estimate", "--model", "405b", "--gpus", "8", "--tp", "8"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("needs") && stderr(&o).contains("GiB"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).contains("optimizer states"));
}

/// Run by the reliability summary (`tests/it/reliability.rs`), which counts the cases.
pub fn bad_input_gets_one_clear_line() {
    fails_with_one_line(
        &["plan", "--model", "lama3-70b", "--gpus", "128"],
        "did you mean llama3-70b",
    );
    // Nothing near the name: the command that lists the names.
    fails_with_one_line(
        &["plan", "--model", "zzz", "--gpus", "8"],
        "unknown model 'zzz' (`sextant models` lists them)",
    );
    fails_with_one_line(
        &["plan", "--model", "8b", "--gpu", "zzz", "--gpus", "8"],
        "unknown hardware profile 'zzz' (`sextant profiles` lists them)",
    );
    fails_with_one_line(&["plan", "--model", "70b", "--gpus", "0"], "at least 1");
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "7"],
        "7 GPUs do not fill",
    );
    // The counts it suggests are ones it accepts.
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "3"],
        "use a divisor of 8 for part of one node (e.g. 2 or 4), or whole nodes",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "17"],
        "use a multiple of 8 (e.g. 16 or 24)",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "99999999999"],
        "more than Sextant models",
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            &data("bad/malformed-config.json"),
            "--gpus",
            "8",
        ],
        "not valid JSON",
    );
    // A mixed cluster is priced with its classes' profiles and saves no plan file:
    // what would not apply is refused, not dropped.
    for (flag, value) in [
        ("--out", "mixed.json"),
        ("--gpu", "b200"),
        ("--calibration", "no-such-overlay.json"),
        ("--target", "megatron-lm"),
    ] {
        fails_with_one_line(
            &[
                "estimate",
                "--model",
                "8b",
                "--gpus",
                "16",
                "--pp",
                "2",
                "--mix",
                "h100-sxm:8,a100-80g:8",
                flag,
                value,
            ],
            &format!("{flag} does not apply with --mix"),
        );
    }
    // Well-formed JSON with a number no f64 holds: said so, not "not valid JSON".
    fails_with_one_line(
        &[
            "plan",
            "--model",
            &data("bad/huge-number-config.json"),
            "--gpus",
            "8",
        ],
        "huge-number-config.json': the number at line 1 column",
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            &data("bad/unknown-type-config.json"),
            "--gpus",
            "8",
        ],
        "not supported",
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            &data("bad/missing-field-config.json"),
            "--gpus",
            "8",
        ],
        "num_attention_heads",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "128", "--frobnicate"],
        "--frobnicate",
    );
    fails_with_one_line(&["plan", "--model", "70b", "--gpus", "-5"], "-5");
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "70b",
            "--gpus",
            "128",
            "--precision",
            "fp4",
        ],
        "[possible values: bf16, fp16, fp8, mxfp8]",
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "70b",
            "--gpus",
            "128",
            "--gpu",
            "a100",
            "--precision",
            "fp8",
        ],
        "no FP8",
    );
    // MXFP8 is Blackwell's: Transformer Engine refuses it on Hopper.
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--gpu",
            "h100",
            "--precision",
            "mxfp8",
        ],
        "has no block-scaled FP8",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "128", "--gpu", "h10"],
        "did you mean",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "128", "--seq", "0"],
        "--seq 0",
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "70b",
            "--gpus",
            "128",
            "--global-batch",
            "0",
        ],
        "--global-batch 0",
    );
    fails_with_one_line(
        &["plan", "--model", "missing-file.json", "--gpus", "8"],
        "cannot read model file",
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "70b",
            "--gpus",
            "128",
            "--cluster",
            &data("bad/profile-bad-efficiency.json"),
        ],
        "efficiency.gemm_bf16",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "128", "--top", "0"],
        "--top 0",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "128", "--tp", "0"],
        "--tp values",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "8", "--gpu", "a100"],
        "no valid plan",
    );
    // Where the model state alone cannot fit, the line says how many GPUs it needs:
    // 70.6B parameters x 18 bytes = 1,183 GiB over 72.1 usable GiB per H100.
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "8"],
        "alone take 147.8 GiB per GPU even with every parameter sharded over all 8, more than the 72.1 GiB a plan may use besides the runtime reserve: at least 24 GPUs of this kind (3 nodes of 8), before activations",
    );
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "1"],
        "alone take 1182.7 GiB on its one GPU, more than",
    );
    // With room for the model state (24 GPUs: 49 GiB each), a plan fits.
    let o = sextant(&["plan", "--model", "70b", "--gpus", "24"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Values that would overflow the products of parallel sizes.
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--tp",
            "8",
            "--dp",
            "2305843009213693953",
            "--mbs",
            "8",
        ],
        "--dp values",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--tp",
            "8",
            "--dp",
            "2",
            "--mbs",
            "9223372036854775809",
        ],
        "--mbs values",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--pp",
            "4",
            "--tp",
            "2",
            "--vpp",
            "4611686018427387905",
        ],
        "--vpp values",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--mix",
            "h100-sxm:4,a100-80g:4",
            "--pp",
            "2",
            "--tp",
            "4",
            "--global-batch",
            "4294967296",
        ],
        "smaller global batch",
    );
}

#[test]
fn model_files_of_every_supported_family_plan() {
    for file in [
        "llama-3.1-8b",
        "mistral-7b-v0.1",
        "mixtral-8x7b-v0.1",
        "qwen2-7b",
        "qwen3-8b",
        "qwen3-30b-a3b",
        "deepseek-v3",
        "gpt-oss-120b",
        "gemma-7b",
        "gemma-2-9b",
        "gemma-3-27b",
        "gemma-3-4b",
        "phi-3-mini-4k-instruct",
        "glm-4-9b-0414",
        "glm-4-9b-chat",
        "glm-4.5-air",
        "olmo-2-1124-7b",
        "granite-3.1-8b-base",
    ] {
        let gpus = if file == "deepseek-v3" { "1024" } else { "64" };
        let path = data(&format!("hf/{file}.json"));
        let o = sextant(&[
            "plan", "--model", &path, "--gpus", gpus, "--top", "1", "--json",
        ]);
        assert!(o.status.success(), "{file}: {}", stderr(&o));
        let plan = PlanFile::from_json(&stdout(&o)).unwrap();
        assert_eq!(plan.plans.len(), 1, "{file}");
        // num_nextn_predict_layers: DeepSeek-V3's one MTP layer, on the last stage.
        assert_eq!(
            plan.model.mtp_layers,
            u64::from(file == "deepseek-v3" || file == "glm-4.5-air"),
            "{file}"
        );
        let stages = &plan.plans[0].estimate.stages;
        assert_eq!(
            stages.iter().map(|s| s.mtp_layers).sum::<u64>(),
            plan.model.mtp_layers,
            "{file}"
        );
        assert_eq!(
            stages.last().unwrap().mtp_layers,
            plan.model.mtp_layers,
            "{file}"
        );
    }
}

/// A Hugging Face config missing a field the family needs is one line naming it
/// (the MLP width once defaulted silently to 4 x hidden), and the families the
/// model cannot represent say why.
#[test]
fn hf_configs_missing_a_field_or_unmodelled_say_so_in_one_line() {
    let dir = TempDir::new("hf-missing");
    let cases = [
        (
            "no-ffn.json",
            r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}"#,
            "required field 'intermediate_size' is missing for model_type 'llama' (a config.json saved by transformers always has it)",
        ),
        (
            "no-text.json",
            r#"{"model_type": "gemma3", "vision_config": {}}"#,
            "model_type 'gemma3' keeps its text model in the object 'text_config', which is missing",
        ),
        (
            "cohere.json",
            r#"{"model_type": "cohere", "hidden_size": 8192}"#,
            "model_type 'cohere' is not supported: its layers run attention and the MLP side by side from one norm (a parallel block), which Sextant does not model",
        ),
    ];
    for (file, text, why) in cases {
        let path = dir.path(file);
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap();
        let o = sextant(&["plan", "--model", path, "--gpus", "8"]);
        assert!(!o.status.success(), "{file}");
        assert_eq!(
            stderr(&o),
            format!("error: '{path}': Hugging Face config: {why}\n"),
            "{file}"
        );
    }
}

#[test]
fn sextant_model_json_and_custom_cluster_are_accepted() {
    let dir = TempDir::new("custom");
    // Round-trip a preset through Sextant's own model format.
    let model = sextant_planner::presets::resolve("llama2-13b")
        .unwrap()
        .spec;
    let model_path = dir.path("m.json");
    std::fs::write(&model_path, serde_json::to_string_pretty(&model).unwrap()).unwrap();
    // A user's own profile: the H100 one with a slower network.
    let mut prof: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("hwprofiles/h100-sxm.json"),
        )
        .unwrap(),
    )
    .unwrap();
    prof["name"] = serde_json::json!("my-cluster");
    prof["network"]["nic_gbytes_per_s"] = serde_json::json!(12.5);
    let prof_path = dir.path("cluster.json");
    std::fs::write(&prof_path, prof.to_string()).unwrap();
    let o = sextant(&[
        "plan",
        "--model",
        model_path.to_str().unwrap(),
        "--gpus",
        "32",
        "--cluster",
        prof_path.to_str().unwrap(),
        "--top",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("my-cluster"));
}

#[test]
fn mixed_cluster_estimate() {
    let o = sextant(&[
        "estimate",
        "--model",
        "70b",
        "--gpus",
        "128",
        "--tp",
        "8",
        "--pp",
        "16",
        "--global-batch",
        "64",
        "--recompute",
        "selective",
        "--mix",
        "h100-sxm:64,a100-80g:64",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("a100-80g")
            && out.contains("h100-sxm")
            && out.contains("Even split on the same stages"),
        "{out}"
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "70b",
            "--gpus",
            "128",
            "--tp",
            "8",
            "--pp",
            "16",
            "--mix",
            "h100-sxm:60,a100-80g:68",
        ],
        "whole pipeline stages",
    );
    fails_with_one_line(
        &[
            "estimate", "--model", "70b", "--gpus", "128", "--tp", "8", "--pp", "16", "--mix",
            "h100-sxm",
        ],
        "PROFILE:GPUS",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "70b",
            "--gpus",
            "128",
            "--tp",
            "8",
            "--pp",
            "16",
            "--mix",
            "h100-sxm:64,tpu:64",
        ],
        "unknown hardware profile",
    );
}

#[test]
fn models_and_profiles_list_the_built_ins() {
    let o = sextant(&["models"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for name in [
        "gpt3-175b",
        "llama2-7b",
        "llama2-13b",
        "llama2-70b",
        "llama3-8b",
        "llama3-70b",
        "llama3.1-405b",
        "mixtral-8x7b",
        "mixtral-8x22b",
        "deepseek-v3",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "gpt-oss-120b",
        "nemotron4-340b",
        "gpt-1.7b",
    ] {
        assert!(out.contains(name), "models lacks {name}");
    }
    let o = sextant(&["profiles"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for name in [
        "a100-80g",
        "h100-sxm",
        "h200-sxm",
        "b200",
        "gb200-nvl72",
        "aws-p5-hf",
        "h800",
        "mi300x",
    ] {
        assert!(out.contains(name), "profiles lacks {name}");
    }
}

#[test]
fn moe_routing_defaults_capacity_and_exports() {
    let est = |extra: &[&str]| {
        let mut a = vec![
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--tp",
            "2",
            "--pp",
            "2",
            "--ep",
            "8",
            "--json",
        ];
        a.extend_from_slice(extra);
        let o = sextant(&a);
        assert!(o.status.success(), "{a:?}: {}", stderr(&o));
        PlanFile::from_json(&stdout(&o)).expect("plan JSON")
    };
    // Mixtral balances with an auxiliary loss: the default is the published 1.52.
    let default = est(&[]);
    assert!((default.workload.moe_imbalance - 1.52).abs() < 1e-12);
    let r = default.plans[0]
        .estimate
        .moe_routing
        .expect("routing summary");
    // One expert per rank at EP 8 of 8 experts: the rank carries the expert's load.
    assert!(
        (r.busiest_rank_load - 1.52).abs() < 1e-9 && r.dropped_fraction == 0.0,
        "{r:?}"
    );
    let balanced = est(&["--moe-imbalance", "1"]);
    let capped = est(&["--moe-capacity-factor", "1.25"]);
    let padded = est(&[
        "--moe-capacity-factor",
        "1.25",
        "--moe-pad-to-capacity",
        "--moe-imbalance",
        "1",
    ]);
    let step = |p: &PlanFile| p.plans[0].estimate.step_secs;
    // Imbalance slows the step; a capacity recovers part of it by dropping tokens;
    // padding a balanced load to the capacity costs time for nothing.
    assert!(
        step(&balanced) < step(&capped) && step(&capped) < step(&default),
        "{} {} {}",
        step(&balanced),
        step(&capped),
        step(&default)
    );
    assert!(step(&padded) > step(&balanced));
    let rc = capped.plans[0].estimate.moe_routing.unwrap();
    assert!(
        rc.dropped_fraction > 0.0 && (rc.busiest_rank_load - 1.25).abs() < 1e-9,
        "{rc:?}"
    );
    // The expert activations follow the load.
    assert!(
        default.plans[0].estimate.memory.activations
            > balanced.plans[0].estimate.memory.activations
    );

    // DeepSeek-V3 routes without an auxiliary loss: 1.04.
    let o = sextant(&[
        "plan",
        "--model",
        "deepseek-v3",
        "--gpus",
        "1024",
        "--top",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        (PlanFile::from_json(&stdout(&o))
            .unwrap()
            .workload
            .moe_imbalance
            - 1.04)
            .abs()
            < 1e-12
    );

    // The capacity reaches Megatron's arguments.
    let dir = TempDir::new("routing");
    let plan = dir.path("plan.json");
    let o = sextant(&[
        "estimate",
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "64",
        "--tp",
        "2",
        "--pp",
        "2",
        "--ep",
        "8",
        "--moe-capacity-factor",
        "1.25",
        "--moe-pad-to-capacity",
        "--out",
        plan.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = sextant(&["export", plan.to_str().unwrap(), "--to", "megatron-lm"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("--moe-expert-capacity-factor 1.25")
            && out.contains("--moe-pad-expert-input-to-capacity"),
        "{out}"
    );

    assert!(
        !out.contains("--overlap-moe-expert-parallel-comm"),
        "not asked for:\n{out}"
    );
    // EP all-to-all overlap reaches the arguments where Megatron allows it
    // (interleaved pipeline); elsewhere `estimate` refuses it.
    for (vpp, expect) in [("2", true), ("1", false)] {
        let args = [
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "64",
            "--tp",
            "2",
            "--pp",
            "2",
            "--vpp",
            vpp,
            "--ep",
            "8",
            "--ep-comm-overlap",
            "--out",
            plan.to_str().unwrap(),
            "--force",
        ];
        if !expect {
            fails_with_one_line(&args, "only under the interleaved schedule");
            continue;
        }
        let o = sextant(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let o = sextant(&["export", plan.to_str().unwrap(), "--to", "megatron-lm"]);
        let out = stdout(&o);
        assert_eq!(
            out.contains("--overlap-moe-expert-parallel-comm")
                && out.contains("--delay-wgrad-compute"),
            expect,
            "vpp {vpp}:\n{out}"
        );
    }

    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "8",
            "--ep",
            "8",
            "--moe-imbalance",
            "5",
        ],
        "at most 4 times the mean",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "8",
            "--ep",
            "8",
            "--moe-pad-to-capacity",
        ],
        "also give --moe-capacity-factor",
    );
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "mixtral-8x7b",
            "--gpus",
            "8",
            "--ep",
            "8",
            "--moe-capacity-factor=-1",
        ],
        "capacity factor",
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--moe-capacity-factor",
            "1.25",
        ],
        "dense model",
    );
}

/// `--recompute-modules` and `--bf16-moments` change the plan and its memory;
/// misuse gets one line and a non-zero exit.
#[test]
fn recompute_modules_and_bf16_moments() {
    let base = [
        "estimate",
        "--model",
        "qwen3-30b-a3b",
        "--gpus",
        "16",
        "--tp",
        "2",
        "--ep",
        "8",
        "--global-batch",
        "256",
        "--json",
    ];
    let gib = |extra: &[&str]| -> (f64, f64) {
        let o = sextant(&[&base[..], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let e = &v["plans"][0]["estimate"];
        (
            e["memory"]["activations"].as_f64().unwrap(),
            e["memory"]["optimizer"].as_f64().unwrap(),
        )
    };
    let (act, opt) = gib(&["--recompute", "selective"]);
    let (act_fine, _) = gib(&[
        "--recompute",
        "selective",
        "--recompute-modules",
        "layernorm,moe_act",
    ]);
    let (_, opt_bf16) = gib(&["--recompute", "selective", "--bf16-moments"]);
    assert!(act_fine < act, "{act_fine} vs {act}");
    assert!(
        (opt_bf16 / opt - 8.0 / 12.0).abs() < 1e-9,
        "{opt_bf16} vs {opt}"
    );
    for (args, msg) in [
        (
            vec!["--recompute-modules", "layernorm"],
            "add --recompute selective",
        ),
        (
            vec![
                "--recompute",
                "selective",
                "--recompute-modules",
                "mla_up_proj",
            ],
            "mla_up_proj needs multi-latent attention",
        ),
        (
            vec![
                "--recompute",
                "selective",
                "--recompute-modules",
                "everything",
            ],
            "unknown recompute module 'everything'",
        ),
    ] {
        let o = sextant(&[&base[..base.len() - 1], &args[..]].concat());
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains(msg) && err.trim().lines().count() == 1,
            "{err}"
        );
    }
}

#[test]
fn megatron_pp_layout_and_mtp_layers() {
    let base = [
        "estimate",
        "--model",
        "deepseek-v3",
        "--gpu",
        "b200",
        "--gpus",
        "256",
        "--pp",
        "8",
        "--ep",
        "32",
        "--global-batch",
        "512",
        "--precision",
        "mxfp8",
        "--recompute",
        "selective",
        "--recompute-modules",
        "mla_up_proj,mlp",
        "--bf16-moments",
        "--json",
    ];
    let stages = |extra: &[&str]| -> Vec<(u64, u64)> {
        let o = sextant(&[&base[..], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let p = &v["plans"][0];
        assert_eq!(p["config"]["vpp"], 2);
        p["estimate"]["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["layers"].as_u64().unwrap(),
                    s["mtp_layers"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    // Megatron-Bridge's DeepSeek-V3 layout: 4 layers a virtual stage, the last
    // holding one layer, the MTP layer and the loss; it implies vpp 2.
    let s = stages(&["--pp-layout", "Et*4|(t*4|)*14tmL"]);
    assert_eq!(s[0], (8, 0));
    assert_eq!(s[7], (5, 1));
    let s = stages(&["--pp-layout", "Et*3|(t*4|)*14t*2L", "--mtp-layers", "0"]);
    assert_eq!(s[7], (6, 0));
    for (args, msg) in [
        (
            vec!["--pp-layout", "Et*3|(t*4|)*14t*2L"],
            "places 0 MTP layers but deepseek-v3 has 1",
        ),
        (
            vec!["--pp-layout", "Et*4|(t*4|)*14tmL", "--vpp", "4"],
            "has 2 virtual stages per rank but --vpp is 4",
        ),
        (
            vec!["--pp-layout", "Et*4|(t*4|)*14tmX"],
            "'X' is not a pipeline layout character",
        ),
        (
            vec!["--pp-layout", "Et*4|(t*4|)*13tmL"],
            "not a multiple of pp = 8",
        ),
        (vec!["--mtp-layers", "99"], "at most 16"),
    ] {
        let o = sextant(&[&base[..base.len() - 1], &args[..]].concat());
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains(msg) && err.trim().lines().count() == 1,
            "{err}"
        );
    }
}

/// The default search ranks only what Megatron-LM runs, and `--target T` only
/// what T's export states: every ranked plan exports to its target, and the
/// default plan also to Megatron-Core. A schedule the target cannot run is a
/// one-line refusal naming `--target any`.
#[test]
fn plans_run_on_their_target() {
    let tmp = TempDir::new("targets");
    for (target, model, gpus) in [
        ("", "70b", "128"),
        ("megatron-core", "8b", "64"),
        ("megatron-bridge", "8b", "64"),
        ("nemo", "8b", "64"),
        ("verl", "8b", "64"),
        ("rlinf", "8b", "64"),
        ("torchtitan", "8b", "64"),
        ("scaletorch", "8b", "64"),
    ] {
        let out = tmp.path(&format!("plan-{model}-{target}.json"));
        let mut args = vec![
            "plan",
            "--model",
            model,
            "--gpus",
            gpus,
            "--top",
            "3",
            "--out",
            out.to_str().unwrap(),
        ];
        if !target.is_empty() {
            args.extend(["--target", target]);
        }
        // verl and RLinf compute log-probabilities with the unfused loss.
        if matches!(target, "verl" | "rlinf") {
            args.extend(["--loss", "unfused"]);
        }
        let o = sextant(&args);
        assert!(o.status.success(), "{target}: {}", stderr(&o));
        let plan = PlanFile::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let want = if target.is_empty() {
            "megatron-lm"
        } else {
            target
        };
        assert_eq!(plan.target.as_deref(), Some(want));
        let targets: &[&str] = if target.is_empty() {
            &["megatron-lm", "megatron-core"]
        } else {
            &[target]
        };
        for to in targets {
            for which in 1..=plan.plans.len() {
                let w = which.to_string();
                let o = sextant(&["export", out.to_str().unwrap(), "--to", to, "--plan", &w]);
                assert!(
                    o.status.success(),
                    "plan {which} for {want} does not export to {to}: {}",
                    stderr(&o)
                );
            }
        }
    }
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "64",
        "--schedule",
        "dualpipe",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("--target any") && e.lines().count() == 1, "{e}");
}

/// `--mem-headroom` keeps that fraction of HBM free of every plan; out of range
/// is one line.
#[test]
fn mem_headroom_bounds_every_plan() {
    for h in ["0", "0.2"] {
        let o = sextant(&[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--mem-headroom",
            h,
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let plan = PlanFile::from_json(&stdout(&o)).unwrap();
        let cap =
            plan.hardware.gpu.hbm_gib * (1.0 - h.parse::<f64>().unwrap()) * (1u64 << 30) as f64;
        assert!(plan.plans.iter().all(|p| p.estimate.memory.total <= cap));
        assert_eq!(plan.hardware.memory.headroom, h.parse::<f64>().unwrap());
    }
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--mem-headroom",
        "0.9",
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("from 0 to 0.5"),
        "{}",
        stderr(&o)
    );
}

/// `plan` ranks by the upper end of each plan's band by default and says so; a
/// plan outside the validated runs is marked and its axes named; `--rank-by point`
/// ranks by the step time; the plan file records which; a bad value is one line.
#[test]
fn rank_by_upper_is_the_default_and_point_a_choice() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "plan", "--model", "8b", "--gpus", "8", "--zero", "1,3", "--top", "3",
        ];
        args.extend_from_slice(extra);
        let o = sextant(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    let json = |extra: &[&str]| {
        let mut a = extra.to_vec();
        a.push("--json");
        PlanFile::from_json(&stdout(&run(&a))).unwrap()
    };
    let outside = |p: &PlanFile| {
        !p.plans[0]
            .estimate
            .band
            .as_ref()
            .expect("a band")
            .outside
            .is_empty()
    };
    let point = json(&["--rank-by", "point"]);
    let upper = json(&[]);
    assert_eq!(point.rank_by, Some(sextant_planner::reach::RankBy::Point));
    assert_eq!(upper.rank_by, Some(sextant_planner::reach::RankBy::Upper));
    // The point estimate picks ZeRO-3 over 8 data-parallel ranks, which no
    // published run used; the upper end picks the distributed optimizer.
    assert!(outside(&point), "{:?}", point.plans[0].config);
    assert!(!outside(&upper), "{:?}", upper.plans[0].config);
    let text = stdout(&run(&["--rank-by", "point"]));
    assert!(text.contains("upper(s)"), "{text}");
    assert!(
        text.contains("*: band widened outside the validated runs: ZeRO-3 DP 8"),
        "{text}"
    );
    fails_with_one_line(
        &["plan", "--model", "8b", "--gpus", "8", "--rank-by", "lower"],
        "--rank-by",
    );
}

/// Issue 22, item 13: a plan file's own numbers are not trusted. `report` and
/// `export` price its plans again with this build's cost model and say, one line
/// per plan, where the file differed; an edited configuration is priced as it now
/// stands; one this model rejects is one clear line.
#[test]
fn plan_files_are_priced_again_when_read() {
    let dir = TempDir::new("rederive");
    let plan = saved(
        &dir,
        "p.json",
        &[
            "estimate", "--model", "8b", "--gpus", "8", "--tp", "2", "--zero", "1",
        ],
    );
    let original: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let write = |v: &serde_json::Value, name: &str| {
        let p = dir.path(name);
        std::fs::write(&p, serde_json::to_string(v).unwrap()).unwrap();
        p
    };
    // The untouched file: no note.
    let o = sextant(&["export", plan.to_str().unwrap(), "--to", "rank-map"]);
    assert!(
        o.status.success() && !stderr(&o).contains("note:"),
        "{}",
        stderr(&o)
    );
    // Edited numbers: both are named, the report shows this build's.
    let mut v = original.clone();
    v["plans"][0]["estimate"]["step_secs"] = (-5.0).into();
    v["plans"][0]["estimate"]["mfu"] = 50.0.into();
    let edited = write(&v, "edited.json");
    let html = dir.path("r.html");
    let o = sextant(&[
        "report",
        edited.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("the file says step -5.000 s, MFU 5000.000%") && err.lines().count() == 1,
        "{err}"
    );
    let report = std::fs::read_to_string(&html).unwrap();
    // As a percentage ("5000.0%"): a bare "5000" also occurs in the interactive
    // timeline's coordinates (data-t0="0.25000").
    assert!(
        !report.contains("5000.0"),
        "the report shows the file's MFU"
    );
    // An edited configuration is priced as it stands, not with the old numbers.
    let mut v = original.clone();
    v["plans"][0]["config"]["zero"] = "zero2".into();
    let changed = write(&v, "changed.json");
    let o = sextant(&["export", changed.to_str().unwrap(), "--to", "rank-map"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("this build's cost model gives"),
        "{}",
        stderr(&o)
    );
    // A configuration this model rejects: one line.
    let mut v = original;
    v["plans"][0]["config"]["mbs"] = 4096.into();
    v["workload"]["global_batch"] = 16384.into();
    let big = write(&v, "big.json");
    fails_with_one_line(
        &["export", big.to_str().unwrap(), "--to", "rank-map"],
        "rejects its configuration",
    );
}

/// Issue 26's rough edges: a missing required argument is named, an unknown
/// profile gets suggestions from its family, a plan file given as `--model` is
/// recognised, and a closed pipe ends `plan` quietly.
#[test]
fn cli_rough_edges_get_one_clear_line() {
    let dir = TempDir::new("rough");
    let plan = saved(
        &dir,
        "p.json",
        &["estimate", "--model", "8b", "--gpus", "8", "--tp", "2"],
    );
    let p = plan.to_str().unwrap();
    fails_with_one_line(&["report", p], "--output");
    fails_with_one_line(&["plan", "--model", "8b", "--gpu", "128"], "--gpus");
    fails_with_one_line(
        &["plan", "--model", "8b", "--gpus", "8", "--gpu", "h100-pcie"],
        "h100-sxm",
    );
    fails_with_one_line(
        &["estimate", "--model", p, "--gpus", "8"],
        "is a Sextant plan file",
    );
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg("\"$0\" plan --model 8b --gpus 8 --json | head -c 1 > /dev/null")
        .arg(env!("CARGO_BIN_EXE_sextant"))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(err.is_empty(), "a closed pipe printed: {err}");
}

/// From an outside review: a plan whose `rank_order` contradicts the order it was
/// priced with is refused; a failed write to standard output is one line, not a
/// panic; `--force` keeps the replaced file's permissions.
#[test]
fn review_findings_stay_fixed() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("review");
    let plan = saved(
        &dir,
        "st.json",
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--target",
            "scaletorch",
            "--top",
            "1",
        ],
    );
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    v["rank_order"] = "tp-cp-ep-dp-pp".into();
    let edited = dir.path("edited.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    fails_with_one_line(
        &["export", edited.to_str().unwrap(), "--to", "megatron-lm"],
        "contradicts the order the plans were priced with",
    );
    // An order no framework builds is refused when the file is read, in one line
    // naming the file, before `exec --ranks` starts any rank.
    v["rank_order"] = "tp-cp-zz-dp-pp".into();
    std::fs::write(&edited, v.to_string()).unwrap();
    let e = edited.to_str().unwrap();
    for args in [
        &["exec", e, "--ranks", "64"][..],
        &["exec", e, "--dry-run"],
        &["export", e, "--to", "scaletorch"],
    ] {
        fails_with_one_line(args, "edited.json': rank order 'tp-cp-zz-dp-pp' is neither");
    }
    if std::path::Path::new("/dev/full").exists() {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_sextant"))
            .arg("models")
            .stdout(
                std::fs::OpenOptions::new()
                    .write(true)
                    .open("/dev/full")
                    .unwrap(),
            )
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.starts_with("error: cannot write to standard output") && err.lines().count() == 1,
            "{err}"
        );
    }
    let script = dir.path("run.sh");
    let export = |force: bool| {
        let mut a = vec![
            "export",
            plan.to_str().unwrap(),
            "--to",
            "scaletorch",
            "-o",
            script.to_str().unwrap(),
        ];
        if force {
            a.push("--force");
        }
        let o = sextant(&a);
        assert!(o.status.success(), "{}", stderr(&o));
    };
    export(false);
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();
    export(true);
    let mode = std::fs::metadata(&script).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "--force changed the mode to {mode:o}");
}

/// The plan table fits the terminal: with `COLUMNS=60` every table and footnote line
/// fits in 60 characters, columns equal on every plan move to an "all plans:" line,
/// and the hidden columns are named; without a width (a pipe) every column is there.
#[test]
fn plan_table_fits_the_terminal_width() {
    let run = |columns: Option<&str>| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_sextant"));
        c.args(["plan", "--model", "70b", "--gpus", "128"]);
        c.env_remove("COLUMNS");
        if let Some(v) = columns {
            c.env("COLUMNS", v);
        }
        let o = c.output().expect("binary runs");
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let narrow = run(Some("60"));
    let table: Vec<&str> = narrow
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("# "))
        .take_while(|l| !l.starts_with("Searched "))
        .filter(|l| !l.is_empty())
        .collect();
    assert!(table.len() > 10, "{narrow}");
    for l in &table {
        assert!(
            l.chars().count() <= 60,
            "line over 60 columns: {l:?}\n{narrow}"
        );
    }
    assert!(narrow.contains("  all plans: "), "{narrow}");
    assert!(narrow.contains("hidden to fit 60 columns: "), "{narrow}");
    let wide = run(None);
    assert!(!wide.contains("hidden to fit"), "{wide}");
    for col in [
        "tok/s/GPU",
        "MFU",
        "mem GiB/cap",
        "bubble",
        "comm",
        "schedule",
    ] {
        assert!(wide.contains(col), "missing {col}:\n{wide}");
    }
    assert!(
        wide.contains("  columns: GA micro-batches per step"),
        "{wide}"
    );
}

/// Plan files of schema version 1 (enums spelled `one_f_one_b`, `dist_opt`,
/// `all_to_all`) are read and migrated; a version this build does not know is
/// refused in one line naming it.
#[test]
fn plan_files_of_version_1_are_migrated_and_unknown_versions_refused() {
    let dir = TempDir::new("plan-versions");
    let path = dir.path("p.json");
    let o = sextant(&[
        "estimate",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--pp",
        "2",
        "--global-batch",
        "64",
        "--json",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"schema_version\": 2"), "{text}");
    let old = text
        .replacen("\"schema_version\": 2", "\"schema_version\": 1", 1)
        .replace("\"1f1b\"", "\"one_f_one_b\"")
        .replace("\"zero\": \"1\"", "\"zero\": \"dist_opt\"")
        .replace("\"zero\": \"0\"", "\"zero\": \"none\"")
        .replace("\"alltoall\"", "\"all_to_all\"");
    assert!(
        old.contains("one_f_one_b") && old.contains("all_to_all"),
        "{old}"
    );
    let v1 = dir.path("v1.json");
    std::fs::write(&v1, &old).unwrap();
    let out = dir.path("v1.sh");
    let o = sextant(&[
        "export",
        v1.to_str().unwrap(),
        "--to",
        "megatron-lm",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v3 = dir.path("v3.json");
    std::fs::write(
        &v3,
        text.replacen("\"schema_version\": 2", "\"schema_version\": 3", 1),
    )
    .unwrap();
    fails_with_one_line(
        &["export", v3.to_str().unwrap(), "--to", "megatron-lm"],
        "schema_version 3",
    );
}

/// `sextant bench --help` lists the four benchmarks, with or without the CUDA
/// feature (without it, running one is one line: tests/it/bench.rs).
#[test]
fn bench_help_lists_the_four_benchmarks() {
    let o = sextant(&["bench", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for (name, what) in [
        ("gemm", "BF16 GEMM TFLOP/s (cuBLAS) over a grid of shapes"),
        ("hbm", "HBM bandwidth: device-to-device copies and memsets"),
        (
            "nccl",
            "NCCL all-reduce, all-gather and reduce-scatter bus bandwidth",
        ),
        ("p2p", "Copy bandwidth between two GPUs"),
    ] {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(name) && l.contains(what)),
            "{name}: '{what}' missing from:\n{out}"
        );
    }
    let top = stdout(&sextant(&["--help"]));
    assert!(
        top.lines()
            .any(|l| l.trim_start().starts_with("bench") && l.contains("gemm, hbm, nccl, p2p")),
        "{top}"
    );
}

/// A model the default target (Megatron-LM) cannot build is still planned, for any
/// framework, with a note saying why; asked for by name, the target refuses in one
/// line.
#[test]
fn default_target_steps_aside_for_a_model_it_cannot_build() {
    let gemma = crate::common::data("hf/gemma-2-9b.json");
    let o = sextant(&[
        "plan",
        "--model",
        &gemma,
        "--gpus",
        "8",
        "--global-batch",
        "64",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("note: no plan is ranked for megatron-lm, the default target")
            && err.contains("normalises after each attention and MLP block"),
        "{err}"
    );
    fails_with_one_line(
        &[
            "plan",
            "--model",
            &gemma,
            "--gpus",
            "8",
            "--global-batch",
            "64",
            "--target",
            "megatron-lm",
        ],
        "normalises after each attention and MLP block",
    );
}

/// `--cuda-graphs` takes Megatron's scope names; anything else is one line that
/// lists them.
#[test]
fn cuda_graph_scopes_are_checked() {
    let with = |scopes: &'static str| {
        vec![
            "estimate",
            "--model",
            "qwen3-30b-a3b",
            "--gpus",
            "16",
            "--ep",
            "16",
            "--cuda-graphs",
            scopes,
        ]
    };
    fails_with_one_line(&with("attn,mlp"), "moe_preprocess");
    // A full-iteration graph needs the fixed shapes of drop-and-pad routing.
    fails_with_one_line(&with("full_iteration"), "--moe-pad-to-capacity");
    let mut padded = with("full_iteration");
    padded.extend(["--moe-capacity-factor", "1.25", "--moe-pad-to-capacity"]);
    let o = sextant(&padded);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = sextant(&with("attn,moe_router,moe_preprocess"));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("CUDA graphs attn moe_router moe_preprocess"),
        "{}",
        stdout(&o)
    );
}

/// `--target scaletorch` prices ScaleTorch's pure-BF16 memory (10 bytes of model
/// state per parameter with data parallelism, not Megatron-Core's 18): every
/// ranked plan takes less memory than the same layout priced as Megatron-Core,
/// and its band is the widest, since no ScaleTorch run was measured.
#[test]
fn scaletorch_target_prices_scaletorch_memory() {
    use sextant_planner::cost::{evaluate, Framework};
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--target",
        "scaletorch",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = PlanFile::from_json(&String::from_utf8_lossy(&o.stdout)).unwrap();
    assert_eq!(plan.assumptions.framework, Framework::ScaleTorch);
    assert!(!plan.plans.is_empty());
    let cluster =
        sextant_planner::hardware::Cluster::new(plan.hardware.clone(), plan.gpus).unwrap();
    for p in &plan.plans {
        let m = &p.estimate.memory;
        let band = p.estimate.band.as_ref().expect("a band");
        assert!(
            band.basis
                .contains("published (every framework; none with scaletorch)"),
            "{}",
            band.basis
        );
        if p.config.dp > 1 {
            assert!(
                ((m.weights + m.gradients + m.optimizer) / m.params - 10.0).abs() < 1e-9,
                "{m:?}"
            );
        }
        let megatron = sextant_planner::cost::Assumptions {
            framework: Framework::MegatronCore,
            ..plan.assumptions
        };
        let mc = evaluate(&plan.model, &cluster, &plan.workload, &p.config, megatron).unwrap();
        assert!(
            m.total < mc.memory.total,
            "{:?}: {} vs Megatron-Core {}",
            p.config,
            m.total,
            mc.memory.total
        );
    }
}

/// ScaleTorch's header and its no-fit line speak of what ScaleTorch does: gradients
/// in FP32 buckets only under data parallelism, no parameter gather, and model state
/// split only by tensor and pipeline parallelism (no ZeRO to name).
#[test]
fn scaletorch_header_and_no_fit_line_describe_scaletorch() {
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--target",
        "scaletorch",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let header = out
        .lines()
        .find(|l| l.starts_with("Workload:"))
        .unwrap_or_else(|| panic!("no workload line: {out}"));
    assert!(
        header.contains("grads fp32 (bf16 without data parallelism)")
            && header.contains("param-gather n/a"),
        "{header}"
    );
    // 70B in pure BF16 (8 bytes per parameter without data parallelism) does not
    // fit 4 H100s whatever the split, and needs at least 8.
    fails_with_one_line(
        &["plan", "--model", "70b", "--gpus", "4", "--target", "scaletorch"],
        "per GPU with every parameter split over all 4 by tensor and pipeline parallelism (ScaleTorch shards nothing over data parallelism), more than the 72.1 GiB a plan may use besides the runtime reserve: at least 8 GPUs of this kind, before",
    );
}

/// `--loss compiled` prices torchtitan's loss under torch.compile (the BF16 logits
/// and their gradient, not the eager loss's FP32 copies): less memory per plan,
/// exported with the loss in `[compile]` beside the model; any other target or `estimate`
/// refuses it in one line, and a Megatron export of such a plan says why not.
#[test]
fn torchtitan_compiled_loss_is_priced_and_exported() {
    use crate::common::TempDir;
    let dir = TempDir::new("compiled-loss");
    let args = |loss: &'static str| {
        [
            "plan",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--target",
            "torchtitan",
            // One stage, so that every plan's worst stage holds the output layer.
            "--pp",
            "1",
            "--loss",
            loss,
        ]
    };
    let path = crate::common::saved(&dir, "plan.json", &args("compiled"));
    let compiled = PlanFile::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let eager = crate::common::planned(&args("native"));
    assert_eq!(
        compiled.assumptions.loss,
        sextant_planner::cost::LossKernel::Compiled
    );
    // The same layout holds 8 bytes less per logit (its one stage has the output layer).
    let (first, same) = compiled
        .plans
        .iter()
        .find_map(|c| {
            eager
                .plans
                .iter()
                .find(|e| e.config == c.config)
                .map(|e| (c, e))
        })
        .expect("a layout ranked with both losses");
    assert!(
        first.estimate.memory.logits < same.estimate.memory.logits / 2.0,
        "{} vs {}",
        first.estimate.memory.logits,
        same.estimate.memory.logits
    );
    let p = path.to_str().unwrap();
    let o = sextant(&["export", p, "--to", "torchtitan"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("[compile]\nenable = true\ncomponents = [\"model\", \"loss\"]"),
        "{}",
        stdout(&o)
    );
    fails_with_one_line(
        &["export", p, "--to", "megatron-core"],
        "torchtitan's loss under torch.compile (--loss compiled), which Megatron-Core has no switch for",
    );
    fails_with_one_line(
        &["plan", "--model", "8b", "--gpus", "64", "--loss", "compiled"],
        "--loss compiled is torchtitan's loss under torch.compile: plan it with --target torchtitan",
    );
    fails_with_one_line(
        &[
            "estimate", "--model", "8b", "--gpus", "8", "--loss", "compiled",
        ],
        "estimate prices Megatron-Core",
    );
    // A plan file priced for Megatron-Core that claims the compiled loss is refused
    // when read, by every command.
    let o = sextant(&["plan", "--model", "8b", "--gpus", "8", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["assumptions"]["loss"] = "compiled".into();
    let edited = dir.path("edited.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    for to in ["torchtitan", "megatron-lm", "rank-map"] {
        fails_with_one_line(
            &["export", edited.to_str().unwrap(), "--to", to],
            "the compiled loss (torchtitan's cross-entropy under torch.compile) is torchtitan's, but the framework is megatron-core",
        );
    }
    // torchtitan has no Transformer Engine loss kernel.
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--target",
            "torchtitan",
            "--loss",
            "te",
        ],
        "--target torchtitan has no Transformer Engine cross-entropy kernel",
    );
    // The model is compiled as priced (its element-wise passes fused), the loss
    // where the plan priced it so; async TP, which needs the model compiled, is
    // exported where the plan has it.
    let mut async_tp = args("native").to_vec();
    async_tp.extend(["--tp", "2", "--tp-comm-overlap", "--top", "1"]);
    let eager_loss = crate::common::saved(&dir, "native.json", &async_tp);
    let o = sextant(&["export", eager_loss.to_str().unwrap(), "--to", "torchtitan"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let toml = stdout(&o);
    assert!(
        toml.contains("[compile]\nenable = true\ncomponents = [\"model\"]\n")
            && toml.contains("tensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"),
        "{toml}"
    );
    // Except where the train spec ignores it: gpt_oss applies TP without async TP.
    let oss = dir.path("oss.json");
    let o = sextant(&[
        "estimate",
        "--model",
        "gpt-oss-120b",
        "--gpus",
        "64",
        "--target",
        "torchtitan",
        "--tp",
        "2",
        "--ep",
        "8",
        "--zero",
        "3",
        "--tp-comm-overlap",
        "--out",
        oss.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("gpt_oss applies tensor parallelism without async TP"),
        "{}",
        stderr(&o)
    );
    let p = crate::common::planned(&[
        "plan",
        "--model",
        "gpt-1.7b",
        "--gpus",
        "64",
        "--target",
        "torchtitan",
        "--zero",
        "0",
    ]);
    assert!(!p.plans.is_empty());
    for rp in &p.plans {
        assert!(
            rp.config.tp == 1 && rp.config.pp == 1 && rp.config.cp == 1,
            "torchtitan without FSDP runs only 1-D DDP: {:?}",
            rp.config
        );
    }
    // A plan with TP beside plain data parallelism, made for any target, is not
    // exported to torchtitan.
    let ddp = crate::common::saved(
        &dir,
        "ddp.json",
        &[
            "plan", "--model", "8b", "--gpus", "64", "--target", "any", "--zero", "0", "--tp", "2",
            "--pp", "2",
        ],
    );
    fails_with_one_line(
        &["export", ddp.to_str().unwrap(), "--to", "torchtitan"],
        "torchtitan runs TP, PP or CP only beside FSDP",
    );
}

/// `--target torchtitan` searches only what torchtitan runs: no distributed
/// optimizer, no Megatron module lists, even stages; asking for only what it
/// cannot run is one line naming what it can.
#[test]
fn torchtitan_target_searches_what_torchtitan_runs() {
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "64",
        "--top",
        "5",
        "--target",
        "torchtitan",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = PlanFile::from_json(&String::from_utf8_lossy(&o.stdout)).unwrap();
    assert!(!plan.plans.is_empty());
    for p in &plan.plans {
        assert_ne!(p.config.zero, sextant_planner::config::Zero::DistOpt);
        assert_eq!(
            p.config.recompute_modules,
            sextant_planner::config::RecomputeModules::DEFAULT
        );
    }
    // --emit naming another framework than --target is one line too.
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "16",
        "--target",
        "torchtitan",
        "--emit",
        "megatron-lm",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("name different frameworks"),
        "{}",
        stderr(&o)
    );
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "16",
        "--top",
        "1",
        "--target",
        "megatron-lm",
        "--emit",
        "torchrun",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (flag, value, says) in [
        ("--zero", "1", "include 0, 2 or 3 in --zero"),
        ("--recompute-modules", "mlp", "drop --recompute-modules"),
    ] {
        let o = sextant(&[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "64",
            "--target",
            "torchtitan",
            flag,
            value,
        ]);
        assert!(!o.status.success(), "{flag} {value}");
        let e = stderr(&o);
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert!(e.contains(says), "{e}");
    }
}

/// An explicit layout printed for a model with multi-token prediction names its MTP
/// layer, so the printed flags estimate the same plan again (they were refused:
/// "places 0 MTP layers but deepseek-v3 has 1").
#[test]
fn printed_layouts_keep_the_mtp_layer() {
    let run = |layout: &str| {
        let o = sextant(&[
            "estimate",
            "--model",
            "deepseek-v3",
            "--gpus",
            "256",
            "--gpu",
            "b200",
            "--tp",
            "1",
            "--pp",
            "8",
            "--ep",
            "32",
            "--global-batch",
            "4096",
            "--precision",
            "mxfp8",
            "--recompute",
            "selective",
            "--recompute-modules",
            "mla_up_proj,mlp",
            "--bf16-moments",
            "--pp-layout",
            layout,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        stdout(&o)
    };
    let first = run("Et*4|(t*4|)*14tmL");
    let printed = first
        .split("--pp-layout \"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .expect("the layout is printed");
    assert_eq!(printed, "Et*4|(t*4|)*14tmL");
    let step = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("Step time"))
            .map(str::to_string)
    };
    assert_eq!(step(&run(printed)), step(&first));
}

/// The plan file's `target` is the framework's canonical name, and a file whose
/// target is not one `plan --target` writes is refused in one escaped line by every
/// command that reads plans (the report used to draw Megatron-LM's launch for it
/// without a word).
#[test]
fn plan_file_targets_are_canonical_and_checked() {
    let dir = crate::common::TempDir::new("target-check");
    let path = crate::common::saved(
        &dir,
        "p.json",
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--target",
            "Megatron_Core",
            "--top",
            "2",
        ],
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let plan = sextant_planner::plan::PlanFile::from_json(&text).unwrap();
    assert_eq!(plan.target.as_deref(), Some("megatron-core"));
    let bad = dir.path("bad.json");
    std::fs::write(
        &bad,
        text.replace(
            "\"target\": \"megatron-core\"",
            "\"target\": \"\\u001b[31mrank-map\"",
        ),
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    for args in [
        vec!["export", bad, "--to", "megatron-core"],
        vec!["report", bad, "-o", "/nonexistent-dir/r.html"],
        vec!["exec", bad, "--dry-run"],
        vec!["compare", bad, "/nonexistent-dir/run.json"],
    ] {
        crate::common::fails_with_one_line(&args, "key 'target'");
        let err = stderr(&sextant(&args));
        assert!(
            err.contains("\\u{1b}[31mrank-map") && !err.contains('\u{1b}'),
            "{err}"
        );
    }
    crate::common::fails_with_one_line(
        &["export", &path.to_string_lossy(), "--to", "\u{1b}x"],
        "unknown export target '\\u{1b}x'",
    );
}

/// A huge number is echoed in scientific notation, not as 300 digits.
#[test]
fn huge_floats_are_echoed_short() {
    for (flag, model, said) in [
        ("--moe-imbalance", "8x7b", "--moe-imbalance 1e300"),
        ("--moe-capacity-factor", "8x7b", "capacity factor 1e300"),
        ("--mem-headroom", "8b", "--mem-headroom 1e300"),
    ] {
        crate::common::fails_with_one_line(
            &[
                "estimate", "--model", model, "--gpus", "64", "--ep", "8", flag, "1e300",
            ],
            said,
        );
    }
    // A vanishing capacity factor is refused, not priced and exported as a
    // 322-digit literal.
    crate::common::fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8x7b",
            "--gpus",
            "64",
            "--ep",
            "8",
            "--moe-capacity-factor",
            "1e-320",
        ],
        "capacity factor 1e-320 is out of range: use 0.01 up to 64",
    );
}

/// `estimate --target T` prices a configuration as `plan --target T` does, so the
/// flags a torchtitan plan prints reproduce its step time (without it, estimate
/// priced Megatron-Core's FSDP: 36.2 s against the plan's 29.4 s), and refuses
/// in one line what the target cannot run.
#[test]
fn estimate_with_a_target_reproduces_that_targets_plan() {
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "16",
        "--target",
        "torchtitan",
        "--top",
        "1",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["target"], "torchtitan");
    let c = &v["plans"][0]["config"];
    let step = v["plans"][0]["estimate"]["step_secs"].as_f64().unwrap();
    let n = |k: &str| c[k].as_u64().unwrap().to_string();
    let zero = c["zero"].as_str().unwrap().to_string();
    let recompute = c["recompute"].as_str().unwrap().to_string();
    let mut args = vec![
        "estimate".to_string(),
        "--model".into(),
        "8b".into(),
        "--gpus".into(),
        "16".into(),
        "--target".into(),
        "torchtitan".into(),
        "--json".into(),
    ];
    for k in ["tp", "pp", "vpp", "cp", "dp", "mbs"] {
        args.push(format!("--{k}"));
        args.push(n(k));
    }
    args.extend(["--zero".into(), zero, "--recompute".into(), recompute]);
    if c["schedule"] == "1f1b" && c["vpp"] == 1 && c["pp"].as_u64().unwrap() > 1 {
        args.extend(["--schedule".into(), "1f1b".into()]);
    }
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = sextant(&a);
    assert!(o.status.success(), "{a:?}: {}", stderr(&o));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let got = e["plans"][0]["estimate"]["step_secs"].as_f64().unwrap();
    assert!(
        (got - step).abs() <= 1e-9 * step,
        "{a:?}: {got} vs the plan's {step}"
    );
    assert_eq!(e["target"], "torchtitan");
    fails_with_one_line(
        &[
            "estimate", "--model", "8b", "--gpus", "16", "--tp", "2", "--zero", "1", "--target",
            "torchtitan",
        ],
        "invalid configuration for --target torchtitan: this plan cannot be expressed for torchtitan: torchtitan has no optimizer-only sharding",
    );
    // Estimate's default ZeRO-1 on a configuration that would not fit under it:
    // the framework's refusal comes first (no memory would fix it), with the
    // --zero values estimate takes.
    fails_with_one_line(
        &[
            "estimate", "--model", "8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--target",
            "torchtitan",
        ],
        "torchtitan has no optimizer-only sharding (ZeRO-1 / distributed optimizer); use --zero 0 (DDP), 2 or 3 (FSDP2)",
    );
    fails_with_one_line(
        &[
            "estimate", "--model", "8b", "--gpus", "8", "--target", "rank-map",
        ],
        "--target rank-map is not a training framework",
    );
    // plan's --emit names itself, and where a launcher target goes instead.
    fails_with_one_line(
        &[
            "plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--emit",
            "torchrun-exec",
        ],
        "--emit torchrun-exec is not a training framework: use megatron-lm",
    );
    // A target's rule on sequence parallelism: ScaleTorch never runs it, so a TP
    // estimate for it defaults to SP off and refuses it asked for; verl's Megatron
    // backend always runs it beside TP.
    let o = sextant(&[
        "estimate",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--zero",
        "0",
        "--target",
        "Scale_Torch",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(e["plans"][0]["config"]["sp"], false);
    assert_eq!(e["target"], "scaletorch");
    fails_with_one_line(
        &[
            "estimate",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--tp",
            "2",
            "--zero",
            "0",
            "--sp",
            "true",
            "--target",
            "scaletorch",
        ],
        "re-plan with --sp false",
    );
    fails_with_one_line(
        &[
            "estimate", "--model", "8b", "--gpus", "8", "--tp", "2", "--sp", "false", "--target",
            "verl",
        ],
        "runs sequence parallelism whenever TP > 1",
    );
    // Out of memory under --json: stdout holds JSON or nothing, never the text
    // breakdown; the refusal is one line.
    let args = [
        "estimate", "--model", "70b", "--gpus", "8", "--tp", "1", "--pp", "1", "--json",
    ];
    fails_with_one_line(&args, "needs 587.5 GiB per GPU");
    assert!(sextant(&args).stdout.is_empty());
}

/// No plan is made for Aleph Alpha's `scaling` (it prices published runs only): a
/// plan file that claims it is refused when read, in one line, by the commands
/// that read plans.
#[test]
fn a_plan_file_priced_for_scaling_is_refused() {
    let dir = crate::common::TempDir::new("scaling-plan");
    let o = sextant(&["plan", "--model", "8b", "--gpus", "8", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["assumptions"]["framework"] = "scaling".into();
    let edited = dir.path("scaling.json");
    std::fs::write(&edited, v.to_string()).unwrap();
    let p = edited.to_str().unwrap();
    let html = dir.path("r.html");
    for args in [
        vec!["export", p, "--to", "rank-map"],
        vec!["export", p, "--to", "megatron-lm"],
        vec!["report", p, "-o", html.to_str().unwrap()],
        vec!["exec", p, "--dry-run"],
    ] {
        fails_with_one_line(&args, "framework scaling is priced for published runs only");
    }
}
