//! Megatron-Bridge / NeMo 2.0, verl, RLinf and torchtitan.
//!
//! Every key below names the file of the framework that defines it. Versions read:
//! Megatron-Bridge 0.7.0, NeMo 2.0 (2025-09), verl 0.8.0.dev, RLinf 0.4.0,
//! torchtitan v0.2.2 ([`TORCHTITAN_VERSION`]: its last TOML-configured release;
//! commit 9810191 of 2026-02-23 replaced TOML with Python config).

use std::fmt::Write;

use sextant_planner::config::{
    Layout, ParallelConfig, Precision, Recompute, RecomputeModules, Zero,
};
use sextant_planner::cost::LossKernel;
use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::Schedule;

use crate::megatron::{moe_token_fields, pipeline_layout};
use crate::quote;
use crate::{ExportError, Target};

/// The torchtitan release whose TOML job config the torchtitan export writes: the
/// last before "Config System Refactor: TOML to Python Dataclass Registry"
/// (pytorch/torchtitan#2386, commit 9810191bb, 2026-02-23).
pub const TORCHTITAN_VERSION: &str =
    "torchtitan v0.2.2 (2026-02-20, commit 73a0e6979dd1), the last release configured by TOML";

/// A stage layout in words, for refusals: `Layout`'s own form is Rust syntax.
fn describe_layout(plan: &PlanFile, cfg: &ParallelConfig) -> String {
    match &cfg.layout {
        Layout::Even => "equal stages".into(),
        Layout::AccountEmbeddingLoss => "stages that count the embedding and loss as layers".into(),
        Layout::FirstLast { first, last } => {
            format!("{first} layers on the first stage and {last} on the last")
        }
        Layout::Explicit { .. } => match pipeline_layout(plan, cfg) {
            Ok(l) => format!("the explicit layout \"{l}\""),
            Err(_) => "an explicit per-stage layout".into(),
        },
    }
}

fn cannot(target: Target, reason: impl Into<String>) -> ExportError {
    ExportError::Inexpressible {
        target,
        reason: reason.into(),
    }
}

fn recompute_fields(cfg: &ParallelConfig) -> Vec<(&'static str, String)> {
    match cfg.recompute {
        Recompute::None => vec![],
        Recompute::Selective if cfg.recompute_modules != RecomputeModules::DEFAULT => {
            // No spaces: one Hydra override must stay one shell word.
            let names: Vec<String> = cfg
                .recompute_modules
                .names()
                .iter()
                .map(|n| format!("\"{n}\""))
                .collect();
            vec![
                ("recompute_granularity", "selective".into()),
                ("recompute_modules", format!("[{}]", names.join(","))),
            ]
        }
        Recompute::Selective => vec![("recompute_granularity", "selective".into())],
        Recompute::Full => vec![
            ("recompute_granularity", "full".into()),
            ("recompute_method", "uniform".into()),
            ("recompute_num_layers", "1".into()),
        ],
    }
}

