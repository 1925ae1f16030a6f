//! Megatron-Core Python: `initialize_model_parallel`, `TransformerConfig`,
//! `DistributedDataParallelConfig` and, with BF16 moments, `OptimizerConfig`.

use std::fmt::Write;

use sextant_planner::config::{
    Layout, ParallelConfig, Precision, Recompute, RecomputeModules, Zero,
};
use sextant_planner::model::MlpKind;
use sextant_planner::plan::PlanFile;

use super::{
    check_rank_order, fp8_recipe, kv_heads_below_tp, loss_fields, megatron_schedule, model_refusal,
    moe_layer_pattern, moe_token_fields, norm_name, pipeline_layout, sliding_window,
    MEGATRON_VERSION,
};
use crate::quote;
use crate::{ExportError, Reason, Target};

/// Megatron-Core: `initialize_model_parallel` (megatron/core/parallel_state.py),
/// `TransformerConfig` (megatron/core/transformer/transformer_config.py, with the
/// parallel fields of megatron/core/model_parallel_config.py) and
/// `DistributedDataParallelConfig` (megatron/core/distributed/distributed_data_parallel_config.py).
pub fn megatron_core(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let t = Target::MegatronCore;
    let cfg = &plan.plans[index].config;
    let m = &plan.model;
    let w = &plan.workload;
    let py_bool = |b: bool| if b { "True" } else { "False" };
    megatron_schedule(cfg, "Megatron-Core").map_err(|r| r.at(t))?;
    check_rank_order(plan, cfg).map_err(|r| r.at(t))?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Megatron-Core, {MEGATRON_VERSION}, for plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&m.name),
        plan.gpus
    );
    if let Some(note) = kv_heads_below_tp(plan, index) {
        let _ = writeln!(s, "# {note}");
    }
    let _ = writeln!(s, "import torch");
    let _ = writeln!(s, "from megatron.core import parallel_state");
    // Multi-latent attention takes MLATransformerConfig, a TransformerConfig subclass
    // in the same module.
    let config_class = if m.mla.is_some() {
        "MLATransformerConfig"
    } else {
        "TransformerConfig"
    };
    let _ = writeln!(
        s,
        "from megatron.core.transformer.transformer_config import {config_class}"
    );
    let _ = writeln!(
        s,
        "from megatron.core.distributed import DistributedDataParallelConfig"
    );
    let _ = writeln!(s, "from megatron.core.transformer.enums import AttnBackend");
    match (m.mlp, m.glu_clamp) {
        (MlpKind::Gated, Some(_)) => {
            let _ = writeln!(
                s,
                "from megatron.core.fusions.fused_bias_geglu import quick_gelu"
            );
        }
        (MlpKind::Gated, None) => {
            let _ = writeln!(s, "import torch.nn.functional as F");
        }
        (MlpKind::Plain, _) => {}
    }
    if cfg.bf16_moments {
        let _ = writeln!(s, "from megatron.core.optimizer import OptimizerConfig");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "parallel_state.initialize_model_parallel(");
    let _ = writeln!(s, "    tensor_model_parallel_size={},", cfg.tp);
    let _ = writeln!(s, "    pipeline_model_parallel_size={},", cfg.pp);
    let _ = writeln!(
        s,
        "    virtual_pipeline_model_parallel_size={},",
        if cfg.vpp > 1 {
            cfg.vpp.to_string()
        } else {
            "None".into()
        }
    );
    let _ = writeln!(s, "    context_parallel_size={},", cfg.cp);
    let _ = writeln!(s, "    expert_model_parallel_size={},", cfg.ep);
    // A dense model leaves it to Megatron-Core's default (TP), as Megatron-LM does;
    // check_rank_order counts with the same sizes.
    if m.moe.is_some() {
        let _ = writeln!(s, "    expert_tensor_parallel_size={},", cfg.etp);
    } else {
        let _ = writeln!(s, "    expert_tensor_parallel_size=None,");
    }
    let _ = writeln!(s, "    order={},", quote::double_quoted(&plan.rank_order));
    let _ = writeln!(s, ")\n");
    config_fields(&mut s, plan, cfg, config_class)?;
    training_fields(&mut s, plan, cfg)?;
    let _ = writeln!(s, "ddp_config = DistributedDataParallelConfig(");
    let _ = writeln!(s, "    grad_reduce_in_fp32={},", py_bool(!cfg.bf16_grads));
    let _ = writeln!(
        s,
        "    overlap_grad_reduce={},",
        py_bool(cfg.overlap.grad_reduce)
    );
    let _ = writeln!(
        s,
        "    overlap_param_gather={},",
        py_bool(cfg.overlap.param_gather && cfg.zero != Zero::None)
    );
    let _ = writeln!(
        s,
        "    use_distributed_optimizer={},",
        py_bool(cfg.zero != Zero::None)
    );
    // The sharding strategy takes effect only under Megatron-FSDP (training flag
    // --use-megatron-fsdp); the distributed optimizer is ZeRO-1 by itself.
    match cfg.zero {
        Zero::Zero2 => {
            let _ = writeln!(s, "    data_parallel_sharding_strategy=\"optim_grads\",  # with Megatron-FSDP (--use-megatron-fsdp)");
        }
        Zero::Zero3 => {
            let _ = writeln!(s, "    data_parallel_sharding_strategy=\"optim_grads_params\",  # with Megatron-FSDP (--use-megatron-fsdp)");
        }
        Zero::None | Zero::DistOpt => {}
    }
    let _ = writeln!(s, ")");
    if cfg.bf16_moments {
        let _ = writeln!(
            s,
            "\noptimizer_config = OptimizerConfig(  # megatron/core/optimizer/optimizer_config.py"
        );
        let _ = writeln!(s, "    optimizer=\"adam\",\n    use_precision_aware_optimizer=True,\n    exp_avg_dtype=torch.bfloat16,\n    exp_avg_sq_dtype=torch.bfloat16,\n)");
    }
    let _ = writeln!(
        s,
        "# Build the model with GPTModel(config=config, ..., share_embeddings_and_output_weights={}); position embedding (rotary base and scaling), vocabulary and tokenizer come from your model's recipe.",
        py_bool(m.tied_embeddings)
    );
    let _ = writeln!(
        s,
        "# micro-batch {} x {} accumulation steps = global batch {} at sequence length {}",
        cfg.mbs,
        w.global_batch / (cfg.mbs * cfg.dp),
        w.global_batch,
        w.seq
    );
    Ok(s)
}

