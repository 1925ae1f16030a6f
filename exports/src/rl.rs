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

pub use sextant_planner::rl::constants::{RLINF_COMMIT, VERL_COMMIT};

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

/// A micro-batch's token budget as both frameworks state it: per rank of the
/// context-parallel group (they multiply it by the CP size: verl
/// verl/workers/actor/megatron_actor.py:223, RLinf rlinf/utils/data_iter_utils.py:683).
fn per_gpu_tokens(tokens: u64, cp: u64) -> u64 {
    tokens.div_ceil(cp.max(1))
}

fn fraction(f: f64) -> String {
    format!("{:.2}", (f * 100.0).floor() / 100.0)
}

/// The lines of the actor block's `megatron:` section (verl), indented by
/// `indent` spaces instead of the actor's six, for a model trained on the same
/// layout (the critic).
fn reindented_section(lines: &[String], head: &str, from: usize, to: usize) -> Vec<String> {
    let Some(i) = lines.iter().position(|l| l == head) else {
        return Vec::new();
    };
    let pad = " ".repeat(from);
    lines[i + 1..]
        .iter()
        .take_while(|l| l.starts_with(&pad))
        .map(|l| format!("{}{}", " ".repeat(to), &l[from..]))
        .collect()
}

/// verl: a Hydra config that composes verl's own `ppo_megatron_trainer` (or, with
/// separate pools, `one_step_off_ppo_megatron_trainer`) and sets what the plan
/// priced over it.
pub fn verl(x: &RlExport) -> Result<String, ExportError> {
    let t = Target::Verl;
    let p = x.plan;
    let w = x.workload;
    let colocated = p.placement.kind == PlacementKind::Colocated;
    let per_node = x.hardware.node.gpus_per_node;
    let cfg = &p.train.config;
    let per_gpu = |tokens: u64| per_gpu_tokens(tokens, cfg.cp);
    sextant_planner::rl::RlFramework::Verl
        .check(w)
        .map_err(|e| cannot(t, e.to_string()))?;
    let mut lines = actor_block(x, t)?;
    let megatron_section = reindented_section(&lines, "    megatron:", 6, 4);
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
            // Micro-batches by tokens: the budget the plan's memory was priced at.
            "    use_dynamic_bsz: true".to_string(),
            format!(
                "    ppo_max_token_len_per_gpu: {}",
                per_gpu(p.train.train_tokens)
            ),
        ],
        t,
    )?;
    let longest = w.lengths.prompt_max + w.lengths.response_max;
    let mut s = String::new();
    header(&mut s, x, "verl", VERL_COMMIT);
    let (dir, module) = if colocated {
        ("verl/trainer/config", "verl.trainer.main_ppo")
    } else {
        (
            "verl/experimental/one_step_off_policy/config",
            "verl.experimental.one_step_off_policy.main_ppo",
        )
    };
    let _ = writeln!(
        s,
        "# Run: save as {dir}/sextant_plan.yaml in a verl checkout at that commit and run, from its root,"
    );
    let _ = writeln!(s, "#   python -m {module} --config-name sextant_plan");
    let _ = writeln!(
        s,
        "# then give the checkpoint paths marked ??? (Hydra will not start without them) and your data files."
    );
    if p.rollout.layout.tp > per_node {
        // verl/workers/rollout/vllm_rollout/vllm_async_server.py:717-721.
        let _ = writeln!(
            s,
            "# The engines' TP {} spans nodes: verl asserts vLLM >= 0.11.1 for that.",
            p.rollout.layout.tp
        );
    }
    if !colocated {
        // What one_step_off_ppo_megatron_trainer.yaml sets over ppo_megatron_trainer
        // (Hydra takes a search path from the primary config only, so it is
        // restated here rather than composed).
        let _ = writeln!(s, "# Separate pools: verl's one-step-off trainer generates one step ahead and takes the old");
        let _ = writeln!(
            s,
            "# log-probabilities from the engine (rollout_correction.bypass_mode), as priced."
        );
        let _ = writeln!(s, "hydra:\n  searchpath:\n    - file://verl/trainer/config");
    }
    let _ = writeln!(s, "defaults:\n  - ppo_megatron_trainer\n  - _self_");
    let _ = writeln!(
        s,
        "data:\n  train_batch_size: {}\n  max_prompt_length: {}\n  max_response_length: {}",
        w.prompts, w.lengths.prompt_max, w.lengths.response_max
    );
    let mut model = vec![
        "  model:".to_string(),
        format!("    path: ???  # {}", quote::comment(&w.actor.name)),
    ];
    if w.actor.mtp_layers > 0 {
        // verl builds the MTP block but trains it only with both switches
        // (verl/models/mcore/model_forward.py:75, model/hf_model.yaml).
        model.push("    mtp:\n      enable: true\n      enable_train: true".to_string());
    }
    insert_after(&mut lines, "actor_rollout_ref:", model, t)?;
    for l in &lines {
        let _ = writeln!(s, "{l}");
    }
    let _ = writeln!(s, "  hybrid_engine: {colocated}");
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
    // vLLM refuses a token budget per step below its sequences per step.
    let _ = writeln!(s, "    max_num_batched_tokens: {}", r.concurrent.max(8192));
    // The KV cache was checked for the longest sequence, not the model's context.
    let _ = writeln!(s, "    max_model_len: {longest}");
    let _ = writeln!(s, "    free_cache_engine: {colocated}");
    if !colocated {
        let _ = writeln!(s, "    calculate_log_probs: true");
    }
    let _ = writeln!(s, "    enable_prefix_caching: true");
    let logprob = |s: &mut String, indent: &str| {
        let _ = writeln!(
            s,
            "{indent}log_prob_micro_batch_size_per_gpu: {}\n{indent}log_prob_use_dynamic_bsz: true\n{indent}log_prob_max_token_len_per_gpu: {}",
            p.train.logprob_mbs,
            per_gpu(p.train.logprob_tokens)
        );
    };
    logprob(&mut s, "    ");
    let _ = writeln!(s, "  ref:");
    logprob(&mut s, "    ");
    if w.critic.is_some() {
        let _ = writeln!(
            s,
            "critic:\n  strategy: megatron\n  ppo_micro_batch_size_per_gpu: {}",
            cfg.mbs
        );
        let _ = writeln!(
            s,
            "  use_dynamic_bsz: true\n  ppo_max_token_len_per_gpu: {}\n  forward_max_token_len_per_gpu: {}",
            per_gpu(p.train.train_tokens),
            per_gpu(p.train.logprob_tokens)
        );
        let _ = writeln!(
            s,
            "  model:\n    path: ???  # {}",
            quote::comment(w.critic.as_ref().map_or("", |m| m.name.as_str()))
        );
        // The critic trains on the actor's layout, its state offloaded between its
        // own passes (in either placement), as priced.
        let _ = writeln!(s, "  megatron:");
        for k in ["param_offload", "grad_offload", "optimizer_offload"] {
            let _ = writeln!(s, "    {k}: true");
        }
        for l in &megatron_section {
            let _ = writeln!(s, "{l}");
        }
    }
    if w.reward.is_some() {
        // The Megatron forward on the actor's layout that was priced, not verl's
        // default reward loop (a vLLM server, reward_model.use_reward_loop).
        // Its forward runs on the actor's groups, so it states the actor's layout
        // and the log-probability pass's token budget (per CP rank, which the
        // reward worker multiplies by its own CP: reward_model.py:143-156).
        let _ = writeln!(
            s,
            "reward_model:\n  enable: true\n  use_reward_loop: false\n  strategy: megatron\n  micro_batch_size_per_gpu: {}",
            p.train.logprob_mbs
        );
        let _ = writeln!(
            s,
            "  use_dynamic_bsz: true\n  forward_max_token_len_per_gpu: {}",
            per_gpu(p.train.logprob_tokens)
        );
        let _ = writeln!(
            s,
            "  model:\n    path: ???  # {}",
            quote::comment(w.reward.as_ref().map_or("", |m| m.name.as_str()))
        );
        let _ = writeln!(
            s,
            "  megatron:\n    param_offload: true\n    tensor_model_parallel_size: {}\n    pipeline_model_parallel_size: {}\n    context_parallel_size: {}",
            cfg.tp, cfg.pp, cfg.cp
        );
    }
    let adv = match w.algorithm {
        Algorithm::Grpo => "grpo",
        Algorithm::Ppo => "gae",
    };
    let _ = writeln!(s, "algorithm:\n  adv_estimator: {adv}");
    if !colocated {
        let _ = writeln!(s, "  rollout_correction:\n    bypass_mode: true");
    }
    let nodes = |g: u64| g.div_ceil(per_node).max(1);
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

