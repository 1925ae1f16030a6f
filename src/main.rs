//! The `sextant` command: the only place that reads files, the clock, the
//! environment and the terminal. Everything it decides comes from the planner.
//! Its calls into the C library are in `sys`, the only module allowed `unsafe`.

#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

/// `print!` and `println!` for this crate: a failed write to standard output
/// (`> /dev/full`, a closed pipe under `exec`) ends the process with one line
/// and exit code 1 instead of std's panic.
macro_rules! print {
    ($($t:tt)*) => { $crate::write_stdout(format_args!($($t)*)) };
}
macro_rules! println {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($t)*))) };
}

fn write_stdout(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

mod args;
mod bench;
mod exec;
mod flags;
mod io;
mod progress;
mod render;
mod rl;
#[cfg(unix)]
mod sys;

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use sextant_exports::{export, LaunchOptions, Target, TARGETS};
use sextant_planner::banded::{estimate_with, simulated};
use sextant_planner::config::{Layout, ParallelConfig, Recompute, Rejection, Zero};
use sextant_planner::cost::evaluate;
use sextant_planner::plan::PlanFile;
use sextant_planner::reach::RankBy;
use sextant_planner::search::{rescore_sensitivity, search_with_progress, SearchSpace};

use args::Common;

#[derive(Parser, Debug)]
#[command(
    name = "sextant",
    version,
    about = "Plans, costs and explains parallel training layouts for large models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Search every valid parallel configuration and rank the best.
    Plan(PlanArgs),
    /// Plan an RL iteration (verl, RLinf): rollout, resharding, training, both placements.
    RlPlan(rl::RlPlanArgs),
    /// Evaluate one given configuration and print its full cost breakdown.
    Estimate(EstimateArgs),
    /// List the built-in models.
    Models,
    /// List the built-in hardware profiles.
    Profiles,
    /// Render a saved plan for a training framework, a launcher or as a rank map.
    Export(ExportArgs),
    /// Write the HTML cost report of a saved plan (re-runs its search for the charts).
    Report(ReportArgs),
    /// Estimate every row of a published-runs CSV and compare with the measurement.
    Validate(ValidateArgs),
    /// Run a plan: one process per rank (torchrun/srun/mpirun, or --ranks N locally).
    Exec(exec::ExecArgs),
    /// Fit a hardware-profile overlay from measured runs or benchmark files.
    Calibrate(exec::CalibrateArgs),
    /// Microbenchmarks of this machine's GPUs: gemm, hbm, nccl, p2p (needs a build
    /// with --features cuda).
    Bench(bench::BenchArgs),
    /// Print predicted vs measured time per component for a run of a plan.
    Compare(exec::CompareArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(clap::Args, Debug)]
struct ValidateArgs {
    /// CSV in the schema of shared/data/published_runs.csv.
    csv: String,
    /// Print JSON (rows, summaries, unrepresentable rows).
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print Markdown tables.
    #[arg(long)]
    markdown: bool,
    /// Also run leave-one-source-out cross-validation.
    #[arg(long = "cross-validate")]
    cross_validate: bool,
    /// Also search each run's workload (same model, machine, batch and software
    /// stack) and price the first plan against the measurement and the experts'
    /// configuration, with the claimed gain split by knob
    #[arg(long)]
    search: bool,
    /// A CSV completing the runs' software configuration: `id`, `source`, and any of
    /// recompute, attention (flash/unfused), recompute_modules, optimizer_moments (bf16/fp32), dispatcher
    /// (alltoall/deepep/hybridep), ep_comm_overlap, tp_comm_overlap (true/false),
    /// pp_layout, mtp_layers, cross_entropy (te/native/unfused, or compiled: torchtitan's loss under torch.compile, framework torchtitan only), cuda_graphs (Megatron's
    /// scopes: attn moe_router moe_preprocess, full_iteration, or none).
    /// Blank columns follow the default rules (see ARCHITECTURE.md).
    #[arg(long, value_name = "CSV")]
    stack: Option<String>,
    /// Print one row's configuration and full cost breakdown instead of the table.
    #[arg(long, value_name = "ID", conflicts_with_all = ["json", "markdown", "cross_validate", "search"])]
    row: Option<String>,
}

#[derive(clap::Args, Debug)]
struct ReportArgs {
    /// Plan file written by `sextant plan --out` or `sextant estimate --out`.
    plan: String,
    /// Where to write the HTML report.
    #[arg(short = 'o', long = "output")]
    output: String,
    /// Replace the output file if it exists.
    #[arg(long)]
    force: bool,
    /// A measured run of the plan's first configuration (`sextant exec ... --out
    /// RUN.json`): section 9 then compares every component, as `compare` does.
    #[arg(long, value_name = "RUN.json")]
    run: Option<String>,
}

#[derive(clap::Args, Debug)]
struct ExportArgs {
    /// Plan file written by `sextant plan --out` or `sextant estimate --out`.
    plan: String,
    /// megatron-lm, megatron-core, megatron-bridge, nemo, verl, rlinf, torchtitan, scaletorch, torchrun,
    /// torchrun-exec, slurm, slurm-exec, rank-map or rank-map-json.
    #[arg(long)]
    to: String,
    /// Which plan of the file (1 = the best).
    #[arg(long = "plan", default_value_t = 1)]
    which: usize,
    /// Write to this file instead of standard output.
    #[arg(short = 'o', long = "output")]
    output: Option<String>,
    /// Replace the output file if it exists.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args, Debug)]
struct PlanArgs {
    #[command(flatten)]
    common: Common,
    /// How many of the best plans to show.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Restrict TP to these values (comma-separated).
    #[arg(long, value_delimiter = ',')]
    tp: Option<Vec<u64>>,
    #[arg(long, value_delimiter = ',')]
    pp: Option<Vec<u64>>,
    #[arg(long, value_delimiter = ',')]
    vpp: Option<Vec<u64>>,
    #[arg(long, value_delimiter = ',')]
    cp: Option<Vec<u64>>,
    #[arg(long, value_delimiter = ',')]
    ep: Option<Vec<u64>>,
    #[arg(long, value_delimiter = ',')]
    etp: Option<Vec<u64>>,
    /// Micro-batch sizes to try.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    mbs: Vec<u64>,
    /// ZeRO stages to try: 0, 1 (distributed optimizer), 2, 3 (fsdp).
    #[arg(
        long,
        value_enum,
        ignore_case = true,
        value_delimiter = ',',
        default_value = "0,1,2,3"
    )]
    zero: Vec<flags::ZeroFlag>,
    /// Recomputation to try.
    #[arg(
        long,
        value_enum,
        ignore_case = true,
        value_delimiter = ',',
        default_value = "none,selective,full"
    )]
    recompute: Vec<flags::RecomputeFlag>,
    /// Also print the best plan for this framework (see `sextant export --help`).
    #[arg(long)]
    emit: Option<String>,
    /// The framework the plans must run on: megatron-lm (default; also torchrun
    /// and slurm, which launch it), megatron-core, megatron-bridge, nemo, verl,
    /// rlinf, torchtitan, scaletorch, or `any` for everything the cost model prices. Only plans
    /// whose export to that framework succeeds are ranked. Default: --emit's
    /// target when given, else megatron-lm.
    #[arg(long)]
    target: Option<String>,
    /// Rank plans by the upper end of their error band (80%, more where widened to a
    /// wider pool's range; upper, the default),
    /// which widens outside what published runs validated, or by the point
    /// estimate (point).
    #[arg(long, value_enum, ignore_case = true, default_value = "upper")]
    rank_by: flags::RankByFlag,
    /// Also write the HTML cost report to this file (replaced only with --force).
    #[arg(long)]
    report: Option<String>,
}

