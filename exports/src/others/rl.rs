//! verl and RLinf: their Megatron (and verl's FSDP) backends' configuration.

use std::fmt::Write;

use sextant_planner::config::{Layout, ParallelConfig, Precision, Recompute, Zero};
use sextant_planner::cost::LossKernel;
use sextant_planner::plan::PlanFile;

use crate::megatron::moe_token_fields;
use crate::quote;
use crate::{ExportError, Reason, Target};

use super::{cannot, describe_layout, layout_fields, mtp_value, recompute_fields, vpp_value};

/// What an RL framework's Megatron backend runs regardless of the plan: it asks the
/// model for logits and computes log-probabilities itself with Megatron-Core's
/// unfused `vocab_parallel_cross_entropy`, so only a plan priced with the unfused
/// loss is the run it launches; and it has no verified setting for TP or
/// expert-parallel communication overlap.
/// The FSDP backends compute log-probabilities with their own code, not
/// torchtitan's compiled loss.
fn compiled_loss_reason(framework: &str) -> String {
    format!("{framework}'s FSDP backend computes log-probabilities with its own code, not the torchtitan loss under torch.compile this plan priced (--loss compiled); re-plan with --loss unfused")
}

fn rl_backend_limits(
    plan: &PlanFile,
    cfg: &ParallelConfig,
    framework: &str,
    loss_path: &str,
) -> Result<(), Reason> {
    if plan.assumptions.loss != LossKernel::Unfused {
        return Err(format!(
            "{framework} computes log-probabilities itself with Megatron-Core's unfused vocab_parallel_cross_entropy ({loss_path}), not the {} loss kernel this plan priced; re-plan with --loss unfused",
            plan.assumptions.loss.name()
        ).into());
    }
    if cfg.overlap.tp_comm && cfg.tp > 1 {
        return Err(format!("{framework} has no verified setting that initialises TP communication overlap; re-plan without --tp-comm-overlap").into());
    }
    if cfg.megatron_ep_overlap(&plan.workload) {
        return Err(format!("{framework}'s training step does not run Megatron-Core's expert-parallel overlap schedule as planned; re-plan without --ep-comm-overlap").into());
    }
    Ok(())
}