/// The RLinf example a plan's configuration overlays: the reasoning example of
/// the actor's architecture (PPO: the one PPO example), whose data, tokenizer,
/// reward and checkpoint settings it keeps.
fn rlinf_example(w: &RlWorkload, model_type: &str) -> &'static str {
    match (w.algorithm, model_type) {
        (Algorithm::Ppo, _) => "qwen2.5-1.5b-ppo-megatron",
        (_, "qwen3_moe") => "qwen3-30b-grpo-megatron",
        (_, "deepseek_v3") => "moonlight-16b-grpo-megatron",
        _ => "qwen2.5-7b-grpo-megatron",
    }
}

/// RLinf: a Hydra config that overlays one of RLinf's reasoning examples
/// ([`rlinf_example`]) with what the plan priced; colocated only (its separate
/// pools need a third, inference pool: [`sextant_planner::rl::RlFramework`]).
pub fn rlinf(x: &RlExport) -> Result<String, ExportError> {
    use sextant_planner::rl::RlFramework;
    let t = Target::Rlinf;
    let p = x.plan;
    let w = x.workload;
    if p.placement.kind != PlacementKind::Colocated {
        return Err(cannot(t, "RLinf's disaggregated mode runs the log-probability passes on a third GPU pool (inference) that this plan does not price; plan with --emit rlinf (colocated)"));
    }
    RlFramework::Rlinf
        .check(w)
        .map_err(|e| cannot(t, e.to_string()))?;
    let cfg = &p.train.config;
    if !cfg.tp.is_multiple_of(p.rollout.layout.tp) {
        return Err(cannot(t, format!("RLinf reshards the actor's TP {} into the engine's TP {}, which must divide it (rlinf/utils/resharding/reshard_config.py:77-82); plan with --emit rlinf", cfg.tp, p.rollout.layout.tp)));
    }
    let per_gpu = |tokens: u64| per_gpu_tokens(tokens, cfg.cp);
    let Some(model_type) = RlFramework::rlinf_model_type(&w.actor) else {
        return Err(cannot(
            t,
            "the actor's architecture has no RLinf model_type",
        ));
    };
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
    // Micro-batches by tokens: the budget the plan's memory was priced at.
    insert_after(
        &mut lines,
        "runner:",
        vec![
            "  enable_dynamic_batch_size: true".to_string(),
            format!("  max_tokens_per_mbs: {}", per_gpu(p.train.train_tokens)),
        ],
        t,
    )?;
    let model_section = reindented_section(&lines, "  model:", 4, 4);
    let optim_section = reindented_section(&lines, "  optim:", 4, 4);
    // The actor's checkpoint is converted by Megatron-Bridge from the Hugging Face
    // files (megatron_model_manager.py:211-217; as the moonlight example does),
    // not by RLinf's converter, whose entry the example names for its own model.
    insert_after(
        &mut lines,
        "actor:",
        vec![
            "  offload_optimizer: true".to_string(),
            format!("  offload_weight: {}", p.offload_params),
            "  offload_grad: true".to_string(),
            "  megatron:".to_string(),
            "    mbridge: true".to_string(),
        ],
        t,
    )?;
    let example = rlinf_example(w, model_type);
    let mut s = String::new();
    header(&mut s, x, "RLinf", RLINF_COMMIT);
    let _ = writeln!(s, "# Run: save as examples/reasoning/config/math/sextant-plan.yaml in an RLinf checkout at that commit and run,");
    let _ = writeln!(
        s,
        "#   bash examples/reasoning/run_main_grpo_math.sh sextant-plan"
    );
    let _ = writeln!(s, "# It overlays {example}.yaml, whose data, tokenizer, reward and checkpoint paths it keeps: set yours there.");
    let _ = writeln!(s, "defaults:\n  - {example}\n  - _self_");
    let critic = if w.critic.is_some() { "critic," } else { "" };
    let gpus = p.placement.gpus();
    let _ = writeln!(
        s,
        "cluster:\n  num_nodes: {}\n  component_placement:\n    actor,{critic}rollout,reward: 0-{}",
        gpus.div_ceil(per_node).max(1),
        gpus - 1
    );
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
    // RLinf runs the reference pass only with a KL coefficient above 0
    // (rlinf/runners/reasoning_runner.py:134-137).
    if w.reference {
        let _ = writeln!(s, "  kl_beta: 0.001  # > 0 runs the reference pass this plan priced; choose your coefficient");
    } else {
        let _ = writeln!(s, "  kl_beta: 0.0");
    }
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
    let _ = writeln!(s, "  model:\n    model_type: {model_type}");
    for l in &lines {
        let _ = writeln!(s, "{l}");
    }
    if w.critic.is_some() {
        // The critic trains on the actor's layout, offloaded while the engines
        // generate, as priced.
        let _ = writeln!(
            s,
            "critic:\n  use_critic_model: true\n  training_backend: megatron\n  offload_optimizer: true\n  offload_weight: true\n  offload_grad: true"
        );
        // The critic (a value head, which Megatron-Bridge's path does not build)
        // goes through RLinf's converter: its entry for the critic's shape.
        let entry = w
            .critic
            .as_ref()
            .and_then(RlFramework::rlinf_converter_entry)
            .ok_or_else(|| {
                cannot(
                    t,
                    "RLinf's checkpoint converter has no entry for the critic's shape",
                )
            })?;
        let _ = writeln!(
            s,
            "  megatron:\n    ckpt_convertor:\n      model: {}",
            quote::double_quoted(entry)
        );
        let _ = writeln!(s, "  model:");
        for l in &model_section {
            let _ = writeln!(s, "{l}");
        }
        let _ = writeln!(s, "  optim:");
        for l in &optim_section {
            let _ = writeln!(s, "{l}");
        }
    }
    Ok(s)
}