#[derive(clap::Args, Debug)]
struct EstimateArgs {
    #[command(flatten)]
    common: Common,
    /// Price the configuration as this framework runs it, as `plan --target` does
    /// (megatron-lm, megatron-core, megatron-bridge, nemo, verl, rlinf,
    /// torchtitan, scaletorch), and refuse it in one line where that framework
    /// cannot run it. Default: Megatron-Core's mechanics, no framework's rules.
    #[arg(long)]
    target: Option<String>,
    #[arg(long, default_value_t = 1)]
    tp: u64,
    #[arg(long, default_value_t = 1)]
    pp: u64,
    /// Virtual pipeline stages per rank.
    #[arg(long, default_value_t = 1)]
    vpp: u64,
    #[arg(long, default_value_t = 1)]
    cp: u64,
    #[arg(long, default_value_t = 1)]
    ep: u64,
    /// Expert tensor parallel size.
    #[arg(long, default_value_t = 1)]
    etp: u64,
    /// Data parallel size (default: what the GPUs leave).
    #[arg(long)]
    dp: Option<u64>,
    /// Micro-batch size.
    #[arg(long, default_value_t = 1)]
    mbs: u64,
    /// ZeRO stage: 0, 1 (distributed optimizer), 2, 3 (fsdp).
    #[arg(long, value_enum, ignore_case = true, default_value = "1")]
    zero: flags::ZeroFlag,
    /// Recomputation.
    #[arg(long, value_enum, ignore_case = true, default_value = "none")]
    recompute: flags::RecomputeFlag,
    /// Sequence parallelism (default: on when TP > 1, except for --target
    /// scaletorch, whose trainer has none).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    sp: Option<bool>,
    /// Layers on the first pipeline stage (uneven split; needs --last-stage-layers).
    #[arg(long = "first-stage-layers", requires = "last_stage_layers")]
    first_stage_layers: Option<u64>,
    /// Layers on the last pipeline stage.
    #[arg(long = "last-stage-layers", requires = "first_stage_layers")]
    last_stage_layers: Option<u64>,
    /// Count the embedding and the loss as one layer each when splitting.
    #[arg(long = "account-embedding-loss", conflicts_with_all = ["first_stage_layers", "layers_per_stage"])]
    account_embedding_loss: bool,
    /// Layers of every virtual stage in pipeline order (pp x vpp values).
    #[arg(
        long = "layers-per-stage",
        value_delimiter = ',',
        conflicts_with = "first_stage_layers"
    )]
    layers_per_stage: Option<Vec<u64>>,
    /// The stage layout as Megatron's --pipeline-model-parallel-layout string
    /// (E embedding, t layer, m MTP layer, L loss, | between virtual stages, x*n
    /// and (...)*n repeat), e.g. "Et*4|(t*4|)*14tmL"; it sets --vpp.
    #[arg(long = "pp-layout", value_name = "LAYOUT", conflicts_with_all = ["first_stage_layers", "layers_per_stage", "account_embedding_loss"])]
    pp_layout: Option<String>,
    /// A mixed cluster as PROFILE:GPUS pairs (e.g. h100-sxm:64,a100-80g:64): place
    /// each class on a block of stages and layers on stages by integer program.
    /// Prints a stage table (with --json: the stages and pipeline time, not a plan
    /// file); --out, --gpu, --cluster, --calibration, --mem-headroom and --target
    /// do not apply.
    #[arg(long, value_delimiter = ',')]
    mix: Option<Vec<String>>,
}

fn emit(common: &Common, plan: &PlanFile, text: String) -> Result<()> {
    if let Some(out) = &common.out {
        io::write_new(Path::new(out), &plan.to_json(), common.force)?;
    }
    if common.json {
        println!("{}", plan.to_json());
    } else {
        print!("{text}");
        if let Some(out) = &common.out {
            println!("Plan written to {out}");
        }
    }
    Ok(())
}

pub(crate) fn check_knobs(name: &str, values: &Option<Vec<u64>>) -> Result<()> {
    if let Some(v) = values {
        if v.is_empty() || v.iter().any(|&x| x == 0 || x > 1 << 24) {
            bail!("--{name} values must be between 1 and {}", 1u64 << 24);
        }
    }
    Ok(())
}

/// What ScaleTorch runs (exports/src/scaletorch.rs): plain data parallelism, no
/// sequence parallelism, virtual stages or expert parallelism, whole-layer or no
/// recomputation. The user's own restrictions stay; a choice ScaleTorch cannot run
/// is one line.
fn scaletorch_space(mut s: SearchSpace) -> Result<SearchSpace> {
    // Switches ScaleTorch does not have: refused before the search, not after it.
    scaletorch_switches(s.bf16_grads, s.bf16_moments, s.overlap.tp_comm)?;
    s.zero.retain(|z| *z == Zero::None);
    if s.zero.is_empty() {
        bail!("--target scaletorch runs plain data parallelism only: include 0 in --zero");
    }
    s.recompute.retain(|r| *r != Recompute::Selective);
    if s.recompute.is_empty() {
        bail!("--target scaletorch recomputes whole layers or nothing: use --recompute none,full");
    }
    let only_one = |v: Option<Vec<u64>>, flag: &str| -> Result<Option<Vec<u64>>> {
        match v {
            Some(v) if !v.contains(&1) => {
                bail!("--target scaletorch has no {flag} above 1: include 1 in --{flag}")
            }
            _ => Ok(Some(vec![1])),
        }
    };
    s.vpp = only_one(s.vpp, "vpp")?;
    s.ep = only_one(s.ep, "ep")?;
    // Its ring attention computes each block's whole score matrix
    // (parallel/context_parallel/context_parallel.py): a plan priced with flash
    // attention runs without context parallelism, or is priced unfused
    // (--no-flash-attention).
    if s.assumptions.flash_attention {
        s.cp = match s.cp {
            Some(v) if !v.contains(&1) => bail!(
                "--target scaletorch runs context parallelism with its unfused ring attention: include 1 in --cp, or price it so with --no-flash-attention"
            ),
            _ => Some(vec![1]),
        };
    }
    s.etp = only_one(s.etp, "etp")?;
    s.sp = Some(vec![false]);
    s.even_layers = true;
    Ok(s)
}

/// The switches ScaleTorch does not have, refused in one line before anything is
/// priced (plan's search and estimate alike).
fn scaletorch_switches(bf16_grads: bool, bf16_moments: bool, tp_comm: bool) -> Result<()> {
    for (on, flag, why) in [
        (
            bf16_grads,
            "--bf16-grads",
            "with data parallelism its gradient buckets are FP32",
        ),
        (
            bf16_moments,
            "--bf16-moments",
            "its AdamW keeps BF16 moments whatever the plan says",
        ),
        (
            tp_comm,
            "--tp-comm-overlap",
            "it runs its tensor-parallel collectives unoverlapped",
        ),
    ] {
        if on {
            bail!("--target scaletorch has no {flag} ({why}): drop {flag}");
        }
    }
    Ok(())
}

