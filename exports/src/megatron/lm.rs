//! Megatron-LM's command-line arguments.

use std::fmt::Write;

use sextant_planner::config::{
    Layout, ParallelConfig, Precision, Recompute, RecomputeModules, Zero,
};
use sextant_planner::cost::LossKernel;
use sextant_planner::model::MlpKind;
use sextant_planner::plan::PlanFile;

use super::{
    check_rank_order, cuda_device_max_connections, cuda_graph_floor, fp8_recipe,
    graphs_delayed_wgrad, kv_heads_below_tp, megatron_schedule, model_refusal, moe_layer_pattern,
    moe_token_fields, norm_name, pipeline_layout, sliding_window, MaxConnections, Value,
    MEGATRON_VERSION,
};
use crate::quote;
use crate::{ExportError, Target};

fn flag(v: &mut Vec<String>, name: &str) {
    v.push(format!("--{name}"));
}

fn arg(v: &mut Vec<String>, name: &str, value: impl ToString) {
    v.push(format!("--{name} {}", value.to_string()));
}

/// The arguments, one flag (with its value) per entry.
pub fn args(plan: &PlanFile, index: usize) -> Result<Vec<String>, ExportError> {
    let cfg = &plan.plans[index].config;
    let w = &plan.workload;
    megatron_schedule(cfg, "Megatron-LM").map_err(cannot_lm)?;
    let mut v = Vec::new();
    parallel_args(&mut v, plan, cfg)?;
    // Batch and sequence: TrainingConfig (megatron/training/config/training_config.py)
    // and _add_data_args.
    arg(&mut v, "micro-batch-size", cfg.mbs);
    arg(&mut v, "global-batch-size", w.global_batch);
    arg(&mut v, "seq-length", w.seq);
    arg(&mut v, "max-position-embeddings", w.seq);
    training_args(&mut v, cfg)?;
    precision_args(&mut v, plan, cfg)?;
    model_args(&mut v, plan, cfg)?;
    let bias =
        !v.iter().any(|a| a == "--disable-bias-linear") || v.iter().any(|a| a == "--add-qkv-bias");
    if bias && graphs_delayed_wgrad(&v) {
        return Err(cannot_lm("the plan graphs attention (or the router beside unoverlapped shared experts) while the expert-parallel overlap defers weight gradients (--delay-wgrad-compute), which Megatron-LM refuses for a model with linear or QKV biases (validate_args); re-plan without --ep-comm-overlap or without those --cuda-graphs scopes"));
    }
    Ok(v)
}

fn cannot_lm(reason: impl Into<String>) -> ExportError {
    ExportError::Inexpressible {
        target: Target::MegatronLm,
        reason: reason.into(),
    }
}

