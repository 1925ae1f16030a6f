//! Full verl and RLinf configurations of an RL plan ([`sextant_planner::rl`]): the
//! actor's Megatron section (written by [`crate::others`], so what an actor-only
//! export refuses is refused here too), the rollout engine, the reference, critic
//! and reward sections, the batch sizes and the placement.
//!
//! Every key written is in the key table of docs/rl.md with the framework file and
//! line that defines it, at the commits [`VERL_COMMIT`] and [`RLINF_COMMIT`]
//! (`tests/it/rl.rs` requires it; `tools/rl_keys_check.py` re-checks the table
//! against a fresh checkout). verl's keys are those of
//! verl/trainer/config/_generated_ppo_megatron_trainer.yaml (separate pools:
//! verl/experimental/one_step_off_policy/config/one_step_off_ppo_megatron_trainer.yaml);
//! RLinf's those of examples/reasoning/config/math/*-megatron*.yaml and
//! rlinf/config.py.

use std::fmt::Write;

use sextant_planner::hardware::HardwareProfile;
use sextant_planner::plan::PlanFile;
use sextant_planner::rl::phases::{assumptions, train_workload};
use sextant_planner::rl::search::PlacementKind;
use sextant_planner::rl::{Algorithm, RlPlan, RlWorkload};

use crate::quote;
use crate::{export, ExportError, LaunchOptions, Target};

/// verl commit whose configuration the verl keys were read from (2026-01-29).
pub const VERL_COMMIT: &str = "b178a3cd56f58b2d502255daba591e92833930a7";
/// RLinf commit whose configuration the RLinf keys were read from (2026-08-22).
pub const RLINF_COMMIT: &str = "a3816b596478dcd8a5c69a6ec1468c9519f77b5b";

/// What an RL export reads: the plan, its workload and the hardware it was priced on.
pub struct RlExport<'a> {
    pub plan: &'a RlPlan,
    pub workload: &'a RlWorkload,
    pub hardware: &'a HardwareProfile,
}

fn cannot(target: Target, reason: impl Into<String>) -> ExportError {
    ExportError::Inexpressible {
        target,
        reason: reason.into(),
    }
}

/// The actor's layout as a one-plan file, for the actor-only exporters.
fn actor_plan(x: &RlExport) -> PlanFile {
    let side = &x.plan.train;
    PlanFile::new(
        x.workload.actor.clone(),
        x.hardware.clone(),
        x.plan.placement.train_gpus,
        train_workload(x.workload),
        assumptions(),
        None,
        vec![(side.config.clone(), side.estimate.clone())],
    )
}

/// The actor-only export's YAML without its comment lines.
fn actor_block(x: &RlExport, target: Target) -> Result<Vec<String>, ExportError> {
    let text = export(&actor_plan(x), 1, target, &LaunchOptions::default())?;
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(str::to_string)
        .collect())
}

/// Inserts `extra` after the first line equal to `after`.
fn insert_after(
    lines: &mut Vec<String>,
    after: &str,
    extra: Vec<String>,
    t: Target,
) -> Result<(), ExportError> {
    let Some(i) = lines.iter().position(|l| l == after) else {
        return Err(cannot(
            t,
            format!("the actor block has no '{}' (the RL export writes the Megatron backend only; re-plan with --zero 0,1)", after.trim()),
        ));
    };
    for (k, l) in extra.into_iter().enumerate() {
        lines.insert(i + 1 + k, l);
    }
    Ok(())
}

fn header(s: &mut String, x: &RlExport, framework: &str, commit: &str) {
    let p = x.plan;
    let _ = writeln!(
        s,
        "# {framework} RL configuration (keys read at commit {commit}) for {}: {} placement,",
        quote::comment(&x.workload.actor.name),
        p.placement.kind.name()
    );
    let _ = writeln!(
        s,
        "# {} training GPUs, {} rollout GPUs; predicted iteration {:.1} s (rollout {:.1}, reshard {:.1}, forward passes {:.1}, training {:.1}).",
        p.placement.train_gpus,
        p.placement.rollout_gpus,
        p.times.iteration,
        p.times.rollout,
        p.times.reshard,
        p.times.forward,
        p.times.training
    );
}