/// What torchtitan runs (exports/src/others/torchtitan.rs states each): FSDP2
/// (reshard after forward or not) or plain replication, never optimizer-only
/// sharding; op-level selective checkpointing, not Megatron's module lists;
/// stages split evenly; the model compiled, as priced, so async TP where
/// --tp-comm-overlap asks for it. The rest its export refuses plan by plan.
fn torchtitan_space(mut s: SearchSpace) -> Result<SearchSpace> {
    s.zero.retain(|z| *z != Zero::DistOpt);
    if s.zero.is_empty() {
        bail!("--target torchtitan has no optimizer-only sharding (ZeRO-1 / distributed optimizer): include 0, 2 or 3 in --zero");
    }
    use sextant_planner::config::RecomputeModules;
    match &s.recompute_modules {
        None => s.recompute_modules = Some(vec![RecomputeModules::DEFAULT]),
        Some(m) if m.iter().any(|m| *m != RecomputeModules::DEFAULT) => bail!(
            "--target torchtitan has no per-module recomputation like Megatron's --recompute-modules (its selective checkpointing is op-level): drop --recompute-modules"
        ),
        Some(_) => {}
    }
    // Without FSDP, torchtitan's data parallelism is one-dimensional DDP.
    s.plain_dp_alone = true;
    s.even_layers = true;
    Ok(s)
}

/// What RLinf's Megatron backend loads (exports/src/others/rl.rs states it): its
/// checkpoint converter writes no virtual-pipeline chunks and splits the layers
/// evenly over the stages (`RlFramework::restrict`, the same rule for `rl-plan`).
fn rlinf_space(s: SearchSpace) -> Result<SearchSpace> {
    if let Some(v) = &s.vpp {
        if !v.contains(&1) {
            bail!("--target rlinf has no virtual pipeline stages (its checkpoint converter writes none): include 1 in --vpp");
        }
    }
    Ok(sextant_planner::rl::RlFramework::Rlinf.restrict(s))
}

/// A `--target` as plan and estimate take it: `None` for `any` (no framework's
/// rules), else the framework and its name as Sextant spells it (the user's
/// spelling may hold anything `Target::parse` trims).
/// `flag`: the flag the name came from (`--target`, or plan's `--emit`).
fn training_target(flag: &str, name: &str) -> Result<Option<(Target, String)>> {
    if sextant_exports::spelling_key(name) == "any" {
        return Ok(None);
    }
    let t = Target::parse(name)?;
    if sextant_exports::expressible_schedules(t).is_none() {
        bail!("{flag} {} is not a training framework: use megatron-lm, megatron-core, megatron-bridge, nemo, verl, rlinf, torchtitan, scaletorch (or torchrun/slurm, which launch Megatron-LM), or any; the other export targets take a saved plan (sextant export PLAN --to {})", sextant_planner::json::one_line(name.trim(), 60), sextant_planner::json::one_line(name.trim(), 60));
    }
    let canonical = TARGETS
        .iter()
        .find(|(_, x)| *x == t)
        .map_or("megatron-lm", |(n, _)| *n);
    Ok(Some((t, canonical.to_string())))
}

/// Prices as `target` runs (plan's and estimate's `--target`): its framework's
/// memory layout, rank order and loss kernel. `None`: Megatron-Core as given.
fn price_for_target(
    inp: &mut args::Inputs,
    target: Option<Target>,
    target_name: &str,
) -> Result<()> {
    if inp.assumptions.loss == sextant_planner::cost::LossKernel::Compiled
        && target != Some(Target::Torchtitan)
    {
        bail!("--loss compiled is torchtitan's loss under torch.compile: plan it with --target torchtitan ({target_name} plans are priced with Megatron-Core's kernels: --loss native, te or unfused)");
    }
    if target == Some(Target::Torchtitan)
        && inp.assumptions.loss == sextant_planner::cost::LossKernel::Te
    {
        bail!("--target torchtitan has no Transformer Engine cross-entropy kernel (--loss te): use --loss native (its eager loss's passes) or compiled");
    }
    if target == Some(Target::Torchtitan) {
        // Priced as torchtitan runs: its memory layout (FSDP2's buffers, its loss
        // and GLU activations), no Megatron host-wait term, its pipeline stages'
        // gradient sync.
        inp.assumptions.framework = sextant_planner::cost::Framework::Torchtitan;
    }
    if target == Some(Target::ScaleTorch) {
        scaletorch_switches(inp.bf16_grads, inp.bf16_moments, inp.overlap.tp_comm)?;
        // Priced as ScaleTorch runs: its rank grid, its unfused loss and its
        // pure-BF16 memory (BF16 weights and Adam moments, FP32 gradient buckets,
        // the loss's logits); its band pools every framework's runs, since no
        // ScaleTorch run was measured.
        inp.assumptions.rank_order = sextant_planner::cost::RankOrder::ScaleTorch;
        inp.assumptions.loss = sextant_planner::cost::LossKernel::Unfused;
        inp.assumptions.framework = sextant_planner::cost::Framework::ScaleTorch;
    }
    if matches!(target, Some(Target::Verl | Target::Rlinf)) {
        // Priced as they run: both compute log-probabilities with Megatron-Core's
        // unfused vocab-parallel cross-entropy, whatever --loss says
        // (exports/src/others/rl.rs).
        inp.assumptions.loss = sextant_planner::cost::LossKernel::Unfused;
    }
    Ok(())
}

/// A plan file of the one configuration `cfg` priced `est` on `inp`'s model,
/// cluster and workload (what `estimate` writes, and what a target's export is
/// asked about).
fn single_plan(
    inp: &args::Inputs,
    cfg: &ParallelConfig,
    est: &sextant_planner::cost::Estimate,
) -> PlanFile {
    PlanFile::new(
        inp.model.clone(),
        inp.cluster.profile.clone(),
        inp.cluster.gpus,
        inp.workload.clone(),
        inp.assumptions,
        None,
        vec![(cfg.clone(), est.clone())],
    )
}

