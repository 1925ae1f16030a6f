//! Megatron-Bridge: Hydra-style overrides on a `ConfigContainer`.

use std::fmt::Write;

use sextant_planner::config::{Layout, Precision, Zero};
use sextant_planner::cost::CudaGraphs;
use sextant_planner::plan::PlanFile;

use crate::megatron::moe_token_fields;
use crate::quote;
use crate::{ExportError, Target};

use super::{cannot, mtp_value, overlay_layout_fields, recompute_fields, vpp_value};

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
    // Every layout field, those the plan does not use cleared: a recipe may set
    // its own (Megatron-Core refuses a layout string beside stage counts), and a
    // stated layout keeps the recipe runner from rebuilding one for the new
    // pipeline size (scripts/training/recipe_runner.py sync_model_pipeline_layout).
    for (k, v) in overlay_layout_fields(plan, cfg).map_err(|r| cannot(t, r))? {
        put(&format!("model.{k}"), v);
    }
    put("model.mtp_num_layers", mtp_value(plan));
    // The loss the plan priced (megatron/core/model_parallel_config.py fields; the
    // provider's default turns the fusion on).
    let (fusion, fusion_impl) =
        crate::megatron::loss_fields(plan.assumptions.loss, Target::MegatronBridge)?;
    put("model.cross_entropy_loss_fusion", fusion.to_string());
    if let Some(i) = fusion_impl {
        put("model.cross_entropy_fusion_impl", i.into());
    }
    // CUDA graphs the plan priced: Transformer Engine's per-layer graphs over the
    // named modules, set as Bridge's own performance scripts set them
    // (scripts/performance/utils/overrides.py `_set_cuda_graph_overrides` at
    // 067f987df: model.cuda_graph_impl, the modules through
    // utils/cuda_graph.py `set_cuda_graph_modules`, and the TE RNG tracker that
    // graph capture needs, which ConfigContainer keeps in step with
    // model.use_te_rng_tracker, training/config.py). Megatron-Core takes the
    // module names as strings (`cuda_graph_modules`, normalised in
    // TransformerConfig.__post_init__, transformer_config.py at d98e8a6). A dense
    // model's full-iteration graph is set as `set_full_iteration_cuda_graph`
    // (utils/cuda_graph.py) sets it, with the NaN check on the loss off, as the
    // same overrides do; an MoE model's needs static shapes that no plan sets.
    let graphs = plan.assumptions.cuda_graphs;
    // The deprecated scope field a recipe may set (DeepSeek-V3's "full", B200
    // Llama's ["full_iteration"]) cannot stand beside the modules
    // (TransformerConfig.__post_init__); Bridge's set_cuda_graph_modules clears it.
    put("model.cuda_graph_scope", "null".into());
    if graphs.is_none() {
        // A recipe's own graphs (Bridge's B200 Llama recipes capture the whole
        // iteration) are not what the plan priced.
        put("model.cuda_graph_impl", "none".into());
    } else if graphs.full_iteration {
        if plan.model.moe.is_some() {
            return Err(cannot(
                t,
                "a full-iteration CUDA graph of an MoE model, which needs a static expert-rank capacity this export does not set; re-plan with --cuda-graphs attn,moe_router,moe_preprocess or without it",
            ));
        }
        put("model.cuda_graph_impl", "full_iteration".into());
        put("model.cuda_graph_modules", "[]".into());
        put("rng.te_rng_tracker", "true".into());
        put("rerun_state_machine.check_for_nan_in_loss", "false".into());
    } else if !graphs.is_none() {
        put("model.cuda_graph_impl", "transformer_engine".into());
        let modules: Vec<&str> = CudaGraphs::SCOPES
            .iter()
            .copied()
            .filter(|&m| match m {
                "attn" => graphs.attn,
                "moe_router" => graphs.moe_router,
                "moe_preprocess" => graphs.moe_preprocess,
                _ => false,
            })
            .collect();
        put(
            "model.cuda_graph_modules",
            format!("[{}]", modules.join(",")),
        );
        put("rng.te_rng_tracker", "true".into());
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
    // megatron/core/distributed/distributed_data_parallel_config.py, and
    // optimizer.use_distributed_optimizer beside it: the config validator turns
    // the distributed optimizer back on where either side asks for it
    // (training/config.py _validate_and_sync_distributed_optimizer_settings).
    match cfg.zero {
        Zero::None | Zero::DistOpt => {
            let on = (cfg.zero == Zero::DistOpt).to_string();
            put("ddp.use_distributed_optimizer", on.clone());
            put("optimizer.use_distributed_optimizer", on);
        }
        Zero::Zero2 | Zero::Zero3 => {
            put("ddp.use_megatron_fsdp", "true".into());
            put("dist.use_megatron_fsdp", "true".into());
            // The config validator asserts it for Megatron-FSDP with checkpoints
            // (training/config.py, "Megatron-FSDP requires the fsdp_dtensor
            // checkpointing format").
            put("checkpoint.ckpt_format", "fsdp_dtensor".into());
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
    let param_gather = cfg.overlap.param_gather && cfg.zero != Zero::None;
    put("ddp.overlap_param_gather", param_gather.to_string());
    // The mixed-precision config below sets it again from its own field
    // (training/mixed_precision.py update_config_with_precision_overrides).
    put("ddp.grad_reduce_in_fp32", (!cfg.bf16_grads).to_string());
    // Megatron-Core OptimizerConfig (megatron/core/optimizer/optimizer_config.py);
    // the override parser turns dtype names into torch dtypes (str_to_dtype in
    // src/megatron/bridge/utils/activation_map.py).
    // Stated either way: a recipe may keep its own (Megatron-Bridge's DeepSeek-V3
    // recipes run BF16 moments and main gradients), and OptimizerConfig asserts
    // FP32 everywhere without the precision-aware optimizer.
    let moments = if cfg.bf16_moments { "bf16" } else { "fp32" };
    put(
        "optimizer.use_precision_aware_optimizer",
        cfg.bf16_moments.to_string(),
    );
    put("optimizer.main_grads_dtype", "fp32".into());
    put("optimizer.main_params_dtype", "fp32".into());
    put("optimizer.exp_avg_dtype", moments.into());
    put("optimizer.exp_avg_sq_dtype", moments.into());
    // Precision: the whole MixedPrecisionConfig ([`mixed_precision`]), not a preset.
    put("++mixed_precision", mixed_precision(cfg, w.precision));
    // comm_overlap: CommOverlapConfig (src/megatron/bridge/training/comm_overlap.py),
    // which recipes leave None or set with their own overlaps (its setup turns
    // data-parallel overlap back on over the ddp fields). Stated whole, as a
    // _target_ the override parser instantiates (omegaconf_utils.py
    // _apply_overrides), added with ++ so that it also replaces a None: a bare
    // comm_overlap.tp_comm_overlap=... cannot override a None section. The
    // recipe's userbuffers layout (tp_comm_overlap_cfg) is dropped for
    // Transformer Engine's default, which the cost model does not distinguish.
    let tp_overlap = cfg.megatron_tp_overlap();
    let ep = plan.model.moe.is_some() && cfg.megatron_ep_overlap(w);
    // Every field (a ++ dict merges into a recipe's section, whose own
    // overlap_param_gather_with_optimizer_step or deferred embedding gradients
    // would stay): the plan's overlaps, Megatron-LM's defaults (the Megatron-LM
    // export's) for what it does not price, null where the config's setup picks.
    let p2p = if cfg.pp > 1 && !cfg.overlap.p2p {
        "false"
    } else {
        "null"
    };
    // Buckets of Megatron-LM's size (its setup would pick 128 Mi parameters).
    let bucket = crate::megatron::ddp_bucket_size(cfg);
    let overlap = format!(
        "{{_target_:megatron.bridge.training.comm_overlap.CommOverlapConfig,tp_comm_overlap:{tp_overlap},tp_comm_overlap_cfg:null,tp_comm_bootstrap_backend:nccl,overlap_p2p_comm:{p2p},batch_p2p_comm:null,overlap_grad_reduce:{},overlap_param_gather:{param_gather},overlap_param_gather_with_optimizer_step:false,align_param_gather:null,bucket_size:{bucket},defer_embedding_wgrad_compute:false,wgrad_deferral_limit:null,data_parallel_size:null,overlap_moe_expert_parallel_comm:{ep},delay_wgrad_compute:{ep}}}",
        cfg.overlap.grad_reduce
    );
    put("++comm_overlap", overlap);
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

/// Megatron-Bridge's `MixedPrecisionConfig` (training/mixed_precision.py) with every
/// field, as a `_target_` the override parser instantiates (a `++` dict merges into
/// a recipe's config, whose other fields would stay; it replaces a preset named by
/// string). The plan's precision as the Megatron-LM export states it: BF16 (or
/// FP16) parameters with FP32 gradient reduction unless BF16 gradients were priced,
/// FP8 with the scaling recipe of [`crate::megatron::fp8_recipe`] or MXFP8, the
/// weights kept and gathered in BF16 (the presets gather FP8 parameters and, with
/// current scaling, run the first and last layer in BF16: not what was priced), and
/// the remaining fields at the dataclass's defaults (Megatron-LM's).
fn mixed_precision(cfg: &sextant_planner::config::ParallelConfig, p: Precision) -> String {
    let dtype = if p == Precision::Fp16 {
        "{_target_:torch.float16,_call_:false}"
    } else {
        "{_target_:torch.bfloat16,_call_:false}"
    };
    let (fp8, recipe) = match p {
        Precision::Bf16 | Precision::Fp16 => ("null", "tensorwise"),
        Precision::Fp8 => ("hybrid", crate::megatron::fp8_recipe(cfg)),
        Precision::Mxfp8 => ("e4m3", "mxfp8"),
    };
    format!(
        "{{_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,fp32:false,fp16:{},bf16:{},params_dtype:{dtype},pipeline_dtype:{dtype},autocast_dtype:null,autocast_enabled:false,grad_reduce_in_fp32:{},fp8:{fp8},fp8_recipe:{recipe},first_last_layers_bf16:false,fp8_margin:0,fp8_amax_history_len:1,fp8_amax_compute_algo:most_recent,fp8_wgrad:true,fp8_dot_product_attention:false,fp8_multi_head_attention:false,fp8_param:false,fp8_param_gather:false,fp4:null,fp4_recipe:nvfp4,fp4_param:false,fp4_param_gather:false,loss_scale:null,initial_loss_scale:4294967296,min_loss_scale:1.0,loss_scale_window:1000,hysteresis:2,num_layers_at_start_in_bf16:0,num_layers_at_end_in_bf16:0,reuse_grad_buf_for_mxfp8_param_ag:false}}",
        p == Precision::Fp16,
        p != Precision::Fp16,
        !cfg.bf16_grads
    )
}