fn fraction(f: f64) -> String {
    format!("{:.2}", (f * 100.0).floor() / 100.0)
}

/// verl: `python -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer` with
/// this file's keys as overrides (colocated), or verl's separate-pool recipe
/// `verl.experimental.one_step_off_policy.main_ppo` (disaggregated), which runs one
/// step off-policy.
pub fn verl(x: &RlExport) -> Result<String, ExportError> {
    let t = Target::Verl;
    let p = x.plan;
    let w = x.workload;
    let colocated = p.placement.kind == PlacementKind::Colocated;
    let per_node = x.hardware.node.gpus_per_node;
    let cfg = &p.train.config;
    if !w.prompts.is_multiple_of(w.mini_batches) {
        return Err(cannot(
            t,
            format!(
                "verl counts mini-batches in prompts: {} prompts do not split into {} mini-batches",
                w.prompts, w.mini_batches
            ),
        ));
    }
    let mut lines = actor_block(x, t)?;
    insert_after(
        &mut lines,
        "    megatron:",
        vec![
            format!("      param_offload: {}", colocated && p.offload_params),
            format!("      grad_offload: {colocated}"),
            format!("      optimizer_offload: {colocated}"),
        ],
        t,
    )?;
    insert_after(
        &mut lines,
        "  actor:",
        vec![
            format!("    ppo_mini_batch_size: {}", w.prompts / w.mini_batches),
            format!("    ppo_epochs: {}", w.epochs),
            format!("    use_kl_loss: {}", w.reference),
        ],
        t,
    )?;
    // The actor block states ppo_micro_batch_size_per_gpu itself.
    let mut s = String::new();
    header(&mut s, x, "verl", VERL_COMMIT);
    if !colocated {
        let _ = writeln!(s, "# Separate pools: run verl.experimental.one_step_off_policy.main_ppo --config-name one_step_off_ppo_megatron_trainer;");
        let _ = writeln!(s, "# verl's separate-pool trainer generates one step ahead (off-policy by one step), which the plan's overlap bounds.");
    }
    let _ = writeln!(
        s,
        "data:\n  train_batch_size: {}\n  max_prompt_length: {}\n  max_response_length: {}",
        w.prompts, w.lengths.prompt_max, w.lengths.response_max
    );
    for l in &lines {
        let _ = writeln!(s, "{l}");
    }
    if colocated {
        let _ = writeln!(s, "  hybrid_engine: true");
    }
    let r = &p.rollout;
    let _ = writeln!(
        s,
        "  rollout:\n    name: vllm\n    n: {}",
        w.responses_per_prompt
    );
    let _ = writeln!(s, "    tensor_model_parallel_size: {}", r.layout.tp);
    let _ = writeln!(
        s,
        "    gpu_memory_utilization: {}",
        fraction(p.memory_fraction)
    );
    let _ = writeln!(s, "    max_num_seqs: {}", r.concurrent);
    let _ = writeln!(s, "    free_cache_engine: {colocated}");
    let _ = writeln!(s, "    enable_prefix_caching: true");
    let _ = writeln!(
        s,
        "    log_prob_micro_batch_size_per_gpu: {}",
        p.train.logprob_mbs
    );
    let _ = writeln!(
        s,
        "  ref:\n    log_prob_micro_batch_size_per_gpu: {}",
        p.train.logprob_mbs
    );
    if w.critic.is_some() {
        let _ = writeln!(
            s,
            "critic:\n  strategy: megatron\n  ppo_micro_batch_size_per_gpu: {}",
            cfg.mbs
        );
        let _ = writeln!(
            s,
            "  megatron:\n    tensor_model_parallel_size: {}\n    pipeline_model_parallel_size: {}",
            cfg.tp, cfg.pp
        );
    }
    if w.reward.is_some() {
        let _ = writeln!(
            s,
            "reward_model:\n  enable: true\n  micro_batch_size_per_gpu: {}",
            p.train.logprob_mbs
        );
    }
    let adv = match w.algorithm {
        Algorithm::Grpo => "grpo",
        Algorithm::Ppo => "gae",
    };
    let _ = writeln!(s, "algorithm:\n  adv_estimator: {adv}");
    let nodes = |g: u64| (g / per_node).max(1);
    let gpn = |g: u64| g.min(per_node);
    let _ = writeln!(
        s,
        "trainer:\n  nnodes: {}\n  n_gpus_per_node: {}",
        nodes(p.placement.train_gpus),
        gpn(p.placement.train_gpus)
    );
    if !colocated {
        let _ = writeln!(
            s,
            "rollout:\n  nnodes: {}\n  n_gpus_per_node: {}",
            nodes(p.placement.rollout_gpus),
            gpn(p.placement.rollout_gpus)
        );
    }
    Ok(s)
}