/// The `TransformerConfig` call's model, parallel and MoE fields.
fn config_fields(
    s: &mut String,
    plan: &PlanFile,
    cfg: &ParallelConfig,
    config_class: &str,
) -> Result<(), ExportError> {
    let m = &plan.model;
    let w = &plan.workload;
    let py_bool = |b: bool| if b { "True" } else { "False" };
    let _ = writeln!(s, "config = {config_class}(");
    let _ = writeln!(s, "    num_layers={},\n    hidden_size={},\n    ffn_hidden_size={},\n    num_attention_heads={},", m.layers, m.hidden, m.ffn_hidden, m.heads);
    // Dropout as priced; TransformerConfig defaults both to 0.1.
    let p = if m.dropout { "0.1" } else { "0.0" };
    let _ = writeln!(s, "    attention_dropout={p},\n    hidden_dropout={p},");
    if let Some(mla) = &m.mla {
        let q = if mla.q_lora_rank > 0 {
            mla.q_lora_rank.to_string()
        } else {
            "None".into()
        };
        let _ = writeln!(
            s,
            "    q_lora_rank={q},\n    kv_lora_rank={},\n    qk_head_dim={},\n    qk_pos_emb_head_dim={},\n    v_head_dim={},",
            mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
        );
    }
    if m.kv_heads != m.heads && m.mla.is_none() {
        let _ = writeln!(s, "    num_query_groups={},", m.kv_heads);
    }
    model_kind_fields(s, m)?;
    let _ = writeln!(s, "    tensor_model_parallel_size={},", cfg.tp);
    let _ = writeln!(s, "    pipeline_model_parallel_size={},", cfg.pp);
    if cfg.vpp > 1 {
        let _ = writeln!(s, "    virtual_pipeline_model_parallel_size={},", cfg.vpp);
    }
    if cfg.pp > 1 {
        // TransformerConfig raises without a pipeline dtype when PP > 1.
        let _ = writeln!(
            s,
            "    pipeline_dtype={},",
            if w.precision == Precision::Fp16 {
                "torch.float16"
            } else {
                "torch.bfloat16"
            }
        );
    }
    let _ = writeln!(s, "    context_parallel_size={},", cfg.cp);
    let _ = writeln!(
        s,
        "    sequence_parallel={},",
        py_bool(cfg.sp && cfg.tp > 1)
    );
    let (fusion, fusion_impl) = loss_fields(plan.assumptions.loss, Target::MegatronCore)?;
    let _ = writeln!(s, "    cross_entropy_loss_fusion={},", py_bool(fusion));
    if let Some(i) = fusion_impl {
        let _ = writeln!(s, "    cross_entropy_fusion_impl=\"{i}\",");
    }
    if m.mtp_layers > 0 {
        let _ = writeln!(s, "    mtp_num_layers={},", m.mtp_layers);
    }
    if let Some(moe) = &m.moe {
        let _ = writeln!(
            s,
            "    expert_model_parallel_size={},\n    expert_tensor_parallel_size={},",
            cfg.ep, cfg.etp
        );
        let _ = writeln!(
            s,
            "    num_moe_experts={},\n    moe_router_topk={},\n    moe_ffn_hidden_size={},\n    moe_grouped_gemm=True,",
            moe.experts, moe.top_k, moe.expert_ffn_hidden
        );
        if moe.shared_hidden() > 0 {
            let _ = writeln!(
                s,
                "    moe_shared_expert_intermediate_size={},",
                moe.shared_hidden()
            );
        }
        if let Some(pattern) = moe_layer_pattern(m) {
            let _ = writeln!(s, "    moe_layer_freq=[{}],", pattern.join(", "));
        }
        if moe.balancing == sextant_planner::routing::Balancing::LossFree {
            let _ = writeln!(s, "    moe_router_enable_expert_bias=True,\n    moe_router_score_function=\"sigmoid\",");
        }
        for (key, value) in moe_token_fields(plan, cfg) {
            let _ = writeln!(s, "    {key}={},", value.python());
        }
        // ModelParallelConfig.overlap_moe_expert_parallel_comm / delay_wgrad_compute.
        if cfg.megatron_ep_overlap(w) {
            let _ = writeln!(
                s,
                "    overlap_moe_expert_parallel_comm=True,\n    delay_wgrad_compute=True,"
            );
        }
    }
    Ok(())
}

