//! Megatron-LM command-line arguments and Megatron-Core Python.
//!
//! Flag names as of Megatron-LM main (2026-08, core_v0.19); all are also valid in
//! core_v0.13 except `--use-megatron-fsdp`, which core_v0.13 spelled
//! `--use-custom-fsdp`. Up to core_v0.15 the flags are written out in
//! `megatron/training/arguments.py`; later ones are generated from the config
//! dataclasses named beside each mapping (`--` + field name with `-` for `_`).

use std::fmt::Write;

use sextant_planner::config::{
    Dispatcher, Layout, ParallelConfig, Precision, Recompute, RecomputeModules, Zero,
};
use sextant_planner::cost::LossKernel;
use sextant_planner::model::MlpKind;
use sextant_planner::plan::PlanFile;
use sextant_planner::schedule::Schedule;

use crate::quote;
use crate::{ExportError, Target};

pub const MEGATRON_VERSION: &str = "Megatron-LM main 2026-08 (core_v0.19); core_v0.13+ except --use-megatron-fsdp (core_v0.13: --use-custom-fsdp)";

/// `--pipeline-model-parallel-layout` string for an explicit per-stage list
/// (syntax: megatron/core/transformer/pipeline_parallel_layer_layout.py; `E`
/// embedding, `t` decoder layer, `m` multi-token-prediction layer, `L` loss, `|`
/// between virtual stages, stage index = vpp_rank * PP + pp_rank, which is
/// Sextant's order too). MTP layers go on the last virtual stage, before the loss.
pub fn pipeline_layout(plan: &PlanFile, cfg: &ParallelConfig) -> Result<String, String> {
    let chunks = cfg
        .stage_layers(plan.model.layers)
        .map_err(|r| r.to_string())?;
    let last = chunks.len() - 1;
    let parts: Vec<String> = chunks
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut s = String::new();
            if i == 0 {
                s.push('E');
            }
            match n {
                0 => {}
                1 => s.push('t'),
                n => s.push_str(&format!("t*{n}")),
            }
            if i == last {
                match plan.model.mtp_layers {
                    0 => {}
                    1 => s.push('m'),
                    n => s.push_str(&format!("m*{n}")),
                }
                s.push('L');
            }
            s
        })
        .collect();
    Ok(parts.join("|"))
}

/// Megatron-Core runs 1F1B, or interleaved 1F1B with virtual stages, and nothing
/// else: `get_forward_backward_func` (megatron/core/pipeline_parallel/schedules.py)
/// returns forward_backward_no_pipelining, _pipelining_without_interleaving or
/// _pipelining_with_interleaving, and no argument selects another. (The
/// combined_1f1b variants overlap expert-parallel communication inside 1F1B, and
/// `--delay-wgrad-compute` defers weight gradients for that overlap; neither is a
/// zero-bubble or bidirectional schedule.) So GPipe, ZB-H1 and DualPipe plans
/// cannot be stated for Megatron-LM or the frameworks built on Megatron-Core.
pub(crate) fn megatron_schedule(cfg: &ParallelConfig, framework: &str) -> Result<(), String> {
    match cfg.schedule {
        Schedule::OneFOneB | Schedule::Interleaved => Ok(()),
        other => Err(format!(
            "{framework} has no {other} pipeline schedule (Megatron-Core's get_forward_backward_func runs 1F1B, or interleaved 1F1B with virtual stages); re-plan with --schedule 1f1b,interleaved"
        )),
    }
}

/// The FP8 scaling recipe for an FP8 plan (Fp8Recipe in megatron/core/enums.py).
/// Delayed scaling, unless selective recomputation replays `moe_act` or
/// `layernorm`: TransformerConfig refuses those with delayed scaling ("Delayed
/// scaling does not support moe_act and layernorm recompute for fp8",
/// transformer_config.py, d98e8a6), so the plan runs with per-tensor current
/// scaling (`tensorwise`), the same FP8 GEMMs.
pub(crate) fn fp8_recipe(cfg: &ParallelConfig) -> &'static str {
    if cfg.recomputes(RecomputeModules::MOE_ACT) || cfg.recomputes(RecomputeModules::LAYERNORM) {
        "tensorwise"
    } else {
        "delayed"
    }
}

/// What a Megatron-LM launch must do with `CUDA_DEVICE_MAX_CONNECTIONS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MaxConnections {
    /// Set it to 1: `validate_args` asserts it with tensor or context parallelism
    /// on GPUs before Blackwell (on Blackwell it is allowed, not required).
    One,
    /// Leave it unset (or above 1): Megatron-FSDP asserts it is not 1, and the
    /// expert-parallel all-to-all overlap needs more than one connection.
    Unset,
}