/// verl: YAML fragment for `python -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer`
/// (verl/trainer/config/ppo_megatron_trainer.yaml; fields in
/// verl/workers/config/engine.py McoreEngineConfig and verl/workers/config/actor.py),
/// or for the FSDP backend (verl/trainer/config/engine/fsdp.yaml).
pub fn verl(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let t = Target::Verl;
    let cfg = &plan.plans[index].config;
    crate::megatron::megatron_schedule(cfg, "verl's Megatron backend").map_err(|r| cannot(t, r))?;
    let w = &plan.workload;
    if w.precision.is_fp8() {
        return Err(cannot(t, "verl has no confirmed FP8 training setting (only free-form override_transformer_config); re-plan with --precision bf16"));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# verl 0.8 actor settings for plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&plan.model.name),
        plan.gpus
    );
    let _ = writeln!(s, "# Apply the same block to actor_rollout_ref.ref and critic if they train with the same layout.");
    let _ = writeln!(s, "# Batches in verl count prompts: choose data.train_batch_size and actor_rollout_ref.actor.ppo_mini_batch_size");
    let _ = writeln!(
        s,
        "# so that prompts x rollout.n equals the plan's global batch of {} sequences.",
        w.global_batch
    );
    let fsdp = cfg.zero == Zero::Zero3 || cfg.zero == Zero::Zero2;
    if fsdp && plan.assumptions.loss == LossKernel::Compiled {
        return Err(cannot(t, compiled_loss_reason("verl")));
    }
    if fsdp {
        // FSDP backend: DP (and Ulysses SP) only.
        if cfg.tp > 1 || cfg.pp > 1 || cfg.ep > 1 {
            return Err(cannot(t, format!("verl's FSDP backend has no tensor, pipeline or expert parallelism (plan has TP {} PP {} EP {}); re-plan with --zero 0,1 for the Megatron backend", cfg.tp, cfg.pp, cfg.ep)));
        }
        if cfg.zero == Zero::Zero2 {
            return Err(cannot(
                t,
                "verl's FSDP backend shards parameters too (ZeRO-3); it has no ZeRO-2 setting",
            ));
        }
        let _ = writeln!(s, "actor_rollout_ref:\n  actor:\n    strategy: fsdp2");
        let _ = writeln!(s, "    ppo_micro_batch_size_per_gpu: {}", cfg.mbs);
        let _ = writeln!(s, "    fsdp_config:\n      fsdp_size: {}", cfg.dp * cfg.cp);
        // Ulysses sequence parallelism stands in for CP on this backend.
        let _ = writeln!(s, "      ulysses_sequence_parallel_size: {}", cfg.cp);
        let _ = writeln!(
            s,
            "  model:\n    enable_gradient_checkpointing: {}",
            cfg.recompute != Recompute::None
        );
        return Ok(s);
    }
    rl_backend_limits(plan, cfg, "verl", "verl/utils/megatron/tensor_parallel.py")
        .map_err(|r| cannot(t, r))?;
    // verl's Megatron bridge turns sequence parallelism on wherever TP > 1
    // (`RlFramework::restrict`): the key below would not turn it off.
    if cfg.tp > 1 && !cfg.sp {
        return Err(cannot(t, "verl's Megatron backend runs sequence parallelism whenever TP > 1 (mbridge mbridge/core/llm_bridge.py:78 at 10cb17f, \"sequence_parallel\": tp_size > 1); this plan has TP without SP: re-plan without --sp false"));
    }
    let _ = writeln!(s, "actor_rollout_ref:\n  actor:\n    strategy: megatron");
    let _ = writeln!(s, "    ppo_micro_batch_size_per_gpu: {}", cfg.mbs);
    let _ = writeln!(s, "    megatron:");
    let kv = |s: &mut String, k: &str, v: String| {
        let _ = writeln!(s, "      {k}: {v}");
    };
    kv(&mut s, "tensor_model_parallel_size", cfg.tp.to_string());
    kv(&mut s, "pipeline_model_parallel_size", cfg.pp.to_string());
    kv(
        &mut s,
        "virtual_pipeline_model_parallel_size",
        vpp_value(cfg),
    );
    kv(&mut s, "context_parallel_size", cfg.cp.to_string());
    kv(&mut s, "sequence_parallel", cfg.sp.to_string());
    if plan.model.moe.is_some() {
        kv(&mut s, "expert_model_parallel_size", cfg.ep.to_string());
        kv(&mut s, "expert_tensor_parallel_size", cfg.etp.to_string());
    }
    kv(
        &mut s,
        "use_distributed_optimizer",
        (cfg.zero == Zero::DistOpt).to_string(),
    );
    kv(
        &mut s,
        "dtype",
        if w.precision == Precision::Fp16 {
            "float16"
        } else {
            "bfloat16"
        }
        .into(),
    );
    // override_transformer_config passes Megatron-Core TransformerConfig fields.
    let mut over = recompute_fields(cfg);
    over.extend(layout_fields(plan, cfg).map_err(|r| cannot(t, r))?);
    if plan.model.mtp_layers > 0 {
        over.push(("mtp_num_layers", mtp_value(plan)));
    }
    over.extend(
        moe_token_fields(plan, cfg)
            .into_iter()
            .map(|(k, v)| (k, v.yaml())),
    );
    // verl looks attention_backend up by member name (AttnBackend[...] in
    // verl/utils/megatron_utils.py); its own default is flash.
    if !plan.assumptions.flash_attention {
        over.push(("attention_backend", "unfused".into()));
    }
    if !over.is_empty() {
        let _ = writeln!(s, "      override_transformer_config:");
        for (k, v) in over {
            let _ = writeln!(s, "        {k}: {v}");
        }
    }
    // Megatron-Core DistributedDataParallelConfig fields; verl's defaults differ by
    // path (verl/utils/megatron_utils.py), so the plan's are stated. The
    // parameter-gather hook reads the optimizer config's copy of the flag.
    let gather = cfg.overlap.param_gather && cfg.zero == Zero::DistOpt;
    let _ = writeln!(s, "      override_ddp_config:");
    let _ = writeln!(s, "        grad_reduce_in_fp32: {}", !cfg.bf16_grads);
    let _ = writeln!(
        s,
        "        overlap_grad_reduce: {}",
        cfg.overlap.grad_reduce
    );
    let _ = writeln!(s, "        overlap_param_gather: {gather}");
    let _ = writeln!(
        s,
        "    optim:\n      override_optimizer_config:\n        overlap_param_gather: {gather}"
    );
    Ok(s)
}