fn cmd_plan(a: PlanArgs) -> Result<()> {
    let mut outputs = a.common.outputs();
    if let Some(r) = &a.report {
        outputs.push(("--report", r.as_str()));
    }
    io::check_outputs(&outputs, &a.common.input_files(), a.common.force)?;
    let mut inp = a.common.resolve()?;
    if a.top == 0 || a.top > 10_000 {
        bail!("--top {} is out of range: use 1 to 10000", a.top);
    }
    for (name, v) in [
        ("tp", &a.tp),
        ("pp", &a.pp),
        ("vpp", &a.vpp),
        ("cp", &a.cp),
        ("ep", &a.ep),
        ("etp", &a.etp),
    ] {
        check_knobs(name, v)?;
    }
    check_knobs("mbs", &Some(a.mbs.clone()))?;
    let recomputes: Vec<Recompute> = a.recompute.iter().map(|&r| r.into()).collect();
    if inp.recompute_modules.is_some() && !recomputes.contains(&Recompute::Selective) {
        bail!(
            "--recompute-modules applies to selective recomputation: add selective to --recompute"
        );
    }
    if inp.assumptions.cuda_graphs.per_layer()
        && !recomputes.is_empty()
        && recomputes.iter().all(|&r| r == Recompute::Full)
    {
        bail!(
            "{}",
            sextant_planner::config::Rejection::GraphsWithFullRecompute
        );
    }
    if let (Some(t), Some(e)) = (&a.target, &a.emit) {
        // torchrun and slurm launch Megatron-LM.
        let framework = |x: Target| match x {
            Target::Torchrun | Target::Slurm => Target::MegatronLm,
            other => other,
        };
        if !t.trim().eq_ignore_ascii_case("any")
            && framework(Target::parse(t)?) != framework(Target::parse(e)?)
        {
            bail!(
                "--target {} and --emit {} name different frameworks: the plans would be searched for one and written for the other; pass the same one, or --target any",
                sextant_planner::json::one_line(t.trim(), 60),
                sextant_planner::json::one_line(e.trim(), 60)
            );
        }
    }
    let (flag, target_name) = match (&a.target, &a.emit) {
        (Some(t), _) => ("--target", t.clone()),
        (None, Some(e)) => ("--emit", e.clone()),
        (None, None) => ("--target", "megatron-lm".into()),
    };
    let (target, target_name) = match training_target(flag, &target_name)? {
        Some((t, name)) => (Some(t), name),
        None => (None, "any".to_string()),
    };
    // The default target (no --target, no --emit) cannot build every model: rank
    // for any framework then, and say why, rather than refuse to plan.
    let target = match target {
        Some(t) if a.target.is_none() && a.emit.is_none() => {
            match sextant_exports::model_refusal(&inp.model, t) {
                Some(why) => {
                    eprintln!("note: no plan is ranked for {target_name}, the default target: {why}; pass --target for the framework you will run");
                    None
                }
                None => Some(t),
            }
        }
        other => other,
    };
    price_for_target(&mut inp, target, &target_name)?;
    let rank_by = RankBy::from(a.rank_by);
    let space = SearchSpace {
        tp: a.tp,
        pp: a.pp,
        vpp: a.vpp,
        cp: a.cp,
        ep: a.ep,
        etp: a.etp,
        sp: None,
        schedule: inp.schedules.clone().or_else(|| {
            target
                .and_then(sextant_exports::expressible_schedules)
                .map(<[_]>::to_vec)
        }),
        mbs: a.mbs,
        zero: a.zero.iter().map(|&z| z.into()).collect(),
        recompute: recomputes.clone(),
        recompute_modules: inp.recompute_modules.map(|m| vec![m]),
        overlap: inp.overlap,
        bf16_grads: inp.bf16_grads,
        bf16_moments: inp.bf16_moments,
        moe_dispatcher: inp.moe_dispatcher,
        assumptions: inp.assumptions,
        rank_by,
        even_layers: false,
        plain_dp_alone: false,
    };
    let space = match target {
        Some(Target::ScaleTorch) => scaletorch_space(space)?,
        Some(Target::Torchtitan) => torchtitan_space(space)?,
        Some(Target::Rlinf) => rlinf_space(space)?,
        // verl's Megatron bridge turns sequence parallelism on wherever TP > 1.
        Some(Target::Verl) => sextant_planner::rl::RlFramework::Verl.restrict(space),
        _ => space,
    };
    // Where the ScaleTorch search left context parallelism out (its ring attention
    // is unfused), a search that finds nothing says how to bring it back.
    let cp_hint = if target == Some(Target::ScaleTorch) && inp.assumptions.flash_attention {
        "; --target scaletorch searched CP 1 only (its ring attention is unfused): --no-flash-attention searches context parallelism too"
    } else {
        ""
    };
    let start = Instant::now();
    // A target keeps only plans its export can state: search twice as deep, keep
    // the first `top` that export.
    let depth = if target.is_some() {
        a.top.saturating_mul(2)
    } else {
        a.top
    };
    let mut res = progress::searching("searching", |p| {
        search_with_progress(&inp.model, &inp.cluster, &inp.workload, &space, depth, p)
    });
    let mut dropped: Vec<String> = Vec::new();
    if let Some(t) = target {
        res.top.retain(|c| {
            let one = single_plan(&inp, &c.config, &c.estimate);
            match export(
                &one,
                1,
                t,
                &LaunchOptions {
                    plan_path: "plan.json".into(),
                },
            ) {
                Ok(_) => true,
                Err(e) => {
                    dropped.push(e.to_string());
                    false
                }
            }
        });
        res.top.truncate(a.top);
        if res.top.is_empty() && !dropped.is_empty() {
            bail!(
                "none of the {depth} best plans runs on {}: {} (or pass --target any to see what the cost model would pick){cp_hint}",
                target_name,
                dropped[0]
            );
        }
    }
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let mut plan = PlanFile::new(
        inp.model.clone(),
        inp.cluster.profile.clone(),
        inp.cluster.gpus,
        inp.workload.clone(),
        inp.assumptions,
        Some(&res),
        res.top
            .iter()
            .map(|c| (c.config.clone(), c.estimate.clone()))
            .collect(),
    );
    // The canonical name (`--target Megatron_LM` is written `megatron-lm`).
    plan.target = target.map(|_| target_name.clone());
    plan.rank_by = Some(rank_by);
    if let Some(summary) = plan.search.as_mut() {
        summary.space = Some(sextant_planner::plan::SpaceRecord::of(
            &space,
            inp.cluster.allow_tp_beyond_nvlink,
        ));
    }
    let mut text = render::assumptions(&inp);
    text.push('\n');
    if res.top.is_empty() && res.enumerated == 0 {
        // Only virtual stages restricted to interleaved schedules: say the rule that
        // leaves none (an interleaved pipeline splits the layers evenly).
        let interleaved_only = inp.schedules.as_ref().is_some_and(|s| {
            !s.is_empty()
                && s.iter()
                    .all(|s| *s == sextant_planner::schedule::Schedule::Interleaved)
        });
        let why = if interleaved_only {
            format!(
                ", and --schedule {} needs the {} layers split evenly over pp x vpp virtual stages (or an explicit --pp-layout)",
                inp.schedules.as_deref().unwrap_or_default().iter().map(|s| s.name()).collect::<Vec<_>>().join(","),
                inp.model.layers
            )
        } else {
            String::new()
        };
        bail!(
            "no configuration of {} on {} GPUs matches the --schedule/--tp/--pp/--vpp/--cp/--ep/--etp values given (within what {} runs): tp x pp x cp must divide the GPU count and tp the attention heads ({}){why}; widen or drop a restriction",
            inp.model.name,
            inp.cluster.gpus,
            target_name,
            inp.model.heads
        );
    }
    if res.top.is_empty() {
        text.push_str("No configuration fits. ");
        text.push_str(&render::search_summary(&res, millis));
        print!("{text}");
        // Where the model state alone cannot fit, say how many GPUs it needs.
        let gpus = inp.cluster.gpus;
        let params = inp.model.params().total as f64;
        let per_gpu = |n: u64| {
            sextant_planner::memory::sharded_state_floor(
                params,
                n,
                inp.assumptions.framework,
                inp.bf16_grads,
                inp.bf16_moments,
            )
        };
        let room = inp.cluster.profile.capacity_bytes()
            - inp.cluster.profile.memory.reserve_gib * sextant_planner::hardware::GIB;
        if per_gpu(gpus) > room && room > 0.0 {
            use sextant_planner::hardware::{Cluster, MAX_GPUS};
            let per_node = inp.cluster.profile.node.gpus_per_node.max(1);
            let least = (per_gpu(1) / room).ceil();
            // What would help: a GPU count `plan` accepts, or none Sextant models.
            let advice = if least > MAX_GPUS as f64 {
                format!("more GPUs of this kind than Sextant models ({MAX_GPUS}) would be needed: use a GPU with more memory")
            } else {
                let need = Cluster::fitting_count(least as u64, per_node);
                format!(
                    "at least {}, before activations",
                    render::gpus_in_nodes(need, per_node)
                )
            };
            bail!(
                "no valid plan for {} on {}: its weights, gradients and optimizer state alone take {:.1} GiB {}, more than the {:.1} GiB a plan may use besides the runtime reserve: {advice}",
                inp.model.name,
                render::gpu_count(gpus),
                per_gpu(gpus) / sextant_planner::hardware::GIB,
                render::fully_sharded(inp.assumptions.framework, gpus),
                room / sextant_planner::hardware::GIB,
            );
        }
        bail!("no valid plan for {} on {}: see the rejection counts above (more GPUs, a smaller global batch, or a larger-memory GPU may help){cp_hint}", inp.model.name, render::gpu_count(gpus));
    }
    text.push_str(&render::plan_table(&res, &inp, table_width()));
    text.push('\n');
    text.push_str(&render::search_summary(&res, millis));
    let mut notes = sextant_planner::notes::sanity_notes(
        &inp.workload,
        inp.cluster.gpus,
        args::DEFAULT_SEQ,
        res.top.first().map(|c| &c.config),
    );
    notes.extend(sextant_planner::notes::host_notes(
        inp.model.moe.is_some(),
        &inp.cluster.profile,
    ));
    notes.extend(sextant_planner::notes::framework_notes(
        inp.assumptions.framework,
    ));
    if let Some(first) = res.top.first() {
        notes.extend(sextant_planner::notes::small_layer_notes(
            inp.model.moe.is_some(),
            &first.estimate,
            &inp.assumptions,
            &inp.cluster.profile,
        ));
    }
    if let Some(first) = res.top.first() {
        notes.extend(sextant_planner::notes::memory_edge_notes(
            first.estimate.memory.total,
            inp.cluster.profile.capacity_bytes(),
            inp.model.moe.is_some(),
        ));
    }
    notes.extend(sextant_planner::notes::tie_notes(
        &res.top,
        |c| match (rank_by, &c.estimate.band) {
            (RankBy::Upper, Some(b)) => b.high_secs,
            _ => c.estimate.step_secs,
        },
        inp.cluster.profile.capacity_bytes(),
    ));
    text.push_str(&render::notes(&notes));
    if let Some(path) = &a.report {
        rescore_sensitivity(&mut res, &inp.model, &inp.cluster, &inp.workload, &space);
        write_report(
            &plan,
            &res.points,
            &res.sensitivity,
            Measurements::default(),
            path,
            a.common.force,
        )?;
    }
    let emit_target = a.emit.as_deref().map(Target::parse).transpose()?;
    let exported = match emit_target {
        Some(t) => Some(export(
            &plan,
            1,
            t,
            &LaunchOptions {
                plan_path: a.common.out.clone().unwrap_or_else(|| "plan.json".into()),
            },
        )?),
        None => None,
    };
    emit(&a.common, &plan, text)?;
    if let Some(e) = exported {
        println!();
        print!("{e}");
    }
    Ok(())
}