/// The `CUDA_DEVICE_MAX_CONNECTIONS` this plan needs from its launch, if any
/// (megatron/training/arguments.py validate_args, d98e8a6).
pub(crate) fn cuda_device_max_connections(plan: &PlanFile, index: usize) -> Option<MaxConnections> {
    let cfg = &plan.plans[index].config;
    if matches!(cfg.zero, Zero::Zero2 | Zero::Zero3)
        || (plan.model.moe.is_some() && cfg.megatron_ep_overlap(&plan.workload))
    {
        Some(MaxConnections::Unset)
    } else if cfg.tp > 1 || cfg.cp > 1 {
        Some(MaxConnections::One)
    } else {
        None
    }
}

/// The expert-parallel sizes Megatron-Core is handed for this plan: the plan's
/// for an MoE model; for a dense one the defaults (expert parallel 1, expert
/// tensor parallel = TP: `validate_args` in megatron/training/arguments.py, and
/// `initialize_model_parallel` when given None).
fn expert_sizes(plan: &PlanFile, cfg: &ParallelConfig) -> (u64, u64) {
    if plan.model.moe.is_some() {
        (cfg.ep, cfg.etp)
    } else {
        (1, cfg.tp)
    }
}

/// The rank orders Megatron-Core can build for this plan. `initialize_model_parallel`
/// (megatron/core/parallel_state.py, d98e8a6) asserts
/// `order.endswith("pp") or pipeline_model_parallel_size == 1 or
/// expert_data_parallel_size == data_parallel_size`, where the data-parallel size
/// is world / (TP x PP x CP) and the expert one world / (ETP x EP x PP): with PP > 1,
/// an order that puts PP before DP needs the two equal.
pub(crate) fn check_rank_order(plan: &PlanFile, cfg: &ParallelConfig) -> Result<(), String> {
    let order = plan.rank_order.as_str();
    if !sextant_planner::ranks::ORDERS.contains(&order) {
        return Err(format!(
            "rank order {} is not one Megatron-Core supports ({})",
            quote::double_quoted(order),
            sextant_planner::ranks::ORDERS.join(", ")
        ));
    }
    let (ep, etp) = expert_sizes(plan, cfg);
    let world = plan.gpus;
    let dp = world / (cfg.tp * cfg.pp * cfg.cp).max(1);
    let edp = world / (etp * ep * cfg.pp).max(1);
    if order.ends_with("pp") || cfg.pp == 1 || edp == dp {
        return Ok(());
    }
    Err(format!(
        "rank order {order} with pipeline parallel size {} needs the expert data-parallel size (world / (ETP {etp} x EP {ep} x PP {}) = {edp}) to equal the data-parallel size ({dp}): Megatron-Core's initialize_model_parallel asserts order.endswith(\"pp\") or pipeline_model_parallel_size == 1 or expert_data_parallel_size == data_parallel_size (megatron/core/parallel_state.py); set the plan's rank_order to the default tp-cp-ep-dp-pp",
        cfg.pp, cfg.pp
    ))
}

fn flag(v: &mut Vec<String>, name: &str) {
    v.push(format!("--{name}"));
}

fn arg(v: &mut Vec<String>, name: &str, value: impl ToString) {
    v.push(format!("--{name} {}", value.to_string()));
}

/// The arguments, one flag (with its value) per entry.
/// Why Megatron-LM's arguments cannot build `m` at all, whatever the plan.
pub fn model_refusal(m: &sextant_planner::model::ModelSpec) -> Option<String> {
    m.sandwich_norms.then(|| format!(
        "{} normalises after each attention and MLP block as well as before it (Gemma 2 and 3, GLM-4), which no Megatron-LM argument builds; use the framework's own model definition (e.g. Megatron-Bridge's) with the parallel sizes of `--to rank-map`",
        m.name
    ))
}

