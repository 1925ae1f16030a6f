//! Exports that cannot run data (issue 22, items 1-2) and three export defects of
//! issue 21: the Megatron-Core rank-order rule, torchtitan's version, and the
//! Slurm device index.
//!
//! The scripts are run for real, in a temporary directory, with `torchrun`,
//! `srun`, `scontrol` and `python` replaced by fake programs on PATH that only
//! record their arguments, so a script that ran data would leave a file behind.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use sextant_exports::{export, LaunchOptions, Target, TARGETS, TORCHTITAN_VERSION};
use sextant_planner::config::{ParallelConfig, Recompute, Zero};
use sextant_planner::cost::LossKernel;
use sextant_planner::plan::PlanFile;
use sextant_planner::ranks::Grid;

use crate::common::{count_hostile, fails_with_one_line, sextant, stderr, TempDir};

/// A plan file written by the CLI (Llama 3 8B on 8 GPUs: TP 2, PP 2, DP 2, the
/// distributed optimizer, which every Megatron-Core target states), parsed.
fn cli_plan(dir: &TempDir) -> (PathBuf, PlanFile) {
    let path = dir.path("plan.json");
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
        "--dp",
        "2",
        "--zero",
        "1",
        "--out",
        path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&path).unwrap();
    (path, PlanFile::from_json(&text).unwrap())
}