/// Renders the report (pure, in reports/) and writes it.
/// A measured run for the report's section 9: where it ran and its components.
#[derive(Default)]
struct Measurements {
    device: String,
    rows: Vec<sextant_reports::Measured>,
}

fn write_report(
    plan: &PlanFile,
    points: &[sextant_planner::search::Point],
    sensitivity: &[sextant_planner::search::Sensitivity],
    measured: Measurements,
    path: &str,
    force: bool,
) -> Result<()> {
    // The plan's own target (Megatron-LM for a plan made for any framework).
    let target = plan
        .target
        .as_deref()
        .and_then(|t| Target::parse(t).ok())
        .unwrap_or(Target::MegatronLm);
    let launch_for = TARGETS
        .iter()
        .find(|(_, t)| *t == target)
        .map_or("megatron-lm", |(n, _)| *n);
    let launch = export(plan, 1, target, &LaunchOptions::default())
        .map_err(|e| sextant_reports::NoLaunch(e.to_string()));
    let html = sextant_reports::render(&sextant_reports::ReportInput {
        plan,
        points,
        sensitivity,
        launch,
        launch_for,
        measured: &measured.rows,
        measured_on: &measured.device,
    });
    io::write_new(Path::new(path), &html, force)
}

/// A plan file's `target` names the framework the search was restricted to: one
/// that `plan --target` writes, or none (any framework). Checked by every command
/// that reads plans.
pub(crate) fn check_plan_target(path: &str, plan: &PlanFile) -> Result<()> {
    if let Some(t) = &plan.target {
        let known = Target::parse(t)
            .ok()
            .filter(|&t| sextant_exports::expressible_schedules(t).is_some());
        if known.is_none() {
            bail!(
                "'{}': key 'target': '{}' is not a framework `plan --target` writes (megatron-lm, megatron-core, megatron-bridge, nemo, verl, rlinf, torchtitan, scaletorch, torchrun, slurm); fix it or remove the key (a plan for any framework has none)",
                sextant_planner::json::one_line(path, 120),
                sextant_planner::json::one_line(t, 60)
            );
        }
    }
    Ok(())
}

/// Reads a plan file and prices its plans again with this build's cost model
/// (`PlanFile::rederive`), saying on stderr, one line per plan, where the file's
/// own numbers differed.
fn read_plan_rederived(path: &str) -> Result<PlanFile> {
    let text = io::read_text(Path::new(path), "plan file")?;
    let mut plan = PlanFile::from_json(&text).map_err(|e| anyhow::anyhow!("'{path}': {e}"))?;
    check_plan_target(path, &plan)?;
    let notes = plan
        .rederive()
        .map_err(|e| anyhow::anyhow!("'{path}': {e}"))?;
    for n in notes {
        eprintln!("note: '{path}' {n}");
    }
    Ok(plan)
}

