//! RL iterations: published runs predicted, the `rl-plan` command on the two bar
//! workloads (both placements side by side, per-phase times and memory), the verl and
//! RLinf exports' keys against the key table of docs/rl.md, and bad input.

use std::collections::BTreeSet;

use sextant_planner::config::{Layout, Precision, Recompute};
use sextant_planner::hardware::builtin_profile;
use sextant_planner::hf::from_hf_config;
use sextant_planner::model::ModelSpec;
use sextant_planner::presets::resolve;
use sextant_planner::rl::phases::fixed_config;
use sextant_planner::rl::search::{evaluate_stated, PhaseTimes};
use sextant_planner::rl::{Algorithm, Lengths, RlFramework, RlWorkload};
use yaml_rust2::{Yaml, YamlLoader};

use crate::common::has_lines;

use crate::common::{data, sextant, stderr, stdout};

struct Row {
    id: String,
    gpu: String,
    moe: bool,
    predicted: f64,
    measured: f64,
    phases: String,
    times: PhaseTimes,
}

fn model(name: &str) -> ModelSpec {
    if name.ends_with(".json") {
        let text = std::fs::read_to_string(data(name)).unwrap();
        from_hf_config(&text, name).unwrap()
    } else {
        resolve(name).unwrap().spec
    }
}

