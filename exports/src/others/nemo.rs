//! NeMo 2.0: recipe overrides in Python.

use std::fmt::Write;

use sextant_planner::config::{Dispatcher, Layout, ParallelConfig, Precision, Zero};
use sextant_planner::plan::PlanFile;

use crate::megatron::moe_token_fields;
use crate::quote;
use crate::{ExportError, Target};

use super::{cannot, describe_layout, recompute_fields};

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
    // The optimizer's dtypes are stated either way (below).
    let _ = writeln!(s, "import torch");
    if !plan.assumptions.flash_attention {
        let _ = writeln!(s, "from megatron.core.transformer.enums import AttnBackend");
    }
    let tp_overlap = cfg.megatron_tp_overlap();
    let _ = writeln!(s, "import nemo_run as run\nfrom nemo.lightning.pytorch.callbacks.megatron_comm_overlap import MegatronCommOverlapCallback");
    // A recipe's DeepEP callback (DeepSeek-V3's) switches the dispatcher to
    // DeepEP on Ampere and Hopper whatever the model config says
    // (nemo/lightning/pytorch/callbacks/deepep.py).
    let drop_deepep = plan.model.moe.is_some() && cfg.moe_dispatcher != Dispatcher::Deduplicated;
    if drop_deepep {
        let _ = writeln!(
            s,
            "from nemo.lightning.pytorch.callbacks.deepep import DeepEPCallback"
        );
    }
    let _ = writeln!(
        s,
        "from nemo.collections.llm.recipes.precision.mixed_precision import {}",
        precision_preset(cfg, w.precision)
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
    // The strategy's stage-layout fields (megatron_strategy.py:123-126, passed on
    // in its ParallelismConfig), every one stated: a recipe may set its own.
    let (first, last, account) = match &cfg.layout {
        Layout::Even => (None, None, false),
        Layout::AccountEmbeddingLoss => (None, None, true),
        Layout::FirstLast { first, last } if cfg.vpp == 1 => (Some(*first), Some(*last), false),
        _ => return Err(cannot(t, format!("NeMo 2.0's strategy states uneven pipelines by first and last stage layer counts (without virtual stages) or by counting embedding and loss as layers; this plan uses {}", describe_layout(plan, cfg)))),
    };
    let opt = |n: Option<u64>| n.map_or_else(|| "None".to_string(), |n| n.to_string());
    // The strategy's layout string too (megatron_strategy.py:133; NeMo's
    // DeepSeek-V3 performance script sets one), which Megatron-Core refuses
    // beside stage counts and which would otherwise replace an even split.
    let _ = writeln!(s, "{st}.pipeline_model_parallel_layout = None");
    let _ = writeln!(
        s,
        "{st}.num_layers_in_first_pipeline_stage = {}",
        opt(first)
    );
    let _ = writeln!(s, "{st}.num_layers_in_last_pipeline_stage = {}", opt(last));
    let _ = writeln!(
        s,
        "{st}.account_for_embedding_in_pipeline_split = {}",
        py(account)
    );
    let _ = writeln!(
        s,
        "{st}.account_for_loss_in_pipeline_split = {}",
        py(account)
    );
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
    // Stated either way: a recipe may keep its own (NeMo's DeepSeek-V3 recipe
    // runs BF16 moments and main gradients), and OptimizerConfig asserts FP32
    // everywhere without the precision-aware optimizer.
    let moments = if cfg.bf16_moments {
        "bfloat16"
    } else {
        "float32"
    };
    let _ = writeln!(s, "recipe.optim.config.use_precision_aware_optimizer = {}\nrecipe.optim.config.main_grads_dtype = torch.float32\nrecipe.optim.config.main_params_dtype = torch.float32\nrecipe.optim.config.exp_avg_dtype = torch.{moments}\nrecipe.optim.config.exp_avg_sq_dtype = torch.{moments}", py(cfg.bf16_moments));
    let _ = writeln!(s, "recipe.data.micro_batch_size = {}", cfg.mbs);
    let _ = writeln!(s, "recipe.data.global_batch_size = {}", w.global_batch);
    let _ = writeln!(s, "recipe.data.seq_length = {}", w.seq);
    let _ = writeln!(s, "recipe.model.config.seq_length = {}", w.seq);
    model_fields(&mut s, plan, cfg)?;
    // TP overlap is switched on by a callback that also initialises Transformer
    // Engine's userbuffers (nemo/lightning/pytorch/callbacks/megatron_comm_overlap.py);
    // the config field alone would be reset. Performance recipes may add one already.
    // Overlaps are set by a callback, whose setup turns data-parallel overlap on
    // with more than one data-parallel rank and picks 128 Mi-parameter buckets
    // (megatron_comm_overlap.py) unless told the plan's; TP overlap through it
    // also initialises Transformer Engine's userbuffers, which a second callback
    // would initialise again ("UB communicators are already initialized"). A
    // recipe's own callback (DeepSeek-V3's, every performance recipe's) is
    // replaced by one with the plan's settings.
    let param_gather = cfg.overlap.param_gather && cfg.zero == Zero::DistOpt;
    let _ = writeln!(s, "recipe.trainer.callbacks = [c for c in (recipe.trainer.callbacks or []) if getattr(c, \"__fn_or_cls__\", None) is not MegatronCommOverlapCallback]");
    let _ = writeln!(
        s,
        "recipe.trainer.callbacks.append(run.Config(MegatronCommOverlapCallback, tp_comm_overlap={}, overlap_grad_reduce={}, overlap_param_gather={}, bucket_size={}))",
        py(tp_overlap),
        py(cfg.overlap.grad_reduce),
        py(param_gather),
        crate::megatron::ddp_bucket_size(cfg)
    );
    let _ = writeln!(
        s,
        "recipe.trainer.plugins = {}()",
        precision_preset(cfg, w.precision)
    );
    // The plugin sets the DDP config's gradient reduction from its own field at
    // connect (nemo/lightning/pytorch/strategies/megatron_strategy.py), over the
    // ddp value above; every BF16 preset reduces in FP32.
    let _ = writeln!(
        s,
        "recipe.trainer.plugins.grad_reduce_in_fp32 = {}",
        py(!cfg.bf16_grads)
    );
    // The FP8 presets gather FP8 parameters, keep the first and last layer in BF16
    // (current scaling), a 1024-step amax history (delayed) or the hybrid format
    // and the gradient buffer's reuse (MXFP8); the plan priced what the Megatron-LM
    // export runs: BF16 weights, FP8 GEMMs in every layer, Megatron-Core's scaling
    // defaults.
    let fp8 = match w.precision {
        Precision::Fp8 => Some(("hybrid", crate::megatron::fp8_recipe(cfg))),
        Precision::Mxfp8 => Some(("e4m3", "mxfp8")),
        Precision::Bf16 | Precision::Fp16 => None,
    };
    if let Some((format, recipe)) = fp8 {
        let pl = "recipe.trainer.plugins";
        let _ = writeln!(s, "{pl}.fp8 = \"{format}\"\n{pl}.fp8_recipe = \"{recipe}\"\n{pl}.fp8_margin = 0\n{pl}.fp8_amax_history_len = 1\n{pl}.fp8_amax_compute_algo = \"most_recent\"\n{pl}.fp8_param_gather = False\n{pl}.first_last_layers_bf16 = False\n{pl}.num_layers_at_start_in_bf16 = 0\n{pl}.num_layers_at_end_in_bf16 = 0\n{pl}.reuse_grad_buf_for_mxfp8_param_ag = False");
    }
    if drop_deepep {
        let _ = writeln!(s, "recipe.trainer.callbacks = [c for c in (recipe.trainer.callbacks or []) if getattr(c, \"__fn_or_cls__\", None) is not DeepEPCallback]");
    }
    Ok(s)
}