/// RLinf: `examples/reasoning/main_grpo.py` with this file merged over a model's
/// example (e.g. examples/reasoning/config/math/qwen2.5-7b-grpo-megatron.yaml).
pub fn rlinf(x: &RlExport) -> Result<String, ExportError> {
    let t = Target::Rlinf;
    let p = x.plan;
    let w = x.workload;
    let colocated = p.placement.kind == PlacementKind::Colocated;
    let cfg = &p.train.config;
    let per_node = x.hardware.node.gpus_per_node;
    let mut lines = actor_block(x, t)?;
    // RLinf's runner.seq_length is the longest sequence (max_new_tokens is it less
    // the prompt), not the mean the actor block was priced at.
    let longest = w.lengths.prompt_max + w.lengths.response_max;
    for l in lines.iter_mut() {
        if l.starts_with("  seq_length: ") {
            *l = format!("  seq_length: {longest}");
        }
    }
    insert_after(
        &mut lines,
        "actor:",
        vec![
            format!("  offload_optimizer: {colocated}"),
            format!("  offload_weight: {}", colocated && p.offload_params),
            format!("  offload_grad: {colocated}"),
        ],
        t,
    )?;
    let mut s = String::new();
    header(&mut s, x, "RLinf", RLINF_COMMIT);
    let critic = if w.critic.is_some() { "critic," } else { "" };
    let gpus = p.placement.gpus();
    let _ = writeln!(
        s,
        "cluster:\n  num_nodes: {}\n  component_placement:",
        (gpus / per_node).max(1)
    );
    if colocated {
        let _ = writeln!(s, "    actor,{critic}rollout,reward: all");
    } else {
        let r = p.placement.rollout_gpus;
        let _ = writeln!(s, "    rollout,reward: 0-{}", r - 1);
        let _ = writeln!(s, "    actor,{critic}inference: {}-{}", r, gpus - 1);
    }
    let adv = match w.algorithm {
        Algorithm::Grpo => "grpo",
        Algorithm::Ppo => "gae",
    };
    let _ = writeln!(s, "algorithm:\n  group_size: {}", w.responses_per_prompt);
    let _ = writeln!(s, "  n_minibatches: {}", w.mini_batches);
    let _ = writeln!(s, "  training_batch_size_per_gpu: {}", cfg.mbs);
    let _ = writeln!(
        s,
        "  logprob_forward_micro_batch_size: {}",
        p.train.logprob_mbs
    );
    let _ = writeln!(s, "  recompute_logprobs: true\n  adv_type: {adv}");
    let _ = writeln!(
        s,
        "data:\n  max_prompt_length: {}\n  rollout_batch_size: {}",
        w.lengths.prompt_max, w.prompts
    );
    let _ = writeln!(s, "rollout:\n  rollout_backend: vllm");
    let _ = writeln!(s, "  tensor_parallel_size: {}", p.rollout.layout.tp);
    let _ = writeln!(
        s,
        "  gpu_memory_utilization: {}",
        fraction(p.memory_fraction)
    );
    let _ = writeln!(s, "  max_running_requests: {}", p.rollout.concurrent);
    if !colocated {
        let _ = writeln!(s, "inference:\n  model:\n    tensor_model_parallel_size: {}\n    pipeline_model_parallel_size: {}", cfg.tp, cfg.pp);
    }
    if w.critic.is_some() {
        let _ = writeln!(
            s,
            "critic:\n  use_critic_model: true\n  training_backend: megatron"
        );
        let _ = writeln!(
            s,
            "  model:\n    tensor_model_parallel_size: {}\n    pipeline_model_parallel_size: {}",
            cfg.tp, cfg.pp
        );
    }
    for l in &lines {
        let _ = writeln!(s, "{l}");
    }
    Ok(s)
}