pub fn args(plan: &PlanFile, index: usize) -> Result<Vec<String>, ExportError> {
    let t = Target::MegatronLm;
    let cannot = |reason: String| ExportError::Inexpressible { target: t, reason };
    let cfg = &plan.plans[index].config;
    let m = &plan.model;
    let w = &plan.workload;
    megatron_schedule(cfg, "Megatron-LM").map_err(cannot)?;
    let mut v = Vec::new();

    // Parallel sizes: ModelParallelConfig (megatron/core/model_parallel_config.py).
    arg(&mut v, "tensor-model-parallel-size", cfg.tp);
    arg(&mut v, "pipeline-model-parallel-size", cfg.pp);
    arg(&mut v, "context-parallel-size", cfg.cp);
    if cfg.sp && cfg.tp > 1 {
        flag(&mut v, "sequence-parallel");
    }
    if m.moe.is_some() {
        arg(&mut v, "expert-model-parallel-size", cfg.ep);
        arg(&mut v, "expert-tensor-parallel-size", cfg.etp);
    }
    // Stage layout: arguments.py _add_distributed_args (--num-layers-per-virtual-
    // pipeline-stage, --num-virtual-stages-per-pipeline-rank, --decoder-first/last-
    // pipeline-num-layers, --pipeline-model-parallel-layout) and TransformerConfig
    // (--account-for-embedding/loss-in-pipeline-split).
    match &cfg.layout {
        Layout::Even => {
            if cfg.vpp > 1 {
                arg(
                    &mut v,
                    "num-layers-per-virtual-pipeline-stage",
                    m.layers / (cfg.pp * cfg.vpp),
                );
            }
        }
        Layout::AccountEmbeddingLoss => {
            flag(&mut v, "account-for-embedding-in-pipeline-split");
            flag(&mut v, "account-for-loss-in-pipeline-split");
            if cfg.vpp > 1 {
                arg(&mut v, "num-virtual-stages-per-pipeline-rank", cfg.vpp);
            }
        }
        Layout::FirstLast { first, last } => {
            if cfg.vpp > 1 {
                return Err(cannot("first/last stage layer counts with virtual stages: state the split as an explicit layout".into()));
            }
            arg(&mut v, "decoder-first-pipeline-num-layers", first);
            arg(&mut v, "decoder-last-pipeline-num-layers", last);
        }
        Layout::Explicit { .. } => {
            let layout = pipeline_layout(plan, cfg).map_err(cannot)?;
            let layout = quote::shell(&layout).map_err(cannot)?;
            v.push(format!("--pipeline-model-parallel-layout {layout}"));
        }
    }
    check_rank_order(plan, cfg).map_err(cannot)?;
    if plan.rank_order == "tp-cp-ep-pp-dp" {
        // DistributedInitConfig.use_tp_pp_dp_mapping; megatron/training/initialize.py.
        flag(&mut v, "use-tp-pp-dp-mapping");
    }

    // Batch and sequence: TrainingConfig (megatron/training/config/training_config.py)
    // and _add_data_args.
    arg(&mut v, "micro-batch-size", cfg.mbs);
    arg(&mut v, "global-batch-size", w.global_batch);
    arg(&mut v, "seq-length", w.seq);
    arg(&mut v, "max-position-embeddings", w.seq);

    // Recomputation: TransformerConfig recompute_granularity / _method / _num_layers.
    match cfg.recompute {
        Recompute::None => {}
        Recompute::Selective => {
            arg(&mut v, "recompute-granularity", "selective");
            if cfg.recompute_modules != RecomputeModules::DEFAULT {
                arg(
                    &mut v,
                    "recompute-modules",
                    cfg.recompute_modules.names().join(" "),
                );
            }
        }
        Recompute::Full => {
            arg(&mut v, "recompute-granularity", "full");
            arg(&mut v, "recompute-method", "uniform");
            arg(&mut v, "recompute-num-layers", 1);
        }
    }

    // Data-parallel sharding: _add_distributed_args; Megatron-FSDP strategies
    // no_shard / optim / optim_grads / optim_grads_params.
    match cfg.zero {
        Zero::None => {}
        Zero::DistOpt => flag(&mut v, "use-distributed-optimizer"),
        Zero::Zero2 | Zero::Zero3 => {
            flag(&mut v, "use-megatron-fsdp");
            arg(
                &mut v,
                "data-parallel-sharding-strategy",
                if cfg.zero == Zero::Zero2 {
                    "optim_grads"
                } else {
                    "optim_grads_params"
                },
            );
            // validate_args asserts it for Megatron-FSDP (arguments.py, d98e8a6,
            // "Megatron-FSDP requires the `fsdp_dtensor` checkpointing format").
            arg(&mut v, "ckpt-format", "fsdp_dtensor");
        }
    }
    if cfg.overlap.grad_reduce && cfg.dp * cfg.cp > 1 {
        flag(&mut v, "overlap-grad-reduce");
        // --overlap-param-gather asserts a sharded optimizer and --overlap-grad-reduce.
        if cfg.overlap.param_gather && cfg.zero != Zero::None {
            flag(&mut v, "overlap-param-gather");
        }
    }
    if cfg.overlap.tp_comm && cfg.tp > 1 {
        if !cfg.sp {
            return Err(cannot(
                "--tp-comm-overlap requires --sequence-parallel (assertion in Megatron-LM)".into(),
            ));
        }
        flag(&mut v, "tp-comm-overlap");
    }
    if !cfg.overlap.p2p && cfg.pp > 1 {
        flag(&mut v, "no-overlap-p2p-communication");
    }

    // Precision: _add_mixed_precision_args / TransformerConfig.fp8 (--fp8-format) and
    // fp8_recipe (Fp8Recipe in megatron/core/enums.py).
    match w.precision {
        Precision::Bf16 => flag(&mut v, "bf16"),
        Precision::Fp16 => flag(&mut v, "fp16"),
        Precision::Fp8 => {
            flag(&mut v, "bf16");
            arg(&mut v, "fp8-format", "hybrid");
            arg(&mut v, "fp8-recipe", fp8_recipe(cfg));
        }
        Precision::Mxfp8 => {
            flag(&mut v, "bf16");
            arg(&mut v, "fp8-format", "e4m3");
            arg(&mut v, "fp8-recipe", "mxfp8");
        }
    }
    // With --bf16, FP32 gradient reduction is switched on unless --grad-reduce-in-bf16.
    // OptimizerConfig (megatron/core/optimizer/optimizer_config.py): Adam's moments
    // in BF16 through the precision-aware optimizer.
    if cfg.bf16_moments {
        flag(&mut v, "use-precision-aware-optimizer");
        arg(&mut v, "exp-avg-dtype", "bf16");
        arg(&mut v, "exp-avg-sq-dtype", "bf16");
    }
    if cfg.bf16_grads {
        flag(&mut v, "grad-reduce-in-bf16");
    } else if w.precision == Precision::Fp16 {
        flag(&mut v, "accumulate-allreduce-grads-in-fp32");
    }
    arg(
        &mut v,
        "attention-backend",
        if plan.assumptions.flash_attention {
            "flash"
        } else {
            "unfused"
        },
    );
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
        LossKernel::Native => flag(&mut v, "cross-entropy-loss-fusion"),
        LossKernel::Unfused => {}
    }

    // Model shape: TransformerConfig / _add_network_size_args.
    arg(&mut v, "num-layers", m.layers);
    arg(&mut v, "hidden-size", m.hidden);
    arg(&mut v, "ffn-hidden-size", m.ffn_hidden);
    arg(&mut v, "num-attention-heads", m.heads);
    if m.kv_heads != m.heads && m.mla.is_none() {
        flag(&mut v, "group-query-attention");
        arg(&mut v, "num-query-groups", m.kv_heads);
    }
    if m.head_dim * m.heads != m.hidden && m.mla.is_none() {
        arg(&mut v, "kv-channels", m.head_dim);
    }
    match (m.mlp, m.glu_clamp) {
        // GPT-OSS's clamped GLU, as Megatron names its parts (arguments.py
        // _add_network_size_args): quick GELU on the gate, the clamp, the offset.
        (MlpKind::Gated, Some(limit)) => {
            flag(&mut v, "quick-geglu");
            arg(&mut v, "activation-func-clamp-value", limit);
            arg(&mut v, "glu-linear-offset", 1.0);
        }
        (MlpKind::Gated, None) => flag(&mut v, "swiglu"),
        _ => {}
    }
    if m.attention_sinks {
        arg(&mut v, "softmax-type", "learnable");
    }
    if let Some(why) = model_refusal(m) {
        return Err(cannot(why));
    }
    // Sliding-window attention: --window-size (left, right) counts the tokens
    // before the current one (a window of W tokens is W - 1, 0), and
    // --window-attn-skip-freq N makes every N-th layer full attention
    // (arguments.py _add_network_size_args).
    if let Some(sw) = &m.sliding_window {
        let full = m.layers.saturating_sub(sw.layers);
        if full > 0 && !m.layers.is_multiple_of(full) {
            return Err(cannot(format!(
                "{} uses a sliding window on {} of {} layers, which is no one-full-layer-in-N pattern --window-attn-skip-freq can state",
                m.name, sw.layers, m.layers
            )));
        }
        arg(
            &mut v,
            "window-size",
            format!("{},0", sw.window.saturating_sub(1)),
        );
        if let Some(n) = m.layers.checked_div(full) {
            arg(&mut v, "window-attn-skip-freq", n);
        }
    }
    if !m.tied_embeddings {
        flag(&mut v, "untie-embeddings-and-output-weights");
    }
    // Megatron-LM's default is learned absolute positions, which validate_args
    // refuses with MTP ("supported position embedding types are rope and none");
    // MLA's decoupled key (--qk-pos-emb-head-dim) is a rotary one.
    if m.mtp_layers > 0 || m.mla.is_some() {
        arg(&mut v, "position-embedding-type", "rope");
    }
    // TransformerConfig.mtp_num_layers (absent: no MTP).
    if m.mtp_layers > 0 {
        arg(&mut v, "mtp-num-layers", m.mtp_layers);
    }
    if !m.bias {
        flag(&mut v, "disable-bias-linear");
        if m.qkv_bias {
            flag(&mut v, "add-qkv-bias");
        }
    }
    if let Some(moe) = &m.moe {
        // _add_moe_args.
        arg(&mut v, "num-experts", moe.experts);
        arg(&mut v, "moe-router-topk", moe.top_k);
        arg(&mut v, "moe-ffn-hidden-size", moe.expert_ffn_hidden);
        // The cost model prices the routed experts as grouped GEMMs, and
        // TransformerConfig allows `moe_act` recomputation only with them.
        flag(&mut v, "moe-grouped-gemm");
        if moe.shared_hidden() > 0 {
            arg(
                &mut v,
                "moe-shared-expert-intermediate-size",
                moe.shared_hidden(),
            );
        }
        for (key, value) in moe_token_fields(plan, cfg) {
            let name = key.replace('_', "-");
            match value {
                Value::Bool(true) => flag(&mut v, &name),
                Value::Bool(false) => {}
                other => arg(&mut v, &name, other.yaml()),
            }
        }
        // Auxiliary-loss-free balancing: per-expert score bias, sigmoid scores
        // (TransformerConfig requires sigmoid or sqrtsoftplus with the bias).
        if moe.balancing == sextant_planner::routing::Balancing::LossFree {
            flag(&mut v, "moe-router-enable-expert-bias");
            arg(&mut v, "moe-router-score-function", "sigmoid");
        }
        // TransformerConfig.overlap_moe_expert_parallel_comm needs the delayed
        // weight-gradient pass to have compute to hide behind.
        if cfg.megatron_ep_overlap(w) {
            flag(&mut v, "overlap-moe-expert-parallel-comm");
            flag(&mut v, "delay-wgrad-compute");
        }
        if let Some(pattern) = moe_layer_pattern(m) {
            let list = quote::shell(&format!("[{}]", pattern.join(","))).map_err(cannot)?;
            v.push(format!("--moe-layer-freq {list}"));
        }
    }
    if let Some(mla) = &m.mla {
        // TransformerConfig.multi_latent_attention and _add_mla_args
        // (megatron/training/arguments.py); no --q-lora-rank: Q is not compressed.
        flag(&mut v, "multi-latent-attention");
        if mla.q_lora_rank > 0 {
            arg(&mut v, "q-lora-rank", mla.q_lora_rank);
        }
        arg(&mut v, "kv-lora-rank", mla.kv_lora_rank);
        arg(&mut v, "qk-head-dim", mla.qk_nope_head_dim);
        arg(&mut v, "qk-pos-emb-head-dim", mla.qk_rope_head_dim);
        arg(&mut v, "v-head-dim", mla.v_head_dim);
    }
    Ok(v)
}