fn write_exe(path: &Path, body: &str) {
    std::fs::write(path, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A directory of fake launchers: each writes its arguments, one per line, to
/// `$FAKE_LOG/<name>` and exits 0. `srun` also runs its command once per task
/// (`FAKE_TASKS`, default 1) with SLURM_PROCID / SLURM_LOCALID set, and
/// CUDA_VISIBLE_DEVICES as `FAKE_BIND` says: `task` gives each task its own GPU,
/// `none` gives every task all of `FAKE_TASKS` GPUs.
fn fake_bin(dir: &TempDir) -> PathBuf {
    let bin = dir.path("fake-bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["torchrun", "python", "sextant-fake"] {
        write_exe(
            &bin.join(name),
            &format!(
                "printf '%s\\n' \"$@\" >> \"$FAKE_LOG/{name}\"\nprintf 'LOCAL_RANK=%s CUDA_VISIBLE_DEVICES=%s\\n' \"${{LOCAL_RANK-}}\" \"${{CUDA_VISIBLE_DEVICES-}}\" >> \"$FAKE_LOG/{name}.env\""
            ),
        );
    }
    write_exe(&bin.join("scontrol"), "echo localhost");
    write_exe(
        &bin.join("srun"),
        r#"printf '%s\n' "$@" >> "$FAKE_LOG/srun"
while [ "${1#--}" != "$1" ]; do shift; done
n=${FAKE_TASKS:-1}
all=$(seq -s, 0 $((n - 1)))
for ((i = 0; i < n; i++)); do
  if [ "${FAKE_BIND:-none}" = task ]; then vis=$i; else vis=$all; fi
  SLURM_PROCID=$i SLURM_LOCALID=$i CUDA_VISIBLE_DEVICES=$vis "$@" || exit
done"#,
    );
    bin
}

/// Runs `script` with bash in `dir` with the fake launchers first on PATH.
fn run_script(dir: &TempDir, bin: &Path, script: &Path, env: &[(&str, &str)]) {
    let log = dir.path("log");
    std::fs::create_dir_all(&log).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let o = Command::new("bash")
        .arg(script)
        .current_dir(&dir.0)
        .env("PATH", path)
        .env("FAKE_LOG", &log)
        .env("SEXTANT", bin.join("sextant-fake"))
        .env("SLURM_JOB_NODELIST", "node0")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{} failed: {}",
        script.display(),
        stderr(&o)
    );
}

fn bash_n(script: &Path) {
    let o = Command::new("bash").arg("-n").arg(script).output().unwrap();
    assert!(
        o.status.success(),
        "bash -n {}: {}",
        script.display(),
        stderr(&o)
    );
}

fn export_cli(target: &str, plan: &Path, out: &Path) {
    let o = sextant(&[
        "export",
        "--to",
        target,
        plan.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "export --to {target}: {}", stderr(&o));
}

/// Issue 22, item 1: `name = "m\ntouch PWNED #"`, then `export --to torchrun p.json
/// -o t.sh; bash t.sh`. The name stays inside the header comment of every
/// target; the launch scripts run (fake launchers) and create nothing.
pub fn a_newline_in_a_model_name_stays_a_comment() {
    let dir = TempDir::new("safety-name");
    let bin = fake_bin(&dir);
    let (_, mut plan) = cli_plan(&dir);
    let name = "m\ntouch PWNED #";
    plan.model.name = name.into();
    let p = dir.path("p.json");
    std::fs::write(&p, plan.to_json()).unwrap();
    for target in ["torchrun", "torchrun-exec", "slurm", "slurm-exec"] {
        count_hostile();
        let t = dir.path("t.sh");
        let _ = std::fs::remove_file(&t);
        export_cli(target, &p, &t);
        bash_n(&t);
        run_script(&dir, &bin, &t, &[]);
        assert!(
            !dir.path("PWNED").exists(),
            "{target}: the model name ran as a command"
        );
        let text = std::fs::read_to_string(&t).unwrap();
        assert!(
            !text.lines().any(|l| l.starts_with("touch")),
            "{target}:\n{text}"
        );
    }
    // NeMo (Python) and Megatron-Bridge (shell words): no line outside a comment
    // holds the name's second half.
    for target in ["nemo", "megatron-bridge", "megatron-lm", "megatron-core"] {
        count_hostile();
        let out = dir.path(&format!("{target}.txt"));
        export_cli(target, &p, &out);
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(
            text.lines()
                .filter(|l| l.contains("touch PWNED"))
                .all(|l| l.starts_with('#')),
            "{target}:\n{text}"
        );
        assert!(text.contains("m\\u000atouch PWNED #"), "{target}:\n{text}");
    }
}

/// Issue 22, item 2: `cp plan.json 'p$(touch PWNED).json'; sextant export --to
/// torchrun-exec 'p$(touch PWNED).json' -o t.sh; bash t.sh`. The path reaches
/// `sextant exec` as one argument, unchanged; nothing else runs. Also paths with
/// spaces, quotes, a newline and a leading '-'.
pub fn a_plan_path_with_shell_syntax_is_one_word() {
    let dir = TempDir::new("safety-path");
    let bin = fake_bin(&dir);
    let (plan_json, _) = cli_plan(&dir);
    for (name, expect) in [
        ("p$(touch PWNED).json", "p$(touch PWNED).json"),
        ("p`touch PWNED`.json", "p`touch PWNED`.json"),
        ("my plan's \"copy\".json", "my plan's \"copy\".json"),
        ("two\nlines;touch PWNED.json", "two\nlines;touch PWNED.json"),
        ("-rf.json", "./-rf.json"),
    ] {
        for target in ["torchrun-exec", "slurm-exec"] {
            count_hostile();
            let p = dir.path(name);
            std::fs::copy(&plan_json, &p).unwrap();
            let t = dir.path("t.sh");
            let _ = std::fs::remove_file(&t);
            // Relative path, as the user typed it in the reproducer.
            let o = Command::new(env!("CARGO_BIN_EXE_sextant"))
                .args(["export", "--to", target, "-o", "t.sh", "--", name])
                .current_dir(&dir.0)
                .output()
                .unwrap();
            assert!(o.status.success(), "{target} {name:?}: {}", stderr(&o));
            bash_n(&t);
            let _ = std::fs::remove_dir_all(dir.path("log"));
            run_script(&dir, &bin, &t, &[]);
            assert!(
                !dir.path("PWNED").exists(),
                "{target}: the plan path {name:?} ran as a command"
            );
            // `sextant exec` got the path unchanged as its one argument.
            let args = launched(&dir, target);
            assert!(
                args.ends_with(&format!("exec\n{expect}\n")),
                "{target} {name:?}: sextant exec got {args:?}"
            );
        }
    }
}

/// `export --plan N` of an exec launcher runs plan N, the one its header names:
/// `sextant exec` gets `--plan N` (plan 1, its default, is not spelled out).
#[test]
fn an_exec_launcher_runs_the_plan_it_names() {
    let dir = TempDir::new("safety-plan-n");
    let bin = fake_bin(&dir);
    let o = sextant(&[
        "plan",
        "--model",
        "8b",
        "--gpus",
        "8",
        "--out",
        dir.path("p.json").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for target in ["torchrun-exec", "slurm-exec"] {
        for (n, tail) in [("3", "exec\np.json\n--plan\n3\n"), ("1", "exec\np.json\n")] {
            let t = dir.path("t.sh");
            let _ = std::fs::remove_file(&t);
            let o = Command::new(env!("CARGO_BIN_EXE_sextant"))
                .args([
                    "export", "--to", target, "--plan", n, "-o", "t.sh", "p.json",
                ])
                .current_dir(&dir.0)
                .output()
                .unwrap();
            assert!(o.status.success(), "{target}: {}", stderr(&o));
            let text = std::fs::read_to_string(&t).unwrap();
            assert!(text.contains(&format!("plan #{n} ")), "{text}");
            bash_n(&t);
            let _ = std::fs::remove_dir_all(dir.path("log"));
            run_script(&dir, &bin, &t, &[]);
            let args = launched(&dir, target);
            assert!(
                args.ends_with(tail),
                "{target} --plan {n}: sextant exec got {args:?}"
            );
        }
    }
}

/// The arguments (one per line) that reached the launcher: torchrun for
/// torchrun-exec (its last two are `exec PATH`), the executor itself under srun.
fn launched(dir: &TempDir, target: &str) -> String {
    let log = if target == "torchrun-exec" {
        "torchrun"
    } else {
        "sextant-fake"
    };
    std::fs::read_to_string(dir.path("log").join(log)).unwrap()
}

/// Undoes `quote::comment` independently: `\\`, `\uXXXX`, `\UXXXXXXXX`.
fn decode_comment(s: &str) -> String {
    let mut out = String::new();
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('\\') => out.push('\\'),
            Some(k @ ('u' | 'U')) => {
                let n = if k == 'u' { 4 } else { 8 };
                let hex: String = (0..n).filter_map(|_| it.next()).collect();
                let v = u32::from_str_radix(&hex, 16).expect("hex escape");
                out.push(char::from_u32(v).expect("a character"));
            }
            other => panic!("stray escape \\{other:?} in {s:?}"),
        }
    }
    out
}

/// Strings an attacker would try, mixed with arbitrary ones.
fn hostile_string() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "\n",
        "\r",
        "'",
        "\"",
        "$(touch PWNED)",
        "`touch PWNED`",
        "\\",
        "#",
        " ",
        "\t",
        "\u{85}",
        "\u{2028}",
        "\u{2029}",
        "\u{202e}",
        "\u{feff}",
        "é",
        "日本",
        "\u{1F600}",
        "--x",
        "~",
        "*",
        "{a,b}",
        "!",
        ";",
        "|",
        "&",
        "<",
        ">",
        "${HOME}",
        "\\n",
        "\0",
        "]]",
        "[",
        "=",
        "'''",
        "\"\"\"",
        ":",
        "- ",
        "{{",
        "%",
    ]);
    prop_oneof![
        any::<String>(),
        prop::collection::vec(pieces, 0..12).prop_map(|v| v.concat()),
    ]
}