fn predict(r: &csv::StringRecord, h: &csv::StringRecord) -> Row {
    let get = |k: &str| r[h.iter().position(|c| c == k).unwrap()].to_string();
    let num = |k: &str| get(k).parse::<u64>().unwrap();
    let mut actor = model(&get("model"));
    actor.mtp_layers = 0;
    let sequences = num("sequences");
    let n = num("responses_per_prompt");
    let w = RlWorkload {
        critic: None,
        reward: None,
        reference: get("reference") == "true",
        algorithm: Algorithm::parse(&get("algorithm")).unwrap(),
        prompts: sequences / n,
        responses_per_prompt: n,
        lengths: Lengths {
            prompt_mean: num("prompt_mean"),
            prompt_max: num("prompt_mean"),
            response_mean: num("response_mean"),
            response_max: num("response_max"),
        },
        mini_batches: num("mini_batches"),
        epochs: 1,
        precision: Precision::Bf16,
        actor,
    };
    let hw = builtin_profile(&get("gpu")).unwrap();
    let gpus = num("gpus");
    let (tp, cp, ep, pp) = (num("tp"), num("cp"), num("ep"), num("pp"));
    let mut cfg = fixed_config(tp, pp, cp, ep, gpus / (tp * cp * pp));
    if !w.actor.layers.is_multiple_of(pp) {
        cfg.layout = Layout::balanced(w.actor.layers, pp, 1);
    }
    // The stated layout, recomputation and engine memory fraction.
    cfg.recompute = match get("recompute").as_str() {
        "none" => Recompute::None,
        "selective" => Recompute::Selective,
        "full" => Recompute::Full,
        other => panic!("{}: recompute {other}", get("id")),
    };
    // Blank where the run does not state it: derived as rl-plan derives it.
    let fraction = match get("rollout_memory_fraction").as_str() {
        "" => None,
        f => Some(f.parse::<f64>().unwrap()),
    };
    // NeMo RL is no framework Sextant plans for: its runs are priced as `rl-plan`
    // prices without `--emit`.
    let framework = match get("framework").as_str() {
        "nemo-rl" => None,
        f => Some(RlFramework::parse(f).unwrap_or_else(|| panic!("framework {f}"))),
    };
    let p = evaluate_stated(
        &w,
        &hw,
        gpus,
        &cfg,
        num("rollout_tp"),
        num("rollout_gpus"),
        fraction,
        framework,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", get("id")));
    Row {
        id: get("id"),
        gpu: hw.name.clone(),
        moe: w.actor.moe.is_some(),
        predicted: p.times.iteration,
        measured: get("value").parse().unwrap(),
        phases: format!(
            "rollout {:.0} reshard+offload {:.1} fwd {:.0} train {:.0}",
            p.times.rollout,
            p.times.reshard + p.times.offload,
            p.times.forward,
            p.times.training,
        ),
        times: p.times,
    }
}

/// Published per-phase times (NeMo RL v0.3's step-time breakdown) against the
/// predicted phases: where the time goes, phase by phase. Printed, not a bar: the
/// rows say which phases the model underprices (docs/rl.md).
#[test]
fn rl_published_phases_compared() {
    let text = std::fs::read_to_string(data("published_rl_phases.csv")).unwrap();
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let h = rd.headers().unwrap().clone();
    // A phase the source does not state is blank, printed as "-".
    let col = |r: &csv::StringRecord, k: &str| -> Option<f64> {
        let v = &r[h.iter().position(|c| c == k).unwrap()];
        (!v.is_empty()).then(|| v.parse().unwrap())
    };
    println!(
        "{:<40} {:>13} {:>13} {:>13} {:>13} {:>13}",
        "run (pred/meas s)", "generation", "refit", "logprobs", "training", "step"
    );
    let mut n = 0;
    for r in rd.records() {
        let r = r.unwrap();
        let row = predict(&r, &h);
        let t = row.times;
        let measured = |m: Option<f64>| m.map_or("-".to_string(), |m| format!("{m:.0}"));
        let cell = |p: f64, m: Option<f64>| format!("{p:.0}/{}", measured(m));
        let refit = t.reshard + t.offload;
        println!(
            "{:<40} {:>13} {:>13} {:>13} {:>13} {:>13}",
            row.id,
            cell(t.rollout, col(&r, "generation_s")),
            format!("{refit:.1}/{}", measured(col(&r, "refit_s"))),
            cell(t.forward, col(&r, "logprob_s")),
            cell(t.training, col(&r, "training_s")),
            cell(row.predicted, Some(row.measured)),
        );
        for v in [t.rollout, t.reshard + t.offload, t.forward, t.training] {
            assert!(v.is_finite() && v >= 0.0, "{}", row.id);
        }
        n += 1;
    }
    assert!(n >= 4);
}

/// Every published RL run predicted from its stated configuration; the table is
/// printed. The bars are the median error and a factor per row.
#[test]
fn rl_published_runs_predicted() {
    let text = std::fs::read_to_string(data("published_rl_runs.csv")).unwrap();
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let h = rd.headers().unwrap().clone();
    let rows: Vec<Row> = rd.records().map(|r| predict(&r.unwrap(), &h)).collect();
    assert!(rows.len() >= 5, "at least five published RL runs");
    println!(
        "{:<42} {:>10} {:>10} {:>8}  phases (s)",
        "run", "predicted", "measured", "error"
    );
    let mut errors: Vec<f64> = Vec::new();
    for r in &rows {
        let e = r.predicted / r.measured - 1.0;
        errors.push(e.abs());
        println!(
            "{:<42} {:>10.1} {:>10.1} {:>+7.1}%  {}",
            r.id,
            r.predicted,
            r.measured,
            100.0 * e,
            r.phases
        );
    }
    // The median `validate` reports (the mean of the middle two for an even count).
    let median = sextant_planner::validate::median_abs(errors.iter().copied());
    println!("median |error| {:.1}%", 100.0 * median);
    for r in &rows {
        let ratio = r.predicted / r.measured;
        assert!(
            ratio.is_finite() && (1.0 / ROW_BAR..ROW_BAR).contains(&ratio),
            "{} predicted {:.1} s against {:.1} s measured",
            r.id,
            r.predicted,
            r.measured
        );
    }
    assert!(median < MEDIAN_BAR, "median error {median}");
    check_rl_validation_file(&rows);
}

/// hwprofiles/validation_rl.json feeds `rl-plan`'s band (`uncertainty::rl_band`);
/// it must hold these rows' errors under this model.
fn check_rl_validation_file(rows: &[Row]) {
    use sextant_planner::cost::Framework;
    use sextant_planner::uncertainty::{ErrorSample, ValidationSet};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/hwprofiles/validation_rl.json");
    let fresh = ValidationSet {
        schema_version: 1,
        source: "signed iteration-time error (predicted / measured - 1) of every row of tests/data/published_rl_runs.csv, each predicted from its stated configuration; written by tests/it/rl.rs".into(),
        samples: rows
            .iter()
            .map(|r| ErrorSample {
                id: r.id.clone(),
                profile: r.gpu.clone(),
                moe: r.moe,
                rel_error: ((r.predicted / r.measured - 1.0) * 1e4).round() / 1e4,
                shares: None,
                reach: None,
                framework: Framework::MegatronCore,
            })
            .collect(),
        rates: Vec::new(),
    };
    if std::env::var_os("SEXTANT_BLESS").is_some() {
        std::fs::write(path, serde_json::to_string_pretty(&fresh).unwrap() + "\n").unwrap();
        return;
    }
    let committed: ValidationSet =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let stale = "hwprofiles/validation_rl.json is stale: run SEXTANT_BLESS=1 cargo test --release --test it rl_published";
    assert_eq!(committed.samples.len(), fresh.samples.len(), "{stale}");
    for (a, b) in committed.samples.iter().zip(&fresh.samples) {
        assert!(
            a.id == b.id && a.moe == b.moe && (a.rel_error - b.rel_error).abs() < 0.005,
            "{stale} ({}: {} vs {})",
            b.id,
            a.rel_error,
            b.rel_error
        );
    }
}

/// How far off one row may be (a factor): a regression bar above today's errors
/// (every row under-predicted, by 20% to 71%, DeepSeek-V3 the worst at a factor of
/// 3.4; docs/rl.md), not the goal.
const ROW_BAR: f64 = 5.0;

/// The median error the published RL rows must stay under: a regression bar just
/// above today's 41.7% over six rows (NeMo RL's five: 35.7%; RLinf's own run in
/// its comparison with verl is 48% short in every phase); the goal, 20%, is not
/// met (docs/rl.md says where the time goes, phase by phase, from NeMo RL's v0.3
/// breakdown and RLinf's comparison).
const MEDIAN_BAR: f64 = 0.43;

fn bar_args(model: &str, gpus: &str) -> Vec<String> {
    let common = if model == "8b" {
        "--prompts 512 --responses 8 --prompt-len 512 --prompt-max 1024 --response-len 2048 --response-max 8192"
    } else {
        "--prompts 512 --responses 16 --prompt-len 1024 --prompt-max 2048 --response-len 4096 --response-max 16384"
    };
    let mut v: Vec<String> = vec![
        "rl-plan".into(),
        "--model".into(),
        model.into(),
        "--gpus".into(),
        gpus.into(),
    ];
    v.extend(common.split(' ').map(String::from));
    v
}

fn run(args: &[String]) -> String {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = sextant(&a);
    assert!(o.status.success(), "{}", stderr(&o));
    stdout(&o)
}

/// The bar workloads: both placements side by side with a pool split, per-phase
/// times and memory, and ranked plans.
#[test]
fn rl_plan_shows_both_placements_for_the_bar_workloads() {
    for (model, gpus) in [("8b", "64"), ("qwen3-30b-a3b", "128")] {
        let out = run(&bar_args(model, gpus));
        println!("{out}");
        let side = out
            .lines()
            .find(|l| l.starts_with("GPUs train / rollout"))
            .expect("side-by-side table");
        assert!(!out.contains("none fits"), "{out}");
        let cells: Vec<&str> = side.split_whitespace().collect();
        // colocated: all GPUs both ways; disaggregated: a split summing to all.
        assert_eq!(&cells[4..7], &[gpus, "/", gpus]);
        let t: u64 = cells[7].parse().unwrap();
        let r: u64 = cells[9].parse().unwrap();
        assert_eq!(t + r, gpus.parse::<u64>().unwrap());
        for row in [
            "rollout (s)",
            "resharding (s)",
            "forward passes (s)",
            "training (s)",
            "iteration (s)",
            "iteration band (s)",
            "memory GiB roll/fwd/train",
        ] {
            assert!(out.lines().any(|l| l.starts_with(row)), "{row} missing");
        }
        // The band comes from the published runs' errors: every one was slower
        // than predicted, so it lies above the point and says so.
        let cells = |name: &str| -> Vec<String> {
            let l = out.lines().find(|l| l.starts_with(name)).unwrap();
            l[27..].split_whitespace().map(String::from).collect()
        };
        let point: f64 = cells("iteration (s)")[0].parse().unwrap();
        let band = cells("iteration band (s)");
        let (low, high): (f64, f64) = (band[0].parse().unwrap(), band[2].parse().unwrap());
        assert!(point < low && low < high, "{point} vs {band:?}");
        assert!(out.contains("read the point as optimistic"), "{out}");
        assert!(out.lines().any(|l| l.starts_with("1  ")), "ranked plans");
        // Two ranked plans never show the same configuration (the cells before the
        // times): what tells them apart is printed, not only its consequences.
        let ranked: Vec<String> = out
            .lines()
            .skip_while(|l| !l.starts_with("#  placement"))
            .skip(1)
            .take_while(|l| l.chars().next().is_some_and(|c| c.is_ascii_digit()))
            .map(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells[1..cells.len() - 6].join(" ")
            })
            .collect();
        assert!(ranked.len() >= 2, "{out}");
        let distinct: BTreeSet<&String> = ranked.iter().collect();
        assert_eq!(distinct.len(), ranked.len(), "{out}");
    }
}