/// `moe_layer_freq` as a per-layer list (1: MoE, 0: dense) when not every layer
/// is MoE (TransformerConfig.moe_layer_freq); `None` when every layer is.
fn moe_layer_pattern(m: &sextant_planner::model::ModelSpec) -> Option<Vec<&'static str>> {
    let moe = m.moe.as_ref()?;
    (moe.dense_leading_layers > 0 || moe.layer_freq > 1).then(|| {
        (0..m.layers)
            .map(|i| if m.is_moe_layer(i) { "1" } else { "0" })
            .collect()
    })
}

/// A Megatron-Core config value, written as a YAML or Hydra word or as Python.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Word(&'static str),
    Num(String),
    Bool(bool),
}

impl Value {
    pub(crate) fn yaml(&self) -> String {
        match self {
            Value::Word(w) => w.to_string(),
            Value::Num(n) => n.clone(),
            Value::Bool(b) => b.to_string(),
        }
    }

    pub(crate) fn python(&self) -> String {
        match self {
            Value::Word(w) => format!("\"{w}\""),
            Value::Num(n) => n.clone(),
            Value::Bool(b) => if *b { "True" } else { "False" }.into(),
        }
    }
}

/// The MoE token path the plan priced, as Megatron-Core `TransformerConfig` fields
/// (megatron/core/transformer/transformer_config.py): the dispatcher
/// (`moe_token_dispatcher_type`, `moe_flex_dispatcher_backend`) and, when tokens
/// are dropped, the expert capacity (`moe_expert_capacity_factor`,
/// `moe_pad_expert_input_to_capacity`; absent: dropless). Empty for dense models.
pub(crate) fn moe_token_fields(
    plan: &PlanFile,
    cfg: &ParallelConfig,
) -> Vec<(&'static str, Value)> {
    let mut v = Vec::new();
    if plan.model.moe.is_none() {
        return v;
    }
    match cfg.moe_dispatcher {
        Dispatcher::AllToAll => v.push(("moe_token_dispatcher_type", Value::Word("alltoall"))),
        Dispatcher::Deduplicated => {
            v.push(("moe_token_dispatcher_type", Value::Word("flex")));
            v.push(("moe_flex_dispatcher_backend", Value::Word("deepep")));
        }
    }
    if let Some(c) = &plan.workload.moe_capacity {
        v.push((
            "moe_expert_capacity_factor",
            Value::Num(c.factor.to_string()),
        ));
        v.push(("moe_pad_expert_input_to_capacity", Value::Bool(c.pad)));
    }
    v
}