fn cmd_report(a: ReportArgs) -> Result<()> {
    let mut inputs = vec![("plan", a.plan.as_str())];
    if let Some(r) = &a.run {
        inputs.push(("--run", r.as_str()));
    }
    io::check_outputs(&[("--output", &a.output)], &inputs, a.force)?;
    let plan = read_plan_rederived(&a.plan)?;
    // The run is checked against the file as written (its hash), before the
    // search below.
    let measured = match &a.run {
        Some(run) => {
            let text = io::read_text(Path::new(&a.plan), "plan file")?;
            let (device, rows) = exec::measured_components(&a.plan, &text, &plan, run)?;
            Measurements { device, rows }
        }
        None => Measurements::default(),
    };
    // The plan file keeps the ranked plans, not every point: search the space it
    // records again for the charts (files from before it was recorded: the
    // default space, with the chosen plan's overlap settings).
    let (points, sensitivity) = if let Some(summary) = &plan.search {
        let first = &plan.plans[0].config;
        let mut cluster =
            sextant_planner::hardware::Cluster::new(plan.hardware.clone(), plan.gpus)?;
        let rank_by = plan.rank_by.unwrap_or_default();
        let space = match &summary.space {
            Some(record) => {
                cluster.allow_tp_beyond_nvlink = record.allow_tp_across_nodes;
                record.space(plan.assumptions, rank_by)
            }
            None => {
                eprintln!(
                    "note: '{}' does not record its search space (written before it was); the charts show the default space",
                    a.plan
                );
                cluster.allow_tp_beyond_nvlink = plan
                    .plans
                    .iter()
                    .any(|p| p.config.tp > plan.hardware.node.nvlink_domain);
                SearchSpace {
                    overlap: first.overlap,
                    bf16_grads: first.bf16_grads,
                    rank_by,
                    ..SearchSpace::default()
                }
            }
        };
        let mut res = progress::searching("re-running the search", |p| {
            search_with_progress(&plan.model, &cluster, &plan.workload, &space, 1, p)
        });
        rescore_sensitivity(&mut res, &plan.model, &cluster, &plan.workload, &space);
        (res.points, res.sensitivity)
    } else {
        (Vec::new(), Vec::new())
    };
    write_report(&plan, &points, &sensitivity, measured, &a.output, a.force)?;
    println!("Report written to {}", a.output);
    Ok(())
}

/// How wide the plan table may be: `COLUMNS` when set to a number (at least 40),
/// else the terminal's width when stdout is one, else no limit (pipes and files get
/// every column).
fn table_width() -> Option<usize> {
    if let Some(n) = std::env::var("COLUMNS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return Some(n.max(40));
    }
    console::Term::stdout()
        .size_checked()
        .map(|(_, cols)| usize::from(cols).max(40))
}

fn cmd_validate(a: ValidateArgs) -> Result<()> {
    use sextant_planner::validate::{
        band_checks, coverage, cross_validate, memory, memory_summary, summarize, validate, HoldOut,
    };
    let text = io::read_text_capped(Path::new(&a.csv), "runs CSV", io::MAX_CSV_BYTES)?;
    let stack = match &a.stack {
        Some(p) => Some(io::read_text_capped(
            Path::new(p),
            "stack CSV",
            io::MAX_CSV_BYTES,
        )?),
        None => None,
    };
    let parsed = sextant_planner::runs::parse_runs_with(&text, stack.as_deref()).map_err(|e| {
        let file = match &a.stack {
            Some(p) if e.in_stack_file() => p,
            _ => &a.csv,
        };
        anyhow::anyhow!("'{}': {e}", sextant_planner::json::one_line(file, 200))
    })?;
    let mut unrepresentable = Vec::new();
    let mut cases = Vec::new();
    for r in parsed {
        match r {
            Ok(c) => cases.push(c),
            Err(u) => unrepresentable.push(u),
        }
    }
    if let Some(id) = &a.row {
        let Some(case) = cases.iter().find(|c| &c.id == id) else {
            if let Some(u) = unrepresentable.iter().find(|u| &u.id == id) {
                bail!("row '{id}' cannot be estimated: {}", u.reason);
            }
            bail!(
                "no row '{id}' in '{}' (ids are the first column, e.g. '{}')",
                a.csv,
                cases.first().map_or("", |c| c.id.as_str())
            );
        };
        let (cfg, e) = case
            .estimate_config()
            .map_err(|r| anyhow::anyhow!("row '{id}' is rejected: {r}"))?;
        let measured = case.measured_step_secs();
        println!(
            "{id}: {} on {} x {}, measured {measured:.3} s, predicted {:.3} s ({:+.1}%)",
            case.model.name,
            case.cluster.gpus,
            case.gpu,
            e.step_secs,
            100.0 * (e.step_secs / measured - 1.0)
        );
        print!("{}", render::breakdown(&cfg, &e, &case.cluster.profile));
        return Ok(());
    }
    let (rows, rejected) = validate(&cases);
    unrepresentable.extend(rejected);
    if rows.is_empty() {
        // The first row's reason says what is wrong; the count says how widespread.
        // From the user's file: a newline or escape in it must not break the
        // one-line error.
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect()
        };
        let first = unrepresentable.first().map_or(String::new(), |u| {
            format!(": row '{}': {}", clean(&u.id), clean(&u.reason))
        });
        bail!(
            "no row of '{}' could be estimated ({} unrepresentable){first}",
            a.csv,
            unrepresentable.len()
        );
    }
    let summary = summarize(&rows);
    // Rows stating a measured peak memory: predicted like with like. A row the
    // model rejects outright is already listed above.
    let (mem_rows, _) = memory(&cases);
    let bands = band_checks(&rows, HoldOut::Row);
    let cv = if a.cross_validate {
        Some(cross_validate(&cases))
    } else {
        None
    };
    let cv_summary = cv.as_ref().map(|(r, _)| summarize(r));
    let claims = a.search.then(|| sextant_planner::claims::claims(&cases));
    let cv_bands = cv.as_ref().map(|(r, _)| band_checks(r, HoldOut::Source));
    if a.json {
        let bands_json = |b: &[sextant_planner::validate::BandCheck]| serde_json::json!({"checks": b, "coverage": coverage(b)});
        let v = serde_json::json!({
            "schema_version": 1,
            "rows": rows,
            "search": claims.as_ref().map(|(c, none)| serde_json::json!({
                "claims": c,
                "summary": sextant_planner::claims::summarize(c),
                "none": none,
            })),
            "summary": summary,
            "bands": bands_json(&bands),
            "unrepresentable": unrepresentable,
            "memory": serde_json::json!({"rows": mem_rows, "summary": memory_summary(&mem_rows)}),
            "cross_validation": cv.as_ref().map(|(r, scales)| serde_json::json!({
                "rows": r,
                "summary": cv_summary,
                "bands": cv_bands.as_deref().map(bands_json),
                "scales": scales.iter().map(|(s, p, k)| serde_json::json!({"held_out": s, "profile": p, "scale": k})).collect::<Vec<_>>(),
            })),
        });
        println!("{}", render::json_text(v));
        return Ok(());
    }
    print!(
        "{}",
        render::validation(&rows, &summary, &unrepresentable, a.markdown)
    );
    print!(
        "{}",
        render::band_coverage(&bands, "the row left out", a.markdown)
    );
    print!("{}", render::memory_validation(&mem_rows, a.markdown));
    if let Some((c, none)) = &claims {
        print!("{}", render::search_claims(c, none, a.markdown));
    }
    if let (Some((cv_rows, scales)), Some(cs), Some(cb)) = (&cv, &cv_summary, &cv_bands) {
        println!();
        print!(
            "{}",
            render::cross_validation(cv_rows, cs, scales, a.markdown)
        );
        print!(
            "{}",
            render::band_coverage(cb, "the row's source left out", a.markdown)
        );
    }
    Ok(())
}

fn cmd_export(a: ExportArgs) -> Result<()> {
    if let Some(out) = &a.output {
        io::check_outputs(&[("--output", out)], &[("plan", &a.plan)], a.force)?;
    }
    let target = Target::parse(&a.to)?;
    let plan = read_plan_rederived(&a.plan)?;
    let out = export(
        &plan,
        a.which,
        target,
        &LaunchOptions {
            plan_path: a.plan.clone(),
        },
    )?;
    match &a.output {
        Some(path) => io::write_new(Path::new(path), &out, a.force)?,
        None => print!("{out}"),
    }
    Ok(())
}