/// RLinf: YAML fragment of the actor (keys read in rlinf/config.py and
/// rlinf/utils/initialize.py; examples in examples/reasoning/config/math/*-megatron.yaml).
pub fn rlinf(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let t = Target::Rlinf;
    let cfg = &plan.plans[index].config;
    crate::megatron::megatron_schedule(cfg, "RLinf's Megatron backend")
        .map_err(|r| cannot(t, r))?;
    let w = &plan.workload;
    if plan.model.mtp_layers > 0 {
        return Err(cannot(t, "RLinf's actor configuration names no multi-token-prediction setting; re-plan with --mtp-layers 0"));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# RLinf 0.4 actor settings for plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&plan.model.name),
        plan.gpus
    );
    let _ = writeln!(s, "# For RL reasoning tasks RLinf derives actor.micro_batch_size from algorithm.training_batch_size_per_gpu");
    let _ = writeln!(s, "# and actor.global_batch_size from data.rollout_batch_size x algorithm.group_size / algorithm.n_minibatches.");
    if matches!(cfg.zero, Zero::Zero2 | Zero::Zero3) {
        if plan.assumptions.loss == LossKernel::Compiled {
            return Err(cannot(t, compiled_loss_reason("RLinf")));
        }
        if cfg.tp > 1 || cfg.pp > 1 || cfg.cp > 1 || cfg.ep > 1 {
            return Err(cannot(t, "RLinf's FSDP backend has no tensor, pipeline, context or expert parallelism; re-plan with --zero 0,1"));
        }
        let _ = writeln!(
            s,
            "actor:\n  training_backend: fsdp\n  micro_batch_size: {}\n  global_batch_size: {}",
            cfg.mbs, w.global_batch
        );
        let _ = writeln!(
            s,
            "  fsdp_config:\n    strategy: fsdp2\n    sharding_strategy: {}",
            if cfg.zero == Zero::Zero3 {
                "full_shard"
            } else {
                "shard_grad_op"
            }
        );
        let _ = writeln!(
            s,
            "    gradient_checkpointing: {}",
            cfg.recompute != Recompute::None
        );
        return Ok(s);
    }
    rl_backend_limits(plan, cfg, "RLinf", "rlinf/utils/distributed.py")
        .map_err(|r| cannot(t, r))?;
    // RLinf copies actor.model keys into TransformerConfig as they are
    // (build_transformer_config in rlinf/config.py), so an enum cannot be named.
    if !plan.assumptions.flash_attention {
        return Err(cannot(t, "RLinf passes attention_backend to Megatron-Core as a plain string, which selects no backend; re-plan without --no-flash-attention"));
    }
    let _ = writeln!(s, "runner:\n  seq_length: {}", w.seq);
    let _ = writeln!(
        s,
        "actor:\n  training_backend: megatron\n  micro_batch_size: {}\n  global_batch_size: {}",
        cfg.mbs, w.global_batch
    );
    let _ = writeln!(s, "  model:");
    let kv = |s: &mut String, k: &str, v: String| {
        let _ = writeln!(s, "    {k}: {v}");
    };
    // RLinf converts the Hugging Face checkpoint into even pipeline stages and
    // writes no virtual-pipeline chunks (convert_middle_file_to_mg.py:102-103
    // raises for its `vpp` schedule; rlinf/config.py:1604-1608 asserts
    // num_layers % PP), and its resharding assumes equal stages
    // (rlinf/utils/resharding/mcore_weight_reshard.py:186).
    if cfg.vpp > 1 {
        return Err(cannot(t, format!("RLinf's checkpoint converter writes no virtual-pipeline chunks (VPP {}); re-plan with --target rlinf (VPP 1)", cfg.vpp)));
    }
    if cfg.layout != Layout::Even || !plan.model.layers.is_multiple_of(cfg.pp) {
        return Err(cannot(t, format!("RLinf splits the {} layers evenly over the pipeline stages only; this plan uses {}; re-plan with --target rlinf", plan.model.layers, describe_layout(plan, cfg))));
    }
    kv(&mut s, "tensor_model_parallel_size", cfg.tp.to_string());
    kv(&mut s, "pipeline_model_parallel_size", cfg.pp.to_string());
    kv(
        &mut s,
        "virtual_pipeline_model_parallel_size",
        vpp_value(cfg),
    );
    kv(&mut s, "context_parallel_size", cfg.cp.to_string());
    kv(&mut s, "sequence_parallel", cfg.sp.to_string());
    if plan.model.moe.is_some() {
        if cfg.etp > cfg.tp {
            return Err(cannot(
                t,
                format!("RLinf requires expert TP ({}) <= TP ({})", cfg.etp, cfg.tp),
            ));
        }
        kv(&mut s, "expert_model_parallel_size", cfg.ep.to_string());
        kv(&mut s, "expert_tensor_parallel_size", cfg.etp.to_string());
        for (k, v) in moe_token_fields(plan, cfg) {
            kv(&mut s, k, v.yaml());
        }
    }
    for (k, v) in recompute_fields(cfg) {
        kv(&mut s, k, v);
    }
    match w.precision {
        Precision::Bf16 | Precision::Fp16 => kv(&mut s, "precision", w.precision.to_string()),
        Precision::Fp8 => {
            kv(&mut s, "precision", "bf16".into());
            kv(&mut s, "fp8", "true".into());
            kv(&mut s, "fp8_hybrid", "true".into());
        }
        Precision::Mxfp8 => {
            return Err(cannot(
                t,
                "RLinf has no MXFP8 setting (fp8 there means per-tensor scaling)",
            ))
        }
    }
    // grad_reduce_in_fp32 is fixed on in RLinf.
    if cfg.bf16_grads {
        return Err(cannot(
            t,
            "RLinf always reduces gradients in FP32; re-plan without --bf16-grads",
        ));
    }
    let _ = writeln!(s, "  optim:");
    // Megatron's optimizer takes its precision from these, which RLinf fills from
    // the model's only where unset (rlinf/config.py:823-830): an example's fp16
    // would otherwise stand beside BF16 parameters.
    let _ = writeln!(
        s,
        "    bf16: {}\n    fp16: {}",
        w.precision != Precision::Fp16,
        w.precision == Precision::Fp16
    );
    let _ = writeln!(
        s,
        "    use_distributed_optimizer: {}",
        cfg.zero == Zero::DistOpt
    );
    let _ = writeln!(s, "    overlap_grad_reduce: {}", cfg.overlap.grad_reduce);
    let _ = writeln!(
        s,
        "    overlap_param_gather: {}",
        cfg.overlap.param_gather && cfg.zero == Zero::DistOpt
    );
    Ok(s)
}