fn key_table() -> BTreeSet<(String, String)> {
    let doc =
        std::fs::read_to_string(format!("{}/docs/rl.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let start = doc.find("<!-- keys:start -->").unwrap();
    let end = doc.find("<!-- keys:end -->").unwrap();
    doc[start..end]
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().trim_matches('`'))
                .collect();
            let sourced = c.len() >= 3
                && c[2]
                    .rsplit_once(':')
                    .is_some_and(|(f, n)| !f.is_empty() && n.parse::<u32>().is_ok());
            (sourced && (c[0] == "verl" || c[0] == "rlinf"))
                .then(|| (c[0].to_string(), c[1].to_string()))
        })
        .collect()
}

fn flatten(y: &Yaml, prefix: &str, out: &mut Vec<String>) {
    if let Yaml::Hash(h) = y {
        for (k, v) in h {
            let k = k.as_str().unwrap();
            let p = if prefix.is_empty() {
                k.to_string()
            } else {
                format!("{prefix}.{k}")
            };
            if matches!(v, Yaml::Hash(_)) && !p.ends_with("component_placement") {
                flatten(v, &p, out);
            } else {
                out.push(p);
            }
        }
    }
}

/// Every key of the verl and RLinf exports is in docs/rl.md's table with a
/// file:line, for colocated, disaggregated (verl), PPO, reward-model (verl),
/// reference-free, MTP (verl) and MoE plans.
#[test]
fn rl_exports_keys_are_all_in_the_key_table() {
    let table = key_table();
    let qwen3 = format!("{}/tests/data/hf/qwen3-8b.json", env!("CARGO_MANIFEST_DIR"));
    let cases: Vec<(&str, &str, &str, Vec<&str>)> = vec![
        ("verl", "8b", "64", vec![]),
        ("verl", "8b", "64", vec!["--placement", "disaggregated"]),
        (
            "verl",
            "8b",
            "64",
            vec!["--algorithm", "ppo", "--critic", "8b", "--reward", "8b"],
        ),
        ("verl", "8b", "64", vec!["--tp", "2", "--pp", "2"]),
        ("verl", "qwen3-30b-a3b", "128", vec![]),
        (
            "verl",
            "qwen3-30b-a3b",
            "128",
            vec!["--placement", "disaggregated"],
        ),
        ("verl", "deepseek-v3", "256", vec!["--rollout-tp", "32"]),
        ("rlinf", &qwen3, "64", vec![]),
        ("rlinf", &qwen3, "64", vec!["--no-reference"]),
        (
            "rlinf",
            &qwen3,
            "64",
            vec!["--algorithm", "ppo", "--critic", &qwen3],
        ),
        ("rlinf", &qwen3, "64", vec!["--tp", "2", "--pp", "2"]),
        ("rlinf", "qwen3-30b-a3b", "128", vec![]),
    ];
    let mut seen = 0;
    for (fw, model, gpus, extra) in cases {
        let marker = if fw == "verl" { "# verl" } else { "# RLinf" };
        let mut a = bar_args(model, gpus);
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend(["--emit".to_string(), fw.to_string()]);
        let out = run(&a);
        let yaml = &out[out.find(marker).unwrap()..];
        let docs = YamlLoader::load_from_str(yaml).expect("the export parses as YAML");
        let mut keys = Vec::new();
        flatten(&docs[0], "", &mut keys);
        assert!(keys.len() > 20, "{yaml}");
        for k in keys {
            assert!(
                table.contains(&(fw.to_string(), k.clone())),
                "{fw} key {k} is not in docs/rl.md's key table ({model} {extra:?})"
            );
            seen += 1;
        }
    }
    assert!(seen > 300);
}