fn hostile_plan(
    base: &PlanFile,
    name: &str,
    gpu: &str,
    profile: &str,
    generator: &str,
) -> PlanFile {
    let mut p = base.clone();
    p.model.name = name.into();
    p.hardware.gpu.name = gpu.into();
    p.hardware.name = profile.into();
    p.generator = generator.into();
    p
}

/// The plan each target can state: verl and RLinf need the unfused loss,
/// torchtitan no distributed optimizer.
fn variant_for(base: &PlanFile, target: Target) -> PlanFile {
    let mut p = base.clone();
    match target {
        Target::Verl | Target::Rlinf => p.assumptions.loss = LossKernel::Unfused,
        // FSDP: torchtitan runs TP and PP only beside it.
        Target::Torchtitan => {
            p.plans[0].config.zero = Zero::Zero3;
            p.assumptions.framework = sextant_planner::cost::Framework::Torchtitan;
        }
        Target::ScaleTorch => {
            p.assumptions.framework = sextant_planner::cost::Framework::ScaleTorch;
            p.assumptions.loss = LossKernel::Unfused;
            p.assumptions.rank_order = sextant_planner::cost::RankOrder::ScaleTorch;
            p.rank_order = p.assumptions.rank_order.order().to_string();
            let c = &mut p.plans[0].config;
            c.zero = Zero::None;
            c.sp = false;
        }
        _ => {}
    }
    p
}