fn cmd_estimate(a: EstimateArgs) -> Result<()> {
    if a.mix.is_some() {
        // The classes' built-in profiles price a mixed cluster, and its result is
        // a stage table, not a plan file: flags that would shape or save anything
        // else are refused rather than dropped.
        let c = &a.common;
        for (flag, given) in [
            ("--out", c.out.is_some()),
            ("--calibration", c.calibration.is_some()),
            ("--gpu", c.gpu.is_some()),
            ("--cluster", c.cluster.is_some()),
            ("--mem-headroom", c.mem_headroom.is_some()),
            ("--target", a.target.is_some()),
        ] {
            if given {
                bail!("{flag} does not apply with --mix: a mixed cluster is priced with its classes' built-in profiles, and its result (a stage table, or with --json the stages and pipeline time) is not a plan file; drop {flag}");
            }
        }
    }
    io::check_outputs(&a.common.outputs(), &a.common.input_files(), a.common.force)?;
    let mut inp = a.common.resolve()?;
    let named = match &a.target {
        Some(t) => training_target("--target", t)?,
        None => None,
    };
    let (target, target_name) = (named.as_ref().map(|n| n.0), named.map(|n| n.1));
    if target.is_none() && inp.assumptions.loss == sextant_planner::cost::LossKernel::Compiled {
        bail!("--loss compiled is torchtitan's loss under torch.compile, and estimate prices Megatron-Core unless told otherwise: add --target torchtitan, or use --loss native, te or unfused");
    }
    price_for_target(
        &mut inp,
        target,
        target_name.as_deref().unwrap_or("megatron-core"),
    )?;
    for (name, v) in [
        ("tp", a.tp),
        ("pp", a.pp),
        ("vpp", a.vpp),
        ("cp", a.cp),
        ("ep", a.ep),
        ("etp", a.etp),
        ("mbs", a.mbs),
        ("dp", a.dp.unwrap_or(1)),
    ] {
        check_knobs(name, &Some(vec![v]))?;
    }
    let parts = a.tp.saturating_mul(a.pp).saturating_mul(a.cp);
    let dp = match a.dp {
        Some(d) => d,
        None => {
            if inp.cluster.gpus % parts != 0 {
                bail!("tp x pp x cp = {parts} does not divide {} GPUs, so there is no whole data-parallel size", inp.cluster.gpus);
            }
            inp.cluster.gpus / parts
        }
    };
    let mut vpp = a.vpp;
    let layout = if let Some(text) = &a.pp_layout {
        let l =
            Layout::from_megatron(text, a.pp).map_err(|e| anyhow::anyhow!("--pp-layout: {e}"))?;
        if a.vpp != 1 && a.vpp != l.vpp {
            bail!("--pp-layout has {} virtual stages per rank but --vpp is {}: drop --vpp or make them agree", l.vpp, a.vpp);
        }
        if l.mtp_layers != inp.model.mtp_layers {
            bail!("--pp-layout places {} MTP layers but {} has {}: change the layout or give --mtp-layers {}", l.mtp_layers, inp.model.name, inp.model.mtp_layers, l.mtp_layers);
        }
        vpp = l.vpp;
        l.layout
    } else if let Some(list) = a.layers_per_stage.clone() {
        Layout::Explicit { layers: list }
    } else if let (Some(first), Some(last)) = (a.first_stage_layers, a.last_stage_layers) {
        Layout::FirstLast { first, last }
    } else if a.account_embedding_loss {
        Layout::AccountEmbeddingLoss
    } else {
        Layout::Even
    };
    let recompute = Recompute::from(a.recompute);
    if inp.recompute_modules.is_some() && recompute != Recompute::Selective {
        bail!("--recompute-modules applies to selective recomputation: add --recompute selective");
    }
    let cfg = ParallelConfig {
        tp: a.tp,
        pp: a.pp,
        vpp,
        cp: a.cp,
        ep: a.ep,
        etp: a.etp,
        dp,
        // Sequence parallelism goes with TP unless the target never runs it
        // (ScaleTorch's trainer has none: its plan searches SP off).
        sp: a
            .sp
            .unwrap_or(a.tp > 1 && target != Some(Target::ScaleTorch)),
        mbs: a.mbs,
        zero: Zero::from(a.zero),
        recompute,
        layout,
        overlap: inp.overlap,
        bf16_grads: inp.bf16_grads,
        bf16_moments: inp.bf16_moments,
        recompute_modules: inp.recompute_modules.unwrap_or_default(),
        moe_dispatcher: inp.moe_dispatcher,
        schedule: inp.schedule_for(vpp)?,
    };
    // A configuration given whole: an expert-parallel overlap Megatron would not
    // run here is refused, not printed as on and silently dropped.
    if cfg.overlap.ep_comm
        && cfg.schedule != sextant_planner::schedule::Schedule::DualPipe
        && cfg.ep_overlap(&inp.workload).is_none()
    {
        let why = if cfg.ep < 2 {
            "it needs expert parallelism (--ep 2 or more on an MoE model)"
        } else if cfg.recompute == Recompute::Full
            || cfg.recomputes(sextant_planner::config::RecomputeModules::MOE)
        {
            "Megatron refuses it with full recomputation or the moe recompute module"
        } else {
            "with a pipeline Megatron runs it only under the interleaved schedule (--vpp 2 or more)"
        };
        bail!("--ep-comm-overlap cannot apply to this configuration: {why}; drop the flag or change the configuration");
    }
    if let Some(mix) = &a.mix {
        return estimate_mixed(&inp, &cfg, mix, a.common.json);
    }
    let est = match estimate_with(
        &inp.model,
        &inp.cluster,
        &inp.workload,
        &cfg,
        inp.assumptions,
    ) {
        // The same pipeline time the search ranks with.
        Ok(e) => simulated(e, &cfg),
        Err(r @ Rejection::OutOfMemory { .. }) => {
            // Show where the memory goes, then say why it is rejected; but first
            // what the target cannot run, which no memory would fix.
            if let Ok(e) = evaluate(
                &inp.model,
                &inp.cluster,
                &inp.workload,
                &cfg,
                inp.assumptions,
            ) {
                if let (Some(t), Some(name)) = (target, &target_name) {
                    let plan = single_plan(&inp, &cfg, &e);
                    if let Err(x) = export(&plan, 1, t, &LaunchOptions::default()) {
                        bail!("invalid configuration for --target {name}: {x}");
                    }
                }
                // Under --json stdout holds JSON or nothing: the one-line
                // refusal below says what does not fit.
                if !a.common.json {
                    print!(
                        "{}\n{}",
                        render::assumptions(&inp),
                        render::breakdown(&cfg, &e, &inp.cluster.profile)
                    );
                }
            }
            bail!("invalid configuration: {r}");
        }
        Err(r) => bail!("invalid configuration: {r}"),
    };
    let mut plan = single_plan(&inp, &cfg, &est);
    if let (Some(t), Some(name)) = (target, &target_name) {
        // What the target cannot run is refused, as plan --target drops it.
        export(
            &plan,
            1,
            t,
            &LaunchOptions {
                plan_path: "plan.json".into(),
            },
        )
        .map_err(|e| anyhow::anyhow!("invalid configuration for --target {name}: {e}"))?;
        plan.target = Some(name.clone());
    }
    let mut text = render::assumptions(&inp);
    text.push('\n');
    text.push_str(&render::breakdown(&cfg, &est, &inp.cluster.profile));
    let mut notes = sextant_planner::notes::sanity_notes(
        &inp.workload,
        inp.cluster.gpus,
        args::DEFAULT_SEQ,
        Some(&cfg),
    );
    notes.extend(sextant_planner::notes::host_notes(
        inp.model.moe.is_some(),
        &inp.cluster.profile,
    ));
    notes.extend(sextant_planner::notes::small_layer_notes(
        inp.model.moe.is_some(),
        &est,
        &inp.assumptions,
        &inp.cluster.profile,
    ));
    notes.extend(sextant_planner::notes::framework_notes(
        inp.assumptions.framework,
    ));
    text.push_str(&render::notes(&notes));
    emit(&a.common, &plan, text)
}

