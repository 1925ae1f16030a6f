//! Renders a Sextant plan in the words of each training framework: Megatron-LM
//! arguments, Megatron-Core Python, Megatron-Bridge overrides, verl and RLinf YAML,
//! torchtitan TOML, torchrun and Slurm launch scripts, and the rank map.
//!
//! Pure: a [`PlanFile`] in, text out. A plan that a framework cannot express is an
//! [`ExportError::Inexpressible`] saying why, never an approximation. Every emitted
//! flag or key names, in a comment beside its mapping, the framework file that
//! defines it. Every string a user controls is written through `quote.rs`, in the
//! quoting of the language it lands in.

#![forbid(unsafe_code)]

mod launch;
mod megatron;
mod others;
mod quote;
mod rankmap;
mod reason;
pub mod rl;
mod scaletorch;

use std::fmt;

use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::Schedule;
use thiserror::Error;

pub use megatron::{pipeline_layout, MEGATRON_VERSION};
pub use others::TORCHTITAN_VERSION;
pub use reason::Reason;

/// What to export to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    MegatronLm,
    MegatronCore,
    MegatronBridge,
    /// NeMo 2.0 recipe overrides.
    Nemo,
    Verl,
    Rlinf,
    Torchtitan,
    /// torchrun script running ScaleTorch's trainer.
    ScaleTorch,
    /// torchrun script running Megatron-LM.
    Torchrun,
    /// torchrun script running `sextant exec`.
    TorchrunExec,
    /// Slurm sbatch script running Megatron-LM.
    Slurm,
    /// Slurm sbatch script running `sextant exec`.
    SlurmExec,
    /// Rank map as a table.
    RankMap,
    /// Rank map as JSON.
    RankMapJson,
}

pub const TARGETS: &[(&str, Target)] = &[
    ("megatron-lm", Target::MegatronLm),
    ("megatron-core", Target::MegatronCore),
    ("megatron-bridge", Target::MegatronBridge),
    ("nemo", Target::Nemo),
    ("verl", Target::Verl),
    ("rlinf", Target::Rlinf),
    ("torchtitan", Target::Torchtitan),
    ("scaletorch", Target::ScaleTorch),
    ("torchrun", Target::Torchrun),
    ("torchrun-exec", Target::TorchrunExec),
    ("slurm", Target::Slurm),
    ("slurm-exec", Target::SlurmExec),
    ("rank-map", Target::RankMap),
    ("rank-map-json", Target::RankMapJson),
];

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = TARGETS
            .iter()
            .find(|(_, t)| t == self)
            .map(|(n, _)| *n)
            .unwrap_or("?");
        f.write_str(name)
    }
}

pub use sextant_planner::cost::spelling_key;

impl Target {
    pub fn parse(s: &str) -> Result<Target, ExportError> {
        let key = spelling_key(s);
        let key = match key.as_str() {
            "bridge" => "megatronbridge",
            "mcore" => "megatroncore",
            "megatron" => "megatronlm",
            other => other,
        };
        TARGETS
            .iter()
            .find(|(n, _)| spelling_key(n) == key)
            .map(|(_, t)| *t)
            .ok_or_else(|| ExportError::UnknownTarget(sextant_planner::json::one_line(s, 60)))
    }
}

#[derive(Debug, Error, Clone, PartialEq)]
pub enum ExportError {
    #[error("unknown export target '{0}' (one of: megatron-lm, megatron-core, megatron-bridge, nemo, verl, rlinf, torchtitan, scaletorch, torchrun, torchrun-exec, slurm, slurm-exec, rank-map, rank-map-json)")]
    UnknownTarget(String),
    #[error("this plan cannot be expressed for {target}: {reason}")]
    Inexpressible { target: Target, reason: String },
    #[error("plan #{0} does not exist in this file (it holds {1})")]
    NoSuchPlan(usize, usize),
}

/// Options for launch scripts.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// Path of the plan file as the launched `sextant exec` will see it.
    pub plan_path: String,
}

impl Default for LaunchOptions {
    fn default() -> Self {
        LaunchOptions {
            plan_path: "plan.json".into(),
        }
    }
}