fn python3() -> bool {
    Command::new("python3")
        .arg("-c")
        .arg("import ast")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Checks one export's text parses in its language and every user string is in it
/// as data (header comments decode back to the name).
fn check_parses(dir: &TempDir, target: Target, text: &str, name: &str, have_python: bool) {
    let file = dir.path("out");
    std::fs::write(&file, text).unwrap();
    match target {
        Target::Torchrun
        | Target::TorchrunExec
        | Target::Slurm
        | Target::SlurmExec
        | Target::MegatronLm
        | Target::MegatronBridge
        | Target::ScaleTorch => bash_n(&file),
        Target::Verl | Target::Rlinf => {
            yaml_rust2::YamlLoader::load_from_str(text)
                .unwrap_or_else(|e| panic!("{target}: YAML does not parse: {e}\n{text}"));
        }
        Target::Torchtitan => {
            text.parse::<toml::Table>()
                .unwrap_or_else(|e| panic!("{target}: TOML does not parse: {e}\n{text}"));
        }
        Target::MegatronCore | Target::Nemo => {
            if have_python {
                let o = Command::new("python3")
                    .args([
                        "-c",
                        "import ast, sys; ast.parse(open(sys.argv[1], encoding='utf-8').read())",
                    ])
                    .arg(&file)
                    .output()
                    .unwrap();
                assert!(
                    o.status.success(),
                    "{target}: Python does not parse: {}\n{text}",
                    stderr(&o)
                );
            }
        }
        Target::RankMap | Target::RankMapJson => {}
    }
    // Every line that holds part of the name is a comment (or, for the Slurm job
    // name, a directive), and some comment line reads back as the whole name.
    if matches!(target, Target::RankMap | Target::RankMapJson) {
        return;
    }
    let comments: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert!(
        comments.iter().any(|l| decode_comment(l).contains(name)),
        "{target}: the name {name:?} does not read back from a comment:\n{text}"
    );
    assert_eq!(
        text.lines().count(),
        text.split('\n').count() - 1,
        "{target}: a line break other than \\n"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Issue 22: arbitrary strings as the model, GPU and profile names, the
    /// generator and the plan path, through every exporter. Each output parses in
    /// its language (`bash -n`, YAML, TOML, Python when python3 is present), the
    /// names read back from the comments, and the torchrun-exec script, run with a
    /// fake torchrun, hands `sextant exec` the path unchanged and creates nothing.
    #[test]
    fn arbitrary_strings_stay_data_in_every_export(
        name in hostile_string(),
        gpu in hostile_string(),
        profile in hostile_string(),
        generator in hostile_string(),
        path in hostile_string(),
    ) {
        thread_local! {
            static BASE: (TempDir, PathBuf, PlanFile, bool) = {
                let dir = TempDir::new("safety-prop");
                let bin = fake_bin(&dir);
                let (_, plan) = cli_plan(&dir);
                (dir, bin, plan, python3())
            };
        }
        BASE.with(|(dir, bin, base, have_python)| {
            let plan = hostile_plan(base, &name, &gpu, &profile, &generator);
            let opts = LaunchOptions { plan_path: path.clone() };
            for (_, target) in TARGETS {
                let p = variant_for(&plan, *target);
                let got = export(&p, 1, *target, &opts);
                let text = match (got, target) {
                    (Err(e), Target::TorchrunExec | Target::SlurmExec) if path.contains('\0') => {
                        let e = e.to_string();
                        assert!(e.contains("NUL") && !e.contains('\n'), "{e}");
                        continue;
                    }
                    (Ok(t), _) => t,
                    (Err(e), _) => panic!("{target}: {e}"),
                };
                check_parses(dir, *target, &text, &name, *have_python);
                // The names change comment lines only (and the Slurm job name):
                // every other line is the one a plan with plain names gets.
                let plain = variant_for(&hostile_plan(&plan, "m", "g", "h", "s"), *target);
                let plain = export(&plain, 1, *target, &opts).unwrap();
                let code = |t: &str| -> Vec<String> {
                    t.lines().filter(|l| !l.starts_with('#')).map(String::from).collect()
                };
                assert_eq!(code(&text), code(&plain), "{target}: a name changed the code");
                if matches!(target, Target::Torchrun | Target::TorchrunExec | Target::Slurm | Target::SlurmExec) {
                    let header = decode_comment(text.lines().nth(1).unwrap());
                    for v in [&name, &gpu, &profile, &generator] {
                        assert!(header.contains(v.as_str()), "{target}: {v:?} not in {header:?}");
                    }
                }
                if *target == Target::TorchrunExec {
                    let script = dir.path("t.sh");
                    std::fs::write(&script, &text).unwrap();
                    let _ = std::fs::remove_dir_all(dir.path("log"));
                    let before = std::fs::read_dir(&dir.0).unwrap().count();
                    run_script(dir, bin, &script, &[]);
                    let after = std::fs::read_dir(&dir.0).unwrap().count();
                    assert_eq!(before + 1, after, "the script created files besides the log");
                    let args = launched(dir, "torchrun-exec");
                    let want = if path.starts_with('-') { format!("./{path}") } else { path.clone() };
                    assert!(args.ends_with(&format!("exec\n{want}\n")), "sextant exec got {args:?}, want {want:?}");
                }
            }
        });
    }
}

/// Every count the Megatron-Core order rule looks at, for one configuration.
fn with_config(base: &PlanFile, moe: bool, order: &str, c: [u64; 6]) -> PlanFile {
    let [tp, cp, ep, etp, dp, pp] = c;
    let mut p = base.clone();
    if !moe {
        p.model.moe = None;
    }
    p.rank_order = order.into();
    p.gpus = tp * cp * dp * pp;
    let cfg: &mut ParallelConfig = &mut p.plans[0].config;
    (cfg.tp, cfg.cp, cfg.ep, cfg.etp, cfg.dp, cfg.pp, cfg.vpp) = (tp, cp, ep, etp, dp, pp, 1);
    cfg.sp = tp > 1;
    cfg.recompute = Recompute::None;
    cfg.schedule = sextant_planner::schedule::Schedule::default_for(1);
    p
}

/// Issue 21: a `tp-cp-ep-pp-dp` plan with PP > 1 whose expert data-parallel size
/// differs from its data-parallel size is refused by the megatron-lm,
/// megatron-core and rank-map exports (and the launchers of Megatron-LM) in one
/// line, as Megatron-Core's `initialize_model_parallel` would refuse it.
pub fn a_pp_before_dp_order_megatron_rejects_is_refused() {
    let dir = TempDir::new("safety-order");
    // Mixtral 8x7B on 32 GPUs: TP 2 PP 2 EP 4 DP 8; EDP = 32 / (1 x 4 x 2) = 4 != 8.
    let o = sextant(&[
        "estimate",
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "32",
        "--tp",
        "2",
        "--pp",
        "2",
        "--ep",
        "4",
        "--dp",
        "8",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut plan = PlanFile::from_json(&String::from_utf8_lossy(&o.stdout)).unwrap();
    plan.assumptions.loss = LossKernel::Native;
    let good = dir.path("good.json");
    std::fs::write(&good, plan.to_json()).unwrap();
    plan.rank_order = "tp-cp-ep-pp-dp".into();
    let bad = dir.path("bad.json");
    std::fs::write(&bad, plan.to_json()).unwrap();
    let bad_s = bad.to_str().unwrap();
    for target in [
        "megatron-lm",
        "megatron-core",
        "rank-map",
        "rank-map-json",
        "torchrun",
        "slurm",
    ] {
        fails_with_one_line(
            &["export", "--to", target, bad_s],
            "expert data-parallel size (world / (ETP 1 x EP 4 x PP 2) = 4) to equal the data-parallel size (8)",
        );
        fails_with_one_line(&["export", "--to", target, bad_s], "tp-cp-ep-dp-pp");
        let o = sextant(&["export", "--to", target, good.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "{target} on the default order: {}",
            stderr(&o)
        );
    }
}

/// The rule is Megatron-Core's assertion, and it is enough: over many
/// configurations and both orders, an export succeeds exactly when
/// `order ends in pp or PP == 1 or EDP == DP`, and whenever it succeeds the dense
/// and expert pipeline groups (Megatron-Core's second assertion, built here by
/// the planner's `RankGenerator` twin) are the same.
#[test]
fn the_order_rule_is_megatron_cores_assertion() {
    let dir = TempDir::new("safety-order-rule");
    let (_, dense) = cli_plan(&dir);
    let o = sextant(&[
        "estimate",
        "--model",
        "mixtral-8x7b",
        "--gpus",
        "32",
        "--tp",
        "2",
        "--pp",
        "2",
        "--ep",
        "4",
        "--dp",
        "8",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let moe = PlanFile::from_json(&String::from_utf8_lossy(&o.stdout)).unwrap();
    let (mut refused, mut accepted) = (0, 0);
    for order in ["tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"] {
        for tp in [1, 2, 4] {
            for cp in [1, 2] {
                for dp in [1, 2, 4, 8] {
                    for pp in [1, 2, 4] {
                        for (is_moe, ep, etp) in [
                            (false, 1, 1),
                            (true, 1, 1),
                            (true, 2, 1),
                            (true, 4, 1),
                            (true, 2, 2),
                            (true, 8, 1),
                        ] {
                            let span = tp * cp * dp;
                            if span % (ep * etp) != 0 {
                                continue;
                            }
                            let base = if is_moe { &moe } else { &dense };
                            let p = with_config(base, is_moe, order, [tp, cp, ep, etp, dp, pp]);
                            // What Megatron-Core is handed: a dense model gets its
                            // defaults (EP 1, ETP = TP).
                            let (mep, metp) = if is_moe { (ep, etp) } else { (1, tp) };
                            let world = span * pp;
                            let mdp = world / (tp * pp * cp);
                            let medp = world / (metp * mep * pp);
                            let megatron_ok = order.ends_with("pp") || pp == 1 || medp == mdp;
                            for target in
                                [Target::MegatronLm, Target::MegatronCore, Target::RankMap]
                            {
                                let got = export(&p, 1, target, &LaunchOptions::default());
                                let rule_refused = matches!(&got, Err(e) if e.to_string().contains("initialize_model_parallel asserts"));
                                assert_eq!(!rule_refused, megatron_ok, "{order} tp {tp} cp {cp} dp {dp} pp {pp} ep {ep} etp {etp} moe {is_moe} {target}: {got:?}");
                            }
                            if megatron_ok {
                                accepted += 1;
                                let dense_grid = Grid::new(order, tp, cp, 1, dp, pp).unwrap();
                                let expert_grid = Grid::new(order, metp, 1, mep, medp, pp).unwrap();
                                assert_eq!(
                                    dense_grid.groups("pp"),
                                    expert_grid.groups("pp"),
                                    "{order} tp {tp} cp {cp} dp {dp} pp {pp} ep {mep} etp {metp}"
                                );
                            } else {
                                refused += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(
        refused > 20 && accepted > 100,
        "refused {refused}, accepted {accepted}"
    );
}

/// Issue 21: the torchtitan export names the torchtitan release it is for.
#[test]
fn torchtitan_export_names_its_version() {
    let dir = TempDir::new("safety-titan");
    let (_, plan) = cli_plan(&dir);
    let p = variant_for(&plan, Target::Torchtitan);
    let text = export(&p, 1, Target::Torchtitan, &LaunchOptions::default()).unwrap();
    let header: Vec<&str> = text.lines().take_while(|l| l.starts_with('#')).collect();
    assert!(
        header
            .iter()
            .any(|l| l.contains("torchtitan v0.2.2") && l.contains(TORCHTITAN_VERSION)),
        "{text}"
    );
    text.parse::<toml::Table>().unwrap();
}

/// Issue 21: under Slurm each task's LOCAL_RANK must name a GPU it can see, both
/// when every task sees all the node's GPUs and when Slurm binds each task to its
/// own GPU. The script asks for GPUs per node without per-task binding, and its
/// tasks fall back to device 0 when CUDA_VISIBLE_DEVICES names one GPU.
#[test]
fn slurm_tasks_get_a_device_index_they_can_see() {
    let dir = TempDir::new("safety-slurm");
    let bin = fake_bin(&dir);
    let (plan_json, _) = cli_plan(&dir);
    for target in ["slurm", "slurm-exec"] {
        let t = dir.path("t.sh");
        let _ = std::fs::remove_file(&t);
        export_cli(target, &plan_json, &t);
        bash_n(&t);
        let text = std::fs::read_to_string(&t).unwrap();
        assert!(text.contains("#SBATCH --gpus-per-node=8\n"), "{text}");
        assert!(!text.contains("--gpus-per-task"), "{text}");
        assert!(
            text.contains("srun --ntasks=8 --ntasks-per-node=8 --gpu-bind=none "),
            "{text}"
        );
        let log = if target == "slurm" {
            "python"
        } else {
            "sextant-fake"
        };
        for bind in ["none", "task"] {
            let _ = std::fs::remove_dir_all(dir.path("log"));
            run_script(&dir, &bin, &t, &[("FAKE_TASKS", "8"), ("FAKE_BIND", bind)]);
            let env = std::fs::read_to_string(dir.path(&format!("log/{log}.env"))).unwrap();
            let lines: Vec<&str> = env.lines().collect();
            assert_eq!(lines.len(), 8, "{env}");
            for (i, l) in lines.iter().enumerate() {
                // The device LOCAL_RANK names, among those the task sees, is GPU i.
                let (lr, vis) = l
                    .strip_prefix("LOCAL_RANK=")
                    .and_then(|r| r.split_once(" CUDA_VISIBLE_DEVICES="))
                    .unwrap();
                let visible: Vec<&str> = vis.split(',').collect();
                let idx: usize = lr.parse().unwrap();
                assert_eq!(
                    visible.get(idx),
                    Some(&i.to_string().as_str()),
                    "{target}, binding {bind}, task {i}: {l}"
                );
            }
        }
    }
}

/// Issue 22 and 21 hostile inputs, for the reliability summary.
pub fn hostile_exports() {
    a_newline_in_a_model_name_stays_a_comment();
    a_plan_path_with_shell_syntax_is_one_word();
    a_pp_before_dp_order_megatron_rejects_is_refused();
}

#[test]
fn names_paths_and_orders_from_the_reproducers() {
    hostile_exports();
}

/// The exec launchers hand every rank one job secret (`SEXTANT_JOB_SECRET`) in
/// the environment, never on a command line: made by the script on one node or
/// under Slurm, required from the user when several nodes each run the script.
#[test]
fn exec_launchers_give_every_rank_one_secret() {
    let dir = TempDir::new("export-secret");
    let bin = fake_bin(&dir);
    // The fake sextant records the secret's length and whether it is on argv.
    write_exe(
        &bin.join("sextant-fake"),
        "printf '%s %s\\n' \"${#SEXTANT_JOB_SECRET}\" \"$SEXTANT_JOB_SECRET\" >> \"$FAKE_LOG/secret\"\nprintf '%s\\n' \"$@\" >> \"$FAKE_LOG/argv\"",
    );
    write_exe(&bin.join("torchrun"), "while [ \"${1#--}\" != \"$1\" ]; do case $1 in --no-python) shift;; *) shift 2;; esac; done; exec \"$@\"");
    let (plan, _) = cli_plan(&dir);
    let secrets = |dir: &TempDir| -> Vec<String> {
        std::fs::read_to_string(dir.path("log/secret"))
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    };
    for target in ["torchrun-exec", "slurm-exec"] {
        let script = dir.path(&format!("{target}.sh"));
        export_cli(target, &plan, &script);
        let _ = std::fs::remove_dir_all(dir.path("log"));
        run_script(&dir, &bin, &script, &[("FAKE_TASKS", "2")]);
        let got = secrets(&dir);
        assert!(!got.is_empty(), "{target}: no rank started");
        assert!(
            got.iter().all(|l| l == &got[0]),
            "{target}: ranks got different secrets: {got:?}"
        );
        let (len, secret) = got[0].split_once(' ').unwrap();
        assert!(
            len.parse::<usize>().unwrap() >= 16,
            "{target}: secret too short: {len}"
        );
        let argv = std::fs::read_to_string(dir.path("log/argv")).unwrap();
        assert!(
            !argv.contains(secret),
            "{target}: the secret is on the command line"
        );
        // A secret the user set is the one the ranks get.
        let _ = std::fs::remove_dir_all(dir.path("log"));
        run_script(
            &dir,
            &bin,
            &script,
            &[("SEXTANT_JOB_SECRET", "0123456789abcdef-user")],
        );
        assert_eq!(secrets(&dir)[0], "21 0123456789abcdef-user", "{target}");
    }
    // Two nodes each running the torchrun script: without a secret, one line and
    // a non-zero exit before torchrun starts.
    let two = dir.path("two.json");
    let o = sextant(&[
        "estimate",
        "--model",
        "8b",
        "--gpus",
        "16",
        "--out",
        two.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let script = dir.path("two.sh");
    export_cli("torchrun-exec", &two, &script);
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let o = Command::new("bash")
        .arg(&script)
        .env("PATH", path)
        .env("FAKE_LOG", dir.path("log"))
        .env_remove("SEXTANT_JOB_SECRET")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("SEXTANT_JOB_SECRET"), "{}", stderr(&o));
}