/// The fields that make the model the one priced, where TransformerConfig's
/// defaults (a GeLU MLP with biases, LayerNorm, hidden / heads channels per head,
/// full attention, vanilla softmax) would build another; the same model the
/// Megatron-LM export's flags build (`core_transformer_config_from_args`:
/// `--swiglu` sets F.silu with the gated unit and bias-activation fusion,
/// `--quick-geglu` quick_gelu with the gated unit).
fn model_kind_fields(
    s: &mut String,
    m: &sextant_planner::model::ModelSpec,
) -> Result<(), ExportError> {
    let t = Target::MegatronCore;
    if let Some(why) = model_refusal(m) {
        return Err(Reason(why).at(t));
    }
    if m.head_dim * m.heads != m.hidden && m.mla.is_none() {
        let _ = writeln!(s, "    kv_channels={},", m.head_dim);
    }
    match (m.mlp, m.glu_clamp) {
        (MlpKind::Gated, Some(limit)) => {
            let _ = writeln!(
                s,
                "    gated_linear_unit=True,\n    activation_func=quick_gelu,\n    activation_func_clamp_value={limit:?},\n    glu_linear_offset=1.0,\n    bias_activation_fusion=True,"
            );
        }
        (MlpKind::Gated, None) => {
            let _ = writeln!(
                s,
                "    gated_linear_unit=True,\n    activation_func=F.silu,\n    bias_activation_fusion=True,"
            );
        }
        // Megatron-LM fuses the bias with GeLU (--bias-gelu-fusion) where there is
        // a bias to fuse.
        (MlpKind::Plain, _) => {
            if m.bias {
                let _ = writeln!(s, "    bias_activation_fusion=True,");
            }
        }
    }
    if !m.bias {
        let _ = writeln!(s, "    add_bias_linear=False,");
    }
    // Megatron-LM keeps the QKV bias in step with the linear biases (validate_args).
    if m.bias || m.qkv_bias {
        let _ = writeln!(s, "    add_qkv_bias=True,");
    }
    let _ = writeln!(s, "    normalization=\"{}\",", norm_name(m.norm_kind()));
    if let Some((left, skip)) = sliding_window(m).map_err(|r| r.at(t))? {
        let _ = writeln!(s, "    window_size=({left}, 0),");
        if let Some(n) = skip {
            let _ = writeln!(s, "    window_attn_skip_freq={n},");
        }
    }
    if m.attention_sinks {
        let _ = writeln!(s, "    softmax_type=\"learnable\",");
    }
    if m.qk_norm {
        let _ = writeln!(s, "    qk_layernorm=True,");
    }
    Ok(())
}