/// The loss the plan priced, as Megatron-Core's `ModelParallelConfig` fields
/// `cross_entropy_loss_fusion` and `cross_entropy_fusion_impl`
/// (megatron/core/model_parallel_config.py).
pub fn loss_fields(loss: LossKernel) -> (bool, Option<&'static str>) {
    match loss {
        LossKernel::Native => (true, Some("native")),
        LossKernel::Te => (true, Some("te")),
        LossKernel::Unfused => (false, None),
    }
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
    let _ = writeln!(s, "# Normalization, position embedding, tokenizer and data flags come from your model's recipe.");
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
    megatron_schedule(cfg, "Megatron-Core")
        .map_err(|reason| ExportError::Inexpressible { target: t, reason })?;
    check_rank_order(plan, cfg)
        .map_err(|reason| ExportError::Inexpressible { target: t, reason })?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Megatron-Core, {MEGATRON_VERSION}, for plan #{}: {} on {} GPUs.",
        plan.plans[index].rank,
        quote::comment(&m.name),
        plan.gpus
    );
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
    if !plan.assumptions.flash_attention {
        let _ = writeln!(s, "from megatron.core.transformer.enums import AttnBackend");
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
    let _ = writeln!(s, "config = {config_class}(");
    let _ = writeln!(s, "    num_layers={},\n    hidden_size={},\n    ffn_hidden_size={},\n    num_attention_heads={},", m.layers, m.hidden, m.ffn_hidden, m.heads);
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
    let (fusion, fusion_impl) = loss_fields(plan.assumptions.loss);
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
    // TransformerConfig.attention_backend (enums.py AttnBackend); the default, auto,
    // lets Transformer Engine pick a fused kernel.
    if !plan.assumptions.flash_attention {
        let _ = writeln!(s, "    attention_backend=AttnBackend.unfused,");
    }
    match &cfg.layout {
        Layout::Even => {}
        Layout::AccountEmbeddingLoss => {
            let _ = writeln!(s, "    account_for_embedding_in_pipeline_split=True,\n    account_for_loss_in_pipeline_split=True,");
        }
        Layout::FirstLast { first, last } => {
            let _ = writeln!(s, "    num_layers_in_first_pipeline_stage={first},\n    num_layers_in_last_pipeline_stage={last},");
        }
        Layout::Explicit { .. } => {
            let layout = pipeline_layout(plan, cfg)
                .map_err(|reason| ExportError::Inexpressible { target: t, reason })?;
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
        py_bool(cfg.overlap.tp_comm && cfg.tp > 1 && cfg.sp)
    );
    let _ = writeln!(s, ")\n");
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
        "# micro-batch {} x {} accumulation steps = global batch {} at sequence length {}",
        cfg.mbs,
        w.global_batch / (cfg.mbs * cfg.dp),
        w.global_batch,
        w.seq
    );
    Ok(s)
}