#[test]
fn rl_plan_bad_input_is_one_line() {
    // Training-pool sizes outside 1..gpus, or for a search without the
    // disaggregated placement, were dropped without a word. A batch beyond any RL
    // run was read as "no training layout fits" (the product of prompts and
    // responses wrapped or overflowed the search).
    let beyond = "responses per prompt is beyond what Sextant plans (at most 16777216";
    for (a, av, b, bv, needle) in [
        (
            "--train-gpus",
            "0",
            "--placement",
            "disaggregated",
            "takes 1 to 15 of the 16 GPUs",
        ),
        (
            "--train-gpus",
            "16",
            "--placement",
            "disaggregated",
            "takes 1 to 15 of the 16 GPUs",
        ),
        (
            "--train-gpus",
            "8",
            "--placement",
            "colocated",
            "--placement colocated does not search",
        ),
        (
            "--prompts",
            "18446744073709551615",
            "--responses",
            "8",
            beyond,
        ),
        ("--prompts", "4194304", "--responses", "8", beyond),
    ] {
        crate::common::fails_with_one_line(
            &["rl-plan", "--model", "8b", "--gpus", "16", a, av, b, bv],
            needle,
        );
    }
    crate::common::fails_with_one_line(
        &[
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--placement",
            "\u{1b}[2J",
        ],
        "unknown --placement '\\u{1b}[2J'",
    );
    // No engine holds its KV cache: the refusal quotes the widest engine tried
    // (the closest to fitting) and says what to give.
    crate::common::fails_with_one_line(
        &[
            "rl-plan",
            "--model",
            "deepseek-v3",
            "--gpus",
            "256",
            "--rollout-tp",
            "1,2,4,8",
        ],
        "rollout TP 8: weights 156.2 GiB, the engine's share 63.7 GiB holds no KV cache for the longest sequence (needs 159.9 GiB); a wider engine holds more: give --rollout-tp sizes above 8 (divisors of the node's 8 GPUs, or whole nodes)",
    );
    // A model whose name holds a terminal escape and a newline (read from its
    // JSON): the refusal quoting it stays one line, the escape shown, not sent.
    let dir = crate::common::TempDir::new("rl-hostile-name");
    let spec = sextant_planner::presets::resolve("8b").unwrap().spec;
    let mut v = serde_json::to_value(&spec).unwrap();
    v["name"] = "a\u{1b}]0;pwned\u{7}\u{1b}[31mRED\r\nx".into();
    let model = dir.path("model.json");
    std::fs::write(&model, v.to_string()).unwrap();
    let args = [
        "rl-plan",
        "--model",
        model.to_str().unwrap(),
        "--gpus",
        "16",
        "--emit",
        "rlinf",
    ];
    crate::common::fails_with_one_line(&args, "the actor a\\u{1b}]0;pwned");
    assert!(!crate::common::sextant(&args).stderr.contains(&0x1b));
    // A rollout engine the serving engines cannot run: one that straddles a
    // node boundary, or splits the heads unevenly (it was priced and exported).
    for (tp, needle) in [
        (
            "3",
            "rollout TP 3: an engine spans part of one 8-GPU node or whole nodes",
        ),
        (
            "12",
            "rollout TP 12: an engine spans part of one 8-GPU node",
        ),
        (
            "64",
            "rollout TP 64: 32 attention heads do not split evenly over 64 GPUs",
        ),
    ] {
        crate::common::fails_with_one_line(
            &[
                "rl-plan",
                "--model",
                "8b",
                "--gpus",
                "64",
                "--rollout-tp",
                tp,
            ],
            needle,
        );
    }
    crate::common::fails_with_one_line(
        &["rl-plan", "--model", "8b", "--gpus", "16", "--top", "0"],
        "--top 0 is out of range: use 1 to 10000",
    );
    for bad in [
        // More GPUs than Sextant models: refused before any search (it grew a
        // vector per node and panicked on capacity overflow).
        vec!["rl-plan", "--model", "8b", "--gpus", "18446744073709551615"],
        vec!["rl-plan", "--model", "8b", "--gpus", "16777217"],
        vec![
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--algorithm",
            "dpo",
        ],
        vec![
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--algorithm",
            "ppo",
        ],
        vec![
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--mini-batches",
            "3",
        ],
        vec![
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--response-max",
            "10",
        ],
        vec![
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--placement",
            "mixed",
        ],
        vec![
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "8",
            "--placement",
            "disaggregated",
        ],
        vec![
            "rl-plan",
            "--model",
            "8b",
            "--gpus",
            "16",
            "--emit",
            "megatron-lm",
        ],
        vec![
            "rl-plan",
            "--model",
            "405b",
            "--gpus",
            "8",
            "--response-len",
            "100000",
        ],
    ] {
        let o = sextant(&bad);
        let err = stderr(&o);
        assert!(!o.status.success(), "{bad:?} succeeded");
        assert_eq!(err.trim().lines().count(), 1, "{bad:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A placement left out by `--placement` reads "not searched", not "none fits".
#[test]
fn rl_plan_names_the_placement_it_did_not_search() {
    let o = crate::common::sextant(&crate::common::words(
        "rl-plan --model 8b --gpus 16 --placement disaggregated",
    ));
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let out = crate::common::stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with("GPUs train / rollout"))
        .unwrap_or_default();
    assert!(
        line.contains("not searched (--placement") && !line.contains("none fits"),
        "{out}"
    );
}

/// More rollout engines than responses: the engines that get none are counted
/// and a note says so, and the ranked table's columns stay aligned at six-digit
/// pool sizes.
#[test]
fn rl_plan_says_when_engines_outnumber_the_responses() {
    let o = crate::common::sextant(&crate::common::words(
        "rl-plan --model 8b --gpus 65536 --prompts 64 --responses 8",
    ));
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    let (out, err) = (crate::common::stdout(&o), crate::common::stderr(&o));
    assert!(
        err.contains(
            "rollout engines get no response: an iteration has 512 responses for 65536 GPUs"
        ),
        "{err}"
    );
    let engines = out
        .lines()
        .find(|l| l.starts_with("rollout engines"))
        .unwrap_or_default();
    assert!(engines.contains("(512 busy)"), "{out}");
    // Every ranked row puts its layout where the header puts "training layout".
    let header = out.lines().find(|l| l.starts_with("#  placement")).unwrap();
    let at = header.find("training layout").unwrap();
    for row in out
        .lines()
        .filter(|l| l.contains("colocated ") || l.contains("disaggregated "))
    {
        if row.starts_with(|c: char| c.is_ascii_digit()) {
            assert_eq!(&row[at..at + 2], "TP", "{out}");
        }
    }
    // Fewer responses than GPUs but every engine busy (TP 8 engines): no note.
    let o = crate::common::sextant(&crate::common::words(
        "rl-plan --model 70b --gpus 1024 --prompts 64 --responses 8 --rollout-tp 8 --placement colocated",
    ));
    assert!(o.status.success(), "{}", crate::common::stderr(&o));
    assert!(!crate::common::stderr(&o).contains("get no response"));
    assert!(!crate::common::stdout(&o).contains("busy)"));
}

/// The exported YAML of an `rl-plan --emit` run (from its header comment on).
fn emitted(model: &str, gpus: &str, extra: &[&str], fw: &str) -> String {
    let mut a = bar_args(model, gpus);
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend(["--emit".to_string(), fw.to_string()]);
    let out = run(&a);
    let marker = if fw == "verl" { "# verl" } else { "# RLinf" };
    out[out.find(marker).expect("the configuration")..].to_string()
}

/// verl: a Hydra config over verl's own (separate pools: what its one-step-off
/// config sets, restated), the checkpoint paths demanded, token-budget
/// micro-batches, the engine's limits consistent, MTP trained where priced, the
/// reward model on the priced Megatron path, the critic offloaded.
#[test]
fn rl_verl_export_starts_and_runs_what_was_priced() {
    let y = emitted("qwen3-30b-a3b", "128", &[], "verl");
    has_lines(
        &y,
        &[
            "defaults:\n  - ppo_megatron_trainer\n  - _self_\n",
            "    path: ???",
            "  hybrid_engine: true\n",
            "    use_dynamic_bsz: true\n",
            "    log_prob_use_dynamic_bsz: true\n",
            // prompt 2048 + response 16384
            "    max_model_len: 18432\n",
        ],
    );
    let num = |key: &str| -> u64 {
        let l = y.lines().find(|l| l.trim_start().starts_with(key)).unwrap();
        l.split(':').nth(1).unwrap().trim().parse().unwrap()
    };
    assert!(num("max_num_batched_tokens:") >= num("max_num_seqs:"));
    // Per rank of the CP group: the frameworks multiply it by CP.
    assert!(num("ppo_max_token_len_per_gpu:") * num("context_parallel_size:") >= 18432);
    let d = emitted(
        "qwen3-30b-a3b",
        "128",
        &["--placement", "disaggregated"],
        "verl",
    );
    has_lines(
        &d,
        &[
            "hydra:\n  searchpath:\n    - file://verl/trainer/config\n",
            "  hybrid_engine: false\n",
            "    calculate_log_probs: true\n",
            "    bypass_mode: true\n",
            "verl.experimental.one_step_off_policy.main_ppo",
        ],
    );
    let ppo = emitted(
        "8b",
        "64",
        &["--algorithm", "ppo", "--critic", "8b", "--reward", "8b"],
        "verl",
    );
    has_lines(
        &ppo,
        &[
            "  use_reward_loop: false\n",
            "  forward_max_token_len_per_gpu: ",
            "critic:\n",
            "  megatron:\n    param_offload: true\n    grad_offload: true\n    optimizer_offload: true\n",
        ],
    );
    let ds = emitted("deepseek-v3", "256", &["--rollout-tp", "32"], "verl");
    assert!(
        ds.contains("    mtp:\n      enable: true\n      enable_train: true\n"),
        "{ds}"
    );
}

/// RLinf: a Hydra overlay of the architecture's reasoning example, an explicit
/// GPU range (a part of a node is not `all`), its architecture named, the
/// reference run only with a KL coefficient, and what it cannot run refused in
/// one line.
#[test]
fn rl_rlinf_export_overlays_its_example_and_refuses_what_it_cannot_run() {
    let y = emitted("qwen3-30b-a3b", "128", &[], "rlinf");
    has_lines(
        &y,
        &[
            "defaults:\n  - qwen3-30b-grpo-megatron\n  - _self_\n",
            "    actor,rollout,reward: 0-127\n",
            "    model_type: qwen3_moe\n",
            "  enable_dynamic_batch_size: true\n",
            "  kl_beta: 0.001",
            "    virtual_pipeline_model_parallel_size: null\n",
        ],
    );
    let tp = |key: &str, y: &str| -> u64 {
        let l = y.lines().find(|l| l.trim_start().starts_with(key)).unwrap();
        l.split(':').nth(1).unwrap().trim().parse().unwrap()
    };
    assert_eq!(
        tp("tensor_model_parallel_size:", &y) % tp("tensor_parallel_size:", &y),
        0
    );
    let qwen3 = format!("{}/tests/data/hf/qwen3-8b.json", env!("CARGO_MANIFEST_DIR"));
    let small = emitted(&qwen3, "4", &["--no-reference"], "rlinf");
    has_lines(
        &small,
        &[
            "    actor,rollout,reward: 0-3\n",
            "  kl_beta: 0.0\n",
            "model_type: qwen3\n",
        ],
    );
    for (extra, needle) in [
        (vec!["--model", "8b"], "a llama model"),
        (vec!["--reward", "qwen3-30b-a3b"], "learned reward model"),
        (vec!["--epochs", "2"], "no epoch loop"),
        (vec!["--placement", "disaggregated"], "third GPU pool"),
        (
            vec!["--algorithm", "ppo", "--critic", "qwen3-30b-a3b"],
            "mixture-of-experts critic",
        ),
        (
            vec!["--algorithm", "ppo", "--critic", "8b"],
            "from the actor's checkpoint",
        ),
    ] {
        let mut a: Vec<String> = vec!["rl-plan".into(), "--gpus".into(), "128".into()];
        if extra[0] != "--model" {
            a.extend(["--model".into(), "qwen3-30b-a3b".into()]);
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a.extend(["--emit".into(), "rlinf".into()]);
        let v: Vec<&str> = a.iter().map(String::as_str).collect();
        crate::common::fails_with_one_line(&v, needle);
    }
}

/// Training sizes of 0 are refused as `plan` refuses them (they were dropped, or
/// read as "nothing fits"), and a model's name or path with a newline stays on
/// one line in the summary and in errors.
#[test]
fn rl_plan_sizes_and_names_stay_one_line() {
    for flag in ["--tp", "--pp", "--ep"] {
        crate::common::fails_with_one_line(
            &["rl-plan", "--model", "8b", "--gpus", "16", flag, "1,0"],
            "values must be between 1 and",
        );
    }
    let dir = crate::common::TempDir::new("rl-names");
    let mut hf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/tests/data/hf/qwen3-8b.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    hf["_name_or_path"] = "a\nb: c".into();
    let named = dir.path("named.json");
    std::fs::write(&named, hf.to_string()).unwrap();
    let out = run(&[
        "rl-plan".into(),
        "--model".into(),
        named.to_string_lossy().into_owned(),
        "--gpus".into(),
        "16".into(),
    ]);
    let first = out.lines().next().unwrap();
    assert!(first.contains("actor a\\nb: c, reference"), "{first}");
    hf["num_attention_heads"] = 0.into();
    let bad = dir.path("bad\nname.json");
    std::fs::write(&bad, hf.to_string()).unwrap();
    crate::common::fails_with_one_line(
        &["plan", "--gpus", "16", "--model", &bad.to_string_lossy()],
        "bad\\nname.json",
    );
}