/// Parallel sizes, the stage layout and the rank order.
fn parallel_args(
    v: &mut Vec<String>,
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Result<(), ExportError> {
    let m = &plan.model;
    // Parallel sizes: ModelParallelConfig (megatron/core/model_parallel_config.py).
    arg(v, "tensor-model-parallel-size", cfg.tp);
    arg(v, "pipeline-model-parallel-size", cfg.pp);
    arg(v, "context-parallel-size", cfg.cp);
    if cfg.sp && cfg.tp > 1 {
        flag(v, "sequence-parallel");
    }
    if m.moe.is_some() {
        arg(v, "expert-model-parallel-size", cfg.ep);
        arg(v, "expert-tensor-parallel-size", cfg.etp);
    }
    // Stage layout: arguments.py _add_distributed_args (--num-layers-per-virtual-
    // pipeline-stage, --num-virtual-stages-per-pipeline-rank, --decoder-first/last-
    // pipeline-num-layers, --pipeline-model-parallel-layout) and TransformerConfig
    // (--account-for-embedding/loss-in-pipeline-split).
    match &cfg.layout {
        Layout::Even => {
            if cfg.vpp > 1 {
                arg(
                    v,
                    "num-layers-per-virtual-pipeline-stage",
                    m.layers / (cfg.pp * cfg.vpp),
                );
            }
        }
        Layout::AccountEmbeddingLoss => {
            flag(v, "account-for-embedding-in-pipeline-split");
            flag(v, "account-for-loss-in-pipeline-split");
            if cfg.vpp > 1 {
                arg(v, "num-virtual-stages-per-pipeline-rank", cfg.vpp);
            }
        }
        Layout::FirstLast { first, last } => {
            if cfg.vpp > 1 {
                return Err(cannot_lm("first/last stage layer counts with virtual stages: state the split as an explicit layout"));
            }
            arg(v, "decoder-first-pipeline-num-layers", first);
            arg(v, "decoder-last-pipeline-num-layers", last);
        }
        Layout::Explicit { .. } => {
            let layout = pipeline_layout(plan, cfg).map_err(cannot_lm)?;
            let layout = quote::shell(&layout).map_err(cannot_lm)?;
            v.push(format!("--pipeline-model-parallel-layout {layout}"));
        }
    }
    check_rank_order(plan, cfg).map_err(cannot_lm)?;
    if plan.rank_order == "tp-cp-ep-pp-dp" {
        // DistributedInitConfig.use_tp_pp_dp_mapping; megatron/training/initialize.py.
        flag(v, "use-tp-pp-dp-mapping");
    }
    Ok(())
}

/// Recomputation, data-parallel sharding and communication overlap.
fn training_args(v: &mut Vec<String>, cfg: &ParallelConfig) -> Result<(), ExportError> {
    // Recomputation: TransformerConfig recompute_granularity / _method / _num_layers.
    match cfg.recompute {
        Recompute::None => {}
        Recompute::Selective => {
            arg(v, "recompute-granularity", "selective");
            if cfg.recompute_modules != RecomputeModules::DEFAULT {
                arg(
                    v,
                    "recompute-modules",
                    cfg.recompute_modules.names().join(" "),
                );
            }
        }
        Recompute::Full => {
            arg(v, "recompute-granularity", "full");
            arg(v, "recompute-method", "uniform");
            arg(v, "recompute-num-layers", 1);
        }
    }

    // Data-parallel sharding: _add_distributed_args; Megatron-FSDP strategies
    // no_shard / optim / optim_grads / optim_grads_params.
    match cfg.zero {
        Zero::None => {}
        Zero::DistOpt => flag(v, "use-distributed-optimizer"),
        Zero::Zero2 | Zero::Zero3 => {
            flag(v, "use-megatron-fsdp");
            arg(
                v,
                "data-parallel-sharding-strategy",
                if cfg.zero == Zero::Zero2 {
                    "optim_grads"
                } else {
                    "optim_grads_params"
                },
            );
            // validate_args asserts it for Megatron-FSDP (arguments.py, d98e8a6,
            // "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format").
            arg(v, "ckpt-format", "fsdp_dtensor");
        }
    }
    if cfg.overlap.grad_reduce && cfg.dp * cfg.cp > 1 {
        flag(v, "overlap-grad-reduce");
        // --overlap-param-gather asserts a sharded optimizer and --overlap-grad-reduce.
        if cfg.overlap.param_gather && cfg.zero != Zero::None {
            flag(v, "overlap-param-gather");
        }
    }
    if cfg.overlap.tp_comm && cfg.tp > 1 {
        if !cfg.sp {
            return Err(cannot_lm(
                "--tp-comm-overlap requires --sequence-parallel (assertion in Megatron-LM)",
            ));
        }
        flag(v, "tp-comm-overlap");
    }
    if !cfg.overlap.p2p && cfg.pp > 1 {
        flag(v, "no-overlap-p2p-communication");
    }
    Ok(())
}

/// Precision, gradient reduction, the attention backend and the loss kernel.
fn precision_args(
    v: &mut Vec<String>,
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Result<(), ExportError> {
    let w = &plan.workload;
    // Precision: _add_mixed_precision_args / TransformerConfig.fp8 (--fp8-format) and
    // fp8_recipe (Fp8Recipe in megatron/core/enums.py).
    match w.precision {
        Precision::Bf16 => flag(v, "bf16"),
        Precision::Fp16 => flag(v, "fp16"),
        Precision::Fp8 => {
            flag(v, "bf16");
            arg(v, "fp8-format", "hybrid");
            arg(v, "fp8-recipe", fp8_recipe(cfg));
        }
        Precision::Mxfp8 => {
            flag(v, "bf16");
            arg(v, "fp8-format", "e4m3");
            arg(v, "fp8-recipe", "mxfp8");
        }
    }
    // With --bf16, FP32 gradient reduction is switched on unless --grad-reduce-in-bf16.
    // OptimizerConfig (megatron/core/optimizer/optimizer_config.py): Adam's moments
    // in BF16 through the precision-aware optimizer.
    if cfg.bf16_moments {
        flag(v, "use-precision-aware-optimizer");
        arg(v, "exp-avg-dtype", "bf16");
        arg(v, "exp-avg-sq-dtype", "bf16");
    }
    if cfg.bf16_grads {
        flag(v, "grad-reduce-in-bf16");
    } else if w.precision == Precision::Fp16 {
        flag(v, "accumulate-allreduce-grads-in-fp32");
    }
    arg(
        v,
        "attention-backend",
        if plan.assumptions.flash_attention {
            "flash"
        } else {
            "unfused"
        },
    );
    // CUDA graphs the plan priced: Transformer Engine's per-layer graphs over the
    // named scopes (`--cuda-graph-impl`, `--cuda-graph-modules`: arguments.py at
    // d98e8a6), or, for a dense model, one graph of the whole forward and
    // backward (`--cuda-graph-impl full_iteration`, which validate_args accepts
    // only with `--no-check-for-nan-in-loss-and-grad`). An MoE model's
    // full-iteration graph needs static MoE shapes (a HybridEP expert-rank
    // capacity) that no plan sets.
    let graphs = plan.assumptions.cuda_graphs;
    if graphs.full_iteration {
        if plan.model.moe.is_some() {
            return Err(ExportError::Inexpressible {
                target: Target::MegatronLm,
                reason: "the plan prices a full-iteration CUDA graph of an MoE model, which needs a static expert-rank capacity this export does not set; re-plan with --cuda-graphs attn,moe_router,moe_preprocess or without it".into(),
            });
        }
        arg(v, "cuda-graph-impl", "full_iteration");
        flag(v, "no-check-for-nan-in-loss-and-grad");
    } else if !graphs.is_none() {
        arg(v, "cuda-graph-impl", "transformer_engine");
        arg(v, "cuda-graph-modules", graphs.to_string());
    }
    // The loss the plan priced (cost::LossKernel): without the flag Megatron-LM runs
    // the unfused one (52 bytes per logit); with it, its own fusion (32).
    // Megatron-LM's arguments.py rejects Transformer Engine's kernel.
    match plan.assumptions.loss {
        LossKernel::Te => {
            return Err(ExportError::Inexpressible {
                target: Target::MegatronLm,
                reason: "the plan prices Transformer Engine's cross-entropy kernel (--loss te), which Megatron-LM refuses (megatron/training/arguments.py); plan with --loss native for Megatron-LM".into(),
            })
        }
        LossKernel::Native => flag(v, "cross-entropy-loss-fusion"),
        LossKernel::Unfused => {}
        LossKernel::Compiled => return Err(crate::megatron::compiled_loss(Target::MegatronLm)),
    }
    Ok(())
}

/// The model's shape: layers, attention, MLP, sliding windows, MTP, MoE and MLA.
fn model_args(
    v: &mut Vec<String>,
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Result<(), ExportError> {
    let m = &plan.model;
    let w = &plan.workload;
    // Model shape: TransformerConfig / _add_network_size_args.
    arg(v, "num-layers", m.layers);
    arg(v, "hidden-size", m.hidden);
    arg(v, "ffn-hidden-size", m.ffn_hidden);
    arg(v, "num-attention-heads", m.heads);
    if m.kv_heads != m.heads && m.mla.is_none() {
        flag(v, "group-query-attention");
        arg(v, "num-query-groups", m.kv_heads);
    }
    if m.head_dim * m.heads != m.hidden && m.mla.is_none() {
        arg(v, "kv-channels", m.head_dim);
    }
    match (m.mlp, m.glu_clamp) {
        // GPT-OSS's clamped GLU, as Megatron names its parts (arguments.py
        // _add_network_size_args): quick GELU on the gate, the clamp, the offset.
        (MlpKind::Gated, Some(limit)) => {
            flag(v, "quick-geglu");
            arg(v, "activation-func-clamp-value", limit);
            arg(v, "glu-linear-offset", 1.0);
        }
        (MlpKind::Gated, None) => flag(v, "swiglu"),
        _ => {}
    }
    if m.attention_sinks {
        arg(v, "softmax-type", "learnable");
    }
    if m.qk_norm {
        flag(v, "qk-layernorm");
    }
    if let Some(why) = model_refusal(m) {
        return Err(cannot_lm(why));
    }
    // Megatron's default is LayerNorm; the plan priced the model's own norm.
    arg(v, "normalization", norm_name(m.norm_kind()));
    if let Some((left, skip)) = sliding_window(m).map_err(|r| r.at(Target::MegatronLm))? {
        arg(v, "window-size", format!("{left},0"));
        if let Some(n) = skip {
            arg(v, "window-attn-skip-freq", n);
        }
    }
    if !m.tied_embeddings {
        flag(v, "untie-embeddings-and-output-weights");
    }
    // Megatron-LM's default is learned absolute positions, which validate_args
    // refuses with MTP ("supported position embedding types are rope and none");
    // MLA's decoupled key (--qk-pos-emb-head-dim) is a rotary one.
    if m.mtp_layers > 0 || m.mla.is_some() {
        arg(v, "position-embedding-type", "rope");
    }
    // TransformerConfig.mtp_num_layers (absent: no MTP).
    if m.mtp_layers > 0 {
        arg(v, "mtp-num-layers", m.mtp_layers);
    }
    // Dropout as the plan priced it (masks and their traffic only with dropout):
    // TransformerConfig's attention_dropout and hidden_dropout default to 0.1,
    // which a Llama-style model does not train with.
    let p = if m.dropout { "0.1" } else { "0.0" };
    arg(v, "attention-dropout", p);
    arg(v, "hidden-dropout", p);
    if !m.bias {
        flag(v, "disable-bias-linear");
        if m.qkv_bias {
            flag(v, "add-qkv-bias");
        }
    }
    if let Some(moe) = &m.moe {
        // _add_moe_args.
        arg(v, "num-experts", moe.experts);
        arg(v, "moe-router-topk", moe.top_k);
        arg(v, "moe-ffn-hidden-size", moe.expert_ffn_hidden);
        // The cost model prices the routed experts as grouped GEMMs, and
        // TransformerConfig allows `moe_act` recomputation only with them.
        flag(v, "moe-grouped-gemm");
        if moe.shared_hidden() > 0 {
            arg(
                v,
                "moe-shared-expert-intermediate-size",
                moe.shared_hidden(),
            );
        }
        for (key, value) in moe_token_fields(plan, cfg) {
            let name = key.replace('_', "-");
            match value {
                Value::Bool(true) => flag(v, &name),
                Value::Bool(false) => {}
                other => arg(v, &name, other.yaml()),
            }
        }
        // Auxiliary-loss-free balancing: per-expert score bias, sigmoid scores
        // (TransformerConfig requires sigmoid or sqrtsoftplus with the bias).
        if moe.balancing == sextant_planner::routing::Balancing::LossFree {
            flag(v, "moe-router-enable-expert-bias");
            arg(v, "moe-router-score-function", "sigmoid");
        }
        // TransformerConfig.overlap_moe_expert_parallel_comm needs the delayed
        // weight-gradient pass to have compute to hide behind.
        if cfg.megatron_ep_overlap(w) {
            flag(v, "overlap-moe-expert-parallel-comm");
            flag(v, "delay-wgrad-compute");
        }
        if let Some(pattern) = moe_layer_pattern(m) {
            let list = quote::shell(&format!("[{}]", pattern.join(","))).map_err(cannot_lm)?;
            v.push(format!("--moe-layer-freq {list}"));
        }
    }
    if let Some(mla) = &m.mla {
        // TransformerConfig.multi_latent_attention and _add_mla_args
        // (megatron/training/arguments.py); no --q-lora-rank: Q is not compressed.
        flag(v, "multi-latent-attention");
        if mla.q_lora_rank > 0 {
            arg(v, "q-lora-rank", mla.q_lora_rank);
        }
        arg(v, "kv-lora-rank", mla.kv_lora_rank);
        arg(v, "qk-head-dim", mla.qk_nope_head_dim);
        arg(v, "qk-pos-emb-head-dim", mla.qk_rope_head_dim);
        arg(v, "v-head-dim", mla.v_head_dim);
    }
    Ok(())
}

pub fn megatron_lm(plan: &PlanFile, index: usize) -> Result<String, ExportError> {
    let a = args(plan, index)?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Megatron-LM arguments for plan #{}: {} on {} GPUs ({}).",
        plan.plans[index].rank,
        quote::comment(&plan.model.name),
        plan.gpus,
        quote::comment(&plan.hardware.name)
    );
    let _ = writeln!(s, "# Flags as in {MEGATRON_VERSION}.");
    if let Some(note) = kv_heads_below_tp(plan, index) {
        let _ = writeln!(s, "# {note}");
    }
    if let Some(note) = cuda_graph_floor(&a) {
        let _ = writeln!(s, "# {note}");
    }
    let _ = writeln!(s, "# Position embedding (rotary base and scaling), tokenizer and data flags come from your model's recipe.");
    match cuda_device_max_connections(plan, index) {
        Some(MaxConnections::One) => {
            let _ = writeln!(s, "# Environment: export CUDA_DEVICE_MAX_CONNECTIONS=1 (validate_args asserts it with tensor or context parallelism before Blackwell).");
        }
        Some(MaxConnections::Unset) => {
            let _ = writeln!(s, "# Environment: unset CUDA_DEVICE_MAX_CONNECTIONS (Megatron-FSDP asserts it is not 1; the expert-parallel overlap needs more than one connection).");
        }
        None => {}
    }
    let _ = writeln!(s, "{}", a.join(" \\\n"));
    Ok(s)
}