/// Megatron-Core TransformerConfig fields that state the stage layout
/// (megatron/core/transformer/transformer_config.py).
fn layout_fields(
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Result<Vec<(&'static str, String)>, String> {
    Ok(match &cfg.layout {
        Layout::Even => vec![],
        Layout::AccountEmbeddingLoss => vec![
            ("account_for_embedding_in_pipeline_split", "true".into()),
            ("account_for_loss_in_pipeline_split", "true".into()),
        ],
        Layout::FirstLast { first, last } => vec![
            ("num_layers_in_first_pipeline_stage", first.to_string()),
            ("num_layers_in_last_pipeline_stage", last.to_string()),
        ],
        Layout::Explicit { .. } => vec![(
            "pipeline_model_parallel_layout",
            quote::double_quoted(&pipeline_layout(plan, cfg)?),
        )],
    })
}

/// TransformerConfig.mtp_num_layers: stated even when 0 (as null), because
/// recipes such as Megatron-Bridge's DeepSeek-V3 switch MTP on by default.
fn mtp_value(plan: &PlanFile) -> String {
    match plan.model.mtp_layers {
        0 => "null".into(),
        n => n.to_string(),
    }
}

fn vpp_value(cfg: &ParallelConfig) -> String {
    if cfg.vpp > 1 {
        cfg.vpp.to_string()
    } else {
        "null".into()
    }
}

/// Megatron-Bridge: Hydra-style overrides for `scripts/training/run_recipe.py`
/// (parsed by src/megatron/bridge/training/utils/omegaconf_utils.py) on a
/// `ConfigContainer` (src/megatron/bridge/training/config.py).
pub fn megatron_bridge(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let t = Target::MegatronBridge;
    let cfg = &plan.plans[index].config;
    crate::megatron::megatron_schedule(cfg, "Megatron-Bridge").map_err(|r| cannot(t, r))?;
    let w = &plan.workload;
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, v: String| lines.push((k.to_string(), v));
    // cfg.model is a GPTModelProvider (src/megatron/bridge/models/gpt_provider.py)
    // whose parallel fields are Megatron-Core's (megatron/core/model_parallel_config.py).
    put("model.tensor_model_parallel_size", cfg.tp.to_string());
    put("model.pipeline_model_parallel_size", cfg.pp.to_string());
    put("model.virtual_pipeline_model_parallel_size", vpp_value(cfg));
    put("model.context_parallel_size", cfg.cp.to_string());
    put("model.sequence_parallel", cfg.sp.to_string());
    if plan.model.moe.is_some() {
        put("model.expert_model_parallel_size", cfg.ep.to_string());
        put("model.expert_tensor_parallel_size", cfg.etp.to_string());
        // Megatron-Core TransformerConfig fields on the provider; Bridge recipes set
        // the flex backend and the capacity the same way.
        for (key, value) in moe_token_fields(plan, cfg) {
            put(&format!("model.{key}"), value.yaml());
        }
        if cfg.megatron_ep_overlap(w) {
            put(
                "comm_overlap.overlap_moe_expert_parallel_comm",
                "true".into(),
            );
            put("comm_overlap.delay_wgrad_compute", "true".into());
        }
    }
    // TransformerConfig.attention_backend is an enum that the override parser
    // (src/megatron/bridge/training/utils/omegaconf_utils.py) leaves a string; a
    // _target_ dict is instantiated there instead, and _call_: false returns the
    // member itself. Without it the recipe's backend (a fused kernel) runs.
    if !plan.assumptions.flash_attention {
        put(
            "model.attention_backend",
            "{_target_:megatron.core.transformer.enums.AttnBackend.unfused,_call_:false}".into(),
        );
    }
    for (k, v) in layout_fields(plan, cfg).map_err(|r| cannot(t, r))? {
        put(&format!("model.{k}"), v);
    }
    put("model.mtp_num_layers", mtp_value(plan));
    // The loss the plan priced (megatron/core/model_parallel_config.py fields; the
    // provider's default turns the fusion on).
    let (fusion, fusion_impl) = crate::megatron::loss_fields(plan.assumptions.loss);
    put("model.cross_entropy_loss_fusion", fusion.to_string());
    if let Some(i) = fusion_impl {
        put("model.cross_entropy_fusion_impl", i.into());
    }
    // megatron/core/transformer/transformer_config.py
    for (k, v) in recompute_fields(cfg) {
        put(&format!("model.{k}"), v);
    }
    // megatron/training/config/training_config.py (TrainingConfig)
    put("train.micro_batch_size", cfg.mbs.to_string());
    put("train.global_batch_size", w.global_batch.to_string());
    // GPTDatasetConfig in src/megatron/bridge/training/config.py owns the length;
    // a validator requires model.seq_length to match it.
    put("dataset.seq_length", w.seq.to_string());
    put("model.seq_length", w.seq.to_string());
    // megatron/core/distributed/distributed_data_parallel_config.py; the config
    // validator keeps ddp.* and optimizer.use_distributed_optimizer in sync.
    match cfg.zero {
        Zero::None => put("ddp.use_distributed_optimizer", "false".into()),
        Zero::DistOpt => put("ddp.use_distributed_optimizer", "true".into()),
        Zero::Zero2 | Zero::Zero3 => {
            put("ddp.use_megatron_fsdp", "true".into());
            put("dist.use_megatron_fsdp", "true".into());
            put(
                "ddp.data_parallel_sharding_strategy",
                if cfg.zero == Zero::Zero2 {
                    "optim_grads"
                } else {
                    "optim_grads_params"
                }
                .into(),
            );
        }
    }
    put(
        "ddp.overlap_grad_reduce",
        cfg.overlap.grad_reduce.to_string(),
    );
    put(
        "ddp.overlap_param_gather",
        cfg.overlap.param_gather.to_string(),
    );
    put("ddp.grad_reduce_in_fp32", (!cfg.bf16_grads).to_string());
    // Megatron-Core OptimizerConfig (megatron/core/optimizer/optimizer_config.py);
    // the override parser turns dtype names into torch dtypes (str_to_dtype in
    // src/megatron/bridge/utils/activation_map.py).
    if cfg.bf16_moments {
        put("optimizer.use_precision_aware_optimizer", "true".into());
        put("optimizer.exp_avg_dtype", "bf16".into());
        put("optimizer.exp_avg_sq_dtype", "bf16".into());
    }
    // Precision presets: src/megatron/bridge/training/mixed_precision.py.
    let preset = match w.precision {
        Precision::Bf16 => "bf16_mixed",
        Precision::Fp16 => "fp16_mixed",
        Precision::Fp8 => "bf16_with_fp8_delayed_scaling_mixed",
        Precision::Mxfp8 => "bf16_with_mxfp8_mixed",
    };
    put("mixed_precision", preset.into());
    // comm_overlap: CommOverlapConfig in src/megatron/bridge/training/comm_overlap.py.
    put(
        "comm_overlap.tp_comm_overlap",
        (cfg.overlap.tp_comm && cfg.tp > 1).to_string(),
    );
    if cfg.layout != Layout::Even && cfg.vpp > 1 && matches!(cfg.layout, Layout::FirstLast { .. }) {
        return Err(cannot(
            t,
            "first/last stage layer counts with virtual stages",
        ));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Megatron-Bridge 0.7 overrides for scripts/training/run_recipe.py --recipe <your recipe>"
    );
    let _ = writeln!(
        s,
        "# (ConfigContainer: src/megatron/bridge/training/config.py). Plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&plan.model.name),
        plan.gpus
    );
    for (k, v) in &lines {
        // One override, one shell word: quoted where the shell would expand
        // (braces, brackets) or strip (double quotes) a character.
        let word = quote::shell(&format!("{k}={v}")).map_err(|r| cannot(t, r))?;
        let _ = writeln!(s, "{word}");
    }
    Ok(s)
}

/// What an RL framework's Megatron backend runs regardless of the plan: it asks the
/// model for logits and computes log-probabilities itself with Megatron-Core's
/// unfused `vocab_parallel_cross_entropy`, so only a plan priced with the unfused
/// loss is the run it launches; and it has no verified setting for TP or
/// expert-parallel communication overlap.
fn rl_backend_limits(
    plan: &PlanFile,
    cfg: &ParallelConfig,
    framework: &str,
    loss_path: &str,
) -> Result<(), String> {
    if plan.assumptions.loss != LossKernel::Unfused {
        return Err(format!(
            "{framework} computes log-probabilities itself with Megatron-Core's unfused vocab_parallel_cross_entropy ({loss_path}), not the {} loss kernel this plan priced; re-plan with --loss unfused",
            plan.assumptions.loss.name()
        ));
    }
    if cfg.overlap.tp_comm && cfg.tp > 1 {
        return Err(format!("{framework} has no verified setting that initialises TP communication overlap; re-plan without --tp-comm-overlap"));
    }
    if cfg.megatron_ep_overlap(&plan.workload) {
        return Err(format!("{framework}'s training step does not run Megatron-Core's expert-parallel overlap schedule as planned; re-plan without --ep-comm-overlap"));
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
    match &cfg.layout {
        Layout::Even => {}
        Layout::FirstLast { first, last } => {
            kv(&mut s, "decoder_first_pipeline_num_layers", first.to_string());
            kv(&mut s, "decoder_last_pipeline_num_layers", last.to_string());
        }
        _ => return Err(cannot(t, format!("RLinf states uneven pipelines only as first/last stage layer counts; this plan uses {}", describe_layout(plan, cfg)))),
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

/// torchtitan: the TOML sections of `torchtitan/config/job_config.py` at
/// [`TORCHTITAN_VERSION`] (the last TOML-configured release).
pub fn torchtitan(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let t = Target::Torchtitan;
    let cfg = &plan.plans[index].config;
    let w = &plan.workload;
    if plan.model.mtp_layers > 0 {
        return Err(cannot(t, "torchtitan's models train no multi-token-prediction layers; re-plan with --mtp-layers 0"));
    }
    if cfg.tp > 1 && !cfg.sp {
        return Err(cannot(
            t,
            "torchtitan applies sequence parallelism whenever TP > 1; this plan has TP without SP",
        ));
    }
    if cfg.etp != 1 && cfg.etp != cfg.tp {
        return Err(cannot(t, format!("torchtitan's expert_tensor_parallel_degree must be 1 or equal to TP ({}); plan has {}", cfg.tp, cfg.etp)));
    }
    let (replicate, shard, reshard) = match cfg.zero {
        Zero::None => (cfg.dp, 1, None),
        Zero::DistOpt => return Err(cannot(t, "torchtitan has no optimizer-only sharding (ZeRO-1 / distributed optimizer); re-plan with --zero 0,2,3")),
        Zero::Zero2 => (1, cfg.dp, Some("never")),
        Zero::Zero3 => (1, cfg.dp, None),
    };
    // Schedule names: torch/distributed/pipelining/schedules.py (get_schedule_class).
    let schedule = match cfg.schedule {
        Schedule::OneFOneB => "1F1B",
        Schedule::Interleaved => "Interleaved1F1B",
        Schedule::Gpipe => "GPipe",
        other => {
            return Err(cannot(
                t,
                format!("torchtitan has no {other} schedule with one stage per rank (its ZBVZeroBubble and DualPipeV put two stages on each rank in a V); re-plan with --schedule 1f1b,interleaved,gpipe"),
            ))
        }
    };
    let layers = plan.model.layers;
    let per_stage = match &cfg.layout {
        Layout::Even => layers / (cfg.pp * cfg.vpp),
        _ => return Err(cannot(t, format!("torchtitan splits stages evenly by pipeline_parallel_layers_per_stage; this plan uses {}", describe_layout(plan, cfg)))),
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# torchtitan job config (TOML, torchtitan/config/job_config.py) for plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&plan.model.name),
        plan.gpus
    );
    let _ = writeln!(s, "# For {TORCHTITAN_VERSION}; later torchtitan is configured in Python and does not read this file.");
    let _ = writeln!(s, "[parallelism]");
    let _ = writeln!(s, "data_parallel_replicate_degree = {replicate}");
    let _ = writeln!(s, "data_parallel_shard_degree = {shard}");
    if let Some(r) = reshard {
        let _ = writeln!(
            s,
            "fsdp_reshard_after_forward = {}",
            quote::double_quoted(r)
        );
    }
    let _ = writeln!(s, "tensor_parallel_degree = {}", cfg.tp);
    let _ = writeln!(
        s,
        "enable_async_tensor_parallel = {}",
        cfg.overlap.tp_comm && cfg.tp > 1
    );
    let _ = writeln!(s, "pipeline_parallel_degree = {}", cfg.pp);
    if cfg.pp > 1 {
        // Schedule names: torch/distributed/pipelining/schedules.py.
        let _ = writeln!(
            s,
            "pipeline_parallel_schedule = {}",
            quote::double_quoted(schedule)
        );
        let _ = writeln!(s, "pipeline_parallel_layers_per_stage = {per_stage}");
        let _ = writeln!(s, "pipeline_parallel_microbatch_size = {}", cfg.mbs);
    }
    let _ = writeln!(s, "context_parallel_degree = {}", cfg.cp);
    if plan.model.moe.is_some() {
        let _ = writeln!(s, "expert_parallel_degree = {}", cfg.ep);
        let _ = writeln!(s, "expert_tensor_parallel_degree = {}", cfg.etp);
    }
    let _ = writeln!(s, "\n[training]");
    let _ = writeln!(s, "local_batch_size = {}", w.global_batch / cfg.dp);
    let _ = writeln!(s, "global_batch_size = {}", w.global_batch);
    let _ = writeln!(s, "seq_len = {}", w.seq);
    let _ = writeln!(s, "\n[activation_checkpoint]");
    match cfg.recompute {
        Recompute::None => {
            let _ = writeln!(s, "mode = \"none\"");
        }
        Recompute::Selective => {
            let _ = writeln!(s, "mode = \"selective\"\nselective_ac_option = \"op\"");
        }
        Recompute::Full => {
            let _ = writeln!(s, "mode = \"full\"");
        }
    }
    match w.precision {
        Precision::Bf16 => {}
        Precision::Fp16 => {
            return Err(cannot(
                t,
                "torchtitan trains in BF16 (mixed_precision_param); FP16 is not offered",
            ))
        }
        Precision::Fp8 => {
            let _ = writeln!(s, "\n[model]\nconverters = [\"quantize.linear.float8\"]");
        }
        Precision::Mxfp8 => {
            let _ = writeln!(s, "\n[model]\nconverters = [\"quantize.linear.mx\"]\n\n[quantize.linear.mx]\nrecipe_name = \"mxfp8_cublas\"");
        }
    }
    Ok(s)
}

/// NeMo 2.0 recipe overrides (Python, on a `nemo.collections.llm` recipe): the
/// strategy fields of nemo/lightning/pytorch/strategies/megatron_strategy.py, the
/// data module's batch fields, and the precision plugins of
/// nemo/collections/llm/recipes/precision/mixed_precision.py.
pub fn nemo(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let t = Target::Nemo;
    let cfg = &plan.plans[index].config;
    crate::megatron::megatron_schedule(cfg, "NeMo 2.0").map_err(|r| cannot(t, r))?;
    let w = &plan.workload;
    let py = |b: bool| if b { "True" } else { "False" };
    // Megatron-Core's combined 1F1B schedule calls the forward step with
    // return_schedule_plan=True; NeMo's wrapped_forward_step_func
    // (nemo/lightning/megatron_parallel.py) takes no such argument.
    if cfg.megatron_ep_overlap(w) {
        return Err(cannot(t, "NeMo 2.0's forward step cannot build the schedule plan that expert-parallel communication overlap needs; re-plan without --ep-comm-overlap"));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# NeMo 2.0 recipe overrides for plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&plan.model.name),
        plan.gpus
    );
    if cfg.bf16_moments {
        let _ = writeln!(s, "import torch");
    }
    if !plan.assumptions.flash_attention {
        let _ = writeln!(s, "from megatron.core.transformer.enums import AttnBackend");
    }
    let tp_overlap = cfg.overlap.tp_comm && cfg.tp > 1 && cfg.sp;
    if tp_overlap {
        let _ = writeln!(s, "import nemo_run as run\nfrom nemo.lightning.pytorch.callbacks.megatron_comm_overlap import MegatronCommOverlapCallback");
    }
    let _ = writeln!(
        s,
        "from nemo.collections.llm.recipes.precision.mixed_precision import {}",
        match w.precision {
            Precision::Bf16 => "bf16_mixed",
            Precision::Fp16 => "fp16_mixed",
            Precision::Fp8 => "bf16_with_fp8_mixed",
            Precision::Mxfp8 => "bf16_with_mxfp8_mixed",
        }
    );
    let st = "recipe.trainer.strategy";
    let _ = writeln!(s, "{st}.tensor_model_parallel_size = {}", cfg.tp);
    let _ = writeln!(s, "{st}.pipeline_model_parallel_size = {}", cfg.pp);
    let _ = writeln!(
        s,
        "{st}.virtual_pipeline_model_parallel_size = {}",
        if cfg.vpp > 1 {
            cfg.vpp.to_string()
        } else {
            "None".into()
        }
    );
    let _ = writeln!(s, "{st}.context_parallel_size = {}", cfg.cp);
    let _ = writeln!(s, "{st}.sequence_parallel = {}", py(cfg.sp && cfg.tp > 1));
    if plan.model.moe.is_some() {
        let _ = writeln!(s, "{st}.expert_model_parallel_size = {}", cfg.ep);
        let _ = writeln!(s, "{st}.expert_tensor_parallel_size = {}", cfg.etp);
    }
    match &cfg.layout {
        Layout::Even => {}
        Layout::AccountEmbeddingLoss => {
            let _ = writeln!(s, "{st}.account_for_embedding_in_pipeline_split = True\n{st}.account_for_loss_in_pipeline_split = True");
        }
        _ => return Err(cannot(t, format!("NeMo 2.0's strategy states uneven pipelines only by counting embedding and loss as layers; this plan uses {}", describe_layout(plan, cfg)))),
    }
    match cfg.zero {
        Zero::None | Zero::DistOpt => {
            let _ = writeln!(s, "recipe.optim.config.use_distributed_optimizer = {}", py(cfg.zero == Zero::DistOpt));
        }
        Zero::Zero2 | Zero::Zero3 => return Err(cannot(t, "ZeRO-2/3 through NeMo 2.0's FSDP strategy option is not mapped; re-plan with --zero 0,1")),
    }
    let _ = writeln!(
        s,
        "{st}.ddp.overlap_grad_reduce = {}",
        py(cfg.overlap.grad_reduce)
    );
    let _ = writeln!(
        s,
        "{st}.ddp.overlap_param_gather = {}",
        py(cfg.overlap.param_gather && cfg.zero == Zero::DistOpt)
    );
    let _ = writeln!(s, "{st}.ddp.grad_reduce_in_fp32 = {}", py(!cfg.bf16_grads));
    // recipe.optim.config is Megatron-Core's OptimizerConfig (recipes/optim/adam.py).
    if cfg.bf16_moments {
        let _ = writeln!(s, "recipe.optim.config.use_precision_aware_optimizer = True\nrecipe.optim.config.exp_avg_dtype = torch.bfloat16\nrecipe.optim.config.exp_avg_sq_dtype = torch.bfloat16");
    }
    let _ = writeln!(s, "recipe.data.micro_batch_size = {}", cfg.mbs);
    let _ = writeln!(s, "recipe.data.global_batch_size = {}", w.global_batch);
    let _ = writeln!(s, "recipe.data.seq_length = {}", w.seq);
    let _ = writeln!(s, "recipe.model.config.seq_length = {}", w.seq);
    for (k, v) in recompute_fields(cfg) {
        let v = if k == "recompute_granularity" || k == "recompute_method" {
            format!("\"{v}\"")
        } else {
            v
        };
        let _ = writeln!(s, "recipe.model.config.{k} = {v}");
    }
    // GPTConfig is a Megatron-Core TransformerConfig.
    let _ = writeln!(
        s,
        "recipe.model.config.mtp_num_layers = {}",
        if plan.model.mtp_layers > 0 {
            plan.model.mtp_layers.to_string()
        } else {
            "None".into()
        }
    );
    let (fusion, fusion_impl) = crate::megatron::loss_fields(plan.assumptions.loss);
    let _ = writeln!(
        s,
        "recipe.model.config.cross_entropy_loss_fusion = {}",
        py(fusion)
    );
    if let Some(i) = fusion_impl {
        let _ = writeln!(s, "recipe.model.config.cross_entropy_fusion_impl = \"{i}\"");
    }
    if !plan.assumptions.flash_attention {
        let _ = writeln!(
            s,
            "recipe.model.config.attention_backend = AttnBackend.unfused"
        );
    }
    for (key, value) in moe_token_fields(plan, cfg) {
        // NeMo's pinned Megatron-Core (2025-09) predates moe_flex_dispatcher_backend
        // and selects DeepEP with moe_enable_deepep (as its DeepEP callback does).
        let (key, value) = if key == "moe_flex_dispatcher_backend" {
            ("moe_enable_deepep", crate::megatron::Value::Bool(true))
        } else {
            (key, value)
        };
        let _ = writeln!(s, "recipe.model.config.{key} = {}", value.python());
    }
    // TP overlap is switched on by a callback that also initialises Transformer
    // Engine's userbuffers (nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py);
    // the config field alone would be reset. Performance recipes may add one already.
    if tp_overlap {
        let _ = writeln!(s, "recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, tp_comm_overlap=True))");
    } else if cfg.tp > 1 {
        let _ = writeln!(s, "# This plan prices TP communication without overlap: remove a MegatronCommOverlapCallback with tp_comm_overlap=True if the recipe adds one.");
    }
    let _ = writeln!(
        s,
        "recipe.trainer.plugins = {}()",
        match w.precision {
            Precision::Bf16 => "bf16_mixed",
            Precision::Fp16 => "fp16_mixed",
            Precision::Fp8 => "bf16_with_fp8_mixed",
            Precision::Mxfp8 => "bf16_with_mxfp8_mixed",
        }
    );
    Ok(s)
}