/// The precision plugin (nemo/collections/llm/recipes/precision/mixed_precision.py):
/// FP8 with the scaling recipe the Megatron-LM export states (delayed, or current
/// scaling where recomputing norms or the experts' activation needs it; the
/// current-scaling preset keeps the first and last layer in BF16).
fn precision_preset(cfg: &ParallelConfig, p: Precision) -> &'static str {
    match p {
        Precision::Bf16 => "bf16_mixed",
        Precision::Fp16 => "fp16_mixed",
        Precision::Fp8 if crate::megatron::fp8_recipe(cfg) == "tensorwise" => {
            "bf16_with_fp8_current_scaling_mixed"
        }
        Precision::Fp8 => "bf16_with_fp8_mixed",
        Precision::Mxfp8 => "bf16_with_mxfp8_mixed",
    }
}

/// The model config's fields: recomputation, MTP, the loss kernel, the attention
/// backend and the MoE token path.
fn model_fields(s: &mut String, plan: &PlanFile, cfg: &ParallelConfig) -> Result<(), ExportError> {
    let py = |b: bool| if b { "True" } else { "False" };
    for (k, v) in recompute_fields(cfg) {
        let v = if v == "null" {
            "None".to_string()
        } else if k == "recompute_granularity" || k == "recompute_method" {
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
    let (fusion, fusion_impl) = crate::megatron::loss_fields(plan.assumptions.loss, Target::Nemo)?;
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
    // NeMo's DeepSeek config overlaps the shared experts by default (its DeepEP
    // callback turned that off); Megatron-Core's default, which the Megatron-LM
    // export keeps and the cost model prices, does not.
    if plan.model.moe.is_some() {
        let _ = writeln!(s, "recipe.model.config.moe_shared_expert_overlap = False");
    }
    Ok(())
}