fn estimate_mixed(
    inp: &args::Inputs,
    cfg: &ParallelConfig,
    mix: &[String],
    json: bool,
) -> Result<()> {
    let mut classes = Vec::new();
    for item in mix {
        let Some((name, n)) = item.split_once(':') else {
            bail!("--mix entry '{item}' is not PROFILE:GPUS (e.g. h100-sxm:64)");
        };
        let n: u64 = n
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("--mix entry '{item}': '{n}' is not a GPU count"))?;
        if n == 0 {
            bail!("--mix entry '{item}': the GPU count must be at least 1");
        }
        classes.push((sextant_planner::hardware::builtin_profile(name)?, n));
    }
    let plan = sextant_planner::mixed::plan_mixed(
        &inp.model,
        &classes,
        &inp.workload,
        cfg,
        inp.assumptions,
    )
    .map_err(|e| anyhow::anyhow!("mixed cluster: {e}"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&plan)?);
        return Ok(());
    }
    // The model and workload lines; the cluster is the classes below, not the
    // default profile the inputs were resolved against.
    for line in render::assumptions(inp)
        .lines()
        .filter(|l| !l.starts_with("Cluster:"))
    {
        println!("{line}");
    }
    println!("\nMixed cluster: {}", mix.join(", "));
    println!(
        "{:>6} {:<12} {:>7} {:>14}",
        "stage", "GPU", "layers", "per micro-batch"
    );
    for st in &plan.stages {
        println!(
            "{:>6} {:<12} {:>7} {:>11.2} ms",
            st.stage,
            st.class,
            st.layers,
            st.secs_per_micro_batch * 1e3
        );
    }
    println!(
        "Pipeline time per step (simulated 1F1B): {:.3} s",
        plan.pipeline_secs
    );
    match plan.even_pipeline_secs {
        Some(e) => println!(
            "Even split on the same stages: {e:.3} s ({:+.1}%)",
            100.0 * (e / plan.pipeline_secs - 1.0)
        ),
        None => println!("An even split on the same stages does not fit in memory."),
    }
    let layers: Vec<String> = plan.stages.iter().map(|s| s.layers.to_string()).collect();
    println!("Layers per stage: {} (sextant estimate --layers-per-stage; Megatron-LM --pipeline-model-parallel-layout)", layers.join(","));
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Plan(a) => cmd_plan(a),
        Command::RlPlan(a) => rl::cmd_rl_plan(a),
        Command::Estimate(a) => cmd_estimate(a),
        Command::Models => {
            print!("{}", render::models_list());
            Ok(())
        }
        Command::Profiles => {
            print!("{}", render::profiles_list());
            Ok(())
        }
        Command::Export(a) => cmd_export(a),
        Command::Report(a) => cmd_report(a),
        Command::Validate(a) => cmd_validate(a),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            // Into a buffer first: clap_complete panics when its writer fails
            // (a full disk, a closed pipe); our writer says so in one line.
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "sextant", &mut buf);
            print!("{}", String::from_utf8_lossy(&buf));
            Ok(())
        }
        Command::Exec(a) => exec::cmd_exec(a),
        Command::Calibrate(a) => exec::cmd_calibrate(a),
        Command::Compare(a) => exec::cmd_compare(a),
        Command::Bench(a) => bench::cmd_bench(a),
    }
}

fn main() -> ExitCode {
    // A write past the file-size limit (RLIMIT_FSIZE) must fail with EFBIG and the
    // old file left intact, not kill the process with SIGXFSZ halfway through.
    #[cfg(unix)]
    sys::ignore_file_size_signal();
    let parsed = Cli::try_parse();
    // `sextant plan --json | head`: a closed pipe ends the process quietly, as it
    // does for other Unix tools, instead of a panic in print!. Not for `exec`,
    // whose ranks must see a closed socket as an error (EPIPE), not die of it.
    #[cfg(unix)]
    if !matches!(
        &parsed,
        Ok(Cli {
            command: Command::Exec(_)
        })
    ) {
        sys::default_pipe_signal();
    }
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            // One line: clap's first line, the arguments it lists under it (a
            // missing required argument), and its suggestion when it has one. A
            // value holding control characters is shown escaped: clap quotes it
            // raw (a newline would cut the line, a terminal escape act) or with
            // some sequences dropped, where it cannot be found; then the values
            // are named escaped after clap's kind of error instead.
            let text = e.to_string();
            let hostile: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned())
                .filter(|a| a.chars().any(char::is_control))
                .collect();
            let message = if hostile.iter().all(|a| text.contains(a.as_str())) {
                let mut text = text.clone();
                for a in &hostile {
                    text = text.replace(a.as_str(), &sextant_planner::json::one_line(a, 200));
                }
                clap_line(&text)
            } else {
                let shown: Vec<String> = hostile
                    .iter()
                    .map(|a| format!("'{}'", sextant_planner::json::one_line(a, 200)))
                    .collect();
                format!(
                    "{} (arguments holding control characters: {})",
                    e.kind().as_str().unwrap_or("invalid arguments"),
                    shown.join(", ")
                )
            };
            // Whatever clap echoed (a megabyte value, a character the checks
            // missed): one bounded line of printable text.
            let message = sextant_planner::json::one_line(&message, 600);
            eprintln!("error: {message}; see 'sextant --help'");
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            // One line whatever an error quotes (a name read from a file may hold
            // newlines or terminal escapes, and be megabytes long), in one write,
            // so that lines from concurrent ranks do not interleave (eprint! with
            // arguments writes each piece separately).
            let line = format!(
                "error: {}\n",
                sextant_planner::json::one_line(&chain.join(": "), ERROR_SHOWN)
            );
            eprint!("{line}");
            ExitCode::from(1)
        }
    }
}

/// Characters of an error line shown: every message is a sentence or two, and
/// what it quotes from a file is cut where it is built; this bounds the rest.
const ERROR_SHOWN: usize = 4000;

/// clap's error text as one line: its first line, the arguments it lists under
/// it (a missing required argument), and its suggestion when it has one.
fn clap_line(text: &str) -> String {
    let mut lines = text.lines();
    let first = lines
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .trim_end_matches(':');
    let listed: Vec<&str> = lines
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let first = if listed.is_empty() {
        first.to_string()
    } else {
        format!("{first}: {}", listed.join(", "))
    };
    let tip = text
        .lines()
        .find(|l| l.trim_start().starts_with("tip:"))
        .map(|t| format!(" ({})", t.trim()))
        .unwrap_or_default();
    format!("{first}{tip}")
}