/// The `TransformerConfig` call's attention backend, layout, recomputation and
/// precision fields, and its end.
fn training_fields(
    s: &mut String,
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Result<(), ExportError> {
    let t = Target::MegatronCore;
    let w = &plan.workload;
    let py_bool = |b: bool| if b { "True" } else { "False" };
    // TransformerConfig.attention_backend (enums.py AttnBackend), the kernel the
    // plan priced, as the Megatron-LM export's --attention-backend states it (the
    // default, auto, lets Transformer Engine pick).
    let backend = if plan.assumptions.flash_attention {
        "flash"
    } else {
        "unfused"
    };
    let _ = writeln!(s, "    attention_backend=AttnBackend.{backend},");
    match &cfg.layout {
        Layout::Even => {}
        Layout::AccountEmbeddingLoss => {
            let _ = writeln!(s, "    account_for_embedding_in_pipeline_split=True,\n    account_for_loss_in_pipeline_split=True,");
        }
        Layout::FirstLast { first, last } => {
            let _ = writeln!(s, "    num_layers_in_first_pipeline_stage={first},\n    num_layers_in_last_pipeline_stage={last},");
        }
        Layout::Explicit { .. } => {
            let layout = pipeline_layout(plan, cfg).map_err(|r| r.at(t))?;
            let _ = writeln!(
                s,
                "    pipeline_model_parallel_layout={},",
                quote::double_quoted(&layout)
            );
        }
    }
    match cfg.recompute {
        Recompute::None => {}
        Recompute::Selective => {
            let _ = writeln!(s, "    recompute_granularity=\"selective\",");
            if cfg.recompute_modules != RecomputeModules::DEFAULT {
                let names: Vec<String> = cfg
                    .recompute_modules
                    .names()
                    .iter()
                    .map(|n| format!("\"{n}\""))
                    .collect();
                let _ = writeln!(s, "    recompute_modules=[{}],", names.join(", "));
            }
        }
        Recompute::Full => {
            let _ = writeln!(s, "    recompute_granularity=\"full\",\n    recompute_method=\"uniform\",\n    recompute_num_layers=1,");
        }
    }
    match w.precision {
        Precision::Bf16 => {
            let _ = writeln!(s, "    bf16=True,");
        }
        Precision::Fp16 => {
            let _ = writeln!(s, "    fp16=True,");
        }
        Precision::Fp8 => {
            let _ = writeln!(
                s,
                "    bf16=True,\n    fp8=\"hybrid\",\n    fp8_recipe=\"{}\",",
                fp8_recipe(cfg)
            );
        }
        Precision::Mxfp8 => {
            let _ = writeln!(
                s,
                "    bf16=True,\n    fp8=\"e4m3\",\n    fp8_recipe=\"mxfp8\","
            );
        }
    }
    let _ = writeln!(
        s,
        "    tp_comm_overlap={},",
        py_bool(cfg.megatron_tp_overlap())
    );
    let _ = writeln!(s, ")\n");
    Ok(())
}