/// The pipeline schedules a target can state, when it cannot state them all: the
/// Megatron-Core family (and the launchers that run Megatron-LM) only 1F1B and
/// interleaved 1F1B, torchtitan those and GPipe. `plan --emit` searches only these.
pub fn expressible_schedules(target: Target) -> Option<&'static [Schedule]> {
    use sextant_planner::cost::Framework;
    match target_framework(target)? {
        Framework::MegatronCore => Some(&[Schedule::OneFOneB, Schedule::Interleaved]),
        Framework::Torchtitan => {
            Some(&[Schedule::OneFOneB, Schedule::Interleaved, Schedule::Gpipe])
        }
        Framework::ScaleTorch => Some(scaletorch::SCHEDULES),
        Framework::Nanotron | Framework::Scaling => None,
    }
}

/// Why `target` cannot run `model` at all, whatever the plan (the targets that
/// launch Megatron-LM: its arguments cannot build the model); `None` when it may.
pub fn model_refusal(model: &sextant_planner::model::ModelSpec, target: Target) -> Option<String> {
    match target {
        Target::MegatronLm | Target::Torchrun | Target::Slurm => megatron::model_refusal(model),
        _ => None,
    }
}

/// The framework a target runs, whose costs its export must have been priced
/// with: the Megatron-Core family (and the launchers that run Megatron-LM),
/// torchtitan or ScaleTorch; `None` for the rank map and Sextant's own executor,
/// which take any plan.
fn target_framework(target: Target) -> Option<sextant_planner::cost::Framework> {
    use sextant_planner::cost::Framework;
    match target {
        Target::MegatronLm
        | Target::MegatronCore
        | Target::MegatronBridge
        | Target::Nemo
        | Target::Verl
        | Target::Rlinf
        | Target::Torchrun
        | Target::Slurm => Some(Framework::MegatronCore),
        Target::Torchtitan => Some(Framework::Torchtitan),
        Target::ScaleTorch => Some(Framework::ScaleTorch),
        Target::TorchrunExec | Target::SlurmExec | Target::RankMap | Target::RankMapJson => None,
    }
}

fn framework_name(f: sextant_planner::cost::Framework) -> &'static str {
    use sextant_planner::cost::Framework;
    match f {
        Framework::MegatronCore => "Megatron-Core",
        Framework::Nanotron => "nanotron",
        Framework::Torchtitan => "torchtitan",
        Framework::ScaleTorch => "ScaleTorch",
        Framework::Scaling => "Aleph Alpha's scaling",
    }
}

/// Renders plan number `rank` (1-based, as printed) of `plan` for `target`.
///
/// A plan is priced with one framework's memory layout, recomputation and
/// pipeline (`Assumptions::framework`); another framework would run a different
/// step, so a plan the target could express but that was priced for another
/// framework is refused too, after the target's own reasons (which say what to
/// change in the plan).
pub fn export(
    plan: &PlanFile,
    rank: usize,
    target: Target,
    opts: &LaunchOptions,
) -> Result<String, ExportError> {
    let text = render(plan, rank, target, opts)?;
    if let Some(priced) = target_framework(target) {
        let f = plan.assumptions.framework;
        if f != priced {
            return Err(ExportError::Inexpressible {
                target,
                reason: format!(
                    "the plan was priced for {} (its memory layout, recomputation and pipeline), not for {}; plan again with --target {target}",
                    framework_name(f),
                    framework_name(priced),
                ),
            });
        }
    }
    Ok(text)
}

fn render(
    plan: &PlanFile,
    rank: usize,
    target: Target,
    opts: &LaunchOptions,
) -> Result<String, ExportError> {
    if rank == 0 || rank > plan.plans.len() {
        return Err(ExportError::NoSuchPlan(rank, plan.plans.len()));
    }
    let i = rank - 1;
    let exec = || launch::Program::SextantExec {
        plan_path: opts.plan_path.clone(),
        rank,
    };
    let megatron = || megatron::args(plan, i).map(launch::Program::Megatron);
    let refuse = |reason: Reason| reason.at(target);
    let cfg = &plan.plans[i].config;
    // A hand-edited or foreign plan file may pair MXFP8 with a GPU that has none:
    // Transformer Engine refuses it at start-up.
    if plan.workload.precision == sextant_planner::config::Precision::Mxfp8
        && !plan.hardware.runs_mxfp8()
        && target != Target::RankMap
        && target != Target::RankMapJson
    {
        return Err(ExportError::Inexpressible {
            target,
            reason: format!(
                "the plan trains in MXFP8 on {}, which its hardware profile says has no block-scaled FP8 (Transformer Engine runs MXFP8 on Blackwell only; a profile for such a GPU sets gpu.mxfp8: true); re-plan with --precision fp8",
                sextant_planner::json::one_line(&plan.hardware.gpu.name, 60)
            ),
        });
    }
    // BF16 Adam moments (Megatron-Core's precision-aware optimizer) need a torch
    // dtype: verl and RLinf pass optimizer overrides on without turning dtype names
    // into dtypes, and torchtitan has no such optimizer.
    if cfg.bf16_moments && matches!(target, Target::Verl | Target::Rlinf | Target::Torchtitan) {
        return Err(ExportError::Inexpressible { target, reason: "BF16 Adam moments (Megatron's precision-aware optimizer) have no verified setting here; re-plan without --bf16-moments".into() });
    }
    // CUDA graphs priced by the plan: only Megatron-LM's arguments and
    // Megatron-Bridge's overrides carry them.
    let graphs = plan.assumptions.cuda_graphs;
    if !graphs.is_none()
        && !matches!(
            target,
            Target::MegatronLm
                | Target::MegatronBridge
                | Target::Torchrun
                | Target::Slurm
                | Target::TorchrunExec
                | Target::SlurmExec
                | Target::RankMap
                | Target::RankMapJson
        )
    {
        return Err(ExportError::Inexpressible {
            target,
            reason: format!("the plan prices CUDA graphs ({graphs}), which this export does not set; export to megatron-lm or megatron-bridge, or re-plan without --cuda-graphs"),
        });
    }
    // Element-wise operations priced eager describe a published run's own code:
    // every export's framework fuses them (Transformer Engine; torchtitan compiled,
    // as its export sets), so the price would not be what runs.
    let eager = plan.assumptions.eager;
    if !eager.is_none() && !matches!(target, Target::RankMap | Target::RankMapJson) {
        return Err(ExportError::Inexpressible {
            target,
            reason: format!("the plan prices its layer's {eager} as eager PyTorch operators (a published run's software), which this export runs fused; re-plan without them"),
        });
    }
    if target == Target::Torchtitan
        && cfg.recompute_modules != sextant_planner::config::RecomputeModules::DEFAULT
        && cfg.recompute == sextant_planner::config::Recompute::Selective
    {
        return Err(ExportError::Inexpressible {
            target,
            reason: format!(
                "torchtitan has no per-module recomputation like Megatron's --recompute-modules {}",
                cfg.recompute_modules
            ),
        });
    }
    match target {
        Target::MegatronLm => megatron::megatron_lm(plan, i),
        Target::MegatronCore => megatron::megatron_core(plan, i),
        Target::MegatronBridge => others::megatron_bridge(plan, i),
        Target::Nemo => others::nemo(plan, i),
        Target::Verl => others::verl(plan, i),
        Target::Rlinf => others::rlinf(plan, i),
        Target::Torchtitan => others::torchtitan(plan, i),
        Target::ScaleTorch => {
            let (args, env) = scaletorch::args(plan, i)?;
            launch::torchrun(plan, i, &launch::Program::ScaleTorch { args, env }).map_err(refuse)
        }
        Target::Torchrun => launch::torchrun(plan, i, &megatron()?).map_err(refuse),
        Target::TorchrunExec => launch::torchrun(plan, i, &exec()).map_err(refuse),
        Target::Slurm => launch::slurm(plan, i, &megatron()?).map_err(refuse),
        Target::SlurmExec => launch::slurm(plan, i, &exec()).map_err(refuse),
        Target::RankMap => {
            rankmap::build(plan, i, &plan.rank_order, target).map(|m| rankmap::table(&m))
        }
        Target::RankMapJson => {
            rankmap::build(plan, i, &plan.rank_order, target).map(|m| rankmap::json(&m))
        }
    }
}
